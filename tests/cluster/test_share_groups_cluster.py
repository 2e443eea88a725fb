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

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from stratalog.broker.share_state_records import SHARE_STATE_TOPIC, partition_for
from stratalog.cluster.local_cluster import LocalCluster

from ..conformance import wire
from ..test_share_state import SETTINGS, Oracle, consume_through_a_crash, poll, share_consumer
from .conftest import wait_for

PARTITIONS = 3


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
        warm.close()
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
