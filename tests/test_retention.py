"""Retention by time and by size, in both storage layouts, seen through real clients."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from stratalog import Broker
from stratalog.storage import reaper

from .conftest import create_topic

HOUR_MS = 3600 * 1000


def _produce(bootstrap: str, topic: str, n: int, *, ts: int | None = None, partition: int = 0):
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0, "batch.num.messages": 50})
    for i in range(n):
        kw = {"timestamp": ts} if ts is not None else {}
        p.produce(topic, value=f"{topic}-{i}".encode() + b"x" * 200, partition=partition, **kw)
        if i % 50 == 49:
            p.flush(10)  # many small batches, so many chunks and segments
    assert p.flush(10) == 0


def _watermarks(bootstrap: str, topic: str, partition: int = 0) -> tuple[int, int]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "wm"})
    try:
        return c.get_watermark_offsets(TopicPartition(topic, partition), timeout=10)
    finally:
        c.close()


def _first_value(bootstrap: str, topic: str, offset: int) -> bytes:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "read"})
    try:
        c.assign([TopicPartition(topic, 0, offset)])
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is not None and m.error() is None:
                return m.value()
        raise AssertionError("no record")
    finally:
        c.close()


def _segment_files(broker: Broker, topic: str | None = None) -> list:
    """The segment files of every log, or of the logs holding ``topic``'s partitions (others,
    such as those of __consumer_offsets once a consumer looked up its group, come and go)."""
    reaper.drain()  # deleted segments' files go on a thread of their own
    if topic is None:
        return sorted((broker.data_dir / "logs").glob("*/*.log"))
    store, t = broker.core.store, broker.core.metadata.topics[topic]
    dirs = {store.partitions[uid].vlog.directory for uid in t.partitions}
    return sorted(p for d in dirs for p in d.glob("*.log"))


@pytest.mark.parametrize("layout", ["virtual", "per-partition"])
def test_retention_by_time_advances_log_start_and_deletes_segments(tmp_path, layout):
    cfg = {
        "storage.layout": layout,
        "segment.bytes": 20_000,
        "storage.virtual_logs": 1,
        "retention.check.interval.ms": 3_600_000,
    }
    with Broker(tmp_path / "d", config=cfg) as b:
        create_topic(b.bootstrap, "old", 1, **{"retention.ms": str(HOUR_MS)})
        now = int(time.time() * 1000)
        _produce(b.bootstrap, "old", 500, ts=now - 2 * HOUR_MS)  # already expired
        _produce(b.bootstrap, "old", 300, ts=now)  # fresh
        before = _segment_files(b, "old")
        assert len(before) > 5
        dropped = b.call(b.core.run_retention)
        assert dropped > 0
        lo, hi = _watermarks(b.bootstrap, "old")
        assert (lo, hi) == (500, 800)
        assert _first_value(b.bootstrap, "old", lo).startswith(b"old-0x")  # first fresh record
        after = _segment_files(b, "old")
        assert len(after) < len(before), "expired segments were not deleted"
    # The new log start survives a restart.
    with Broker(tmp_path / "d", config=cfg) as b:
        assert _watermarks(b.bootstrap, "old") == (500, 800)


@pytest.mark.parametrize("layout", ["virtual", "per-partition"])
def test_retention_by_size(tmp_path, layout):
    cfg = {
        "storage.layout": layout,
        "segment.bytes": 20_000,
        "retention.check.interval.ms": 3_600_000,
    }
    with Broker(tmp_path / "d", config=cfg) as b:
        create_topic(b.bootstrap, "sized", 1, **{"retention.bytes": "50000"})
        _produce(b.bootstrap, "sized", 1000)
        b.call(b.core.run_retention)
        lo, hi = _watermarks(b.bootstrap, "sized")
        assert hi == 1000
        assert lo > 0
        p = b.core.partition("sized", 0)
        # As Kafka: drop oldest data while what is left stays at least retention.bytes.
        biggest = max(p.chunks.size_of(i) for i in range(len(p.chunks)))
        assert 50000 <= p.size_bytes < 50000 + biggest
        # Everything from the new start is still readable.
        c = Consumer(
            {"bootstrap.servers": b.bootstrap, "group.id": "s", "auto.offset.reset": "earliest"}
        )
        c.assign([TopicPartition("sized", 0, lo)])
        got = []
        deadline = time.monotonic() + 10
        while len(got) < hi - lo and time.monotonic() < deadline:
            got += [m.offset() for m in c.consume(1000, 0.5) if m.error() is None]
        c.close()
        assert got == list(range(lo, hi))


def test_shared_segment_is_kept_until_no_partition_needs_it(tmp_path):
    # Two topics interleave in one virtual log; one expires, the other keeps the segments.
    cfg = {
        "storage.layout": "virtual",
        "storage.virtual_logs": 1,
        "segment.bytes": 30_000,
        "retention.check.interval.ms": 3_600_000,
    }
    with Broker(tmp_path / "d", config=cfg) as b:
        create_topic(b.bootstrap, "short", 1, **{"retention.ms": str(HOUR_MS)})
        create_topic(b.bootstrap, "long", 1, **{"retention.ms": "-1"})
        old = int(time.time() * 1000) - 2 * HOUR_MS
        for _ in range(5):
            _produce(b.bootstrap, "short", 50, ts=old)
            _produce(b.bootstrap, "long", 50, ts=old)
        segments = _segment_files(b)
        b.call(b.core.run_retention)
        assert _watermarks(b.bootstrap, "short") == (250, 250)
        assert _watermarks(b.bootstrap, "long") == (0, 250)
        # Every sealed segment still holds chunks of "long": none may go.
        assert _segment_files(b) == segments
        assert _first_value(b.bootstrap, "long", 0) == b"long-0" + b"x" * 200


def test_deleting_a_topic_frees_its_storage(tmp_path):
    cfg = {"storage.layout": "virtual", "storage.virtual_logs": 1, "segment.bytes": 20_000}
    with Broker(tmp_path / "d", config=cfg) as b:
        create_topic(b.bootstrap, "gone", 1)
        _produce(b.bootstrap, "gone", 400)
        assert len(_segment_files(b)) > 3
        from confluent_kafka.admin import AdminClient

        admin = AdminClient({"bootstrap.servers": b.bootstrap})
        admin.delete_topics(["gone"])["gone"].result(10)
        assert len(_segment_files(b)) == 1  # only the active segment remains
