"""Tiers in a cluster: only a virtual log's primary migrates, its backups follow when told.

Three broker processes and a real etcd, with a small hot tier and either one cold directory
for all (``tiers.cold.shared``) or one each. The oracles are outside the code under test:
confluent-kafka's delivery reports say what was written, a confluent-kafka consumer reads it
back from a new primary after the old one was killed, the cold directories show what was
uploaded (each range once per directory), and each broker's own log says whether it copied a
segment or took the primary's.
"""

from __future__ import annotations

import itertools
import json
import signal
import time
from pathlib import Path

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from stratalog.cluster.local_cluster import LocalCluster

from ..conformance import wire
from .waits import until

SEGMENT = 64 * 1024
RECORDS = 400  # of 1 KiB: about seven segments


def _tiered_cluster(root: Path, shared: bool) -> tuple[LocalCluster, list[Path]]:
    """Three brokers with a small hot tier and one cold directory (``shared``) or one each."""
    colds = [root / "cold"] if shared else [root / f"cold-{n}" for n in (1, 2, 3)]
    for d in colds:
        d.mkdir()
    c = LocalCluster(
        root / "c",
        brokers=3,
        settings={
            "tiers.cold.shared": str(shared).lower(),
            # A small hot tier: the primary migrates down to a quarter of it.
            "tiers.hot.capacity": str(8 * SEGMENT),
            "tiers.migrate.threshold": "0.25",
            "tiers.migrate.interval.ms": "200",
            "tiers.migrate.threads": "1",
            "segment.bytes": str(SEGMENT),
        },
        log_level="INFO",  # the brokers' logs say who copied what
    )
    for b in c.brokers:
        b.settings = {**c.settings, "tiers.cold.path": str(colds[(b.node_id - 1) % len(colds)])}
    c.start()
    return c, colds


@pytest.fixture(params=[True, False], ids=["shared", "per-broker"])
def tiered(request, tmp_path: Path):
    c, colds = _tiered_cluster(tmp_path, request.param)
    try:
        yield c, colds
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


def _cold_ranges(cold: Path) -> dict[str, list[tuple[int, int]]] | None:
    """Each partition's cold segments by its manifest, once the directory holds exactly what
    the manifests name (a second upload of a range would be files more); else None (an upload
    is under way)."""
    out = {}
    for d in sorted(cold.glob("p*")):
        manifests = sorted(d.glob("manifest-*.json"))
        if len(manifests) != 1:
            return None
        segs = json.loads(manifests[0].read_text())["segments"]
        named = {f"{s['name']}.{ext}" for s in segs for ext in ("log", "idx")}
        if {p.name for p in d.iterdir()} - {manifests[0].name} != named:
            return None
        out[d.name] = [(s["base"], s["last"]) for s in segs]
    return out


def _collect(into: list):
    def report(err, msg) -> None:
        if err is None:
            into.append(msg.value())

    return report


def test_only_the_primary_migrates_and_a_new_primary_serves_all_history(tiered):
    """The primary picks the segments; each backup moves the same ones only once told: from the
    shared tier without uploading anything, or by copying them into its own. After a kill -9
    of the primary a consumer reads every record from offset 0 from the new one."""
    c, colds = tiered
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

    def read_logs() -> dict[int, list[str]]:
        return {b.node_id: b.log_path.read_text(errors="replace").splitlines() for b in c.brokers}

    def copies_in(logs: dict[int, list[str]], n: int) -> list[str]:
        return [line for line in logs[n] if "to the cold tier" in line and "migrated" in line]

    def state():
        ranges = [_cold_ranges(d) for d in colds]
        hot = [_hot_segments(c, n, vlog) for n in (primary, *backups)]
        # Segment 0 is cold, and every backup dropped exactly the segments its primary did
        # (and, each with a tier of its own, copied exactly the same ranges).
        done = (
            all(ranges)
            and all(r == ranges[0] for r in ranges)
            and "00000000000000000000.log" not in hot[0]
            and all(h == hot[0] for h in hot)
        )
        return (ranges, hot, len(copies_in(read_logs(), primary))) if done else None

    def quiet():
        # The same state two seconds apart (ten migration intervals): no migration under way.
        # (A slow machine shows segment 0 gone while the next ones are still on their way.)
        first = state()
        time.sleep(2)
        return first if first is not None and state() == first else None

    until(quiet, "migration on the primary and its backups", timeout=90)
    (ranges,) = until(lambda: _cold_ranges(colds[0]), "no upload under way").values()
    # One upload per range and tier: contiguous from offset 0, no overlap.
    assert ranges[0][0] == 0
    assert all(a[1] + 1 == b[0] for a, b in itertools.pairwise(ranges))

    def logs_once_taken() -> dict[int, list[str]] | None:
        # A range uploaded after the wait above reaches the backups a moment later.
        logs = read_logs()
        took = [[x for x in logs[n] if "from the shared cold tier" in x] for n in backups]
        done = len(colds) > 1 or all(len(t) >= len(ranges) for t in took)
        return logs if done else None

    logs = until(logs_once_taken, "the backups took every range", timeout=30)

    def copies(n: int) -> list[str]:
        return copies_in(logs, n)

    assert len(copies(primary)) == len(ranges)
    for n in backups:
        took = [line for line in logs[n] if "from the shared cold tier" in line]
        if len(colds) == 1:
            assert copies(n) == [] and len(took) == len(ranges)
        else:
            # Copied the same segments, each only after the primary had (timestamps first).
            assert took == [] and len(copies(n)) == len(ranges)
            assert all(b[:23] >= a[:23] for a, b in zip(copies(primary), copies(n), strict=True))

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
