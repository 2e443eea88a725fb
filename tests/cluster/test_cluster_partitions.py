"""CreatePartitions in a cluster, and splits (stratalog.splits) that survive a failover.

Three `stratalog serve` processes and a real etcd. The oracles: Metadata from every broker,
the records confluent-kafka was acknowledged for, and the order of acknowledged writes (each
sent after the one before was acknowledged) for the order marks a new leader answers with.
"""

from __future__ import annotations

import signal
import time

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, ConfigResource, NewPartitions, NewTopic

from stratalog.client.family_reader import Member, read_family
from stratalog.client.wire import WireClient
from stratalog.records import build_batch

from .test_leader_election import _broker, _partitions, _settled
from .waits import until


def _grow(bootstrap: str, topic: str, total: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_partitions([NewPartitions(topic, total)])[topic].result(timeout=30)


def test_create_partitions_adds_led_replicated_partitions_everywhere(cluster):
    first = cluster.brokers[0].bootstrap
    admin = AdminClient({"bootstrap.servers": first})
    admin.create_topics([NewTopic("grown", 2, 2)])["grown"].result(timeout=30)
    _settled(first, "grown", 2, 2)
    _grow(cluster.brokers[1].bootstrap, "grown", 5)
    for b in cluster.brokers:  # every broker learns of them from etcd
        parts = _settled(b.bootstrap, "grown", 5, 2)
        assert all(len(p["replica_nodes"]) == 2 for p in parts)
    producer = Producer({"bootstrap.servers": first, "acks": "all"})
    acked: list[tuple[int, int]] = []

    def delivered(err, msg) -> None:
        if err is None:
            acked.append((msg.partition(), msg.offset()))

    for p in range(5):
        producer.produce("grown", b"v%d" % p, partition=p, on_delivery=delivered)
    assert producer.flush(30) == 0
    assert sorted(acked) == [(p, 0) for p in range(5)]


def _append(client: WireClient, topic: str, partition: int, n: int, tag: bytes, into: list) -> int:
    now = int(time.time() * 1000)
    values = [b"%s:%d" % (tag, i) for i in range(n)]
    batch = build_batch([(b"moved", v, now) for v in values])
    ((err, base),) = client.produce(topic, {partition: batch}).values()
    assert err == 0, err
    into.append((partition, values))  # in the order acknowledged
    return base


def test_a_split_keeps_children_with_their_parents_through_a_failover(cluster):
    """Children share their parents' replicas and leader (the same virtual log); a kill -9 of
    that leader moves the family together, and the new leader answers the same order marks."""
    written: list[tuple[int, list[bytes]]] = []
    first = cluster.brokers[0].bootstrap
    admin = AdminClient({"bootstrap.servers": first})
    topic = NewTopic("splitting", 1, 3, config={"partition.autoscale.enable": "true"})
    admin.create_topics([topic])["splitting"].result(timeout=30)
    _settled(first, "splitting", 1, 3)
    order: list[tuple[int, int]] = []  # (partition, count) in the order acknowledged
    with WireClient(first) as client:
        for i in range(10):
            _append(client, "splitting", 0, 3, b"a%d" % i, written)
        _grow(first, "splitting", 2)
        parts = _settled(first, "splitting", 2, 3)
        assert parts[1]["leader_id"] == parts[0]["leader_id"]
        assert parts[1]["replica_nodes"] == parts[0]["replica_nodes"]
        client.metadata(["splitting"])
        parent_end = 30
        for i in range(30):
            p = (0, 1, 1)[i % 3]
            base = _append(client, "splitting", p, 2, b"b%d" % i, written)
            if p == 1:
                order.append((base, parent_end))
            else:
                parent_end += 2
        before = client.fetch("splitting", {1: 0}, max_bytes=1 << 20)[1].order
    assert before == order

    leader = _broker(cluster, parts[0]["leader_id"])
    cluster.stop_broker(leader, signal.SIGKILL)
    alive = next(b for b in cluster.brokers if b is not leader).bootstrap

    def moved():
        ps = _partitions(alive, "splitting")
        ids = {p["leader_id"] for p in ps}
        return ps if len(ids) == 1 and ids - {-1, leader.node_id} else None

    try:
        until(moved, "a new leader for the family", timeout=60)
        with WireClient(alive) as client:
            got = until(lambda: client.fetch("splitting", {1: 0}, max_bytes=1 << 20)[1], "a fetch")
            assert got.order == order
            ends = {p: o for p, (o, _) in client.list_offsets("splitting", [0, 1], -1).items()}
            batches = list(read_family(client, "splitting",
                                       [Member(0, 0, ends[0]), Member(1, 0, ends[1], 0)],
                                       fetch_bytes=256))  # fmt: skip
    finally:
        cluster.start_broker(leader)  # (the module's other tests use all three)
    values = [v for b in batches for v in b.column("value").to_pylist()]
    assert sorted(values) == sorted(v for _, vs in written for v in vs)
    # Each child record after every parent record acknowledged before it.
    at = {v: i for i, v in enumerate(values)}
    parent_so_far: list[bytes] = []
    for p, vs in written:
        if p == 0:
            parent_so_far += vs
        else:
            assert all(at[v] > at[w] for v in vs for w in parent_so_far)


def test_the_leader_splits_a_partition_under_load(cluster):
    """In a cluster the broker leading a partition measures its rate and asks etcd for the
    split; every broker then shows the children, led with their parents."""
    first = cluster.bootstrap
    admin = AdminClient({"bootstrap.servers": first})
    configs = {
        "partition.autoscale.enable": "true",
        "partition.autoscale.bytes.per.sec": "20000",
        "partition.autoscale.window.ms": "1000",
        "partition.autoscale.max.partitions": "2",
    }
    admin.create_topics([NewTopic("hot", 1, 2, config=configs)])["hot"].result(timeout=30)
    _settled(cluster.brokers[0].bootstrap, "hot", 1, 2)
    producer = Producer({"bootstrap.servers": first, "acks": "all", "linger.ms": 5})
    deadline = time.monotonic() + 60
    while len(_partitions(cluster.brokers[0].bootstrap, "hot")) < 2 and time.monotonic() < deadline:
        for _ in range(100):  # about 100 KB/s, five times the bound
            producer.produce("hot", b"x" * 1000, partition=0)
        producer.poll(0.1)
    assert producer.flush(30) == 0
    for b in cluster.brokers:
        parts = _settled(b.bootstrap, "hot", 2, 2)
        assert parts[1]["leader_id"] == parts[0]["leader_id"]
    res = ConfigResource(ConfigResource.Type.TOPIC, "hot")
    got = admin.describe_configs([res])[res].result(timeout=15)
    assert got["partition.split.history"].value == "1,2"
    time.sleep(2)  # past another window: max.partitions stops a second split
    assert len(_partitions(cluster.brokers[0].bootstrap, "hot")) == 2
