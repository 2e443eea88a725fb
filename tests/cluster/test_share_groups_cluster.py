"""Share groups (KIP-932) on a three-broker cluster: the share-partitions live on the brokers
leading a topic's partitions (several of them), their durable state in ``__share_group_state``,
replicated like ``__consumer_offsets``, at the leader of each key's partition of it (reached
with ReadShareGroupState/WriteShareGroupState when that is another broker). A kill -9 of the
broker leading a partition a consumer holds records of moves the partition, and its
share-partition, to another broker, which reads the state back: what was acknowledged is not
delivered again, what was held comes again with its delivery counted, and a poison record is
archived at the delivery limit, counting its deliveries before the failover.

The consumers and the oracle are ``tests/test_share_state.py``'s (librdkafka's share consumer;
the oracle counts what the consumers saw and what the brokers confirmed).
"""

from __future__ import annotations

import signal
import uuid

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from stratalog.broker.share_state import FencedLeader
from stratalog.broker.share_state_records import (
    SHARE_STATE_TOPIC,
    ShareState,
    StateBatch,
    partition_for,
)
from stratalog.cluster.local_cluster import LocalCluster
from stratalog.storage.journal import StorageFailure

from ..conformance import wire
from ..test_share_groups import close_share_consumer
from ..test_share_state import SETTINGS, Oracle, consume_through_a_crash, poll, share_consumer
from .conftest import in_process_brokers, wait_for

PARTITIONS = 3
NOT_COORDINATOR = 16
FENCED_LEADER_EPOCH = 74


@pytest.fixture
def cluster(tmp_path):
    c = LocalCluster(
        tmp_path / "c", brokers=3, settings={**SETTINGS, "replica.lag.time.max.ms": "3000"}
    )
    c.start()
    try:
        yield c
    finally:
        c.stop()


def _led(bootstrap: str, topic: str) -> dict[int, int] | None:
    """Each partition's leader, once every partition has one."""
    md = wire.metadata(bootstrap, topic)["topics"][0]
    if md["error_code"] != 0 or not md["partitions"]:
        return None
    lead = {p["partition_index"]: p["leader_id"] for p in md["partitions"]}
    return lead if -1 not in lead.values() else None


def _group_with_remote_state(cluster: LocalCluster, topic: str, leaders: dict[int, int]) -> str:
    """A group some of whose share-partitions keep their state at another broker than their
    leader, so that ReadShareGroupState and WriteShareGroupState are used: the state topic
    exists once a share group heartbeated, and a key's coordinator follows from its name."""
    first = cluster.brokers[0].bootstrap
    warm = share_consumer(cluster.bootstrap, "warm-up", topic, Oracle())
    try:
        state = wait_for(
            lambda: _led(first, SHARE_STATE_TOPIC) or (poll(warm, Oracle(), 0.2) and None), 30
        )
    finally:
        close_share_consumer(warm)
    assert state, f"{SHARE_STATE_TOPIC} was not created"
    tid = wire.topic_id(first, topic)

    def remote(group: str) -> bool:
        return any(state[partition_for((group, tid, p), len(state))] != n
                   for p, n in leaders.items())  # fmt: skip

    return next(g for g in (f"{topic}-g{i}" for i in range(100)) if remote(g))


def test_share_group_across_leaders_survives_a_leader_failover(cluster: LocalCluster) -> None:
    topic = "share-cluster"
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    admin.create_topics([NewTopic(topic, PARTITIONS, 3, config={"min.insync.replicas": "2"})])[
        topic
    ].result(timeout=30)
    leaders = wait_for(lambda: _led(cluster.brokers[0].bootstrap, topic))
    assert leaders and len(set(leaders.values())) > 1, f"led by one broker only: {leaders}"
    group = _group_with_remote_state(cluster, topic, leaders)

    def crash(held: set[tuple[int, int]]) -> set[tuple[int, int]]:
        # The leader of the first held record's partition dies with the records held there.
        victim_id = leaders[min(held)[0]]
        victim = next(b for b in cluster.brokers if b.node_id == victim_id)
        cluster.stop_broker(victim, signal.SIGKILL)
        moved = {part for part, node in leaders.items() if node == victim_id}
        survivor = next(b for b in cluster.brokers if b is not victim).bootstrap

        def moved_on() -> bool:
            now = _led(survivor, topic) or {}
            return all(now.get(part) not in (None, victim_id) for part in moved)

        assert wait_for(moved_on, 30), f"partitions {moved} stayed without a new leader"
        return {k for k in held if k[0] in moved}

    consume_through_a_crash(cluster.bootstrap, topic, PARTITIONS, 400, crash, group)
    # The state topic replicates like __consumer_offsets: on all three brokers.
    alive = next(b for b in cluster.brokers if b.pid).bootstrap
    state = wire.metadata(alive, SHARE_STATE_TOPIC)["topics"][0]
    assert state["error_code"] == 0 and state["partitions"]
    assert all(len(p["replica_nodes"]) == 3 for p in state["partitions"])


@pytest.fixture(scope="module")
def two(etcd, tmp_path_factory):
    started = in_process_brokers(etcd, tmp_path_factory, "share", {"admin.port": -1})
    try:
        yield next(started)
    finally:
        started.close()


def test_state_is_read_and_written_at_its_coordinator(two) -> None:
    """A broker reads and writes the state of a share-partition another broker coordinates
    through it (ReadShareGroupState, WriteShareGroupState, DeleteShareGroupState), and a write
    from an older leader of the partition is fenced there."""
    first, _second = two

    def created() -> dict[int, int] | None:
        try:
            first.call(first.core.share_state_partitions, True)
        except StorageFailure:
            return None  # (being created through etcd)
        return all(_led(b.bootstrap, SHARE_STATE_TOPIC) for b in two) and _led(
            first.bootstrap, SHARE_STATE_TOPIC
        )

    state_leaders = wait_for(created, 30)
    assert state_leaders, f"{SHARE_STATE_TOPIC} was not created"
    tid = uuid.uuid4()
    key = ("g", tid, 0)
    # b2 coordinates the key, b1 asks it.
    b2 = next(
        b for b in two if b.core.node_id == state_leaders[partition_for(key, len(state_leaders))]
    )
    b1 = next(b for b in two if b is not b2)
    state = ShareState(7, (StateBatch(7, 9, 0, 2), StateBatch(10, 10, 2, 1)), leader_epoch=3)
    b1.call(b1.core.share_state.write, [(key, state)])  # through b2
    assert b2.call(b2.core.share_state.read_local, key) == state
    assert b1.call(b1.core.share_state.read, key) == ShareState(7, state.batches)
    # A former leader (epoch 2) cannot overwrite what the leader at epoch 3 wrote.
    with pytest.raises(FencedLeader):
        b1.call(b1.core.share_state.write, [(key, ShareState(8, leader_epoch=2))])
    assert b2.call(b2.core.share_state.read_local, key) == state
    # Reads are fenced too (Kafka's share coordinator): a former leader may not load the state,
    # and a newer leader's read records its epoch, fencing the leader it replaced.
    with pytest.raises(FencedLeader):
        b1.call(b1.core.share_state.read, key, 2)
    assert b1.call(b1.core.share_state.read, key, 5) == ShareState(7, state.batches)
    assert b2.call(b2.core.share_state.read_local, key).leader_epoch == 5
    with pytest.raises(FencedLeader):
        b1.call(b1.core.share_state.write, [(key, ShareState(8, leader_epoch=4))])
    stale = wire.call(b2.bootstrap, 84, 0, group_id=key[0], topics=[
        {"topic_id": tid, "partitions": [{"partition": 0, "leader_epoch": 4}]}])  # fmt: skip
    assert stale["results"][0]["partitions"][0]["error_code"] == FENCED_LEADER_EPOCH
    # b1 does not coordinate the key: it says so to whoever asks it.
    asked = wire.call(b1.bootstrap, 84, 0, group_id=key[0], topics=[
        {"topic_id": tid, "partitions": [{"partition": 0, "leader_epoch": 3}]}])  # fmt: skip
    assert asked["results"][0]["partitions"][0]["error_code"] == NOT_COORDINATOR
    b1.call(b1.core.share_state.write, [(key, None)])  # DeleteShareGroupState
    assert b1.call(b1.core.share_state.read, key) is None
    assert b2.call(b2.core.share_state.read_local, key) is None
