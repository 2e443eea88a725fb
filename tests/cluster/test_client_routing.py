"""Stratalog's own wire client against three real brokers and a real etcd.

Given one broker's address, the client must reach every partition at its leader (a non-leader
answers NOT_LEADER_OR_FOLLOWER), commit offsets at the group's coordinator, and follow a leader
that moves. The oracles are confluent-kafka's delivery reports, watermarks and committed offsets,
never the client under test.
"""

from __future__ import annotations

import signal
import time

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from stratalog import Broker
from stratalog.client.wire import EARLIEST, LATEST, WireClient
from stratalog.records import build_batch, iter_records
from stratalog.storage.batch import parse_header

from ..conformance import wire

PARTITIONS = 6


def create_spread_topic(bootstrap: str, name: str, partitions: int = PARTITIONS) -> dict[int, int]:
    """A topic replicated three times, every partition's replicas in sync; partition -> leader
    (as confluent-kafka's metadata says). The leaders rotate over the brokers: a test before
    it in the module that killed or stopped a leader left its logs led by the survivors, so
    the preferred leaders are elected back first (ElectLeaders, every partition)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    new = NewTopic(name, partitions, 3, config={"min.insync.replicas": "2"})
    admin.create_topics([new])[name].result(timeout=30)
    deadline = time.monotonic() + 60
    elected = 0.0
    while True:
        t = admin.list_topics(name, timeout=10).topics[name]
        parts = t.partitions
        if (
            t.error is None
            and len(parts) == partitions
            and all(p.leader >= 0 and len(p.isrs) == 3 for p in parts.values())
        ):
            leaders = {i: p.leader for i, p in parts.items()}
            if len(set(leaders.values())) >= min(3, partitions):
                return leaders
            if time.monotonic() - elected > 5:
                elected = time.monotonic()
                wire.call(bootstrap.split(",")[0], 43, 2, election_type=0,
                          topic_partitions=None, timeout=10000)  # fmt: skip
        assert time.monotonic() < deadline, {i: (p.leader, p.isrs) for i, p in parts.items()}
        time.sleep(0.2)


def leaders_of(bootstrap: str, name: str) -> dict[int, int]:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    return {
        i: p.leader for i, p in admin.list_topics(name, timeout=10).topics[name].partitions.items()
    }


def produce_acked(bootstrap: str, topic: str, n: int, tag: str) -> dict[tuple[int, int], bytes]:
    """Produce ``n`` records round the partitions with acks=all; (partition, offset) -> value of
    every record the brokers acknowledged."""
    acked: dict[tuple[int, int], bytes] = {}
    failed: list[str] = []

    def on_delivery(err, msg) -> None:
        if err is None:
            acked[(msg.partition(), msg.offset())] = msg.value()
        else:
            failed.append(err.name())

    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True,
                  "linger.ms": 2})  # fmt: skip
    for i in range(n):
        p.produce(topic, b"%s-%06d" % (tag.encode(), i), partition=i % PARTITIONS,
                  on_delivery=on_delivery)  # fmt: skip
        p.poll(0)
    assert p.flush(60) == 0
    assert failed == []
    return acked


def read_with(client: WireClient, topic: str, partitions: range) -> dict[tuple[int, int], bytes]:
    """Every record of the partitions, fetched by the client under test."""
    out: dict[tuple[int, int], bytes] = {}
    lows = client.list_offsets(topic, list(partitions), EARLIEST)
    ends = client.list_offsets(topic, list(partitions), LATEST)
    offsets = {p: lows[p][0] for p in partitions}
    while any(offsets[p] < ends[p][0] for p in partitions):
        todo = {p: o for p, o in offsets.items() if o < ends[p][0]}
        for p, data in client.fetch(topic, todo).items():
            assert data.error_code == 0, (p, data.error_code)
            raw = bytes(data.records)
            pos = 0
            while pos + 61 <= len(raw):
                h = parse_header(raw, pos)
                for r in iter_records(raw[pos : pos + h.size], h):
                    out[(p, r.offset)] = r.value
                pos += h.size
                offsets[p] = h.last_offset + 1
    return out


def watermarks(bootstrap: str, topic: str) -> dict[int, int]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "routing-watermarks"})
    try:
        return {
            p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=15)[1]
            for p in range(PARTITIONS)
        }
    finally:
        c.close()


def test_one_address_reaches_every_partition_at_its_leader(cluster):
    first = cluster.brokers[0].bootstrap
    leaders = create_spread_topic(first, "spread")
    assert set(leaders.values()) == {1, 2, 3}, leaders  # some partitions led elsewhere
    acked = produce_acked(cluster.bootstrap, "spread", 600, "a")
    with WireClient(first) as client:
        assert read_with(client, "spread", range(PARTITIONS)) == acked
        ends = client.list_offsets("spread", list(range(PARTITIONS)), LATEST)
        assert {p: e for p, (e, _) in ends.items()} == watermarks(first, "spread")
        # One connection per broker that leads something, each found through Metadata.
        assert {client.leaders.leader("spread", p) for p in range(PARTITIONS)} == {1, 2, 3}
        assert all(client.leaders.leader("spread", p) == n for p, n in leaders.items())
        assert len([c for c in client._conns.values() if c.is_open]) == 3


def test_produce_reaches_each_leader(cluster):
    first = cluster.brokers[1].bootstrap
    create_spread_topic(first, "written")
    now = int(time.time() * 1000)
    with WireClient(first) as client:
        batches = {
            p: build_batch([(None, b"w%d-%d" % (p, i), now) for i in range(10)])
            for p in range(PARTITIONS)
        }
        answers = client.produce("written", batches, acks=-1)
    assert {p: e for p, (e, _) in answers.items()} == dict.fromkeys(range(PARTITIONS), 0)
    assert watermarks(first, "written") == dict.fromkeys(range(PARTITIONS), 10)


def test_offsets_are_committed_at_each_groups_coordinator(cluster):
    first = cluster.brokers[2].bootstrap
    create_spread_topic(first, "committed", 2)
    groups = [f"g{i}" for i in range(6)]  # coordinators differ by group
    with WireClient(first) as client:
        for i, g in enumerate(groups):
            client.offset_commit(g, {("committed", 0): (10 + i, "m"), ("committed", 1): (i, "")})
        coordinators = {client.leaders.coordinator(g) for g in groups}
        assert len(coordinators) > 1, coordinators  # not all at the bootstrap broker
        assert client.offset_fetch("g3") == {("committed", 0): (13, "m"), ("committed", 1): (3, "")}
    for i, g in enumerate(groups):
        c = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": g})
        try:
            tps = [TopicPartition("committed", p) for p in (0, 1)]
            got = [tp.offset for tp in c.committed(tps, timeout=30)]
        finally:
            c.close()
        assert got == [10 + i, i]


def test_consumer_protocol_group_at_its_coordinator(cluster):
    """KIP-848 in a cluster: librdkafka members (group.protocol=consumer) find the group's
    coordinator, share the partitions and commit there; the other brokers answer the group's
    heartbeats NOT_COORDINATOR."""
    topic, group, parts = "kip848", "kip848-cluster", PARTITIONS
    create_spread_topic(cluster.brokers[0].bootstrap, topic, parts)
    acked = produce_acked(cluster.bootstrap, topic, 40, "kip848")
    members = []
    for name in ("a", "b"):
        c = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": group,
                      "group.protocol": "consumer", "client.id": name,
                      "auto.offset.reset": "earliest", "enable.auto.commit": False})  # fmt: skip
        c.subscribe([topic])
        members.append(c)
    read: dict[tuple[int, int], bytes] = {}
    try:
        deadline = time.monotonic() + 60
        while True:
            for c in members:
                msgs = c.consume(num_messages=100, timeout=0.1)
                read.update(((m.partition(), m.offset()), m.value()) for m in msgs)
                if msgs:
                    c.commit(asynchronous=False)
            owned = [sorted(tp.partition for tp in c.assignment()) for c in members]
            flat = sorted(p for ps in owned for p in ps)
            if read == acked and all(owned) and flat == list(range(parts)):
                break
            assert time.monotonic() < deadline, (owned, len(read))
    finally:
        for c in members:
            c.close()
    coordinator = wire.call(cluster.brokers[0].bootstrap, 10, 6, key_type=0,
                            coordinator_keys=[group])["coordinators"][0]  # fmt: skip
    assert coordinator["error_code"] == 0, coordinator
    checker = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": group})
    try:
        tps = [TopicPartition(topic, p) for p in range(parts)]
        committed = {tp.partition: tp.offset for tp in checker.committed(tps, timeout=30)}
    finally:
        checker.close()
    ends = {p: 1 + max(o for q, o in acked if q == p) for p in range(parts)}
    assert committed == ends
    for b in cluster.brokers:
        described = wire.call(b.bootstrap, 69, 1, group_ids=[group],
                              include_authorized_operations=False)["groups"][0]  # fmt: skip
        if b.node_id == coordinator["node_id"]:
            assert (described["error_code"], described["group_state"]) == (0, "Empty")
        else:
            assert described["error_code"] == 16  # NOT_COORDINATOR
            hb = wire.call(b.bootstrap, 68, 1, group_id=group, member_id="m", member_epoch=0,
                           rebalance_timeout=1000, subscribed_topic_names=[topic],
                           topic_partitions=[])  # fmt: skip
            assert hb["error_code"] == 16


@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGKILL], ids=["stop", "kill"])
def test_the_client_follows_a_leader_that_moves(cluster, how):
    topic = f"moving-{how.name.lower()}"
    first = cluster.brokers[0].bootstrap
    leaders = create_spread_topic(first, topic)
    acked = produce_acked(cluster.bootstrap, topic, 300, "before")
    # A broker other than the one the checks ask, leading some partitions.
    victim = next(b for b in cluster.brokers[1:] if b.node_id in leaders.values())
    moved = [p for p, n in leaders.items() if n == victim.node_id]
    client = WireClient(f"{victim.bootstrap},{first}")  # the victim first: it has to go on
    stopped = False
    try:
        assert read_with(client, topic, range(PARTITIONS)) == acked
        cluster.stop_broker(victim, how)
        stopped = True
        # The same client, with a map naming the gone leader: a refresh and a retry each.
        now = int(time.time() * 1000)
        answers = client.produce(
            topic, {p: build_batch([(None, b"after-%d" % p, now)]) for p in moved}
        )
        assert all(err == 0 for err, _ in answers.values()), answers
        for p in moved:
            acked[(p, answers[p][1])] = b"after-%d" % p
        assert read_with(client, topic, range(PARTITIONS)) == acked
        assert all(client.leaders.leader(topic, p) != victim.node_id for p in moved)
        assert victim.node_id not in leaders_of(first, topic).values()
    finally:
        client.close()
        if stopped:
            cluster.start_broker(victim)


def test_a_single_broker_is_one_connection(tmp_path):
    with Broker(tmp_path / "b") as b, WireClient(b.bootstrap) as client:
        client.create_topic("solo", 3)
        now = int(time.time() * 1000)
        client.produce("solo", {p: build_batch([(None, b"s%d" % p, now)]) for p in range(3)})
        ends = client.list_offsets("solo", [0, 1, 2], LATEST)
        assert {p: o for p, (o, _) in ends.items()} == dict.fromkeys(range(3), 1)
        assert read_with(client, "solo", range(3)) == {(p, 0): b"s%d" % p for p in range(3)}
        client.metadata(["solo"])
        assert list(client._conns) == [client.address]
        assert client._home is not None and client._home.is_open
