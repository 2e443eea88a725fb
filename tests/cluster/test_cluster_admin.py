"""The admin APIs that change state in a three-broker cluster on a real etcd.

DeleteGroups and OffsetDelete: only the group's coordinator answers (the others say
NOT_COORDINATOR); the tombstones replicate with ``__consumer_offsets``, so the coordinator's
successor after a kill -9 knows the offsets are gone.

DeleteRecords: the leader moves a partition's log start and records it in etcd, from where
every replica applies it, so the brokers' partition states agree, a replica that was down (and
behind) takes it when it is back and has the records, and a new leader after a failover answers
with the same log start.
"""

from __future__ import annotations

import json
import signal
import time
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic
from kafka.admin import KafkaAdminClient
from kafka.structs import TopicPartition as KpTopicPartition

from stratalog.cluster.local_cluster import BrokerProc, LocalCluster

from ..conformance import wire
from .waits import until

pytestmark = pytest.mark.timeout(600)

NOT_LEADER = 6
OFFSET_OUT_OF_RANGE = 1


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = LocalCluster(
        tmp_path_factory.mktemp("admin") / "c",
        brokers=3,
        settings={"replica.lag.time.max.ms": "3000", "retention.check.interval.ms": "500"},
    )
    c.start()
    try:
        yield c
    finally:
        c.stop()


def _metadata(bootstrap: str, name: str) -> dict[str, Any]:
    return wire.call(
        bootstrap, 3, 12, topics=[{"name": name, "topic_id": None}],
        allow_auto_topic_creation=False, include_topic_authorized_operations=False,
    )["topics"][0]  # fmt: skip


def _in_sync(cluster: LocalCluster, name: str, partitions: int) -> dict[str, Any]:
    def check():
        t = _metadata(_live(cluster)[0].bootstrap, name)
        parts = t["partitions"]
        ok = len(parts) == partitions and all(
            len(p["isr_nodes"]) == 3 and p["leader_id"] >= 0 for p in parts
        )
        return t if ok else None

    return until(check, f"{name} in sync on three brokers", timeout=60)


def _live(cluster: LocalCluster) -> list[BrokerProc]:
    return [b for b in cluster.brokers if b.pid]


def _broker(cluster: LocalCluster, node_id: int) -> BrokerProc:
    return next(b for b in cluster.brokers if b.node_id == node_id)


def _leader(cluster: LocalCluster, name: str, partition: int) -> BrokerProc:
    def check():
        t = _metadata(_live(cluster)[0].bootstrap, name)
        p = next(p for p in t["partitions"] if p["partition_index"] == partition)
        live = {b.node_id for b in _live(cluster)}
        return p["leader_id"] if p["leader_id"] in live else None

    return _broker(cluster, until(check, f"a live leader of {name}-{partition}", timeout=60))


def _produce(bootstrap: str, name: str, partitions: int, per_partition: int, tag: str) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 2})
    failed: list[str] = []

    def acked(err, _msg) -> None:
        if err is not None:
            failed.append(err.name())

    for i in range(per_partition):
        for part in range(partitions):
            p.produce(name, b"%s-%d" % (tag.encode(), i), partition=part, on_delivery=acked)
    assert p.flush(60) == 0 and not failed, failed


def _delete(bootstrap: str, name: str, partition: int, offset: int) -> dict[str, Any]:
    wanted = {"name": name, "partitions": [{"partition_index": partition, "offset": offset}]}
    r = wire.call(bootstrap, 21, 2, timeout=10000, topics=[wanted])
    return r["topics"][0]["partitions"][0]


def _earliest(bootstrap: str, name: str, partition: int) -> dict[str, Any]:
    return wire.list_offset(bootstrap, name, partition, -2)


def _starts(b: BrokerProc, uids: list[int]) -> dict[int, int]:
    """The partitions' log starts as the broker's partition-state.json holds them."""
    raw = json.loads((b.data_dir / "logs" / "partition-state.json").read_text())
    parts = raw.get("partitions", raw)
    return {u: parts.get(str(u), {}).get("start", 0) for u in uids}


def _uids(cluster: LocalCluster, name: str) -> list[int]:
    meta = json.loads((cluster.brokers[0].data_dir / "meta" / "cluster.json").read_text())
    return list(meta["topics"][name]["partitions"])


def test_delete_records_moves_every_replicas_log_start(cluster):
    name = "dr"
    first = cluster.brokers[0].bootstrap
    admin = AdminClient({"bootstrap.servers": first})  # (kept alive until the result)
    admin.create_topics([NewTopic(name, 2, 3)])[name].result(30)
    _in_sync(cluster, name, 2)
    _produce(cluster.bootstrap, name, 2, 10, "a")
    leader = _leader(cluster, name, 0)
    follower = next(b for b in cluster.brokers if b.node_id != leader.node_id)

    # Only the leader moves it; a follower answers NOT_LEADER_OR_FOLLOWER.
    assert _delete(follower.bootstrap, name, 0, 4) == {
        "partition_index": 0, "low_watermark": -1, "error_code": NOT_LEADER}  # fmt: skip
    assert _delete(leader.bootstrap, name, 0, 4)["low_watermark"] == 4
    # kafka-python's admin client finds the leader itself.
    kp = KafkaAdminClient(bootstrap_servers=cluster.bootstrap, request_timeout_ms=30000)
    try:
        got = kp.delete_records({KpTopicPartition(name, 1): 3})
        assert got[KpTopicPartition(name, 1)]["low_watermark"] == 3
    finally:
        kp.close()
    uids = _uids(cluster, name)
    until(
        lambda: all(
            _starts(b, uids) == dict(zip(uids, [4, 3], strict=True)) for b in cluster.brokers
        ),
        "every replica's partition state at the moved starts",
    )

    # A replica that is down meanwhile, and behind, takes it once back and caught up.
    other = next(b for b in cluster.brokers if b.node_id not in (leader.node_id,))
    cluster.stop_broker(other)
    _produce(leader.bootstrap, name, 2, 10, "b")  # offsets 10-19, which ``other`` lacks
    assert _delete(_leader(cluster, name, 0).bootstrap, name, 0, 15)["low_watermark"] == 15
    cluster.start_broker(other)
    _in_sync(cluster, name, 2)
    until(
        lambda: all(_starts(b, uids)[uids[0]] == 15 for b in cluster.brokers),
        "the restarted replica's log start at 15",
    )

    # The leader dies: the new one answers with the same log start.
    leader = _leader(cluster, name, 0)
    cluster.stop_broker(leader, signal.SIGKILL)
    new = _leader(cluster, name, 0)
    assert new.node_id != leader.node_id
    assert until(lambda: _earliest(new.bootstrap, name, 0)["error_code"] == 0, "new leader")
    assert _earliest(new.bootstrap, name, 0)["offset"] == 15
    assert _earliest(new.bootstrap, name, 1)["offset"] == 3
    assert wire.fetch(new.bootstrap, name, 0, 14)["error_code"] == OFFSET_OUT_OF_RANGE
    assert wire.fetch(new.bootstrap, name, 0, 15)["error_code"] == 0
    cluster.start_broker(leader)
    _in_sync(cluster, name, 2)
    time.sleep(1.0)
    assert all(_starts(b, uids)[uids[0]] == 15 for b in cluster.brokers)


def _coordinator(cluster: LocalCluster, group: str) -> BrokerProc:
    def check():
        r = wire.call(_live(cluster)[0].bootstrap, 10, 4, key_type=0, coordinator_keys=[group])
        c = r["coordinators"][0]
        live = {b.node_id for b in _live(cluster)}
        return c["node_id"] if c["error_code"] == 0 and c["node_id"] in live else None

    return _broker(cluster, until(check, f"the coordinator of {group}", timeout=60))


def _commit(cluster: LocalCluster, group: str, topic: str, offset: int) -> None:
    part = {"partition_index": 0, "committed_offset": offset, "committed_leader_epoch": -1,
            "committed_metadata": ""}  # fmt: skip

    def check():
        r = wire.call(
            _coordinator(cluster, group).bootstrap, 8, 9, group_id=group,
            generation_id_or_member_epoch=-1, member_id="", group_instance_id=None,
            topics=[{"name": topic, "partitions": [part]}],
        )  # fmt: skip
        return r["topics"][0]["partitions"][0]["error_code"] == 0

    until(check, f"a commit of {group}", timeout=60)


def _committed(bootstrap: str, group: str, topic: str) -> int:
    r = wire.call(bootstrap, 9, 9, require_stable=False, groups=[
        {"group_id": group, "member_id": None, "member_epoch": -1,
         "topics": [{"name": topic, "partition_indexes": [0]}]}])  # fmt: skip
    return r["groups"][0]["topics"][0]["partitions"][0]["committed_offset"]


def _offset_delete(bootstrap: str, group: str, topic: str) -> dict[str, Any]:
    r = wire.call(bootstrap, 47, 0, group_id=group,
                  topics=[{"name": topic, "partitions": [{"partition_index": 0}]}])  # fmt: skip
    return {"error": r["error_code"], "partitions": [
        p["error_code"] for t in r["topics"] for p in t["partitions"]]}  # fmt: skip


def _delete_group(bootstrap: str, group: str) -> int:
    return wire.call(bootstrap, 42, 2, groups_names=[group])["results"][0]["error_code"]


NOT_COORDINATOR = 16
GROUP_ID_NOT_FOUND = 69


def test_group_deletions_on_the_coordinator_survive_its_death(cluster):
    topic = "gt"
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    admin.create_topics([NewTopic(topic, 1, 3)])[topic].result(30)
    _in_sync(cluster, topic, 1)
    ga, gb, gc = "group-a", "group-b", "group-c"
    for g in (ga, gb, gc):
        _commit(cluster, g, topic, 5)

    # Only the group's coordinator answers.
    for g in (ga, gb):
        other = next(b for b in _live(cluster) if b.node_id != _coordinator(cluster, g).node_id)
        assert _offset_delete(other.bootstrap, g, topic) == {"error": NOT_COORDINATOR,
                                                             "partitions": []}  # fmt: skip
        assert _delete_group(other.bootstrap, g) == NOT_COORDINATOR
    assert _offset_delete(_coordinator(cluster, ga).bootstrap, ga, topic) == {
        "error": 0, "partitions": [0]}  # fmt: skip
    assert _delete_group(_coordinator(cluster, gb).bootstrap, gb) == 0
    # confluent-kafka finds the coordinator itself.
    admin.delete_consumer_groups([gc], request_timeout=30)[gc].result(timeout=30)

    # The coordinators die: their successors, replicas of the offsets partitions, agree.
    for g in (ga, gb):
        victim = _coordinator(cluster, g)
        cluster.stop_broker(victim, signal.SIGKILL)
        new = _coordinator(cluster, g)
        assert new.node_id != victim.node_id
        assert until(lambda g=g, new=new: _committed(new.bootstrap, g, topic) == -1,
                     f"{g}'s offset gone at its new coordinator")  # fmt: skip
        cluster.start_broker(victim)
    assert _committed(_coordinator(cluster, gc).bootstrap, gc, topic) == -1
    assert _delete_group(_coordinator(cluster, gb).bootstrap, gb) == GROUP_ID_NOT_FOUND


@pytest.mark.parametrize("protocol", ["classic", "consumer"])
def test_a_group_keeps_its_member_through_its_coordinators_death(cluster, protocol):
    """The group's records (Kafka's formats, in __consumer_offsets: a classic group's metadata
    record, a KIP-848 group's records of types 3 and 5-8) reach the offsets partition's
    replicas; the new coordinator takes the group back, so a librdkafka consumer heartbeats on
    with its generation or member epoch: no revocation, no second assignment."""
    topic, group = f"gm-{protocol}", f"group-m-{protocol}"
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    admin.create_topics([NewTopic(topic, 1, 3)])[topic].result(30)
    _in_sync(cluster, topic, 1)
    assigned: list[list[int]] = []
    revoked: list[list[int]] = []
    config = {"bootstrap.servers": cluster.bootstrap, "group.id": group,
              "enable.auto.commit": False, "group.protocol": protocol}  # fmt: skip
    if protocol == "classic":  # (the consumer protocol's timeouts are the broker's)
        config |= {"session.timeout.ms": 30000, "heartbeat.interval.ms": 500}
    consumer = Consumer(config)
    consumer.subscribe(
        [topic],
        on_assign=lambda c, ps: assigned.append([p.partition for p in ps]),
        on_revoke=lambda c, ps: revoked.append([p.partition for p in ps]),
    )
    try:
        until(lambda: consumer.poll(0.2) is None and assigned, "the first assignment", timeout=60)
        member = consumer.memberid()
        victim = _coordinator(cluster, group)
        before = _described(victim.bootstrap, group, protocol)[1]
        cluster.stop_broker(victim, signal.SIGKILL)
        new = until(lambda: (c := _coordinator(cluster, group)) is not victim and c, "a successor")
        deadline = time.monotonic() + 8  # heartbeats to the successor, well within the session
        while time.monotonic() < deadline:
            consumer.poll(0.2)
        state, after = _described(new.bootstrap, group, protocol)
        seen = (list(assigned), list(revoked))  # (closing the consumer revokes)
        cluster.start_broker(victim)
    finally:
        consumer.close()
    assert seen == ([[0]], [])
    assert state == "Stable"
    assert [m[0] for m in after] == [member]
    assert after == before  # the same member, at the same epoch (KIP-848)


def _described(bootstrap: str, group: str, protocol: str) -> tuple[str, list[tuple[str, int]]]:
    """The group's state and its (member id, member epoch) pairs (-1: classic, no epoch)."""
    if protocol == "classic":
        g = wire.call(bootstrap, 15, 5, groups=[group],
                      include_authorized_operations=False)["groups"][0]  # fmt: skip
        return g["group_state"], [(m["member_id"], -1) for m in g["members"]]
    g = wire.call(bootstrap, 69, 1, group_ids=[group],
                  include_authorized_operations=False)["groups"][0]  # fmt: skip
    return g["group_state"], [(m["member_id"], m["member_epoch"]) for m in g["members"]]


def _describe(bootstrap: str, topic: str, names: list[str]) -> dict[str, tuple[str, int]]:
    r = wire.call(bootstrap, 32, 4, include_synonyms=False, include_documentation=False,
                  resources=[{"resource_type": 2, "resource_name": topic,
                              "configuration_keys": names}])["results"][0]  # fmt: skip
    return {c["name"]: (c["value"], c["config_source"]) for c in r["configs"]}


def test_config_changes_reach_every_broker(cluster):
    """AlterConfigs (legacy, whole) and IncrementalAlterConfigs change the topic in etcd: every
    broker describes, and enforces, the new configs."""
    topic = "cfg"
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    admin.create_topics([NewTopic(topic, 1, 3, config={"retention.ms": "3600000"})])[topic].result(
        30
    )
    _in_sync(cluster, topic, 1)
    live = _live(cluster)
    names = ["retention.ms", "retention.bytes", "max.message.bytes"]
    r = wire.call(live[0].bootstrap, 33, 2, validate_only=False, resources=[
        {"resource_type": 2, "resource_name": topic,
         "configs": [{"name": "retention.bytes", "value": "100000"}]}])  # fmt: skip
    assert r["responses"][0]["error_code"] == 0, r
    for b in live:
        # (A broker whose watch of etcd has not brought it the new topic yet describes none.)
        got = until(lambda b=b: (d := _describe(b.bootstrap, topic, names)).get(
                    "retention.bytes", (None,))[0] == "100000" and d,
                    f"broker {b.node_id} sees the legacy change")  # fmt: skip
        assert got["retention.ms"][1] != 1  # no longer overridden: replaced as a whole
    r = wire.call(live[1].bootstrap, 44, 1, validate_only=False, resources=[
        {"resource_type": 2, "resource_name": topic, "configs": [
            {"name": "max.message.bytes", "config_operation": 0, "value": "300"}]}])  # fmt: skip
    assert r["responses"][0]["error_code"] == 0, r
    for b in live:
        until(lambda b=b: _describe(b.bootstrap, topic, names).get("max.message.bytes")
              == ("300", 1), f"broker {b.node_id} sees the incremental change")  # fmt: skip
    leader = _leader(cluster, topic, 0)
    from stratalog.records import build_batch

    big = build_batch([(b"k", b"x" * 600, int(time.time() * 1000))])
    assert wire.produce(leader.bootstrap, topic, 0, big)["error_code"] == 10  # MESSAGE_TOO_LARGE
    # A broker started later takes the topic's configs from etcd.
    b = live[2]
    cluster.stop_broker(b)
    cluster.start_broker(b)
    assert _describe(b.bootstrap, topic, names)["max.message.bytes"] == ("300", 1)


def test_client_quotas_are_the_clusters(cluster):
    """AlterClientQuotas on one broker: every broker describes the quota (etcd holds it), one
    started afterwards too, and each enforces it on the bytes it serves (as Kafka's brokers
    each do)."""
    client = "quota-client"
    live = _live(cluster)
    entity = [{"entity_type": "client-id", "entity_name": client}]
    r = wire.call(live[0].bootstrap, 49, 1, validate_only=False, entries=[
        {"entity": entity, "ops": [{"key": "producer_byte_rate", "value": 2048.0,
                                    "remove": False}]}])  # fmt: skip
    assert r["entries"][0]["error_code"] == 0, r

    def described(b: BrokerProc) -> list:
        r = wire.call(b.bootstrap, 48, 1, strict=False, components=[
            {"entity_type": "client-id", "match_type": 0, "match": client}])  # fmt: skip
        return [[(v["key"], v["value"]) for v in e["values"]] for e in r["entries"]]

    for b in live:
        until(lambda b=b: described(b) == [[("producer_byte_rate", 2048.0)]],
              f"broker {b.node_id} describes the quota")  # fmt: skip
    b = live[1]
    cluster.stop_broker(b)
    cluster.start_broker(b)
    assert described(b) == [[("producer_byte_rate", 2048.0)]]
    # Enforced by a partition's leader: 4 KiB produces, the seventh is over 2048 B/s.
    topic = "quota-topic"
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    admin.create_topics([NewTopic(topic, 1, 3)])[topic].result(30)
    _in_sync(cluster, topic, 1)
    from stratalog.records import build_batch

    from ..conformance.test_quotas import Session

    s = Session(_leader(cluster, topic, 0).bootstrap, client)
    throttles = []
    try:
        for _ in range(7):
            batch = build_batch([(b"k", b"v" * 4000, int(time.time() * 1000))])
            r, _took = s.call(0, 9, transactional_id=None, acks=-1, timeout=10000, topic_data=[
                {"name": topic, "partition_data": [{"index": 0, "records": batch}]}])  # fmt: skip
            throttles.append(r["throttle_time"] > 0)
    finally:
        s.close()
    assert throttles[-1] and not throttles[0]
    # Removed on another broker: gone everywhere.
    r = wire.call(live[2].bootstrap, 49, 1, validate_only=False, entries=[
        {"entity": entity, "ops": [{"key": "producer_byte_rate", "value": 0.0,
                                    "remove": True}]}])  # fmt: skip
    assert r["entries"][0]["error_code"] == 0, r
    for b in live:
        until(lambda b=b: described(b) == [], f"broker {b.node_id} forgets the quota")
