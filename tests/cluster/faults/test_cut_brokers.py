"""One broker cut off through the fault proxies, as the partition faults do, with what it must
do then; each was found by those faults.

A backup cut off while writes go on must leave the in-sync set and stay out until the cut
heals, both when it is cut from the replication traffic (blackholed: its links freeze, nothing
is reset; its primary drops it after ``replica.lag.time.max.ms``) and when it is cut from etcd
(its lease expires and the controller drops it, while its replication link lives on): a frozen
link kept counting as joined, and an unregistered backup that still acknowledged was named in
sync again by its primary, the controller dropped it, and so on, tens of etcd writes a second.

A primary cut from etcd must stop leading once its backups, fenced by the new primary, refuse
its old epoch: it went on answering as the leader, from a log shorter than the new primary's,
until its copy of etcd caught up (20 s in one run), and a consumer it told OFFSET_OUT_OF_RANGE
went back to offset 0. It must do so even when nobody writes to it: its idle heartbeat is what
the backups refuse then.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import NewTopic

from stratalog.faults.targets import StratalogTarget, admin_client

from ...conformance import wire

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


def isr(bootstrap: str) -> tuple[int, list[int]]:
    """The partition's leader and in-sync replicas, as the metadata says now."""
    md = admin_client(bootstrap).list_topics(TOPIC, timeout=10)
    p = md.topics[TOPIC].partitions[0]
    return p.leader, sorted(p.isrs)


def in_sync_topic(target: StratalogTarget) -> int:
    """The test topic (one partition, three replicas), once all are in sync; its leader."""
    admin = admin_client(target.bootstrap)  # (kept: the future dies with its client)
    admin.create_topics([NewTopic(TOPIC, 1, 3)])[TOPIC].result(30)
    deadline = time.monotonic() + 30
    while (got := isr(target.bootstrap))[1] != [1, 2, 3]:
        assert time.monotonic() < deadline, got
        time.sleep(0.2)
    return got[0]


def stays_out_while_cut(target: StratalogTarget, link: str) -> None:
    leader = in_sync_topic(target)
    backup = next(n for n in (1, 2, 3) if n != leader)
    # The leader's own view (a backup cut from etcd keeps a stale copy of the metadata).
    via = target.cluster.brokers[leader - 1].bootstrap
    producer = Producer({"bootstrap.servers": target.bootstrap, "acks": 1, "linger.ms": 0})

    def write_for(seconds: float) -> list[list[int]]:
        """Writes (acks=1: the primary's log grows whatever the backups do), and the in-sync
        sets seen meanwhile."""
        seen = []
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            producer.produce(TOPIC, b"x" * 100, partition=0)
            producer.poll(0.05)
            seen.append(isr(via)[1])
        return seen

    write_for(1)
    target.cut(f"broker-{backup}", link)
    seen = write_for(10)
    out_at = next((i for i, s in enumerate(seen) if backup not in s), None)
    assert out_at is not None, f"broker {backup} never left the in-sync set: {seen}"
    back = [s for s in seen[out_at:] if backup in s]
    assert back == [], f"broker {backup} was named in sync while still cut off: {seen}"
    target.reconnect(f"broker-{backup}", link)
    deadline = time.monotonic() + 30
    while backup not in (got := isr(via))[1]:
        assert time.monotonic() < deadline, f"broker {backup} did not rejoin: {got}"
        write_for(0.2)
    producer.flush(30)


def test_a_blackholed_backup_stays_out_of_the_in_sync_set_until_healed(
    target: StratalogTarget,
) -> None:
    stays_out_while_cut(target, "replication")


def test_a_backup_cut_from_etcd_stays_out_of_the_in_sync_set_until_it_registers_again(
    target: StratalogTarget,
) -> None:
    stays_out_while_cut(target, "etcd")


def list_offsets_error(bootstrap: str) -> int:
    """The error code of a ListOffsets (latest) for the partition, asked of one broker."""
    asked = {"partition_index": 0, "current_leader_epoch": -1, "timestamp": -1}
    topics = [{"name": TOPIC, "partitions": [asked]}]
    r = wire.call(bootstrap, 2, 7, replica_id=-1, isolation_level=0, topics=topics)
    return r["topics"][0]["partitions"][0]["error_code"]


def test_an_idle_primary_cut_from_etcd_stops_leading_once_fenced_at_a_newer_epoch(
    target: StratalogTarget,
) -> None:
    leader = in_sync_topic(target)
    zombie = target.cluster.brokers[leader - 1].bootstrap
    assert list_offsets_error(zombie) == 0
    producer = Producer({"bootstrap.servers": target.bootstrap, "acks": -1})
    for _ in range(10):
        producer.produce(TOPIC, b"before", partition=0)
    assert producer.flush(30) == 0
    target.cut(f"broker-{leader}", "etcd")
    try:
        others = [b.bootstrap for b in target.cluster.brokers if b.node_id != leader]
        deadline = time.monotonic() + 30
        while (now := isr(others[0])[0]) in (leader, -1):
            assert time.monotonic() < deadline, f"no failover from broker {leader}"
            time.sleep(0.2)
        # Nobody writes to the old primary (its copy of etcd, cut off, still names itself):
        # its heartbeat to the backups, fenced by the new primary, is refused at the old
        # epoch, and from then on it must send clients to look again (NOT_LEADER_OR_FOLLOWER)
        # rather than answer reads from a log the new primary is moving past.
        deadline = time.monotonic() + 10
        while (err := list_offsets_error(zombie)) != 6:
            assert time.monotonic() < deadline, f"broker {leader} still leads (error {err})"
            time.sleep(0.2)
        assert list_offsets_error(target.cluster.brokers[now - 1].bootstrap) == 0
    finally:
        target.reconnect(f"broker-{leader}", "etcd")
    producer.produce(TOPIC, b"after", partition=0)
    assert producer.flush(30) == 0
