"""Moving partitions to other replicas (AlterPartitionReassignments, ListPartitionReassignments;
KIP-455) in a Stratalog cluster: three `stratalog serve` processes and a real etcd, driven by
confluent-kafka, by raw requests and by Kafka's own kafka-reassign-partitions.

A partition moves into the virtual log of its new replica list: its records are copied there,
the old leader is sealed, and the topic switches in one etcd transaction
(cluster/reassignment.py). What clients must see: every acknowledged record exactly once at the
offset it was acknowledged at, the new replicas and leader in Metadata, nothing in flight after.
"""

from __future__ import annotations

import json
import signal
import threading
import time

from confluent_kafka import Consumer, Producer, TopicPartition

from stratalog.peers.kafka import run_tool

from ..conformance import wire
from .test_leader_election import _broker, _create, _partitions, _settled
from .waits import until

UNKNOWN_TOPIC_OR_PARTITION = 3
INVALID_REPLICA_ASSIGNMENT = 39
NO_REASSIGNMENT_IN_PROGRESS = 85


def _alter(bootstrap: str, topic: str, moves: dict[int, list[int] | None], version: int = 1):
    r = wire.call(
        bootstrap, 45, version, timeout=30000, allow_replication_factor_change=True,
        topics=[{"name": topic, "partitions": [
            {"partition_index": i, "replicas": reps} for i, reps in moves.items()]}],
    )  # fmt: skip
    assert r["error_code"] == 0, r
    return {p["partition_index"]: p for p in r["responses"][0]["partitions"]}


def _ongoing(bootstrap: str, topics: list | None = None) -> dict:
    r = wire.call(bootstrap, 46, 0, timeout=30000, topics=topics)
    assert r["error_code"] == 0, r
    return {(t["name"], p["partition_index"]): p for t in r["topics"] for p in t["partitions"]}


def _other_than(replicas: list[int], brokers: list[int]) -> int:
    return next(b for b in brokers if b not in replicas)


def test_a_partition_moves_while_an_idempotent_producer_writes(cluster):
    first = cluster.brokers[0].bootstrap
    ids = sorted(b.node_id for b in cluster.brokers)
    _create(first, "moving", 2, 2)
    before = _settled(first, "moving", 2, 2)
    old = before[0]["replica_nodes"]
    # The broker that had no replica leads it afterwards; one old replica stays.
    target = [_other_than(old, ids), old[1]]

    acked: dict[bytes, tuple[int, int]] = {}
    failed: list[str] = []
    stop = threading.Event()

    def delivered(err, msg) -> None:
        if err is not None:
            failed.append(str(err))
        else:
            acked[msg.value()] = (msg.partition(), msg.offset())

    producer = Producer({
        "bootstrap.servers": cluster.bootstrap, "enable.idempotence": True, "acks": "all",
        "linger.ms": 2, "message.timeout.ms": 60000,
    })  # fmt: skip

    def produce() -> None:
        n = 0
        while not stop.is_set():
            for part in (0, 1):
                producer.produce("moving", f"v{n}-{part}".encode(), partition=part,
                                 on_delivery=delivered)  # fmt: skip
            n += 1
            producer.poll(0)
            time.sleep(0.002)

    writer = threading.Thread(target=produce)
    writer.start()
    try:
        until(lambda: len(acked) > 500, "records acknowledged before the move")
        assert _alter(first, "moving", {0: target})[0]["error_code"] == 0
        until(lambda: not _ongoing(first), "the reassignment to finish", timeout=60)
        after = len(acked)
        until(lambda: len(acked) > after + 300, "records acknowledged after the move")
    finally:
        stop.set()
        writer.join()
    assert producer.flush(60) == 0
    assert not failed, failed[:5]

    moved = until(
        lambda: (p := _partitions(first, "moving")[0])["replica_nodes"] == target and p, "Metadata"
    )
    assert moved["leader_id"] == target[0]
    assert moved["leader_epoch"] > before[0]["leader_epoch"]  # never back: clients'd ignore it
    assert _partitions(first, "moving")[1]["replica_nodes"] == before[1]["replica_nodes"]

    consumer = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": "moving-check",
                         "enable.auto.commit": False})  # fmt: skip
    read: dict[bytes, list[tuple[int, int]]] = {}
    epochs: dict[int, int] = {}  # partition 0's offset -> the leader epoch its batch carries
    consumer.assign([TopicPartition("moving", p, 0) for p in (0, 1)])
    try:
        deadline = time.monotonic() + 60
        while sum(map(len, read.values())) < len(acked) and time.monotonic() < deadline:
            for m in consumer.consume(500, 1.0):
                if m.error() is None:
                    read.setdefault(m.value(), []).append((m.partition(), m.offset()))
                    if m.partition() == 0:
                        epochs[m.offset()] = m.leader_epoch()
    finally:
        consumer.close()
    twice = {v: at for v, at in read.items() if len(at) > 1}
    assert not twice, list(twice.items())[:5]
    wrong = {v: (at, read.get(v)) for v, at in acked.items() if read.get(v) != [at]}
    assert not wrong, list(wrong.items())[:5]
    assert sum(1 for v in acked if acked[v][0] == 0) > after // 2  # partition 0 took writes

    # The copied records keep the epoch they were written in, and the new leader knows where
    # that epoch ends (OffsetForLeaderEpoch, KIP-320): a consumer that read them sees no
    # truncation (without the copied epochs the answer was offset 0).
    old_epoch = before[0]["leader_epoch"]
    assert epochs[0] == old_epoch
    # (Under load the writer may have ended before the switch: then the old epoch ends where
    # the copy does, at the partition's end.)
    switched_at = min((o for o, e in epochs.items() if e > old_epoch), default=max(epochs) + 1)
    r = wire.call(
        _broker(cluster, target[0]).bootstrap, 23, 4, replica_id=-1,
        topics=[{"topic": "moving", "partitions": [
            {"partition": 0, "current_leader_epoch": -1, "leader_epoch": old_epoch}]}],
    )  # fmt: skip
    answer = r["topics"][0]["partitions"][0]
    assert (answer["error_code"], answer["leader_epoch"]) == (0, old_epoch)
    assert answer["end_offset"] == switched_at


def test_reassignment_errors_and_cancelling(cluster):
    first = cluster.brokers[0].bootstrap
    ids = sorted(b.node_id for b in cluster.brokers)
    _create(first, "reassign-errors", 1, 2)
    (p,) = _settled(first, "reassign-errors", 1, 2)
    unknown = _alter(first, "no-such-topic", {0: ids[:2]})
    assert unknown[0]["error_code"] == UNKNOWN_TOPIC_OR_PARTITION
    refused = _alter(first, "reassign-errors", {5: ids[:2]})
    assert refused[5]["error_code"] == UNKNOWN_TOPIC_OR_PARTITION
    bad = _alter(first, "reassign-errors", {0: [ids[0], 999]})
    assert bad[0]["error_code"] == INVALID_REPLICA_ASSIGNMENT
    assert "999" in bad[0]["error_message"]
    dup = _alter(first, "reassign-errors", {0: [ids[0], ids[0]]})
    assert dup[0]["error_code"] == INVALID_REPLICA_ASSIGNMENT
    nothing = _alter(first, "reassign-errors", {0: None})
    assert nothing[0]["error_code"] == NO_REASSIGNMENT_IN_PROGRESS
    # Where it is already: done at once, nothing in flight.
    assert _alter(first, "reassign-errors", {0: p["replica_nodes"]})[0]["error_code"] == 0
    assert not _ongoing(first)

    # In flight while the leader it copies from is paused (well within its lease): listed
    # from any broker, then cancelled; the partition stays where it was and takes writes.
    leader = _broker(cluster, p["leader_id"])
    other = next(b for b in cluster.brokers if b.node_id != leader.node_id)
    target = [_other_than(p["replica_nodes"], ids), p["replica_nodes"][1]]
    cluster.send_signal(leader, signal.SIGSTOP)
    try:
        assert _alter(other.bootstrap, "reassign-errors", {0: target})[0]["error_code"] == 0
        listed = until(lambda: _ongoing(other.bootstrap), "the reassignment to be listed")
        assert listed[("reassign-errors", 0)] == {
            "partition_index": 0,
            "replicas": [*target, p["replica_nodes"][0]],
            "adding_replicas": [target[0]],
            "removing_replicas": [p["replica_nodes"][0]],
        }
        assert _ongoing(other.bootstrap, [{"name": "reassign-errors", "partition_indexes": [0]}])
        assert not _ongoing(other.bootstrap, [{"name": "nothing", "partition_indexes": [0]}])
        assert _alter(other.bootstrap, "reassign-errors", {0: None})[0]["error_code"] == 0
        assert not _ongoing(other.bootstrap)
        again = _alter(other.bootstrap, "reassign-errors", {0: None})
        assert again[0]["error_code"] == NO_REASSIGNMENT_IN_PROGRESS
    finally:
        cluster.send_signal(leader, signal.SIGCONT)
    assert _partitions(first, "reassign-errors")[0]["replica_nodes"] == p["replica_nodes"]
    got = until(
        lambda: (
            (r := wire.produce(leader.bootstrap, "reassign-errors", 0, _record()))["error_code"]
            == 0
            and r
        ),
        "the partition to take writes again",
    )
    assert got["error_code"] == 0


def _record() -> bytes:
    from stratalog.records import build_batch

    return build_batch([(b"k", b"v", int(time.time() * 1000))])


def test_kafka_reassign_partitions_execute_then_verify(cluster, tmp_path):
    first = cluster.brokers[0].bootstrap
    ids = sorted(b.node_id for b in cluster.brokers)
    _create(first, "tool-moved", 1, 2)
    (p,) = _settled(first, "tool-moved", 1, 2)
    # The leader learns of the topic from its own watch of etcd, a moment after `first` did.
    until(lambda: wire.produce(p_leader(cluster, p), "tool-moved", 0, _record())["error_code"]
          == 0, "the leader to take writes")  # fmt: skip
    for _ in range(19):
        assert wire.produce(p_leader(cluster, p), "tool-moved", 0, _record())["error_code"] == 0
    stored = wire.stored_batches(p_leader(cluster, p), "tool-moved", 0)
    target = [_other_than(p["replica_nodes"], ids), p["replica_nodes"][0]]
    plan = tmp_path / "plan.json"
    move = {"topic": "tool-moved", "partition": 0, "replicas": target, "log_dirs": ["any"] * 2}
    plan.write_text(json.dumps({"version": 1, "partitions": [move]}))
    bs = ["--bootstrap-server", cluster.bootstrap, "--reassignment-json-file", str(plan)]
    done = run_tool("kafka-reassign-partitions", *bs, "--execute", timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Successfully started partition reassignment for tool-moved-0" in done.stdout

    def verified():
        out = run_tool("kafka-reassign-partitions", *bs, "--verify", timeout=120)
        assert out.returncode == 0, out.stdout + out.stderr
        return (
            out.stdout
            if "Reassignment of partition tool-moved-0 is completed" in out.stdout
            else None
        )

    text = until(verified, "kafka-reassign-partitions --verify to say completed", timeout=60)
    assert "Reassignment of partition tool-moved-0 is completed" in text
    moved = _partitions(first, "tool-moved")[0]
    assert moved["replica_nodes"] == target and moved["leader_id"] == target[0]
    # The batches as they were stored: offsets, leader epochs, CRCs, timestamps.
    assert wire.stored_batches(_broker(cluster, target[0]).bootstrap, "tool-moved", 0) == stored


def p_leader(cluster, p: dict) -> str:
    return _broker(cluster, p["leader_id"]).bootstrap


def _epoch_end(bootstrap: str, topic: str, index: int, epoch: int) -> dict:
    r = wire.call(
        bootstrap, 23, 4, replica_id=-1,
        topics=[{"topic": topic, "partitions": [
            {"partition": index, "current_leader_epoch": -1, "leader_epoch": epoch}]}],
    )  # fmt: skip
    return r["topics"][0]["partitions"][0]


def test_records_copied_into_a_log_at_a_newer_epoch_keep_theirs(cluster):
    """A partition moves into a log whose epoch is already above its records' (the other
    partition moved there first, which raised it): OffsetForLeaderEpoch of the records' epoch
    still ends where the new leader's epoch starts, not at the first copied offset, which a
    consumer would take for a truncation (librdkafka then resets its position)."""
    first = cluster.brokers[0].bootstrap
    ids = sorted(b.node_id for b in cluster.brokers)
    _create(first, "epochs", 2, 2)
    before = _settled(first, "epochs", 2, 2)
    moving, staying = (0, 1) if before[0]["leader_epoch"] <= before[1]["leader_epoch"] else (1, 0)
    p = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all",
                  "enable.idempotence": True})  # fmt: skip
    for i in range(40):
        p.produce("epochs", b"e%d" % i, partition=i % 2)
    assert p.flush(30) == 0
    lists = {tuple(x["replica_nodes"]) for x in before}
    fresh = next([a, b] for a in ids for b in ids if a != b and (a, b) not in lists)
    assert _alter(first, "epochs", {staying: fresh})[staying]["error_code"] == 0
    until(lambda: not _ongoing(first), "the first move to finish", timeout=60)
    assert _alter(first, "epochs", {moving: fresh})[moving]["error_code"] == 0
    until(lambda: not _ongoing(first), "the second move to finish", timeout=60)
    after = _settled(first, "epochs", 2, 2)
    assert after[moving]["leader_epoch"] > before[moving]["leader_epoch"]
    for i in range(10):
        p.produce("epochs", b"after%d" % i, partition=moving)
    assert p.flush(30) == 0
    consumer = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": "epochs-check",
                         "enable.auto.commit": False})  # fmt: skip
    epochs: dict[int, int] = {}
    consumer.assign([TopicPartition("epochs", moving, 0)])
    try:
        deadline = time.monotonic() + 30
        while len(epochs) < 30 and time.monotonic() < deadline:
            for m in consumer.consume(100, 1.0):
                if m.error() is None:
                    epochs[m.offset()] = m.leader_epoch()
    finally:
        consumer.close()
    old_epoch = before[moving]["leader_epoch"]
    assert epochs[0] == old_epoch and len(epochs) == 30
    leader = _broker(cluster, after[moving]["leader_id"]).bootstrap
    answer = _epoch_end(leader, "epochs", moving, old_epoch)
    assert (answer["error_code"], answer["leader_epoch"]) == (0, old_epoch)
    assert answer["end_offset"] == min(o for o, e in epochs.items() if e > old_epoch) == 20
