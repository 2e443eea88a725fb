"""Transactions on a three-broker cluster: the coordinator is the leader of the transactional
id's __transaction_state partition, markers reach the partitions other brokers lead by
WriteTxnMarkers, and the coordinator's death moves the id to a broker that read the replicated
state back.

A confluent-kafka transactional producer writes to partitions led by all three brokers; a
transaction committed, one aborted, then the coordinator is killed (-9) with a transaction
open: a new producer with the same transactional.id, served by the new coordinator, fences the
old one (its open transaction aborted) and commits. read_committed consumers see exactly the
committed transactions, whole.
"""

from __future__ import annotations

import signal
import time

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from stratalog.cluster.local_cluster import LocalCluster

from ..conformance import wire

PARTITIONS = 6
TXID = "cluster-tx"


@pytest.fixture
def cluster(tmp_path):
    c = LocalCluster(
        tmp_path / "c",
        brokers=3,
        settings={
            "replica.lag.time.max.ms": "3000",
            "transaction.abort.timed.out.transaction.cleanup.interval.ms": "500",
        },
    )
    c.start()
    try:
        yield c
    finally:
        c.stop()


def _producer(bootstrap: str) -> Producer:
    p = Producer({"bootstrap.servers": bootstrap, "transactional.id": TXID,
                  "transaction.timeout.ms": 30000, "message.timeout.ms": 30000})  # fmt: skip
    p.init_transactions(60)
    return p


def _read(bootstrap: str, topic: str, level: str, expect: int) -> list[bytes]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"r-{time.monotonic()}",
                  "isolation.level": level, "enable.auto.commit": False})  # fmt: skip
    c.assign([TopicPartition(topic, i, 0) for i in range(PARTITIONS)])
    out: list[bytes] = []
    deadline = time.monotonic() + 60
    while len(out) < expect and time.monotonic() < deadline:
        m = c.poll(0.5)
        if m is not None and m.error() is None:
            out.append(m.value())
    idle = time.monotonic() + 2  # anything more shows up here
    while time.monotonic() < idle:
        m = c.poll(0.2)
        if m is not None and m.error() is None:
            out.append(m.value())
    c.close()
    return sorted(out)


def _coordinator(bootstrap: str) -> int:
    deadline = time.monotonic() + 60
    while True:
        found = wire.call(bootstrap, 10, 4, key_type=1, coordinator_keys=[TXID])
        c = found["coordinators"][0]
        if c["error_code"] == 0:
            return c["node_id"]
        assert time.monotonic() < deadline, found
        time.sleep(0.5)


def _batch(p: Producer, topic: str, tag: str) -> list[bytes]:
    values = [f"{tag}{i}".encode() for i in range(2 * PARTITIONS)]
    for i, v in enumerate(values):
        p.produce(topic, v, partition=i % PARTITIONS)
    return values


def test_transactions_across_brokers_and_a_coordinator_failover(cluster: LocalCluster):
    bootstrap = ",".join(b.bootstrap for b in cluster.brokers)
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic("txn", PARTITIONS, 3, config={"min.insync.replicas": "2"})])[
        "txn"
    ].result(timeout=30)
    md = wire.metadata(cluster.brokers[0].bootstrap, "txn")
    leaders = {p["leader_id"] for p in md["topics"][0]["partitions"]}
    assert len(leaders) > 1, "the topic's partitions should be led by several brokers"

    p = _producer(bootstrap)
    p.begin_transaction()
    committed = _batch(p, "txn", "a")
    p.commit_transaction(60)
    p.begin_transaction()
    aborted = _batch(p, "txn", "b")
    p.flush(60)
    p.abort_transaction(60)
    assert _read(bootstrap, "txn", "read_committed", len(committed)) == sorted(committed)

    # The coordinator dies with a transaction open.
    p.begin_transaction()
    lost = _batch(p, "txn", "c")
    p.flush(60)
    node = _coordinator(cluster.brokers[0].bootstrap)
    victim = next(b for b in cluster.brokers if b.node_id == node)
    cluster.stop_broker(victim, signal.SIGKILL)
    survivors = [b for b in cluster.brokers if b is not victim]
    alive = ",".join(b.bootstrap for b in survivors)
    deadline = time.monotonic() + 60
    while _coordinator(survivors[0].bootstrap) == node:  # until the failover moved the log
        assert time.monotonic() < deadline, "no new transaction coordinator"
        time.sleep(0.5)
    q = _producer(alive)  # the new coordinator aborts the open transaction, fencing p
    q.begin_transaction()
    later = _batch(q, "txn", "d")
    q.commit_transaction(60)
    with pytest.raises(KafkaException):
        p.produce("txn", b"zombie", partition=0)
        p.commit_transaction(30)
    want = sorted(committed + later)
    assert _read(alive, "txn", "read_committed", len(want)) == want
    everything = _read(alive, "txn", "read_uncommitted", 4 * len(committed))
    assert everything == sorted(committed + aborted + lost + later)
