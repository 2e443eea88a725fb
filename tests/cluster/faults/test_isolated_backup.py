"""A backup cut from the replication traffic (blackholed: its links freeze, nothing is reset)
while writes go on: its primary drops it from the in-sync set after
``replica.lag.time.max.ms``, and it stays out until it has caught up again, after the heal.
(Found by the ``isolate1`` fault: a frozen link kept counting as joined, and the primary named
the backup in sync again every second while it still had nothing.)"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import NewTopic

from stratalog.faults.targets import StratalogTarget, admin_client

pytestmark = pytest.mark.faults

TOPIC = "isolated"


@pytest.fixture
def target(tmp_path: Path) -> Iterator[StratalogTarget]:
    t = StratalogTarget(tmp_path / "c", settings={"replica.lag.time.max.ms": "1500"}, network=True)
    t.start()
    try:
        yield t
    finally:
        t.stop()


def isr(target: StratalogTarget) -> tuple[int, list[int]]:
    """The partition's leader and in-sync replicas, as the metadata says now."""
    md = admin_client(target.bootstrap).list_topics(TOPIC, timeout=10)
    p = md.topics[TOPIC].partitions[0]
    return p.leader, sorted(p.isrs)


def test_a_blackholed_backup_leaves_the_in_sync_set_and_stays_out_until_healed(
    target: StratalogTarget,
) -> None:
    admin = admin_client(target.bootstrap)
    admin.create_topics([NewTopic(TOPIC, 1, 3)])[TOPIC].result(timeout=30)
    deadline = time.monotonic() + 30
    while (got := isr(target))[1] != [1, 2, 3]:
        assert time.monotonic() < deadline, got
        time.sleep(0.2)
    leader = got[0]
    backup = next(n for n in (1, 2, 3) if n != leader)
    producer = Producer({"bootstrap.servers": target.bootstrap, "acks": 1, "linger.ms": 0})

    def write_for(seconds: float) -> list[list[int]]:
        """Writes (acks=1: the primary's log grows whatever the backups do), and the in-sync
        sets seen meanwhile."""
        seen = []
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            producer.produce(TOPIC, b"x" * 100, partition=0)
            producer.poll(0.05)
            seen.append(isr(target)[1])
        return seen

    write_for(1)
    target.cut(f"broker-{backup}", "replication")
    seen = write_for(8)
    out_at = next((i for i, s in enumerate(seen) if backup not in s), None)
    assert out_at is not None, f"broker {backup} never left the in-sync set: {seen}"
    back = [s for s in seen[out_at:] if backup in s]
    assert back == [], f"broker {backup} was named in sync while still cut off: {seen}"
    target.reconnect(f"broker-{backup}", "replication")
    deadline = time.monotonic() + 30
    while backup not in (got := isr(target))[1]:
        assert time.monotonic() < deadline, f"broker {backup} did not rejoin: {got}"
        write_for(0.2)
    producer.flush(30)
