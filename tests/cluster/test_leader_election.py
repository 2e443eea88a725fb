"""Leadership as Kafka clients and tools see it in a Stratalog cluster: KIP-951 leader hints and
ElectLeaders (API 43), against three `stratalog serve` processes and a real etcd.

A partition's leader is its virtual log's primary, so an election moves every partition of the
log; partitions share a log exactly when they share a replica list, hence a preferred replica.
"""

from __future__ import annotations

import threading
import time
from collections import Counter

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from stratalog.records import build_batch

from ..conformance import wire
from .waits import until

NOT_LEADER = 6
ELECTION_NOT_NEEDED = 84
PREFERRED_LEADER_NOT_AVAILABLE = 80
ELIGIBLE_LEADERS_NOT_AVAILABLE = 83


def _partitions(bootstrap: str, topic: str) -> list[dict]:
    md = wire.call(
        bootstrap, 3, 12, topics=[{"name": topic, "topic_id": None}],
        allow_auto_topic_creation=False, include_topic_authorized_operations=False,
    )  # fmt: skip
    return sorted(md["topics"][0]["partitions"], key=lambda p: p["partition_index"])


def _create(bootstrap: str, name: str, partitions: int, factor: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(name, partitions, factor)])[name].result(timeout=30)


def _settled(bootstrap: str, topic: str, partitions: int, factor: int) -> list[dict]:
    """Metadata once every partition is led and all its replicas are in sync."""

    def check():
        parts = _partitions(bootstrap, topic)
        ok = len(parts) == partitions and all(
            p["leader_id"] >= 0 and len(p["isr_nodes"]) == factor for p in parts
        )
        return parts if ok else None

    return until(check, f"{topic} to settle")


def _elect(bootstrap: str, topic: str, partitions: list[int], kind: int = 0, version: int = 2):
    r = wire.call(
        bootstrap, 43, version, election_type=kind,
        topic_partitions=[{"topic": topic, "partitions": partitions}], timeout=30000,
    )  # fmt: skip
    assert r["error_code"] == 0 if version >= 1 else True, r
    return {p["partition_id"]: p for p in r["replica_election_results"][0]["partition_result"]}


def _broker(cluster, node_id: int):
    return next(b for b in cluster.brokers if b.node_id == node_id)


def _batch() -> bytes:
    return build_batch([(b"k", b"v", int(time.time() * 1000))])


def test_produce_to_a_backup_names_the_leader_from_v10(cluster):
    first = cluster.brokers[0].bootstrap
    _create(first, "hint-produce", 3, 3)
    parts = _settled(first, "hint-produce", 3, 3)
    ports = {b.node_id: b.port for b in cluster.brokers}
    for p in parts:
        backup = _broker(cluster, next(r for r in p["replica_nodes"] if r != p["leader_id"]))
        for version in (9, 10, 12):
            got = wire.produce(
                backup.bootstrap, "hint-produce", p["partition_index"], _batch(), version=version
            )
            assert got["error_code"] == NOT_LEADER
            if version < 10:
                assert "current_leader" not in got
                continue
            leader = got["current_leader"]
            assert (leader["leader_id"], leader["leader_epoch"]) == (
                p["leader_id"],
                p["leader_epoch"],
            )
        whole = wire.call(
            backup.bootstrap, 0, 12, transactional_id=None, acks=-1, timeout=5000,
            topic_data=[{"name": "hint-produce", "partition_data": [
                {"index": p["partition_index"], "records": _batch()}]}],
        )  # fmt: skip
        assert whole["node_endpoints"] == [
            {"node_id": p["leader_id"], "host": "127.0.0.1", "port": ports[p["leader_id"]],
             "rack": None}
        ]  # fmt: skip
    # The leader itself answers without a hint.
    leader = _broker(cluster, parts[0]["leader_id"])
    data = [{"name": "hint-produce", "partition_data": [{"index": 0, "records": _batch()}]}]
    ok = wire.call(
        leader.bootstrap, 0, 12, transactional_id=None, acks=-1, timeout=5000, topic_data=data
    )
    assert ok["responses"][0]["partition_responses"][0]["error_code"] == 0
    assert ok["responses"][0]["partition_responses"][0]["current_leader"]["leader_id"] == -1
    assert ok["node_endpoints"] == []


def _fetch(bootstrap: str, topic: str, partition: int, version: int) -> dict:
    tid = wire.topic_id(bootstrap, topic) if version >= 13 else wire.ZERO_UUID
    return wire.call(
        bootstrap, 1, version, cluster_id=None, replica_id=-1,
        replica_state={"replica_id": -1, "replica_epoch": -1},
        max_wait=10, min_bytes=1, max_bytes=1 << 20, isolation_level=0, session_id=0,
        session_epoch=-1,
        topics=[{"topic": topic, "topic_id": tid, "partitions": [{
            "partition": partition, "current_leader_epoch": -1, "fetch_offset": 0,
            "last_fetched_epoch": -1, "log_start_offset": -1, "partition_max_bytes": 1 << 20}]}],
        forgotten_topics_data=[], rack_id="",
    )  # fmt: skip


def test_fetch_from_a_backup_names_the_leader_from_v16(cluster):
    first = cluster.brokers[0].bootstrap
    _create(first, "hint-fetch", 1, 3)
    (p,) = _settled(first, "hint-fetch", 1, 3)
    backup = _broker(cluster, next(r for r in p["replica_nodes"] if r != p["leader_id"]))
    for version in (15, 16, 17):
        r = _fetch(backup.bootstrap, "hint-fetch", 0, version)
        part = r["responses"][0]["partitions"][0]
        assert part["error_code"] == NOT_LEADER
        if version < 16:
            assert part["current_leader"]["leader_id"] == -1  # not sent; kio's default
            continue
        assert part["current_leader"] == {
            "leader_id": p["leader_id"],
            "leader_epoch": p["leader_epoch"],
        }
        assert [e["node_id"] for e in r["node_endpoints"]] == [p["leader_id"]]
        assert r["node_endpoints"][0]["port"] == _broker(cluster, p["leader_id"]).port


def test_preferred_election_moves_the_virtual_log_back_only_when_asked(cluster):
    """A restarted broker stays a follower until an election is asked for; the election moves
    every partition of its log (here 0 and 3: same replica list) at epoch + 1, and producers
    writing all along lose nothing."""
    first = cluster.brokers[0].bootstrap
    _create(first, "moves", 6, 3)
    before = _settled(first, "moves", 6, 3)
    preferred = before[0]["replica_nodes"][0]
    assert before[0]["leader_id"] == preferred
    siblings = [
        p["partition_index"] for p in before if p["replica_nodes"] == before[0]["replica_nodes"]
    ]
    assert siblings == [0, 3]
    assert _elect(first, "moves", [0, 1])[0]["error_code"] == ELECTION_NOT_NEEDED

    b = _broker(cluster, preferred)
    other = next(x for x in cluster.brokers if x.node_id != preferred).bootstrap
    cluster.stop_broker(b)  # a clean stop hands its logs over
    moved = until(
        lambda: (ps := _partitions(other, "moves"))[0]["leader_id"] not in (-1, preferred) and ps,
        "the hand-over",
    )
    # With the preferred replica down the election cannot happen.
    assert _elect(other, "moves", [0])[0]["error_code"] == PREFERRED_LEADER_NOT_AVAILABLE
    cluster.start_broker(b)
    back = _settled(other, "moves", 6, 3)
    time.sleep(2)  # a few reconciliations: nothing moves leadership back by itself
    back = _partitions(other, "moves")
    assert [p["leader_id"] for p in back] == [p["leader_id"] for p in moved]
    assert back[0]["leader_id"] != preferred

    # Produce to every partition during the election; idempotence keeps it exactly once.
    stop = threading.Event()
    errors: list = []
    acked: Counter = Counter()
    producer = Producer({"bootstrap.servers": other, "acks": "all", "enable.idempotence": True,
                         "linger.ms": 5})  # fmt: skip

    def produce() -> None:
        i = 0
        while not stop.is_set():
            producer.produce(
                "moves", b"v%d" % i, partition=i % 6,
                on_delivery=lambda e, m: errors.append(e) if e else acked.update([m.partition()]),
            )  # fmt: skip
            producer.poll(0)
            i += 1
            time.sleep(0.002)
        producer.flush(60)

    writer = threading.Thread(target=produce)
    writer.start()
    try:
        time.sleep(1)
        got = _elect(other, "moves", [0])
        assert got[0]["error_code"] == 0, got
        assert got[0]["error_message"] is None
        time.sleep(1)
    finally:
        stop.set()
        writer.join(90)
    after = _partitions(other, "moves")
    assert after[0]["leader_id"] == preferred
    assert after[0]["leader_epoch"] == back[0]["leader_epoch"] + 1
    assert after[3]["leader_id"] == preferred  # the same log: it moved too
    for i in (1, 2, 4, 5):
        assert after[i]["leader_id"] == back[i]["leader_id"]
        assert after[i]["leader_epoch"] == back[i]["leader_epoch"]
    assert errors == []
    # The old primary stays in sync and follows the new one.
    _settled(other, "moves", 6, 3)
    consumer = Consumer({"bootstrap.servers": other, "group.id": "moves-check",
                         "enable.auto.commit": False})  # fmt: skip
    consumer.assign([TopicPartition("moves", i, 0) for i in range(6)])
    seen: Counter = Counter()
    values: Counter = Counter()
    deadline = time.monotonic() + 30
    while sum(seen.values()) < sum(acked.values()) and time.monotonic() < deadline:
        m = consumer.poll(0.5)
        if m is not None and m.error() is None:
            seen[m.partition()] += 1
            values[m.value()] += 1
    consumer.close()
    assert seen == acked
    assert max(values.values()) == 1
    assert _elect(other, "moves", [0, 3])[3]["error_code"] == ELECTION_NOT_NEEDED


def test_unclean_elections_are_refused_unless_not_needed(cluster):
    first = cluster.brokers[0].bootstrap
    _create(first, "unclean", 3, 1)
    parts = _settled(first, "unclean", 3, 1)
    assert _elect(first, "unclean", [0], kind=1)[0]["error_code"] == ELECTION_NOT_NEEDED
    # The only replica of partition 0 goes: nothing in sync is left to lead it.
    lone = _broker(cluster, parts[0]["leader_id"])
    other = next(b for b in cluster.brokers if b is not lone).bootstrap
    cluster.stop_broker(lone)
    try:
        until(lambda: _partitions(other, "unclean")[0]["leader_id"] == -1, "no leader")
        got = _elect(other, "unclean", [0], kind=1)[0]
        assert got["error_code"] == ELIGIBLE_LEADERS_NOT_AVAILABLE
        assert "unclean leader election is not supported" in got["error_message"]
        got = _elect(other, "unclean", [0], kind=0)[0]
        assert got["error_code"] == PREFERRED_LEADER_NOT_AVAILABLE
    finally:
        cluster.start_broker(lone)
    _settled(first, "unclean", 3, 1)


def test_unknown_partitions_and_election_types(cluster):
    first = cluster.brokers[0].bootstrap
    r = wire.call(
        first, 43, 2, election_type=0, timeout=5000,
        topic_partitions=[{"topic": "no-such-topic", "partitions": [0]}],
    )  # fmt: skip
    assert r["replica_election_results"][0]["partition_result"][0]["error_code"] == 3
    r = wire.call(first, 43, 2, election_type=7, topic_partitions=None, timeout=5000)
    assert r["error_code"] == 42  # INVALID_REQUEST


def test_kafka_leader_election_tool_moves_leaders_back(cluster):
    from stratalog.peers.kafka import run_tool

    first = cluster.brokers[0].bootstrap
    _create(first, "tool", 3, 3)
    before = _settled(first, "tool", 3, 3)
    b = _broker(cluster, before[1]["replica_nodes"][0])
    cluster.stop_broker(b)
    cluster.start_broker(b)
    _settled(first, "tool", 3, 3)
    assert _partitions(first, "tool")[1]["leader_id"] != b.node_id
    done = run_tool(
        "kafka-leader-election", "--bootstrap-server", first, "--election-type", "PREFERRED",
        "--all-topic-partitions", timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "Successfully completed leader election (PREFERRED) for partitions" in done.stdout
    assert "tool-1" in done.stdout
    assert [p["leader_id"] for p in _partitions(first, "tool")] == [
        p["replica_nodes"][0] for p in before
    ]
    again = run_tool(
        "kafka-leader-election", "--bootstrap-server", first, "--election-type", "PREFERRED",
        "--topic", "tool", "--partition", "1", timeout=120,
    )  # fmt: skip
    assert again.returncode == 0, again.stderr
    assert "Valid replica already elected for partitions tool-1" in again.stdout
