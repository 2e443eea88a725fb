"""DeleteGroups and OffsetDelete against Apache Kafka: the answers, then what the group APIs and
a consumer see afterwards.

Raw requests cover the error rules (unknown, empty and live groups; subscribed and unsubscribed
topics, read from the members' ConsumerProtocol subscriptions; a live group of another protocol
type; missing topics and partitions; duplicates); confluent-kafka's and kafka-python's admin
clients and ``kafka-consumer-groups --delete`` / ``--delete-offsets`` run the same deletions as
operators do; committed offsets, DescribeGroups, ListGroups and a restarted consumer's position
show the result. A Stratalog broker restarted on its data keeps the deletions.
"""

from __future__ import annotations

import struct
import time
from typing import Any

import pytest
from confluent_kafka import Consumer, ConsumerGroupTopicPartitions, TopicPartition
from confluent_kafka.admin import AdminClient
from kafka.admin import KafkaAdminClient
from kafka.structs import TopicPartition as KpTopicPartition

from stratalog.records import build_batch

from ..conftest import BrokerProcess
from . import wire
from .conftest import both

pytestmark = pytest.mark.kafka

BASE_TS = int(time.time() * 1000) - 60_000


def err(code: int) -> str:
    return wire.error_names(code)


def subscription(*topics: str) -> bytes:
    """A ConsumerProtocol subscription v1: version, topics, no user data, no owned partitions."""
    out = struct.pack(">hi", 1, len(topics))
    for t in topics:
        out += struct.pack(">h", len(t)) + t.encode()
    return out + struct.pack(">ii", -1, 0)


def commit(bs: str, group: str, offsets: dict[tuple[str, int], int], member: str = "",
           generation: int = -1) -> dict[str, Any]:  # fmt: skip
    by_topic: dict[str, list[dict[str, Any]]] = {}
    for (t, p), o in offsets.items():
        by_topic.setdefault(t, []).append(
            {"partition_index": p, "committed_offset": o, "committed_leader_epoch": -1,
             "committed_metadata": ""})  # fmt: skip
    r = wire.call(
        bs, 8, 9, group_id=group, generation_id_or_member_epoch=generation, member_id=member,
        group_instance_id=None,
        topics=[{"name": t, "partitions": parts} for t, parts in by_topic.items()],
    )  # fmt: skip
    return {
        (t["name"], p["partition_index"]): err(p["error_code"])
        for t in r["topics"]
        for p in t["partitions"]
    }


def committed(bs: str, group: str, wanted: dict[str, list[int]]) -> dict[str, Any]:
    topics = [{"name": t, "partition_indexes": ps} for t, ps in wanted.items()]
    r = wire.call(bs, 9, 9, require_stable=False, groups=[
        {"group_id": group, "member_id": None, "member_epoch": -1, "topics": topics}])  # fmt: skip
    g = r["groups"][0]
    return {
        "error": err(g["error_code"]),
        "offsets": sorted(
            (t["name"], p["partition_index"], p["committed_offset"])
            for t in g["topics"]
            for p in t["partitions"]
        ),
    }


def offset_delete(bs: str, group: str, wanted: list[tuple[str, list[int]]]) -> dict[str, Any]:
    topics = [{"name": t, "partitions": [{"partition_index": p} for p in ps]} for t, ps in wanted]
    r = wire.call(bs, 47, 0, group_id=group, topics=topics)
    return {
        "error": err(r["error_code"]),
        "partitions": sorted(
            (t["name"], p["partition_index"], err(p["error_code"]))
            for t in r["topics"]
            for p in t["partitions"]
        ),
    }


def delete_groups(bs: str, groups: list[str], version: int = 2) -> list[tuple[str, str]]:
    r = wire.call(bs, 42, version, groups_names=groups)
    # (Kafka answers in the order of the groups' coordinator partitions: sorted here.)
    return sorted((x["group_id"], err(x["error_code"])) for x in r["results"])


def describe(bs: str, group: str) -> tuple[str, str, int, str]:
    r = wire.call(bs, 15, 5, groups=[group], include_authorized_operations=False)
    g = r["groups"][0]
    return err(g["error_code"]), g["group_state"], len(g["members"]), g["protocol_type"]


def listed(bs: str, prefix: str) -> list[tuple[str, str, str, str]]:
    """The groups listed whose names start with ``prefix``: (id, state, protocol type, type).
    A group whose members all left without committing is among them: Kafka keeps it, Empty,
    until its periodic clean-up (``offsets.retention.check.interval.ms``)."""
    r = wire.call(bs, 16, 5, states_filter=[], types_filter=[])
    return sorted(
        (g["group_id"], g["group_state"], g["protocol_type"], g["group_type"])
        for g in r["groups"]
        if g["group_id"].startswith(prefix)
    )


def join(bs: str, group: str, metadata: bytes, ptype: str = "consumer") -> tuple[str, int]:
    """A single member joins (MEMBER_ID_REQUIRED, then with the id) and syncs as leader;
    returns (member id, generation)."""

    def once(member: str) -> dict[str, Any]:
        return wire.call(
            bs, 11, 9, group_id=group, session_timeout=30000, rebalance_timeout=10000,
            member_id=member, group_instance_id=None, protocol_type=ptype,
            protocols=[{"name": "range", "metadata": metadata}], reason=None,
        )  # fmt: skip

    member = once("")["member_id"]
    joined = once(member)
    assert joined["error_code"] == 0, joined
    gen = joined["generation_id"]
    synced = wire.call(
        bs, 14, 5, group_id=group, generation_id=gen, member_id=member, group_instance_id=None,
        protocol_type=ptype, protocol_name="range",
        assignments=[{"member_id": member, "assignment": b""}],
    )  # fmt: skip
    assert synced["error_code"] == 0, synced
    return member, gen


def leave(bs: str, group: str, member: str) -> None:
    members = [{"member_id": member, "group_instance_id": None, "reason": None}]
    r = wire.call(bs, 13, 5, group_id=group, members=members)
    assert r["error_code"] == 0, r


def raw_scenario(bs: str, name: str) -> dict[str, Any]:
    topic, other, missing = f"{name}-t", f"{name}-u", f"{name}-missing"
    assert wire.create_topic(bs, topic, 3) == 0
    assert wire.create_topic(bs, other, 1) == 0
    simple, live, connect, idle = (
        f"{name}-{x}" for x in ("simple", "live", "connect-left", "idle")
    )
    both_topics = {topic: [0, 1, 2], other: [0]}
    out: dict[str, Any] = {}

    # A group that only has committed offsets (generation -1, no members).
    out["commit_simple"] = commit(bs, simple, {(topic, 0): 5, (topic, 1): 6, (other, 0): 7})
    out["offset_delete_simple"] = offset_delete(
        bs, simple, [(topic, [0, 2, 9]), (missing, [0]), (other, [])]
    )
    out["after_offset_delete_simple"] = committed(bs, simple, both_topics)
    out["offset_delete_unknown_group"] = offset_delete(bs, f"{name}-nobody", [(topic, [0])])
    out["offset_delete_empty_group_id"] = offset_delete(bs, "", [(topic, [0])])

    # A live consumer group subscribed to ``topic`` only: its offsets of ``other`` can go.
    member, gen = join(bs, live, subscription(topic))
    out["commit_live"] = commit(bs, live, {(topic, 0): 3, (other, 0): 4}, member, gen)
    out["offset_delete_live"] = offset_delete(bs, live, [(topic, [0, 1]), (other, [0])])
    out["after_offset_delete_live"] = committed(bs, live, both_topics)
    out["delete_live_group"] = delete_groups(bs, [live])
    out["describe_live"] = describe(bs, live)
    # A live group of another protocol type cannot have offsets deleted at all.
    c_member, _ = join(bs, connect, b"\x00\x00anything", ptype="connect")
    out["offset_delete_connect"] = offset_delete(bs, connect, [(other, [0])])
    leave(bs, connect, c_member)
    out["describe_connect_left"] = describe(bs, connect)

    # Once the member left: the group (offsets and all) can be deleted, once.
    leave(bs, live, member)
    out["listed_before"] = listed(bs, name)
    out["delete_groups"] = delete_groups(bs, [live, live, simple, f"{name}-nobody"])
    out["after_delete"] = committed(bs, live, both_topics)
    out["describe_after_delete"] = describe(bs, live)
    out["listed_after"] = listed(bs, name)
    out["delete_again"] = delete_groups(bs, [live])
    # A group whose member left without committing anything.
    idle_member, _ = join(bs, idle, subscription(topic))
    leave(bs, idle, idle_member)
    out["describe_idle"] = describe(bs, idle)
    out["listed_idle"] = listed(bs, idle)
    out["delete_idle"] = delete_groups(bs, [idle, ""])
    out["listed_idle_after_delete"] = listed(bs, idle)
    out["describe_idle_after_delete"] = describe(bs, idle)
    # Committing again makes a new group.
    out["commit_again"] = commit(bs, live, {(topic, 2): 9})
    out["after_commit_again"] = committed(bs, live, {topic: [0, 2]})
    return out


def test_group_admin_raw(pair, name):
    strat, kafka = both(pair, raw_scenario, name)
    assert strat == kafka, wire.differences(strat, kafka)


@pytest.mark.parametrize("version", [0, 1])
def test_delete_groups_old_versions(pair, name, version):
    def scenario(bs: str) -> list[tuple[str, str]]:
        topic = f"{name}-t"
        assert wire.create_topic(bs, topic, 1) == 0
        commit(bs, f"{name}-g", {(topic, 0): 1})
        return delete_groups(bs, [f"{name}-g", f"{name}-none"], version)

    strat, kafka = both(pair, scenario)
    assert strat == kafka


def _produce(bs: str, topic: str, partitions: int, per: int) -> None:
    for p in range(partitions):
        recs = [(b"k%d" % i, b"v%d-%d" % (p, i), BASE_TS + i) for i in range(per)]
        assert wire.produce(bs, topic, p, build_batch(recs))["error_code"] == 0


def _resumes_at(bs: str, group: str, topic: str, partitions: int) -> list[tuple[int, int]]:
    """Where a consumer of the group starts in each partition (auto.offset.reset=earliest):
    its committed offset, or 0 once the offset is gone."""
    c = Consumer({"bootstrap.servers": bs, "group.id": group, "enable.auto.commit": False,
                  "auto.offset.reset": "earliest"})  # fmt: skip
    try:
        c.assign([TopicPartition(topic, p) for p in range(partitions)])
        first: dict[int, int] = {}
        deadline = time.monotonic() + 30
        while len(first) < partitions and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is not None and m.error() is None:
                first.setdefault(m.partition(), m.offset())
        return sorted(first.items())
    finally:
        c.close()


def _name(error: Any) -> str | None:
    """kafka-python's error (a class or an instance, or None) by name."""
    if error is None or isinstance(error, str):
        return error
    return getattr(error, "__name__", type(error).__name__)


def clients_scenario(bs: str, name: str) -> dict[str, Any]:
    topic = f"{name}-t"
    assert wire.create_topic(bs, topic, 2) == 0
    _produce(bs, topic, 2, 10)
    groups = [f"{name}-{i}" for i in range(4)]
    for g in groups:
        assert set(commit(bs, g, {(topic, 0): 4, (topic, 1): 6}).values()) == {"none"}
    out: dict[str, Any] = {}
    admin = AdminClient({"bootstrap.servers": bs})
    futures = admin.delete_consumer_groups([groups[0], f"{name}-nobody"], request_timeout=30)
    out["confluent_delete"] = {}
    for g, f in sorted(futures.items()):
        try:
            f.result(timeout=30)
            out["confluent_delete"][g] = "ok"
        except Exception as e:
            out["confluent_delete"][g] = e.args[0].name()
    kp = KafkaAdminClient(bootstrap_servers=bs, request_timeout_ms=30000)
    try:
        deleted = kp.delete_groups([groups[1], f"{name}-nobody"])
        items = deleted.items() if isinstance(deleted, dict) else deleted
        out["kafka_python_delete"] = sorted((g, _name(e)) for g, e in items)
        got = kp.delete_group_offsets(groups[2], [KpTopicPartition(topic, 0)])
        out["kafka_python_delete_offsets"] = sorted(
            (tp.partition, _name(e)) for tp, e in got.items()
        )
    finally:
        kp.close()
    out["resume"] = {g: _resumes_at(bs, g, topic, 2) for g in groups}
    left = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(groups[2])])
    out["listed_offsets"] = sorted(
        (tp.partition, tp.offset) for tp in left[groups[2]].result(timeout=30).topic_partitions
    )
    return out


def test_group_admin_clients(pair, name):
    strat, kafka = both(pair, clients_scenario, name)
    assert strat == kafka, wire.differences(strat, kafka)


def tool_scenario(bs: str, name: str) -> dict[str, Any]:
    from stratalog.peers.kafka import run_tool

    topic = f"{name}-t"
    assert wire.create_topic(bs, topic, 2) == 0
    g1, g2 = f"{name}-a", f"{name}-b"
    for g in (g1, g2):
        commit(bs, g, {(topic, 0): 1, (topic, 1): 2})

    def tool(*args: str) -> tuple[int, list[str]]:
        r = run_tool("kafka-consumer-groups", "--bootstrap-server", bs, *args, timeout=90)
        lines = [line.strip() for line in (r.stdout + r.stderr).splitlines() if line.strip()]
        # Kafka's column padding depends on the names' lengths only: the same on both.
        return r.returncode, [" ".join(line.split()) for line in lines if "WARN" not in line]

    out = {
        "delete_offsets": tool("--delete-offsets", "--group", g1, "--topic", f"{topic}:1"),
        "delete": tool("--delete", "--group", g2),
        "delete_missing": tool("--delete", "--group", f"{name}-nobody"),
        "committed_a": committed(bs, g1, {topic: [0, 1]}),
        "committed_b": committed(bs, g2, {topic: [0, 1]}),
    }
    return out


def test_kafka_consumer_groups_delete(pair, name):
    strat, kafka = both(pair, tool_scenario, name)
    assert strat == kafka, wire.differences(strat, kafka)
    assert strat["committed_a"]["offsets"] == [(f"{name}-t", 0, 1), (f"{name}-t", 1, -1)]


def test_group_deletions_survive_restart(tmp_path, name):
    b = BrokerProcess(tmp_path / "data").start()
    try:
        bs = b.bootstrap
        topic = f"{name}-t"
        assert wire.create_topic(bs, topic, 2) == 0
        commit(bs, f"{name}-a", {(topic, 0): 1, (topic, 1): 2})
        commit(bs, f"{name}-b", {(topic, 0): 3})
        assert offset_delete(bs, f"{name}-a", [(topic, [1])])["error"] == "none"
        assert delete_groups(bs, [f"{name}-b"]) == [(f"{name}-b", "none")]
        b.kill()  # no clean stop: the tombstones were durable before the answers
        b.start()
        assert committed(b.bootstrap, f"{name}-a", {topic: [0, 1]})["offsets"] == [
            (topic, 0, 1), (topic, 1, -1)]  # fmt: skip
        assert committed(b.bootstrap, f"{name}-b", {topic: [0]})["offsets"] == [(topic, 0, -1)]
        assert [g[0] for g in listed(b.bootstrap, name)] == [f"{name}-a"]
    finally:
        b.kill()


def _three_emptied_groups(bs: str, name: str) -> tuple[str, str, str]:
    """Groups of ``name``: one whose member joined and left (idle), one with offsets only, never
    joined (kept), one whose member committed, then left (done: its offsets keep it)."""
    topic, idle, kept, done = f"{name}-t", f"{name}-idle", f"{name}-kept", f"{name}-done"
    assert wire.create_topic(bs, topic, 1) == 0
    member, _ = join(bs, idle, subscription(topic))
    leave(bs, idle, member)
    commit(bs, kept, {(topic, 0): 1})
    member, gen = join(bs, done, subscription(topic))
    commit(bs, done, {(topic, 0): 2}, member, gen)
    leave(bs, done, member)
    return idle, kept, done


def test_a_group_its_members_left_is_dropped_at_the_clean_up_interval(tmp_path, name):
    """Stratalog alone: Kafka's clean-up runs every ``offsets.retention.check.interval.ms``
    (10 minutes by default, too long for a test); here at 1 s the group a member joined and
    left is listed Empty, then is gone (Dead), while a group with offsets stays listed."""
    settings = {"offsets.retention.check.interval.ms": "1000"}
    b = BrokerProcess(tmp_path / "data", settings=settings).start()
    try:
        bs = b.bootstrap
        idle, kept, done = _three_emptied_groups(bs, name)
        assert listed(bs, name) == [
            (done, "Empty", "consumer", "classic"),
            (idle, "Empty", "consumer", "classic"),
            (kept, "Empty", "", "classic"),
        ]
        assert describe(bs, idle) == ("none", "Empty", 0, "consumer")
        deadline = time.monotonic() + 20
        while len(listed(bs, name)) > 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert listed(bs, name) == [
            (done, "Empty", "consumer", "classic"),
            (kept, "Empty", "", "classic"),
        ]
        assert describe(bs, idle) == ("none", "Dead", 0, "")
        # A member joining again makes it a group again, of its own type.
        again, _ = join(bs, idle, b"\x00\x00anything", ptype="connect")
        assert describe(bs, idle)[1:] == ("Stable", 1, "connect")
        leave(bs, idle, again)
    finally:
        b.kill()


def test_emptied_groups_survive_a_restart_with_their_protocol_type(tmp_path, name):
    """Stratalog alone (the restart of Kafka is test_deliberate's): a group its member left,
    and one whose member committed and left, come back from their records in
    __consumer_offsets as they were listed and described before, Empty with their protocol
    type; a group with offsets only (never joined) keeps none."""
    b = BrokerProcess(tmp_path / "data").start()
    try:
        bs = b.bootstrap
        idle, kept, done = _three_emptied_groups(bs, name)
        before = listed(bs, name)
        described = describe(bs, idle)
        time.sleep(0.5)  # (an emptied group's record is written without holding up LeaveGroup)
        b.stop()
        bs = b.start().bootstrap
        assert (
            listed(bs, name)
            == before
            == [
                (done, "Empty", "consumer", "classic"),
                (idle, "Empty", "consumer", "classic"),
                (kept, "Empty", "", "classic"),
            ]
        )
        assert describe(bs, idle) == described == ("none", "Empty", 0, "consumer")
    finally:
        b.kill()
