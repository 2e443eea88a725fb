"""DeleteRecords against Apache Kafka: the answers, then what consumers see afterwards.

Raw requests (every version) and three clients (confluent-kafka's and kafka-python's admin
clients, Kafka's own ``kafka-delete-records``) move log starts on both brokers; the low
watermarks and error codes are compared, then ListOffsets, Fetch below, at and inside the new
start, and a consumer reading from the beginning. A Stratalog broker restarted on its data
directory keeps the moved start (Kafka's is not restarted: the scenario is Stratalog's
durability, its answers were compared before the restart).
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient
from kafka.admin import KafkaAdminClient
from kafka.structs import TopicPartition as KpTopicPartition

from stratalog.peers.kafka import run_tool
from stratalog.records import build_batch

from ..conftest import BrokerProcess
from . import clients, wire
from .conftest import both

pytestmark = pytest.mark.kafka

BASE_TS = int(time.time() * 1000) - 60_000
EARLIEST, LATEST = -2, -1


def delete_records(
    bs: str, wanted: list[tuple[str, list[tuple[int, int]]]], version: int = 2
) -> list[dict[str, Any]]:
    r = wire.call(
        bs,
        21,
        version,
        topics=[
            {"name": t, "partitions": [{"partition_index": i, "offset": o} for i, o in parts]}
            for t, parts in wanted
        ],
        timeout=10000,
    )
    return wire.normalise(r["topics"])


def _fill(bs: str, topic: str) -> None:
    """Partition 0: offsets 0-2 in one batch, 3-4 in another; partition 1: 0-1; 2: empty."""
    assert wire.create_topic(bs, topic, 3) == 0
    batches = {
        0: [
            build_batch(
                [(b"a", b"0", BASE_TS), (b"b", b"1", BASE_TS + 1), (b"c", b"2", BASE_TS + 2)]
            ),
            build_batch([(b"d", b"3", BASE_TS + 3), (b"e", b"4", BASE_TS + 4)]),
        ],
        1: [build_batch([(b"f", b"0", BASE_TS + 5), (b"g", b"1", BASE_TS + 6)])],
    }
    for p, bs_ in batches.items():
        for b in bs_:
            assert wire.produce(bs, topic, p, b)["error_code"] == 0


def _offsets(bs: str, topic: str, partitions: int) -> list[tuple[int, int, int]]:
    """(partition, earliest, latest) by ListOffsets."""
    return [
        (
            p,
            wire.list_offset(bs, topic, p, EARLIEST)["offset"],
            wire.list_offset(bs, topic, p, LATEST)["offset"],
        )
        for p in range(partitions)
    ]


def _fetch(bs: str, topic: str, partition: int, offset: int) -> dict[str, Any]:
    """A Fetch's error, watermarks and the offsets of the batches it returned."""
    p = wire.fetch(bs, topic, partition, offset)
    return {
        "error": p["error_code"],
        "high_watermark": p["high_watermark"],
        "log_start_offset": p["log_start_offset"],
        "batches": [
            (b["base_offset"], b["last_offset_delta"]) for b in wire.parse_batches(p["records"])
        ],
    }


def raw_scenario(bs: str, topic: str, version: int) -> dict[str, Any]:
    _fill(bs, topic)
    missing = f"{topic}-missing"
    out: dict[str, Any] = {}
    # Inside a batch, the high watermark (-1), an empty partition at 0, a missing partition and
    # topic; the same partition twice (answered once, for the last offset).
    out["first"] = delete_records(
        bs,
        [
            (topic, [(0, 1), (1, -1), (2, 0), (7, 0), (1, 0)]),
            (missing, [(0, 0)]),
        ],
        version,
    )
    out["offsets"] = _offsets(bs, topic, 3)
    out["fetch_below"] = _fetch(bs, topic, 0, 0)
    out["fetch_at"] = _fetch(bs, topic, 0, 1)
    out["fetch_inside"] = _fetch(bs, topic, 0, 2)
    out["fetch_emptied"] = _fetch(bs, topic, 1, 2)
    # Back below the start (a no-op answered with the start), past the high watermark, a
    # negative offset other than -1, exactly the high watermark.
    out["below"] = delete_records(bs, [(topic, [(0, 0)])], version)
    out["past"] = delete_records(bs, [(topic, [(0, 6), (2, 1)])], version)
    out["negative"] = delete_records(bs, [(topic, [(0, -2), (1, -7)])], version)
    out["offsets_after_errors"] = _offsets(bs, topic, 3)
    out["at_end"] = delete_records(bs, [(topic, [(0, 5)])], version)
    out["offsets_at_end"] = _offsets(bs, topic, 3)
    out["fetch_at_end"] = _fetch(bs, topic, 0, 5)
    # What comes after goes on from there.
    assert wire.produce(bs, topic, 0, build_batch([(b"h", b"5", BASE_TS + 7)]))["error_code"] == 0
    out["offsets_after_produce"] = _offsets(bs, topic, 3)
    return out


@pytest.mark.parametrize("version", [0, 1, 2])
def test_delete_records_raw(pair, name, version):
    strat, kafka = both(pair, raw_scenario, f"{name}-v{version}", version)
    assert strat == kafka, wire.differences(strat, kafka)


def other_topics_scenario(bs: str, topic: str) -> dict[str, Any]:
    """The offsets topic (internal), and a topic with an empty cleanup policy: Kafka refuses
    DeleteRecords (POLICY_VIOLATION) only on a compacted topic without ``delete``."""
    out: dict[str, Any] = {}
    out["internal"] = delete_records(bs, [("__consumer_offsets", [(0, 0)])])
    kept = f"{topic}-kept"
    out["create_kept"] = wire.create_topic(bs, kept, 1, **{"cleanup.policy": ""})
    if out["create_kept"] == 0:
        assert wire.produce(bs, kept, 0, build_batch([(b"k", b"v", BASE_TS)]))["error_code"] == 0
        out["kept"] = delete_records(bs, [(kept, [(0, 1)])])
        out["kept_offsets"] = _offsets(bs, kept, 1)
    return out


def test_delete_records_internal_and_policy(pair, name):
    strat, kafka = both(pair, other_topics_scenario, name)
    assert strat == kafka, wire.differences(strat, kafka)


def clients_scenario(bs: str, topic: str) -> dict[str, Any]:
    """confluent-kafka's and kafka-python's admin clients, then a consumer from the start."""
    recs = clients.records(12, 2, BASE_TS, tag="dr")
    assert wire.create_topic(bs, topic, 2) == 0
    produced = clients.cf_produce(bs, topic, recs)
    out: dict[str, Any] = {"produced": produced}
    admin = AdminClient({"bootstrap.servers": bs})
    futures = admin.delete_records([TopicPartition(topic, 0, 2), TopicPartition(topic, 1, -1)])
    out["confluent"] = sorted(
        (tp.partition, f.result(timeout=30).low_watermark) for tp, f in futures.items()
    )
    bad = admin.delete_records([TopicPartition(topic, 0, 100)])
    try:
        next(iter(bad.values())).result(timeout=30)
        out["confluent_past"] = "ok"
    except Exception as e:  # KafkaException: the broker's error
        out["confluent_past"] = e.args[0].name()
    kp = KafkaAdminClient(bootstrap_servers=bs, request_timeout_ms=30000)
    try:
        got = kp.delete_records({KpTopicPartition(topic, 0): 4})
        out["kafka_python"] = sorted((tp.partition, v["low_watermark"]) for tp, v in got.items())
    finally:
        kp.close()
    out["offsets"] = _offsets(bs, topic, 2)
    out["consumed"] = [(r[0], r[1], r[2], r[3]) for r in clients.cf_consume(bs, topic, 2, 2)]
    return out


def test_delete_records_clients(pair, name):
    strat, kafka = both(pair, clients_scenario, name)
    assert strat == kafka, wire.differences(strat, kafka)


def tool_scenario(bs: str, topic: str, tmp: str) -> dict[str, Any]:
    """kafka-delete-records with an offsets JSON file, as an operator runs it."""
    _fill(bs, topic)
    spec = {
        "version": 1,
        "partitions": [
            {"topic": topic, "partition": 0, "offset": 3},
            {"topic": topic, "partition": 1, "offset": 9},
        ],
    }
    path = f"{tmp}/{topic}.json"
    with open(path, "w") as f:
        json.dump(spec, f)
    r = run_tool(
        "kafka-delete-records", "--bootstrap-server", bs, "--offset-json-file", path, timeout=90
    )
    return {
        "exit": r.returncode,
        "stdout": sorted(line.replace(bs, "<bs>") for line in r.stdout.splitlines() if line),
        "offsets": _offsets(bs, topic, 3),
    }


def test_kafka_delete_records_tool(pair, name, tmp_path):
    strat, kafka = both(pair, tool_scenario, name, str(tmp_path))
    assert strat == kafka, wire.differences(strat, kafka)
    assert strat["offsets"][0] == (0, 3, 5)


def test_delete_records_survives_restart(tmp_path, name):
    """The moved start is durable: after a clean stop, and after kill -9 (no clean stop)."""
    b = BrokerProcess(tmp_path / "data").start()
    try:
        before = raw_scenario(b.bootstrap, name, 2)
        b.stop()
        b.start()
        assert _offsets(b.bootstrap, name, 3) == before["offsets_after_produce"]
        assert _fetch(b.bootstrap, name, 0, 4)["error"] == 1  # OFFSET_OUT_OF_RANGE
        # Inside a batch, then a crash: the start is where it was moved, not the batch's base.
        batch = build_batch([(b"i", b"6", BASE_TS), (b"j", b"7", BASE_TS), (b"k", b"8", BASE_TS)])
        assert wire.produce(b.bootstrap, name, 0, batch)["base_offset"] == 6
        moved = delete_records(b.bootstrap, [(name, [(0, 7)])])
        assert moved[0]["partitions"] == [
            {"partition_index": 0, "low_watermark": 7, "error_code": 0}
        ]
        b.kill()
        b.start()
        assert _offsets(b.bootstrap, name, 3)[0] == (0, 7, 9)
        assert _fetch(b.bootstrap, name, 0, 6)["error"] == 1
        assert _fetch(b.bootstrap, name, 0, 7)["batches"] == [(6, 2)]
    finally:
        b.kill()
