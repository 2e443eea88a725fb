"""Compacted topics end to end: a ``stratalog serve`` process, confluent-kafka clients.

A topic with cleanup.policy=compact is cleaned by the broker's cleaner while it runs: a consumer
from the beginning sees each key's latest value at the offset it was produced at, offsets
strictly increasing, superseded values gone; a kill -9 in the middle of a cleaning (the worker
held after writing its segments, STRATALOG_COMPACTION_PAUSE_MS) loses no latest value. Bad
input: a record without a key answers INVALID_RECORD, bad compaction configs INVALID_CONFIG.
"""

from __future__ import annotations

import json
import time

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
    ResourceType,
)

from .conftest import BrokerProcess, create_topic

SETTINGS = {
    "segment.bytes": "16000",
    "storage.virtual_logs": "2",
    "log.cleaner.backoff.ms": "200",
    "fsync": "never",
}
COMPACT = {"cleanup.policy": "compact", "min.cleanable.dirty.ratio": "0.01"}


def produce(bootstrap: str, topic: str, rows: list[tuple[bytes, bytes | None]]) -> dict:
    """Keyed records to partition 0, acks=all; returns key -> (offset, value) of the last
    acknowledged record of each key."""
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 2, "batch.num.messages": 20})
    acked: dict[bytes, tuple[int, bytes | None]] = {}
    offsets: list[int] = []

    def done(err, msg):
        assert err is None, err
        offsets.append(msg.offset())
        acked[msg.key()] = (msg.offset(), msg.value())

    for i, (key, value) in enumerate(rows):
        p.produce(topic, key=key, value=value, partition=0, on_delivery=done)
        if i % 50 == 49:
            p.poll(0)
    assert p.flush(30) == 0
    assert offsets == sorted(offsets)
    return acked


def consume(bootstrap: str, topic: str) -> list[tuple[int, bytes, bytes | None]]:
    """Every record of partition 0 from the beginning: (offset, key, value)."""
    c = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "compaction", "enable.auto.commit": False}
    )
    rows: list[tuple[int, bytes, bytes | None]] = []
    try:
        lo, hi = c.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
        c.assign([TopicPartition(topic, 0, lo)])
        deadline = time.monotonic() + 30
        while (not rows or rows[-1][0] < hi - 1) and time.monotonic() < deadline:
            for m in c.consume(1000, 0.3):
                if m.error() is None:
                    rows.append((m.offset(), m.key(), m.value()))
    finally:
        c.close()
    assert rows and rows[-1][0] == hi - 1, "did not read to the end"
    return rows


def latest(rows) -> dict[bytes, tuple[int, bytes | None]]:
    out = {}
    for off, key, value in rows:
        out[key] = (off, value)
    return out


def workload(rounds: int, keys: int, tag: str = "") -> list[tuple[bytes, bytes | None]]:
    return [
        (b"k%03d" % k, b"%s r%03d k%03d " % (tag.encode(), r, k) + b"x" * 60)
        for r in range(rounds)
        for k in range(keys)
    ]


def filler(n: int, tag: str) -> list[tuple[bytes, bytes | None]]:
    """Records of keys of their own: they roll the active segment past the workload."""
    return [(b"f-%s-%d" % (tag.encode(), i), b"y" * 100) for i in range(n)]


def wait_compacted(bootstrap: str, topic: str, keys: int, timeout: float = 60) -> list:
    """Read until each workload key appears once (the cleaner ran over them)."""
    deadline = time.monotonic() + timeout
    while True:
        rows = consume(bootstrap, topic)
        if sum(1 for _o, k, _v in rows if k.startswith(b"k")) == keys:
            return rows
        assert time.monotonic() < deadline, "the topic was never compacted"
        time.sleep(0.5)


def check(rows, acked: dict) -> None:
    offsets = [r[0] for r in rows]
    assert offsets == sorted(set(offsets)), "offsets strictly increasing"
    assert latest(rows) == acked, "each key's latest value, at its produced offset"


def test_a_compacted_topic_keeps_each_keys_latest_value(tmp_path):
    bp = BrokerProcess(tmp_path / "data", settings=SETTINGS)
    try:
        bp.start()
        create_topic(bp.bootstrap, "c", 1, **COMPACT)
        create_topic(bp.bootstrap, "plain", 1)
        acked = produce(bp.bootstrap, "c", workload(12, 40))
        produce(bp.bootstrap, "plain", workload(3, 40))
        acked |= produce(bp.bootstrap, "c", filler(300, "a"))
        rows = wait_compacted(bp.bootstrap, "c", 40)
        check(rows, acked)
        assert all(b" r011 " in v for _o, k, v in rows if k.startswith(b"k"))
        assert len(consume(bp.bootstrap, "plain")) == 120  # not compacted
        # Tombstones: the latest record of a key is its tombstone, kept (delete.retention.ms
        # is a day by default), and the key's older values go.
        acked |= produce(bp.bootstrap, "c", [(b"k000", None), (b"k001", b"again")])
        acked |= produce(bp.bootstrap, "c", filler(300, "b"))
        deadline = time.monotonic() + 60
        while True:
            rows = consume(bp.bootstrap, "c")
            if len([r for r in rows if r[1] in (b"k000", b"k001")]) == 2:
                break
            assert time.monotonic() < deadline
            time.sleep(0.5)
        check(rows, acked)
        assert latest(rows)[b"k000"][1] is None
        # Clean stop and start: the same records.
        bp.stop()
        bp.start()
        check(consume(bp.bootstrap, "c"), acked)
    finally:
        bp.kill()


def test_a_cleaner_steered_by_the_journal_compacts(tmp_path):
    """log.cleaner.fsync_target_ms: the cleaner's rate starts at log.cleaner.min_bytes_per_sec
    and is steered by the group commit's fsyncs (fsync=always), and the topic is compacted."""
    settings = SETTINGS | {
        "fsync": "always",
        "log.cleaner.fsync_target_ms": "20",
        "log.cleaner.min_bytes_per_sec": "100000",
    }
    bp = BrokerProcess(tmp_path / "data", settings=settings)
    try:
        bp.start()
        create_topic(bp.bootstrap, "c", 1, **COMPACT)
        acked = produce(bp.bootstrap, "c", workload(12, 40))
        acked |= produce(bp.bootstrap, "c", filler(300, "a"))
        check(wait_compacted(bp.bootstrap, "c", 40), acked)
    finally:
        bp.kill()


def test_kill_9_during_compaction_loses_no_latest_value(tmp_path, monkeypatch):
    data = tmp_path / "data"
    monkeypatch.setenv("STRATALOG_COMPACTION_PAUSE_MS", "60000")
    bp = BrokerProcess(data, settings=SETTINGS)
    try:
        bp.start()
        create_topic(bp.bootstrap, "c", 1, **COMPACT)
        acked = produce(bp.bootstrap, "c", workload(10, 30))
        acked |= produce(bp.bootstrap, "c", filler(300, "a"))
        written = data / "logs" / "compacted"
        deadline = time.monotonic() + 60
        while not list(written.glob("p*/*.log")):
            assert time.monotonic() < deadline, "the cleaner never wrote a segment"
            time.sleep(0.05)
        assert not list(written.glob("p*/manifest-*.json"))  # held before its commit
        bp.kill()  # SIGKILL: the cleaner's worker dies with it
        monkeypatch.delenv("STRATALOG_COMPACTION_PAUSE_MS")
        bp.start()
        rows = consume(bp.bootstrap, "c")
        check(rows, acked)
        # Then the cleaning is done again, and a kill -9 after it changes nothing either.
        rows = wait_compacted(bp.bootstrap, "c", 30)
        check(rows, acked)
        (manifest,) = written.glob("p*/manifest-*.json")
        named = {s["name"] for s in json.loads(manifest.read_text())["segments"]}
        assert {f.stem for f in manifest.parent.glob("*.log")} == named
        acked |= produce(bp.bootstrap, "c", [(b"k005", b"after")])
        bp.kill()
        bp.start()
        rows = consume(bp.bootstrap, "c")
        check(rows, acked)
        assert sum(1 for _o, k, _v in rows if k.startswith(b"k")) == 31  # k005 twice
    finally:
        bp.kill()


def test_bad_input_to_a_compacted_topic(tmp_path):
    bp = BrokerProcess(tmp_path / "data", settings=SETTINGS)
    try:
        bp.start()
        create_topic(bp.bootstrap, "c", 1, **{"cleanup.policy": "compact,delete"})
        p = Producer({"bootstrap.servers": bp.bootstrap, "message.timeout.ms": 10000})
        errors = []
        p.produce(
            "c", key=None, value=b"no key", partition=0, on_delivery=lambda e, m: errors.append(e)
        )
        assert p.flush(20) == 0  # (one batch each: Kafka refuses a whole batch)
        p.produce(
            "c", key=b"k", value=b"fine", partition=0, on_delivery=lambda e, m: errors.append(e)
        )
        assert p.flush(20) == 0
        assert errors[0] is not None and errors[0].code() == KafkaError.INVALID_RECORD
        assert errors[1] is None
        rows = consume(bp.bootstrap, "c")
        assert [(k, v) for _o, k, v in rows] == [(b"k", b"fine")]

        admin = AdminClient({"bootstrap.servers": bp.bootstrap})
        bad = {
            "min.cleanable.dirty.ratio": "1.5",
            "min.compaction.lag.ms": "-1",
            "max.compaction.lag.ms": "0",
            "delete.retention.ms": "soon",
            "cleanup.policy": "compact,shred",
        }
        for i, (name, value) in enumerate(bad.items()):
            fs = admin.create_topics([NewTopic(f"bad{i}", 1, 1, config={name: value})])
            with pytest.raises(KafkaException) as e:
                fs[f"bad{i}"].result(timeout=15)
            assert e.value.args[0].code() == KafkaError.INVALID_CONFIG, (name, value)
            res = ConfigResource(
                ResourceType.TOPIC,
                "c",
                incremental_configs=[
                    ConfigEntry(name, value, incremental_operation=AlterConfigOpType.SET)
                ],
            )
            with pytest.raises(KafkaException) as e:
                admin.incremental_alter_configs([res])[res].result(timeout=15)
            assert e.value.args[0].code() == KafkaError.INVALID_CONFIG, (name, value)
        # Good values are taken and described.
        res = ConfigResource(
            ResourceType.TOPIC,
            "c",
            incremental_configs=[
                ConfigEntry(
                    "min.cleanable.dirty.ratio", "0.2", incremental_operation=AlterConfigOpType.SET
                )
            ],
        )
        admin.incremental_alter_configs([res])[res].result(timeout=15)
        desc = admin.describe_configs([ConfigResource(ResourceType.TOPIC, "c")])
        configs = next(iter(desc.values())).result(timeout=15)
        assert configs["min.cleanable.dirty.ratio"].value == "0.2"
        assert configs["delete.retention.ms"].value == "86400000"
        assert configs["cleanup.policy"].value == "compact,delete"
        # DeleteRecords: refused on a compacted topic without the delete policy, as Kafka does.
        create_topic(bp.bootstrap, "only", 1, **{"cleanup.policy": "compact"})
        produce(bp.bootstrap, "only", [(b"a", b"1"), (b"b", b"2")])
        tp = TopicPartition("only", 0, 1)
        with pytest.raises(KafkaException) as e:
            admin.delete_records([tp])[tp].result(timeout=15)
        assert e.value.args[0].code() == KafkaError.POLICY_VIOLATION
    finally:
        bp.kill()
