"""Share groups' durable state (``__share_group_state``, broker/share_state.py).

The crash test kills `stratalog serve` with SIGKILL while two librdkafka share consumers
(confluent-kafka ``ShareConsumer``, explicit acknowledgement) are consuming, one of them holding
records it acquired and never acknowledged, and restarts it on the same port. The oracle trusts
only what the consumers saw: each delivery (partition, offset, delivery count), and each
acknowledgement the broker confirmed (the acknowledgement-commit callback without an error).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from pathlib import Path

from confluent_kafka import AcknowledgeType, Producer, ShareConsumer

from stratalog.broker.share_partition import (
    ACCEPT,
    ACKNOWLEDGED,
    ARCHIVED,
    AVAILABLE,
    RELEASE,
    SharePartition,
)
from stratalog.broker.share_state import restore, state_of
from stratalog.broker.share_state_records import (
    ShareState,
    StateBatch,
    decode_key,
    decode_value,
    encode_key,
    encode_value,
    kafka_uuid,
    partition_for,
)

from .conformance import wire
from .conftest import BrokerProcess, create_topic
from .test_share_groups import JavaShareConsumer, _produce, close_share_consumer

DELIVERY_LIMIT = 5
SETTINGS = {
    "group.share.record.lock.duration.ms": "3000",
    "group.share.heartbeat.interval.ms": "1000",
    "group.share.session.timeout.ms": "10000",
    "group.share.delivery.count.limit": str(DELIVERY_LIMIT),
    "share.auto.offset.reset": "earliest",
}


# -- records and the state they carry ---------------------------------------------------------
def test_snapshot_records_round_trip_in_kafkas_layout() -> None:
    tid = uuid.UUID("8f1e0a6e-6c1b-4d3b-9a57-0f5a3c2b1d00")
    key = ("g", tid, 3)
    raw = encode_key(key)
    # ShareSnapshotKey (record type 0): group as an int16-length string, the uuid, the index.
    assert raw == b"\x00\x00" + b"\x00\x01g" + tid.bytes + b"\x00\x00\x00\x03"
    assert decode_key(raw) == key
    assert decode_key(b"\x00\x01" + raw[2:]) is None  # a ShareUpdate key: not a state
    state = ShareState(10, (StateBatch(10, 12, 0, 2), StateBatch(13, 13, 2, 1)), 1, 4, 0)
    assert decode_value(encode_value(state)) == state
    assert decode_value(None) is None
    # Kafka's coordinator key: the topic id in Kafka's base64 spelling.
    assert kafka_uuid(tid) == "jx4KbmwbTTuaVw9aPCsdAA"
    assert 0 <= partition_for(key, 50) < 50


def test_a_share_partition_restored_keeps_counts_and_redelivers_what_was_acquired() -> None:
    sp = SharePartition(0, delivery_limit=3)
    sp.acquire("a", 0, 6, 10, now=0)  # 0-5 delivered once
    sp.acknowledge("a", 0, 1, (ACCEPT,), now=0)  # start moves to 2
    sp.acknowledge("a", 3, 3, (RELEASE,), now=0)
    sp.acquire("b", 3, 4, 10, now=0)  # 3 again: count 2
    sp.acknowledge("a", 4, 4, (ACCEPT,), now=0)
    assert state_of(sp).start_offset == 2
    again = SharePartition(0, delivery_limit=3)
    restore(again, state_of(sp))
    assert (again.start, again.end) == (2, 6)
    # Acquired at the crash (2, 3, 5): available again with their counts; 4 stays done.
    assert {o: (r.state, r.delivery_count) for o, r in again.records.items()} == {
        2: (AVAILABLE, 1),
        3: (AVAILABLE, 2),
        4: (ACKNOWLEDGED, 1),
        5: (AVAILABLE, 1),
    }
    runs = again.acquire("c", 2, 6, 10, now=0)
    assert [(a.first_offset, a.last_offset, a.delivery_count) for a in runs] == [
        (2, 2, 2),
        (3, 3, 3),
        (5, 5, 2),
    ]
    # A record acquired for its last permitted delivery when the broker went is archived.
    last = SharePartition(0, delivery_limit=3)
    restore(last, state_of(again))
    assert last.records[3].state == ARCHIVED


# -- kill -9 with real consumers ----------------------------------------------------------------
class Oracle:
    """What the consumers observed: deliveries and confirmed acknowledgements."""

    def __init__(self) -> None:
        self.poison: tuple[int, int] | None = None
        self.deliveries: dict[tuple[int, int], list[int]] = {}
        self.confirmed: dict[tuple[int, int], int] = {}
        self.failed: set[tuple[int, int]] = set()  # acknowledgements the broker refused
        self.redelivered_confirmed: list[tuple[int, int]] = []

    def callback(self, offsets, error) -> None:
        for tp, offs in offsets.items():
            for o in offs:
                key = (tp.partition, o)
                if key == self.poison:
                    continue
                if error is None:
                    self.confirmed[key] = self.confirmed.get(key, 0) + 1
                else:
                    self.failed.add(key)

    def delivered(self, msgs) -> None:
        for m in msgs:
            key = (m.partition(), m.offset())
            if self.confirmed.get(key):
                self.redelivered_confirmed.append(key)
            self.deliveries.setdefault(key, []).append(m.delivery_count())


def share_consumer(bootstrap: str, group: str, topic: str, oracle: Oracle) -> ShareConsumer:
    c = ShareConsumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "share.acknowledgement.mode": "explicit",
        }
    )
    c.set_acknowledgement_commit_callback(oracle.callback)
    c.subscribe([topic])
    return c


def poll(c: ShareConsumer, oracle: Oracle, timeout: float = 0.3) -> list:
    msgs = [m for m in c.poll(timeout) if m.error() is None]
    oracle.delivered(msgs)
    return msgs


def ack(c: ShareConsumer, msgs: list, oracle: Oracle) -> None:
    for m in msgs:
        poison = (m.partition(), m.offset()) == oracle.poison
        c.acknowledge(m, AcknowledgeType.RELEASE if poison else AcknowledgeType.ACCEPT)
    if msgs:
        c.commit_sync(10)


def _progress(oracle: Oracle) -> str:
    by_partition: dict[int, int] = {}
    for part, _o in oracle.confirmed:
        by_partition[part] = by_partition.get(part, 0) + 1
    return f"confirmed by partition {by_partition}, {len(oracle.failed)} refused"


def consume_through_a_crash(
    bootstrap: str,
    topic: str,
    partitions: int,
    per_partition: int,
    crash: Callable[[set[tuple[int, int]]], set[tuple[int, int]]],
    group: str | None = None,
) -> None:
    """Two share consumers consume a third of ``topic`` (filled with ``per_partition`` records
    per partition), acknowledging everything; one of them then acquires records it never
    acknowledges, one of which is a poison record from then on (always released), and
    ``crash(held)`` kills a broker, answering the held records it took with it (those acquired
    and unacknowledged at the crash). Consumption goes on until every record is acknowledged
    and the poison one archived; then the oracle's verdict."""
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5})
    for i in range(partitions * per_partition):
        p.produce(topic, value=f"r{i}".encode(), partition=i % partitions)
    assert p.flush(30) == 0
    oracle = Oracle()
    group = group or f"{topic}-g"
    consumers = [share_consumer(bootstrap, group, topic, oracle) for _ in range(2)]
    everything = {(part, o) for part in range(partitions) for o in range(per_partition)}
    try:
        deadline = time.monotonic() + 60
        while len(oracle.confirmed) < len(everything) // 3:
            assert time.monotonic() < deadline, _progress(oracle)
            for c in consumers:
                ack(c, poll(c, oracle), oracle)
        # One consumer acquires records and never acknowledges them; then the broker dies.
        held: list = []
        while not held:
            assert time.monotonic() < deadline, _progress(oracle)
            for holder in consumers:
                held = poll(holder, oracle)
                if held:
                    break
        held_keys = {(m.partition(), m.offset()) for m in held}
        # One of them is a poison record from now on, always released: it must be archived at
        # the delivery limit, its deliveries before the crash counted.
        poison = oracle.poison = min(held_keys)
        everything.discard(poison)
        before = {k: list(v) for k, v in oracle.deliveries.items()}
        confirmed_before = len(oracle.confirmed)
        lost = crash(held_keys)
        # The holder's acknowledgement of what it held reaches a broker that no longer has those
        # records acquired by anyone: refused, not confirmed.
        ack(holder, held, oracle)
        deadline = time.monotonic() + 90
        while True:
            missing = everything - set(oracle.confirmed) - (oracle.failed - lost)
            poison_done = oracle.deliveries.get(poison, [0])[-1] >= DELIVERY_LIMIT
            if not missing and poison_done:
                break
            assert time.monotonic() < deadline, (
                f"{len(missing)} never acknowledged, e.g. {sorted(missing)[:5]}; "
                f"poison deliveries {oracle.deliveries.get(poison)}"
            )
            for c in consumers:
                ack(c, poll(c, oracle), oracle)
        for _ in range(5):  # nothing more comes, the poison record least of all
            for c in consumers:
                ack(c, poll(c, oracle, 0.2), oracle)
    finally:
        for c in consumers:
            close_share_consumer(c)

    # Nothing whose acknowledgement the broker confirmed was delivered again, before or after
    # the crash, and every record was confirmed exactly once (an acknowledgement refused at the
    # crash may have been made durable just before it: then its record is not delivered again).
    assert oracle.redelivered_confirmed == []
    assert all(n == 1 for n in oracle.confirmed.values()), {
        k: n for k, n in oracle.confirmed.items() if n != 1
    }
    unconfirmed = everything - set(oracle.confirmed)
    assert unconfirmed <= oracle.failed - lost, sorted(unconfirmed)[:10]
    assert confirmed_before >= len(everything) // 3
    # What was held at the crash came again, each with its earlier delivery counted.
    assert lost, "the crash took no acquired record with it"
    for key in lost - {poison}:
        seen = oracle.deliveries[key]
        assert len(seen) >= 2 and seen[-1] > before[key][-1], (key, seen)
        assert oracle.confirmed.get(key) == 1, key
    # Delivery counts went on across the crash, never back: the poison record was delivered
    # at most DELIVERY_LIMIT times in all, with counts rising, then archived.
    for key, seen in oracle.deliveries.items():
        assert seen == sorted(set(seen)), (key, seen)
    assert len(oracle.deliveries[poison]) <= DELIVERY_LIMIT
    assert oracle.deliveries[poison][-1] == DELIVERY_LIMIT
    assert len(before[poison]) >= 1


def test_kill_9_mid_consumption_keeps_acknowledgements_and_delivery_counts(tmp_path: Path) -> None:
    topic = "share-crash"
    bp = BrokerProcess(tmp_path / "data", settings=SETTINGS)
    bp.start()

    def crash(held: set[tuple[int, int]]) -> set[tuple[int, int]]:
        bp.kill()
        bp.start()  # the same port: the consumers reconnect
        return held

    try:
        create_topic(bp.bootstrap, topic, 2)
        consume_through_a_crash(bp.bootstrap, topic, 2, 1500, crash)
    finally:
        bp.kill()


def _spso(bootstrap: str, group: str) -> tuple[int, int]:
    """(start offset, lag) of the group's one share-partition, as DescribeShareGroupOffsets."""
    r = wire.call(bootstrap, 90, 1, groups=[{"group_id": group, "topics": None}])
    topics = r["groups"][0]["topics"]
    if not topics:
        return -1, -1
    (part,) = topics[0]["partitions"]
    return part["start_offset"], part["lag"]


def _java_run(bootstrap: str, group: str, topic: str, n: int) -> list[tuple[int, int, int, str]]:
    """Kafka's KafkaShareConsumer (kafka-console-share-consumer) until it printed ``n`` records
    (it acknowledges them as it goes, the last ones when it closes), or 30 s without one."""
    c = JavaShareConsumer(
        bootstrap, group, topic, "--max-messages", str(n), "--timeout-ms", "30000"
    )
    try:
        c.proc.wait(90)
    finally:
        c.stop()
    return c.records()


def test_java_share_consumer_state_survives_kill_9_and_delete_groups(tmp_path: Path) -> None:
    """What Kafka's Java share consumer acknowledged survives a kill -9 of the broker: the
    start offset is reported from the durable state before anyone fetches, and only new
    records are delivered; DeleteGroups deletes that state durably, so the group starts over."""
    topic, group = "share-java-durable", "share-java-durable-g"
    bp = BrokerProcess(tmp_path / "data", settings=SETTINGS)
    bp.start()
    try:
        create_topic(bp.bootstrap, topic, 1)
        _produce(bp.bootstrap, topic, 1, 0, 5)
        assert _java_run(bp.bootstrap, group, topic, 5) == [(0, o, 1, f"r{o}") for o in range(5)]
        assert _spso(bp.bootstrap, group) == (5, 0)
        bp.kill()
        bp.start()
        assert _spso(bp.bootstrap, group) == (5, 0)  # read from __share_group_state
        _produce(bp.bootstrap, topic, 1, 5, 2)
        assert _spso(bp.bootstrap, group) == (5, 2)
        assert _java_run(bp.bootstrap, group, topic, 2) == [(0, 5, 1, "r5"), (0, 6, 1, "r6")]
        assert _spso(bp.bootstrap, group) == (7, 0)
        deleted = wire.call(bp.bootstrap, 42, 2, groups_names=[group])
        assert deleted["results"][0]["error_code"] == 0, deleted
        bp.kill()
        bp.start()
        assert _spso(bp.bootstrap, group) == (-1, -1)
        again = _java_run(bp.bootstrap, group, topic, 7)
        assert again == [(0, o, 1, f"r{o}") for o in range(7)]  # from the log start, afresh
    finally:
        bp.kill()
