"""Share-group membership (broker/share_groups.py) and the simple assignor, on their own."""

from __future__ import annotations

import uuid
from collections.abc import Iterable

import pytest

from stratalog.broker.assignors import simple
from stratalog.broker.group_coordinator import GroupError
from stratalog.broker.share_groups import ShareGroups, ShareHeartbeat
from stratalog.broker.share_partition import SharePartition

from .test_consumer_groups import assert_restored, stored

T = uuid.UUID(int=1)


class Topics:
    def __init__(self, partitions: int) -> None:
        self.partitions = partitions

    def by_name(self, name: str) -> tuple[uuid.UUID, int] | None:
        return (T, self.partitions) if name == "t" else None

    def names(self) -> Iterable[str]:
        return ["t"]


def _hb(member: str, epoch: int, topics: tuple[str, ...] | None = None) -> ShareHeartbeat:
    return ShareHeartbeat("g", member, epoch, subscribed_topic_names=topics)


def _error(call) -> str:
    with pytest.raises(GroupError) as e:
        call()
    return e.value.error


def test_members_join_take_their_share_and_leave():
    groups, topics = ShareGroups(), Topics(2)
    a = groups.heartbeat(_hb("a", 0, ("t",)), topics, now=0)
    assert (a.member_epoch, a.assignment) == (1, {T: frozenset({0, 1})})
    b = groups.heartbeat(_hb("b", 0, ("t",)), topics, now=0)
    assert (b.member_epoch, b.assignment) == (2, {T: frozenset({1})})
    a = groups.heartbeat(_hb("a", 1), topics, now=1)  # moves to its new target at once
    assert (a.member_epoch, a.assignment) == (2, {T: frozenset({0})})
    assert groups.heartbeat(_hb("a", 2), topics, now=2).assignment is None  # unchanged
    assert groups.heartbeat(_hb("b", -1), topics, now=3).member_epoch == -1
    assert groups.heartbeat(_hb("a", 2), topics, now=4).assignment == {T: frozenset({0, 1})}


def test_wrong_epochs_and_unknown_members_are_refused():
    groups, topics = ShareGroups(), Topics(1)
    groups.heartbeat(_hb("a", 0, ("t",)), topics, now=0)
    assert _error(lambda: groups.heartbeat(_hb("a", 5), topics, now=1)) == "FENCED_MEMBER_EPOCH"
    assert _error(lambda: groups.heartbeat(_hb("x", 1), topics, now=1)) == "UNKNOWN_MEMBER_ID"
    assert _error(lambda: groups.heartbeat(_hb("x", -1), topics, now=1)) == "UNKNOWN_MEMBER_ID"
    gone = ShareHeartbeat("nope", "x", -1)
    assert _error(lambda: groups.heartbeat(gone, topics, now=1)) == "GROUP_ID_NOT_FOUND"
    assert _error(lambda: groups.heartbeat(_hb("b", 0), topics, now=1)) == "INVALID_REQUEST"
    assert _error(lambda: groups.heartbeat(_hb("b", -3), topics, now=1)) == "INVALID_REQUEST"


def test_a_silent_member_is_removed_and_its_records_wait_for_their_locks():
    groups, topics = ShareGroups(session_timeout_ms=100), Topics(1)
    groups.heartbeat(_hb("a", 0, ("t",)), topics, now=0)
    g = groups.group("g")
    assert g is not None
    sp = g.partitions[(T, 0)] = SharePartition(0, lock_ms=500)
    sp.acquire("a", 0, 3, 10, now=0)
    assert groups.next_deadline() == 100
    assert groups.expire(100, topics) == [("g", "a")]
    assert g.state == "Empty" and sp.fetch_from() == 3  # as Kafka: leaving releases nothing
    assert groups.next_deadline() == 500
    groups.expire(500, topics)
    assert sp.fetch_from() == 0


def test_the_simple_assignor_gives_every_member_partitions():
    subs = {m: frozenset({T}) for m in ("a", "b", "c")}
    assert simple(subs, {T: 6}, {}) == {
        "a": {T: frozenset({0, 3})},
        "b": {T: frozenset({1, 4})},
        "c": {T: frozenset({2, 5})},
    }
    # More members than partitions: each member one partition, a partition shared.
    assert simple(subs, {T: 2}, {}) == {
        "a": {T: frozenset({0})},
        "b": {T: frozenset({1})},
        "c": {T: frozenset({0})},
    }


def test_membership_comes_back_from_its_records_and_leaves_tombstones():
    """Kafka's records of types 10 to 14, encoded and decoded as __consumer_offsets holds them."""
    groups, topics = ShareGroups(session_timeout_ms=1000), Topics(3)
    table: dict = {}

    groups.heartbeat(ShareHeartbeat("g", "a", 0, rack_id="r1", subscribed_topic_names=("t",),
                                    client_id="c-a"), topics, now=0)  # fmt: skip
    groups.heartbeat(_hb("b", 0, ("t",)), topics, now=0)
    groups.heartbeat(_hb("a", 1), topics, now=1)
    stored(groups, "g", table)
    assert {k.kind for k in table} == {10, 11, 12, 13, 14}
    before = groups.group("g")

    again = ShareGroups(session_timeout_ms=1000)
    assert again.restore(table, topics, now=500) == 1
    g = again.group("g")
    assert_restored(before, g, ("epoch", "previous_epoch", "assigned", "rack_id", "client_id",
                                "subscribed_topic_names"))  # fmt: skip
    assert {m.session_deadline for m in g.members.values()} == {1500}  # new sessions from now
    assert again.changes("g") == []
    assert again.heartbeat(_hb("a", before.members["a"].epoch), topics, now=600).assignment is None

    groups.heartbeat(_hb("b", -1), topics, now=2)
    gone = [k for k, v in stored(groups, "g", table) if v is None]
    assert {(k.kind, k.member) for k in gone} == {(10, "b"), (13, "b"), (14, "b")}
