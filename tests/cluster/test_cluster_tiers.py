"""Tiers in a cluster: only a virtual log's primary migrates, its backups follow when told.

Three broker processes and a real etcd share one cold directory (``tiers.cold.shared``) and
have a small hot tier. The oracles are outside the code under test: confluent-kafka's delivery
reports say what was written, a confluent-kafka consumer reads it back from a new primary after
the old one was killed, the shared directory shows each range uploaded once, and each broker's
own log says whether it copied a segment or took the primary's.
"""

from __future__ import annotations

import itertools
import json
import signal
from pathlib import Path

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from stratalog.cluster.local_cluster import LocalCluster

from ..conformance import wire
from .waits import until

SEGMENT = 64 * 1024
RECORDS = 400  # of 1 KiB: about seven segments


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("tiers")
    cold = root / "cold"
    cold.mkdir()
    c = LocalCluster(
        root / "c",
        brokers=3,
        settings={
            "tiers.cold.path": str(cold),
            "tiers.cold.shared": "true",
            # A small hot tier: the primary migrates down to a quarter of it.
            "tiers.hot.capacity": str(8 * SEGMENT),
            "tiers.migrate.threshold": "0.25",
            "tiers.migrate.interval.ms": "200",
            "tiers.migrate.threads": "1",
            "segment.bytes": str(SEGMENT),
        },
        log_level="INFO",  # the brokers' logs say who copied what
    )
    c.start()
    try:
        yield c, cold
    finally:
        c.stop()


def _leader(bootstrap: str, topic: str) -> int:
    md = wire.call(bootstrap.split(",")[0], 3, 12, topics=[{"name": topic, "topic_id": None}],
                   allow_auto_topic_creation=False,
                   include_topic_authorized_operations=False)  # fmt: skip
    parts = md["topics"][0]["partitions"]
    return parts[0]["leader_id"] if parts else -1


def _hot_segments(c: LocalCluster, node: int, vlog: str) -> set[str]:
    d = c.brokers[node - 1].data_dir / "logs" / vlog
    return {p.name for p in d.glob("*.log")}


def _cold_ranges(cold: Path) -> dict[str, list[tuple[int, int]]]:
    """Each partition's cold segments by its manifest, after checking that the directory holds
    exactly what the manifest names (a second upload of a range would be a file more)."""
    out = {}
    for d in sorted(cold.glob("p*")):
        manifests = sorted(d.glob("manifest-*.json"))
        assert len(manifests) == 1, manifests
        segs = json.loads(manifests[0].read_text())["segments"]
        named = {f"{s['name']}.{ext}" for s in segs for ext in ("log", "idx")}
        assert {p.name for p in d.iterdir()} - {manifests[0].name} == named
        out[d.name] = [(s["base"], s["last"]) for s in segs]
    return out


def _collect(into: list):
    def report(err, msg) -> None:
        if err is None:
            into.append(msg.value())

    return report


def test_only_the_primary_migrates_and_a_new_primary_serves_all_history(shared):
    c, cold = shared
    admin = AdminClient({"bootstrap.servers": c.bootstrap})
    admin.create_topics([NewTopic("tiered", 1, 3)])["tiered"].result(timeout=30)
    primary = until(lambda: _leader(c.bootstrap, "tiered") > 0 and _leader(c.bootstrap, "tiered"),
                    "a leader")  # fmt: skip
    producer = Producer({"bootstrap.servers": c.bootstrap, "acks": "all",
                         "enable.idempotence": True, "linger.ms": 5,
                         "batch.size": 8192})  # fmt: skip
    values = [b"%06d:" % i + b"x" * 1024 for i in range(RECORDS)]
    acked = []
    for v in values:
        producer.produce("tiered", v, partition=0, on_delivery=_collect(acked))
        producer.poll(0)
    assert producer.flush(30) == 0
    assert acked == values

    vlog = next(p.name for p in (c.brokers[primary - 1].data_dir / "logs").iterdir() if p.is_dir())
    backups = [b.node_id for b in c.brokers if b.node_id != primary]

    def migrated_everywhere() -> bool:
        ranges = _cold_ranges(cold)
        hot = [_hot_segments(c, n, vlog) for n in (primary, *backups)]
        # Segment 0 is cold, and every backup dropped exactly the segments its primary did.
        return (
            bool(ranges)
            and "00000000000000000000.log" not in hot[0]
            and all(h == hot[0] for h in hot)
        )

    until(migrated_everywhere, "migration on the primary and its backups", timeout=60)
    (ranges,) = _cold_ranges(cold).values()
    # One upload per range: contiguous from offset 0, no overlap.
    assert ranges[0][0] == 0
    assert all(a[1] + 1 == b[0] for a, b in itertools.pairwise(ranges))
    logs = {b.node_id: b.log_path.read_text(errors="replace") for b in c.brokers}
    assert "to the cold tier" in logs[primary]
    for n in backups:
        assert "to the cold tier" not in logs[n].replace("from the shared cold tier", "")
        assert "from the shared cold tier" in logs[n]

    c.stop_broker(c.brokers[primary - 1], signal.SIGKILL)
    alive = c.brokers[backups[0] - 1].bootstrap
    until(lambda: _leader(alive, "tiered") in backups, "a new primary", timeout=30)
    consumer = Consumer({"bootstrap.servers": c.bootstrap, "group.id": "tiers",
                         "enable.auto.commit": False})  # fmt: skip
    consumer.assign([TopicPartition("tiered", 0, OFFSET_BEGINNING)])
    got: list[tuple[int, bytes]] = []
    try:

        def read_all() -> bool:
            for m in consumer.consume(100, 0.5):
                if m.error() is None:
                    got.append((m.offset(), m.value()))
            return len(got) >= RECORDS

        until(read_all, "every record from the new primary", timeout=30, every=0)
    finally:
        consumer.close()
    assert got == list(enumerate(values))
