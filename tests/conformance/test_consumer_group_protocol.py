"""The consumer group protocol (KIP-848) against the reference Kafka.

Kafka computes target assignments apart from the heartbeat that caused them, so the epochs and
assignments of a join's first answers depend on when its assignor ran. The scenarios therefore
compare groups once they settled (every member at the assignment epoch, its assignment its
target), and what settles: which partitions are covered and how many each member holds, the
group's type, state and assignor in ListGroups, ConsumerGroupDescribe and DescribeGroups,
committed offsets, and the errors of bad requests.
"""

from __future__ import annotations

import struct
import time
import uuid
from typing import Any

from confluent_kafka import Consumer, Producer

from . import wire
from .conftest import both
from .deliberate import check_deliberate

SETTLE_S = 60  # Kafka tells members to heartbeat every 5 s; a hand-over takes two heartbeats


def _describe(bs: str, group: str) -> dict[str, Any]:
    r = wire.call(bs, 69, 1, group_ids=[group], include_authorized_operations=False)
    return r["groups"][0]


def _listed(bs: str, group: str) -> list[dict[str, Any]]:
    groups = wire.call(bs, 16, 5, states_filter=[], types_filter=[])["groups"]
    return [g for g in groups if g["group_id"] == group]


def _partitions(assignment: dict[str, Any]) -> set[tuple[str, int]]:
    # Kafka lists an assignment's topics and partitions from hash sets: compared as sets.
    return {
        (tp["topic_name"], p) for tp in assignment["topic_partitions"] for p in tp["partitions"]
    }


def _settled(d: dict[str, Any]) -> bool:
    return d["group_state"] == "Stable" and all(
        m["member_epoch"] == d["assignment_epoch"]
        and _partitions(m["assignment"]) == _partitions(m["target_assignment"])
        for m in d["members"]
    )


def _group_view(bs: str, group: str) -> dict[str, Any]:
    """What both brokers must agree on about a settled group (epochs and ids aside)."""
    d = _describe(bs, group)
    members = sorted(
        (
            m["client_id"],
            m["member_type"],
            tuple(sorted(m["subscribed_topic_names"])),  # a set in Kafka: no order
            m["subscribed_topic_regex"],
            sum(len(tp["partitions"]) for tp in m["assignment"]["topic_partitions"]),
        )
        for m in d["members"]
    )
    owned = sorted(
        (tp["topic_name"], p)
        for m in d["members"]
        for tp in m["assignment"]["topic_partitions"]
        for p in tp["partitions"]
    )
    described = wire.call(bs, 15, 5, groups=[group], include_authorized_operations=False)
    return {
        "state": d["group_state"],
        "assignor": d["assignor_name"],
        "members": members,
        "owned": owned,
        "listed": _listed(bs, group),
        "describe_groups": described["groups"],
    }


def _read(consumers: dict[str, Consumer], seen: set[tuple[int, int]]) -> None:
    """One poll of each member; what it read goes into ``seen`` and is committed."""
    for c in consumers.values():
        msgs = c.consume(num_messages=100, timeout=0.05)
        seen.update((m.partition(), m.offset()) for m in msgs if m.error() is None)
        if msgs:
            c.commit(asynchronous=False)


def _settle(
    bs: str, group: str, consumers: dict[str, Consumer], partitions: int, seen: set
) -> dict:
    deadline = time.monotonic() + SETTLE_S
    while True:
        _read(consumers, seen)
        owned = [tp.partition for c in consumers.values() for tp in c.assignment()]
        d = _describe(bs, group)
        if (
            sorted(owned) == list(range(partitions))
            and all(c.assignment() for c in consumers.values())
            and len(d["members"]) == len(consumers)
            and _settled(d)
        ):
            return _group_view(bs, group)
        assert time.monotonic() < deadline, (owned, d)


def _member(bs: str, group: str, topic: str, name: str) -> Consumer:
    c = Consumer({"bootstrap.servers": bs, "group.id": group, "group.protocol": "consumer",
                  "client.id": name, "auto.offset.reset": "earliest",
                  "enable.auto.commit": False})  # fmt: skip
    c.subscribe([topic])
    return c


def librdkafka_members(bs: str, topic: str, group: str) -> dict[str, Any]:
    parts = 6
    assert wire.create_topic(bs, topic, parts) == 0
    wire.wait_for_topic(bs, topic, parts)
    p = Producer({"bootstrap.servers": bs})
    for i in range(60):
        p.produce(topic, value=b"v%d" % i, partition=i % parts)
    assert p.flush(30) == 0
    out: dict[str, Any] = {}
    seen: set[tuple[int, int]] = set()
    members = {n: _member(bs, group, topic, n) for n in ("m1", "m2")}
    try:
        out["two"] = _settle(bs, group, members, parts, seen)
        members["m3"] = _member(bs, group, topic, "m3")
        out["three"] = _settle(bs, group, members, parts, seen)
        members.pop("m1").close()
        out["after_leave"] = _settle(bs, group, members, parts, seen)
        # The remaining members read the rest and commit it.
        deadline = time.monotonic() + SETTLE_S
        while len(seen) < 60:
            _read(members, seen)
            assert time.monotonic() < deadline, len(seen)
    finally:
        for c in members.values():
            c.close()
    fetched = wire.call(bs, 9, 9, require_stable=False, groups=[
        {"group_id": group, "member_id": None, "member_epoch": -1, "topics": None}])  # fmt: skip
    out["committed"] = fetched["groups"]
    d = _describe(bs, group)
    out["empty"] = {"state": d["group_state"], "members": d["members"]}
    out["empty_listed"] = _listed(bs, group)
    return out


def test_librdkafka_members_settle_alike(pair, name):
    strat, kafka = both(pair, librdkafka_members, name, f"{name}-group")
    assert wire.normalise(strat) == wire.normalise(kafka)
    topic_parts = [(name, p) for p in range(6)]
    for phase, counts in (("two", [3, 3]), ("three", [2, 2, 2]), ("after_leave", [3, 3])):
        view = kafka[phase]
        assert view["owned"] == topic_parts and view["state"] == "Stable"
        assert sorted(m[-1] for m in view["members"]) == counts
        assert view["listed"][0]["group_type"] == "consumer"
    assert kafka["empty"]["state"] == "Empty"


def _hb(bs: str, version: int = 1, **fields: Any) -> dict[str, Any]:
    values = dict(rebalance_timeout=-1, subscribed_topic_names=None, topic_partitions=None)
    return wire.call(bs, 68, version, **{**values, **fields})


def _heartbeat_until_settled(
    bs: str,
    group: str,
    member: str,
    r: dict[str, Any],
    want: set[tuple[uuid.UUID, int]],
    owned: dict[str, list[int]],
) -> int:
    """Heartbeat as a client does (reporting what it owns, ``owned``, kept current: an answer
    without an assignment leaves it as it was) until the member holds ``want`` and the group
    settled; the member's epoch then."""
    deadline = time.monotonic() + SETTLE_S
    while True:
        if r["assignment"] is not None:
            owned.clear()
            owned.update(
                (tp["topic_id"], tp["partitions"]) for tp in r["assignment"]["topic_partitions"]
            )
        epoch = r["member_epoch"]
        held = {(uuid.UUID(str(t)), p) for t, ps in owned.items() for p in ps}
        described = _describe(bs, group)
        if held == want and _settled(described):
            return epoch
        assert time.monotonic() < deadline, (bs, r, held, want, described)
        time.sleep(0.3)
        report = [{"topic_id": uuid.UUID(str(t)), "partitions": ps} for t, ps in owned.items()]
        r = _hb(bs, group_id=group, member_id=member, member_epoch=epoch, topic_partitions=report)
        assert r["error_code"] == 0, r


def bad_requests(bs: str, topic: str, group: str, member: str) -> dict[str, Any]:
    assert wire.create_topic(bs, topic, 2) == 0
    wire.wait_for_topic(bs, topic, 2)
    tid = wire.topic_id(bs, topic)
    out: dict[str, Any] = {}
    join = dict(group_id=group, member_id=member, member_epoch=0, rebalance_timeout=30000,
                subscribed_topic_names=[topic], topic_partitions=[])  # fmt: skip
    r = _hb(bs, **join)
    assert r["error_code"] == 0, r
    owned: dict[str, list[int]] = {}
    epoch = _heartbeat_until_settled(bs, group, member, r, {(tid, 0), (tid, 1)}, owned)
    # A second topic joins the subscription: a new target, so the member's epoch moves on and
    # an older epoch than its previous one exists on both brokers.
    assert wire.create_topic(bs, f"{topic}-b", 1) == 0
    wire.wait_for_topic(bs, f"{topic}-b", 1)
    tid_b = wire.topic_id(bs, f"{topic}-b")
    r = _hb(bs, group_id=group, member_id=member, member_epoch=epoch,
            subscribed_topic_names=[topic, f"{topic}-b"])  # fmt: skip
    assert r["error_code"] == 0, r
    want = {(tid, 0), (tid, 1), (tid_b, 0)}
    epoch = _heartbeat_until_settled(bs, group, member, r, want, owned)
    out["settled"] = _group_view(bs, group)
    beat = dict(group_id=group, member_id=member)
    out["greater_epoch"] = _hb(bs, **beat, member_epoch=epoch + 5)
    not_its_own = [{"topic_id": tid, "partitions": [0, 1, 5]}]
    out["smaller_epoch"] = _hb(bs, **beat, member_epoch=epoch - 1, topic_partitions=not_its_own)
    out["unknown_member"] = _hb(bs, group_id=group, member_id=str(uuid.UUID(int=7)),
                                member_epoch=epoch)  # fmt: skip
    out["leave_unknown_group"] = _hb(bs, **dict(beat, group_id=f"{group}-missing"), member_epoch=-1)
    out["invalid_assignor"] = _hb(bs, **dict(join, member_id=str(uuid.UUID(int=8))),
                                  server_assignor="no-such-assignor")  # fmt: skip
    out["empty_member_id"] = _hb(bs, **dict(join, member_id=""))
    out["join_without_rebalance_timeout"] = _hb(bs, **dict(join, rebalance_timeout=-1))
    out["join_owning_partitions"] = _hb(
        bs, **dict(join, topic_partitions=[{"topic_id": tid, "partitions": [0]}])
    )
    out["join_without_subscription"] = _hb(bs, **dict(join, subscribed_topic_names=None))
    out["bad_regex"] = _hb(bs, **dict(join, subscribed_topic_names=None),
                           subscribed_topic_regex="(")  # fmt: skip
    out["bad_epoch"] = _hb(bs, **beat, member_epoch=-3)

    commit = dict(group_id=group, member_id=member, group_instance_id=None, topics=[
        {"name": topic, "partitions": [{"partition_index": 0, "committed_offset": 5,
                                        "committed_leader_epoch": -1,
                                        "committed_metadata": ""}]}])  # fmt: skip
    out["commit_stale"] = wire.call(bs, 8, 9, **commit, generation_id_or_member_epoch=epoch + 1)
    out["commit_v8"] = wire.call(bs, 8, 8, **commit, generation_id_or_member_epoch=epoch)
    out["commit_not_a_member"] = wire.call(
        bs, 8, 9, **dict(commit, member_id=""), generation_id_or_member_epoch=-1
    )
    out["commit"] = wire.call(bs, 8, 9, **commit, generation_id_or_member_epoch=epoch)

    def fetch(member_id: str | None, member_epoch: int) -> dict[str, Any]:
        return wire.call(bs, 9, 9, require_stable=False, groups=[
            {"group_id": group, "member_id": member_id, "member_epoch": member_epoch,
             "topics": None}])  # fmt: skip

    out["fetch_stale"] = fetch(member, epoch + 1)
    out["fetch_unknown_member"] = fetch(str(uuid.UUID(int=9)), epoch)
    out["fetch"] = fetch(member, epoch)
    out["fetch_as_admin"] = fetch(None, -1)
    out["delete_live_group"] = wire.call(bs, 42, 2, groups_names=[group])
    offsets_of = dict(
        group_id=group, topics=[{"name": topic, "partitions": [{"partition_index": 0}]}]
    )
    out["offset_delete_subscribed"] = wire.call(bs, 47, 0, **offsets_of)

    out["leave"] = _hb(bs, **beat, member_epoch=-1)
    out["after_leave"] = _hb(bs, **beat, member_epoch=epoch)
    out["describe_empty"] = {k: v for k, v in _describe(bs, group).items() if "epoch" not in k}
    out["listed_empty"] = _listed(bs, group)
    out["describe_missing"] = wire.call(bs, 69, 0, group_ids=[f"{group}-missing"],
                                        include_authorized_operations=False)  # fmt: skip
    out["offset_delete_empty"] = wire.call(bs, 47, 0, **offsets_of)
    out["delete_empty_group"] = wire.call(bs, 42, 2, groups_names=[group])
    out["describe_deleted"] = _describe(bs, group)
    out["listed_deleted"] = _listed(bs, group)
    return out


def test_bad_requests_get_kafkas_errors(pair, name):
    member = str(uuid.uuid4())
    strat, kafka = both(pair, bad_requests, name, f"{name}-group", member)
    assert wire.normalise(strat) == wire.normalise(kafka), wire.differences(
        wire.normalise(strat), wire.normalise(kafka)
    )
    codes = {k: v.get("error_code") for k, v in kafka.items() if isinstance(v, dict)}
    assert codes["greater_epoch"] == codes["smaller_epoch"] == 110  # FENCED_MEMBER_EPOCH
    assert codes["unknown_member"] == codes["after_leave"] == 25  # UNKNOWN_MEMBER_ID
    assert codes["invalid_assignor"] == 112  # UNSUPPORTED_ASSIGNOR
    assert codes["leave_unknown_group"] == 69  # GROUP_ID_NOT_FOUND
    assert codes["bad_regex"] == 128  # INVALID_REGULAR_EXPRESSION
    assert codes["empty_member_id"] == codes["join_owning_partitions"] == 42  # INVALID_REQUEST
    assert kafka["commit_stale"]["topics"][0]["partitions"][0]["error_code"] == 113  # STALE
    assert kafka["fetch_stale"]["groups"][0]["error_code"] == 113
    assert kafka["leave"]["member_epoch"] == -1
    deleted = kafka["offset_delete_subscribed"]["topics"][0]["partitions"][0]
    assert deleted["error_code"] == 86  # GROUP_SUBSCRIBED_TO_TOPIC
    assert kafka["describe_deleted"]["error_code"] == 69 and kafka["listed_deleted"] == []


def _classic_member(bs: str, group: str, topic: str) -> str:
    """A classic member (JoinGroup v9, two steps) subscribed to ``topic``; its member id."""
    name = topic.encode()
    subscription = struct.pack(">hih", 0, 1, len(name)) + name + struct.pack(">i", -1)
    join = dict(group_id=group, session_timeout=30000, rebalance_timeout=30000,
                group_instance_id=None, protocol_type="consumer", reason=None,
                protocols=[{"name": "range", "metadata": subscription}])  # fmt: skip
    first = wire.call(bs, 11, 9, **join, member_id="")
    assert first["error_code"] == 79, first  # MEMBER_ID_REQUIRED
    joined = wire.call(bs, 11, 9, **join, member_id=first["member_id"])
    assert joined["error_code"] == 0, joined
    return joined["member_id"]


def mixed_protocols(bs: str, topic: str, group: str, member: str) -> dict[str, str]:
    assert wire.create_topic(bs, topic, 1) == 0
    wire.wait_for_topic(bs, topic, 1)
    joined = _hb(bs, group_id=group, member_id=member, member_epoch=0, rebalance_timeout=30000,
                 subscribed_topic_names=[topic], topic_partitions=[])  # fmt: skip
    assert joined["error_code"] == 0, joined
    classic_join = wire.call(
        bs, 11, 9, group_id=group, session_timeout=30000, rebalance_timeout=30000, member_id="",
        group_instance_id=None, protocol_type="consumer", reason=None,
        protocols=[{"name": "range", "metadata": b""}],
    )  # fmt: skip
    _classic_member(bs, f"{group}-classic", topic)
    to_classic = _hb(bs, group_id=f"{group}-classic", member_id=member, member_epoch=0,
                     rebalance_timeout=30000, subscribed_topic_names=[topic],
                     topic_partitions=[])  # fmt: skip
    return {
        "classic_join": wire.error_names(classic_join["error_code"]).upper(),
        "consumer_heartbeat_to_classic": wire.error_names(to_classic["error_code"]).upper(),
    }


def test_no_classic_members_in_consumer_groups(pair, name):
    strat, kafka = both(pair, mixed_protocols, name, f"{name}-group", str(uuid.uuid4()))
    check_deliberate(
        "groups.consumer-protocol-without-classic-members",
        strat,
        kafka,
        documented={
            "classic_join": "INCONSISTENT_GROUP_PROTOCOL",
            "consumer_heartbeat_to_classic": "GROUP_ID_NOT_FOUND",
        },
    )


def member_of_an_unknown_group(bs: str, group: str, member: str) -> dict[str, str]:
    r = _hb(bs, group_id=group, member_id=member, member_epoch=3)
    return {"heartbeat": wire.error_names(r["error_code"]).upper()}


def test_a_member_of_an_unknown_group_is_told_so(pair, name):
    """The group's records outlive restarts (test_deliberate's restart test), so an unknown
    group is one that never was or was deleted, and both answer as Kafka does."""
    strat, kafka = both(pair, member_of_an_unknown_group, f"{name}-group", str(uuid.uuid4()))
    assert strat == kafka == {"heartbeat": "GROUP_ID_NOT_FOUND"}


def java_tools(bs: str, topic: str, group: str) -> dict[str, Any]:
    """Kafka's Java consumer in the consumer protocol (kafka-console-consumer), then
    kafka-consumer-groups on the group it leaves behind."""
    from stratalog.peers.kafka import run_tool

    assert wire.create_topic(bs, topic, 3) == 0
    wire.wait_for_topic(bs, topic, 3)
    p = Producer({"bootstrap.servers": bs})
    for i in range(30):
        p.produce(topic, value=b"j%d" % i, partition=i % 3)
    assert p.flush(30) == 0

    def tool(name: str, *args: str) -> list[list[str]]:
        r = run_tool(name, "--bootstrap-server", bs, *args, timeout=120)
        assert r.returncode == 0, (r.stdout, r.stderr)
        lines = (r.stdout + r.stderr).splitlines()
        return [line.split() for line in lines if line.strip() and "WARN" not in line]

    consumed = tool(
        "kafka-console-consumer", "--topic", topic, "--group", group, "--from-beginning",
        "--max-messages", "30", "--timeout-ms", "60000",
        "--consumer-property", "group.protocol=consumer",
    )  # fmt: skip
    state = tool("kafka-consumer-groups", "--describe", "--state", "--group", group)
    return {
        "records": sorted(w[0] for w in consumed if w[0].startswith("j")),
        "offsets": tool("kafka-consumer-groups", "--describe", "--group", group),
        # GROUP COORDINATOR (ID) ASSIGNMENT-STRATEGY STATE #MEMBERS: the coordinator aside.
        "state": [row[:1] + row[-3:] for row in state],
        "listed": [r for r in tool("kafka-consumer-groups", "--list", "--type") if r[0] == group],
    }


def test_kafka_tools_alike(pair, name):
    strat, kafka = both(pair, java_tools, name, f"{name}-group")
    assert strat == kafka, wire.differences(strat, kafka)
    assert kafka["records"] == sorted(f"j{i}" for i in range(30))
    assert kafka["listed"] == [[f"{name}-group", "Consumer"]]
    assert [f"{name}-group", "uniform", "Empty", "0"] in kafka["state"]
