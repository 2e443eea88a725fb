"""The deliberate differences (deliberate.DELIBERATE), each shown on both brokers.

A test here asserts Stratalog's documented behaviour and that Kafka's differs (check_deliberate).
The allow-list itself must be documented in docs/compatibility.md, entry by entry, and every entry
must be exercised by a test.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from kio.schema.errors import ErrorCode

from stratalog import Broker
from stratalog.peers.kafka import BROKER_MAIN, KafkaBroker, _java, _jvm_base, resolve_kafka
from stratalog.records import build_batch

from . import wire
from .conftest import KAFKA_PROPERTIES, both, start_kafka, warm_up
from .deliberate import DELIBERATE, check_deliberate
from .test_consumer_group_protocol import _group_view, _hb, _heartbeat_until_settled
from .test_share_groups import Member, member_id

pytestmark = pytest.mark.kafka

HERE = Path(__file__).resolve().parent
DOC = HERE.parents[1] / "docs" / "compatibility.md"


def _now_ms() -> int:
    return int(time.time() * 1000)


def err(code: int) -> str:
    return ErrorCode(code).name.upper()


# -- the allow-list is documented and used --------------------------------------------------------


def test_allow_list_is_documented():
    text = " ".join(DOC.read_text().split())
    for scenario, reason in DELIBERATE.items():
        assert f"`{scenario}`" in text, f"{scenario} is not listed in {DOC}"
        assert " ".join(reason.split()) in text, f"{DOC} does not give the reason for {scenario}"
    listed = set(re.findall(r"^\| `([a-z0-9.-]+)` \|", DOC.read_text(), re.M))
    assert listed == set(DELIBERATE), "the allow-list table in the doc and deliberate.py differ"


def test_every_allow_list_entry_is_tested():
    # The cluster's differences are checked against the three-broker Kafka, in tests/cluster.
    files = [
        *sorted(HERE.glob("test_*.py")),
        HERE.parent / "cluster" / "test_cluster_conformance.py",
    ]
    sources = "".join(p.read_text() for p in files)
    checked = re.findall(r'check_deliberate\(\s*"([a-z0-9.-]+)"', sources)
    assert sorted(checked) == sorted(DELIBERATE), "each entry needs exactly one check_deliberate"


TRANSIENT = {"COORDINATOR_LOAD_IN_PROGRESS", "COORDINATOR_NOT_AVAILABLE", "NOT_COORDINATOR"}


# -- topic configs --------------------------------------------------------------------------------


def _create_with(bs: str, topic: str, **configs: str) -> str:
    r = wire.call(
        bs, 19, 7,
        topics=[{"name": topic, "num_partitions": 1, "replication_factor": 1, "assignments": [],
                 "configs": [{"name": k, "value": v} for k, v in configs.items()]}],
        timeout=10000, validate_only=False,
    )  # fmt: skip
    return err(r["topics"][0]["error_code"])


def _alter(bs: str, topic: str, name: str, value: str) -> str:
    r = wire.call(
        bs, 44, 1,
        resources=[{"resource_type": 2, "resource_name": topic,
                    "configs": [{"name": name, "config_operation": 0, "value": value}]}],
        validate_only=False,
    )  # fmt: skip
    return err(r["responses"][0]["error_code"])


def rejected_configs(bs: str, topic: str, values: dict[str, list[str]]) -> dict[str, Any]:
    assert wire.create_topic(bs, topic, 1) == 0
    out: dict[str, Any] = {}
    for i, (config, choices) in enumerate(values.items()):
        for j, value in enumerate(choices):
            out[f"create {config}={value}"] = _create_with(
                bs, f"{topic}-{i}-{j}", **{config: value}
            )
            out[f"alter {config}={value}"] = _alter(bs, topic, config, value)
    return out


def test_compression_type_rejected(pair, name):
    values = {"compression.type": ["gzip", "zstd", "uncompressed"]}
    strat, kafka = both(pair, rejected_configs, name, values)
    check_deliberate(
        "configs.compression-type-rejected",
        strat,
        kafka,
        documented={k: "INVALID_CONFIG" for k in strat},
    )
    assert set(kafka.values()) == {"NONE"}


def test_unsupported_topic_configs_rejected(pair, name):
    values = {
        "preallocate": ["true"],
        "index.interval.bytes": ["8192"],
        "unclean.leader.election.enable": ["false"],
    }
    strat, kafka = both(pair, rejected_configs, name, values)
    check_deliberate(
        "configs.unsupported-topic-config-rejected",
        strat,
        kafka,
        documented={k: "INVALID_CONFIG" for k in strat},
    )
    assert set(kafka.values()) == {"NONE"}


def segment_bytes_default(bs: str, topic: str) -> tuple[str, str]:
    assert wire.create_topic(bs, topic, 1) == 0
    r = wire.call(
        bs, 32, 4,
        resources=[{"resource_type": 2, "resource_name": topic,
                    "configuration_keys": ["segment.bytes"]}],
        include_synonyms=False, include_documentation=False,
    )  # fmt: skip
    (c,) = r["results"][0]["configs"]
    return c["value"], "topic" if c["config_source"] == wire.TOPIC_CONFIG_SOURCE else "default"


def test_segment_bytes_default(pair, name):
    strat, kafka = both(pair, segment_bytes_default, name)
    check_deliberate(
        "configs.segment-bytes-default", strat, kafka, documented=("134217728", "default")
    )
    assert kafka == ("1073741824", "default")


# -- retention ------------------------------------------------------------------------------------


def test_retention_per_chunk(pair, name):
    """An expired batch followed by a fresh one in the same segment: Stratalog drops the first."""
    ts = _now_ms()
    old = ts - 2 * 3_600_000

    def scenario(bs: str) -> dict[str, int]:
        control, mixed = f"{name}-control", f"{name}-mixed"
        for t in (control, mixed):
            assert wire.create_topic(bs, t, 1, **{"retention.ms": "3600000"}) == 0
        batch = build_batch([(b"k0", b"v0", old), (b"k1", b"v1", old + 1)])
        for t in (control, mixed):
            assert wire.produce(bs, t, 0, batch)["error_code"] == 0
        fresh = build_batch([(b"k2", b"v2", ts)])
        assert wire.produce(bs, mixed, 0, fresh)["error_code"] == 0
        if bs == pair.stratalog.bootstrap:
            pair.stratalog.call(pair.stratalog.core.run_retention)
        # Until retention has run (Kafka checks every second here): the control topic holds only
        # expired records and must lose them on both brokers.
        deadline = time.monotonic() + 20
        while wire.list_offset(bs, control, 0, -2)["offset"] != 2:
            assert time.monotonic() < deadline, "retention never ran"
            time.sleep(0.2)
        return {
            "control_start": 2,
            "mixed_start": wire.list_offset(bs, mixed, 0, -2)["offset"],
            "mixed_end": wire.list_offset(bs, mixed, 0, -1)["offset"],
        }

    strat, kafka = both(pair, scenario)
    check_deliberate(
        "retention.per-chunk",
        strat,
        kafka,
        documented={"control_start": 2, "mixed_start": 2, "mixed_end": 3},
    )
    assert kafka == {"control_start": 2, "mixed_start": 0, "mixed_end": 3}


# -- consumer-group membership across a broker restart --------------------------------------------


class _RestartableKafka(KafkaBroker):
    """The reference Kafka, restartable on the same data, ports and cluster id.

    KafkaBroker.stop() removes the data; here the JVM is stopped and started again the way
    KafkaBroker.start() starts it, on the configuration it wrote.
    """

    def __init__(self) -> None:
        super().__init__(KAFKA_PROPERTIES, keep=True)

    def restart(self) -> None:
        proc, self._proc = self._proc, None
        assert proc is not None and self.log_dir is not None
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        base = _jvm_base(
            _java(), self.heap, self.log_dir / "log4j2.properties",
            str(resolve_kafka(self.cache_dir) / "*"),
        )  # fmt: skip
        with open(self.console_log, "ab") as console:
            self._proc = subprocess.Popen(
                [*base, f"-Dkafka.logs.dir={self.log_dir}", BROKER_MAIN,
                 str(self.log_dir / "server.properties")],
                stdin=subprocess.DEVNULL, stdout=console, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        self._wait_ready()

    def close(self) -> None:
        log_dir = self.log_dir
        self.stop()
        if log_dir is not None:
            shutil.rmtree(log_dir, ignore_errors=True)


def membership_across_restart(bs: str, restart: Callable[[], str], name: str) -> dict[str, Any]:
    topic, group = name, f"{name}-group"
    assert wire.create_topic(bs, topic, 1) == 0
    join = dict(
        group_id=group, session_timeout=30000, rebalance_timeout=30000, group_instance_id=None,
        protocol_type="consumer", protocols=[{"name": "range", "metadata": b""}], reason=None,
    )  # fmt: skip
    member = wire.call(bs, 11, 9, member_id="", **join)["member_id"]
    joined = wire.call(bs, 11, 9, member_id=member, **join)
    assert joined["error_code"] == 0, joined
    gen = joined["generation_id"]
    synced = wire.call(
        bs, 14, 5, group_id=group, generation_id=gen, member_id=member, group_instance_id=None,
        protocol_type="consumer", protocol_name="range",
        assignments=[{"member_id": member, "assignment": b"assigned-" + member.encode()[:8]}],
    )  # fmt: skip
    assert synced["error_code"] == 0, synced
    committed = wire.call(
        bs, 8, 9, group_id=group, generation_id_or_member_epoch=gen, member_id=member,
        group_instance_id=None,
        topics=[{"name": topic, "partitions": [{"partition_index": 0, "committed_offset": 7,
                 "committed_leader_epoch": -1, "committed_metadata": ""}]}],
    )  # fmt: skip
    assert committed["topics"][0]["partitions"][0]["error_code"] == 0
    # A member of the consumer protocol (KIP-848) too, settled on the topic's partition.
    kip848, member2 = f"{name}-kip848", str(uuid.uuid4())
    r = _hb(bs, group_id=kip848, member_id=member2, member_epoch=0, rebalance_timeout=30000,
            subscribed_topic_names=[topic], topic_partitions=[])  # fmt: skip
    assert r["error_code"] == 0, r
    owned: dict[str, list[int]] = {}
    epoch = _heartbeat_until_settled(bs, kip848, member2, r, {(wire.topic_id(bs, topic), 0)}, owned)
    # And a share-group member (KIP-932), assigned the partition.
    share = Member(bs, f"{name}-share", topic, member_id(name, "share"))
    share.join()
    share_epoch = share.epoch
    share_before = wire.call(
        bs, 77, 1, group_ids=[share.group], include_authorized_operations=False
    )["groups"]

    bs = restart()

    def settled(request: Callable[[], dict[str, Any]], code: Callable[[dict], int]) -> dict:
        """The answer once the reloading coordinator no longer answers with a transient error."""
        deadline = time.monotonic() + 30
        while True:
            r = request()
            if err(code(r)) not in TRANSIENT:
                return r
            assert time.monotonic() < deadline, f"the group coordinator did not come back: {r}"
            time.sleep(0.2)

    hb = err(
        settled(
            lambda: wire.call(bs, 12, 4, group_id=group, generation_id=gen, member_id=member,
                              group_instance_id=None),
            lambda r: r["error_code"],
        )["error_code"]
    )  # fmt: skip
    described = settled(
        lambda: wire.call(bs, 15, 5, groups=[group], include_authorized_operations=False),
        lambda r: r["groups"][0]["error_code"],
    )
    fetched = settled(
        lambda: wire.call(bs, 9, 9, require_stable=False, groups=[
            {"group_id": group, "member_id": None, "member_epoch": -1,
             "topics": [{"name": topic, "partition_indexes": [0]}]}]),
        lambda r: r["groups"][0]["error_code"],
    )  # fmt: skip
    assert described["groups"][0]["error_code"] == 0, described
    members = described["groups"][0]["members"]
    report = [{"topic_id": uuid.UUID(str(t)), "partitions": ps} for t, ps in owned.items()]
    beat = settled(
        lambda: _hb(bs, group_id=kip848, member_id=member2, member_epoch=epoch,
                    topic_partitions=report),
        lambda r: r["error_code"],
    )  # fmt: skip
    share.bs = bs
    share_beat = settled(share.heartbeat, lambda r: r["error_code"])
    share_after = settled(
        lambda: wire.call(bs, 77, 1, group_ids=[share.group], include_authorized_operations=False),
        lambda r: r["groups"][0]["error_code"],
    )["groups"]
    return {
        # (The epoch itself differs: Kafka's assignment after a join bumps it more than once.)
        "share_heartbeat": (
            err(share_beat["error_code"]),
            share_beat["member_epoch"] == share_epoch,
        ),
        "share_group_kept": wire.normalise(share_after) == wire.normalise(share_before),
        "kip848_heartbeat": (err(beat["error_code"]), beat["member_epoch"] == epoch),
        "kip848_group": _group_view(bs, kip848),
        "heartbeat": hb,
        "group_state": described["groups"][0]["group_state"],
        "members": len(members),
        "same_member": [m["member_id"] == member for m in members],
        "assignments": [bytes(m["member_assignment"]) for m in members],
        "committed": fetched["groups"][0]["topics"][0]["partitions"][0]["committed_offset"],
    }


def test_group_membership_after_restart(fresh_stratalog, name):
    strat_broker: list[Broker] = [fresh_stratalog()]

    def restart_stratalog() -> str:
        old = strat_broker[-1]
        old.stop()
        strat_broker.append(fresh_stratalog(old.data_dir))
        return strat_broker[-1].bootstrap

    kafka = start_kafka(_RestartableKafka)
    try:
        warm_up(kafka.bootstrap)

        def restart_kafka() -> str:
            kafka.restart()
            return kafka.bootstrap

        with ThreadPoolExecutor(2) as pool:
            fs = pool.submit(
                membership_across_restart, strat_broker[0].bootstrap, restart_stratalog, name
            )
            fk = pool.submit(membership_across_restart, kafka.bootstrap, restart_kafka, name)
            strat, kafka_obs = fs.result(120), fk.result(120)
    finally:
        kafka.close()
    # Both keep the member (its group metadata record in __consumer_offsets), its assignment
    # and the group's offset; and the consumer-protocol member with its epoch and assignment
    # (the group's records, types 3 and 5 to 8); and the share-group member at its epoch (types
    # 10 to 14), the group described as before.
    assert kafka_obs["share_heartbeat"] == ("NONE", True)
    assert kafka_obs["share_group_kept"] is True
    assert kafka_obs["heartbeat"] == "NONE" and kafka_obs["group_state"] == "Stable"
    assert kafka_obs["kip848_heartbeat"] == ("NONE", True)
    assert kafka_obs["kip848_group"]["state"] == "Stable"
    assert kafka_obs["same_member"] == [True] and kafka_obs["committed"] == 7
    assert {**strat, "assignments": None} == {**kafka_obs, "assignments": None}
    assert [a[:9] for a in strat["assignments"]] == [b"assigned-"]


# -- the high watermark under fsync=always --------------------------------------------------------


def visible_after_ack(bs: str, topic: str, ts: int) -> dict[str, Any]:
    assert wire.create_topic(bs, topic, 1) == 0
    ack = wire.produce(bs, topic, 0, build_batch([(b"k", b"v", ts)]), acks=1)
    now_latest = wire.list_offset(bs, topic, 0, -1)["offset"]
    fetched = wire.fetch(bs, topic, 0, 0, max_wait=0)
    return {
        "ack": (err(ack["error_code"]), ack["base_offset"]),
        "latest_right_after_ack": now_latest,
        "fetched_right_after_ack": sum(
            b["records"] for b in wire.parse_batches(fetched["records"])
        ),
        "high_watermark_right_after_ack": fetched["high_watermark"],
    }


def test_high_watermark_moves_after_fsync(pair, fresh_stratalog, name):
    # The default fsync=always with a long group-commit window, so the gap between the append
    # (acks=1 is answered) and the fsync (the high watermark moves) is wide enough to see.
    strat_broker = fresh_stratalog(group_commit_ms=1500.0)
    ts = _now_ms()
    with ThreadPoolExecutor(2) as pool:
        fs = pool.submit(visible_after_ack, strat_broker.bootstrap, name, ts)
        fk = pool.submit(visible_after_ack, pair.kafka.bootstrap, name, ts)
        strat, kafka = fs.result(60), fk.result(60)
    check_deliberate(
        "fsync.high-watermark-after-fsync",
        strat,
        kafka,
        documented={
            "ack": ("NONE", 0),
            "latest_right_after_ack": 0,
            "fetched_right_after_ack": 0,
            "high_watermark_right_after_ack": 0,
        },
    )
    assert kafka["latest_right_after_ack"] == 1 and kafka["fetched_right_after_ack"] == 1
    deadline = time.monotonic() + 10  # ...and it does become visible once fsynced
    while wire.list_offset(strat_broker.bootstrap, name, 0, -1)["offset"] != 1:
        assert time.monotonic() < deadline
        time.sleep(0.1)
