"""The consumer group protocol's state machine (broker/consumer_groups.py) and its assignors
(broker/assignors.py), driven directly: sans-IO, time passed in."""

from __future__ import annotations

import uuid

import pytest

from stratalog.broker import modern_group_records as cg
from stratalog.broker.assignors import range_, uniform
from stratalog.broker.consumer_groups import (
    ASSIGNING,
    EMPTY,
    RECONCILING,
    STABLE,
    ConsumerGroups,
    Heartbeat,
)
from stratalog.broker.group_coordinator import GroupError

T1 = uuid.UUID(int=1)
T2 = uuid.UUID(int=2)


class Topics:
    def __init__(self, **sizes: int) -> None:
        self.ids = {"t1": T1, "t2": T2}
        self.sizes = dict(sizes)

    def by_name(self, name: str):
        if name not in self.sizes:
            return None
        return self.ids.setdefault(name, uuid.uuid4()), self.sizes[name]

    def names(self):
        return list(self.sizes)


def join(groups, topics, member, now=0, names=("t1",), regex=None, group="g", assignor=None):
    return groups.heartbeat(
        Heartbeat(
            group,
            member,
            0,
            rebalance_timeout_ms=10_000,
            subscribed_topic_names=names,
            subscribed_topic_regex=regex,
            server_assignor=assignor,
            owned={},
        ),
        topics,
        now,
    )


def beat(groups, topics, member, epoch, owned=None, now=0, group="g"):
    return groups.heartbeat(Heartbeat(group, member, epoch, owned=owned), topics, now)


def parts(assignment, topic=T1) -> set[int]:
    return set(assignment.get(topic, ())) if assignment is not None else set()


def error_of(call) -> str:
    with pytest.raises(GroupError) as e:
        call()
    return e.value.error


def test_first_member_gets_every_partition() -> None:
    groups, topics = ConsumerGroups(), Topics(t1=4)
    a = join(groups, topics, "a")
    assert a.member_epoch == 1 and parts(a.assignment) == {0, 1, 2, 3}
    assert a.heartbeat_interval_ms == 5000
    again = beat(groups, topics, "a", 1)
    assert again.member_epoch == 1 and again.assignment is None  # unchanged: not sent
    assert groups.group("g").state == STABLE


def test_partition_moves_only_after_its_owner_revoked_it() -> None:
    groups, topics = ConsumerGroups(), Topics(t1=4)
    join(groups, topics, "a")
    b = join(groups, topics, "b")
    # b's target holds two partitions, but a still owns them: b gets nothing yet.
    target_b = groups.group("g").target["b"]
    assert len(parts(target_b)) == 2
    assert parts(b.assignment) == set() and b.member_epoch == 2
    assert groups.group("g").state == RECONCILING
    # a learns its shrunk assignment and keeps its epoch until it revokes.
    a = beat(groups, topics, "a", 1, owned={T1: frozenset({0, 1, 2, 3})})
    assert a.member_epoch == 1 and parts(a.assignment) == {0, 1, 2, 3} - parts(target_b)
    # Still reporting the partitions: nothing moves.
    assert beat(groups, topics, "b", 2).assignment is None
    a = beat(groups, topics, "a", 1, owned={T1: frozenset({0, 1, 2, 3})})
    assert a.member_epoch == 1
    assert parts(beat(groups, topics, "b", 2).assignment) == set()
    # a revokes: it moves to the new epoch, and b's next heartbeat gets the partitions.
    kept = frozenset(parts(a.assignment))
    a = beat(groups, topics, "a", 1, owned={T1: kept})
    assert a.member_epoch == 2
    b = beat(groups, topics, "b", 2)
    assert parts(b.assignment) == parts(target_b)
    assert groups.group("g").state == STABLE


def test_member_epoch_fencing_and_unknown_members() -> None:
    groups, topics = ConsumerGroups(), Topics(t1=2)
    join(groups, topics, "a")
    assert error_of(lambda: beat(groups, topics, "a", 7)) == "FENCED_MEMBER_EPOCH"
    assert error_of(lambda: beat(groups, topics, "nobody", 1)) == "UNKNOWN_MEMBER_ID"
    # A group the broker does not know (its records outlive restarts): as Kafka answers.
    assert error_of(lambda: beat(groups, topics, "a", 1, group="other")) == "GROUP_ID_NOT_FOUND"
    assert groups.group("other") is None
    # The previous epoch is accepted while the member owns only partitions still its own (the
    # answer that moved it on may have been lost); owning more is fenced.
    join(groups, topics, "b")
    beat(groups, topics, "a", 1, owned={T1: frozenset({0, 1})})
    a = beat(groups, topics, "a", 1, owned={T1: frozenset(parts(groups.group("g").target["a"]))})
    assert a.member_epoch == 2
    assert beat(groups, topics, "a", 1, owned={}).member_epoch == 2
    assert error_of(lambda: beat(groups, topics, "a", 1, owned={T1: frozenset({0, 1})})) == (
        "FENCED_MEMBER_EPOCH"
    )


def test_bad_requests() -> None:
    groups, topics = ConsumerGroups(), Topics(t1=2)

    def hb(**kw):
        fields = dict(
            group_id="g",
            member_id="m",
            member_epoch=0,
            rebalance_timeout_ms=1000,
            subscribed_topic_names=("t1",),
            owned={},
        )
        return lambda: groups.heartbeat(Heartbeat(**{**fields, **kw}), topics, 0)

    assert error_of(hb(server_assignor="sticky")) == "UNSUPPORTED_ASSIGNOR"
    assert error_of(hb(group_id="")) == "INVALID_REQUEST"
    assert error_of(hb(rebalance_timeout_ms=-1)) == "INVALID_REQUEST"
    assert error_of(hb(owned={T1: frozenset({0})})) == "INVALID_REQUEST"
    assert error_of(hb(owned=None)) == "INVALID_REQUEST"
    assert error_of(hb(subscribed_topic_names=None)) == "INVALID_REQUEST"
    assert error_of(hb(member_epoch=-3)) == "INVALID_REQUEST"
    assert error_of(hb(member_epoch=3, member_id="")) == "INVALID_REQUEST"
    assert error_of(hb(subscribed_topic_regex="(")) == "INVALID_REGULAR_EXPRESSION"
    assert groups.group("g") is None  # nothing was created by refused requests


def test_leave_and_expiry_free_partitions_for_the_rest() -> None:
    groups, topics = ConsumerGroups(session_timeout_ms=1000), Topics(t1=4)
    join(groups, topics, "a", now=0)
    join(groups, topics, "b", now=0)
    join(groups, topics, "c", now=0)
    # a leaves: its partitions are free at once, and the others' targets cover everything.
    left = groups.heartbeat(Heartbeat("g", "a", -1), topics, 10)
    assert left.member_epoch == -1
    g = groups.group("g")
    assert set(g.members) == {"b", "c"} and g.group_epoch == g.assignment_epoch
    assert parts(g.target["b"]) | parts(g.target["c"]) == {0, 1, 2, 3}
    # c keeps heartbeating, b goes silent and is removed after the session timeout.
    for now in (500, 900):
        beat(groups, topics, "c", g.members["c"].epoch, now=now)
    assert groups.expire(999, topics) == []
    assert groups.expire(1000, topics) == [("g", "b")]
    c = beat(groups, topics, "c", g.members["c"].epoch, now=1100)
    assert parts(c.assignment) == {0, 1, 2, 3}
    groups.heartbeat(Heartbeat("g", "c", -1), topics, 1200)
    assert g.state == EMPTY and groups.group("g") is g  # an empty group stays, as in Kafka


def test_a_member_that_does_not_revoke_in_time_is_removed() -> None:
    groups, topics = ConsumerGroups(), Topics(t1=2)
    join(groups, topics, "a", now=0)
    join(groups, topics, "b", now=0)
    beat(groups, topics, "a", 1, owned={T1: frozenset({0, 1})}, now=100)  # told to revoke one
    assert groups.group("g").members["a"].rebalance_deadline == 100 + 10_000
    assert groups.expire(10_099, topics) == []
    assert groups.expire(10_100, topics) == [("g", "a")]
    b = beat(groups, topics, "b", 2, now=10_200)
    assert parts(b.assignment) == {0, 1}


def test_rejoin_after_fencing_releases_the_old_incarnation() -> None:
    groups, topics = ConsumerGroups(), Topics(t1=2)
    join(groups, topics, "a")
    join(groups, topics, "b")
    a = beat(groups, topics, "a", 1, owned={T1: frozenset({0, 1})})
    kept = frozenset(parts(a.assignment))
    beat(groups, topics, "a", 1, owned={T1: kept})
    beat(groups, topics, "b", 2)
    # a is fenced (a stale epoch it cannot justify) and rejoins with epoch 0 and nothing owned.
    assert error_of(lambda: beat(groups, topics, "a", 5)) == "FENCED_MEMBER_EPOCH"
    again = join(groups, topics, "a")
    assert again.member_epoch > 2
    g = groups.group("g")
    owners = [m for m in g.members.values() for p in parts(m.assigned)]
    assert len(owners) <= 2  # never more owners than partitions


def test_new_partitions_and_topics_are_picked_up() -> None:
    groups, topics = ConsumerGroups(), Topics(t1=2)
    join(groups, topics, "a", names=("t1", "t2"))  # t2 does not exist yet
    epoch = groups.group("g").group_epoch
    topics.sizes["t1"] = 3
    a = beat(groups, topics, "a", 1)
    assert parts(a.assignment) == {0, 1, 2} and groups.group("g").group_epoch == epoch + 1
    topics.sizes["t2"] = 1
    a = beat(groups, topics, "a", a.member_epoch)
    assert parts(a.assignment, T2) == {0}


def test_regex_subscription_follows_matching_topics() -> None:
    groups, topics = ConsumerGroups(), Topics(t1=1)
    a = join(groups, topics, "a", names=None, regex="t.*")
    assert parts(a.assignment) == {0}
    topics.sizes["t2"] = 2
    a = beat(groups, topics, "a", a.member_epoch)
    assert parts(a.assignment, T2) == {0, 1}
    assert groups.group("g").state == STABLE


def test_states_and_assignor_choice() -> None:
    groups, topics = ConsumerGroups(), Topics(t1=4)
    join(groups, topics, "a", assignor="range")
    g = groups.group("g")
    assert g.assignor == "range" and g.state == STABLE
    g.group_epoch += 1  # as a subscription change would, before the next heartbeat
    assert g.state == ASSIGNING


# -- assignors ---------------------------------------------------------------------------------
def _flat(result) -> list[tuple[uuid.UUID, int]]:
    return sorted((t, p) for a in result.values() for t, ps in a.items() for p in ps)


def test_uniform_covers_every_partition_once_and_balances() -> None:
    subs = {m: frozenset({T1, T2}) for m in "abc"}
    out = uniform(subs, {T1: 5, T2: 3}, {})
    assert _flat(out) == sorted([(T1, p) for p in range(5)] + [(T2, p) for p in range(3)])
    counts = sorted(sum(len(ps) for ps in a.values()) for a in out.values())
    assert counts == [2, 3, 3]


def test_uniform_is_sticky() -> None:
    subs = {m: frozenset({T1}) for m in "ab"}
    before = uniform(subs, {T1: 6}, {})
    after = uniform({**subs, "c": frozenset({T1})}, {T1: 6}, before)
    for m in "ab":  # the old members keep a subset of what they had
        assert after[m][T1] <= before[m][T1]
    assert len(after["c"][T1]) == 2


def test_uniform_with_different_subscriptions() -> None:
    subs = {"a": frozenset({T1, T2}), "b": frozenset({T2})}
    out = uniform(subs, {T1: 2, T2: 2}, {})
    assert _flat(out) == [(T1, 0), (T1, 1), (T2, 0), (T2, 1)]
    assert out["b"].get(T1) is None and len(out["b"][T2]) == 2  # b takes what it can


def test_range_splits_each_topic_in_ranges() -> None:
    out = range_({"a": frozenset({T1}), "b": frozenset({T1})}, {T1: 5}, {})
    assert out["a"][T1] == {0, 1, 2} and out["b"][T1] == {3, 4}


def test_commit_and_fetch_validation() -> None:
    groups, topics = ConsumerGroups(), Topics(t1=1)
    assert groups.validate_commit("g", "m", 3, 9) is None  # not a consumer group: classic rules
    join(groups, topics, "a")
    assert groups.validate_commit("g", "a", 1, 9) == "NONE"
    assert groups.validate_commit("g", "a", 2, 9) == "STALE_MEMBER_EPOCH"
    assert groups.validate_commit("g", "a", 1, 8) == "UNSUPPORTED_VERSION"
    assert groups.validate_commit("g", "x", 1, 9) == "UNKNOWN_MEMBER_ID"
    assert groups.validate_commit("g", "", -1, 9) == "UNKNOWN_MEMBER_ID"  # the group has members
    # TxnOffsetCommit: any version; a producer without group metadata passes.
    assert groups.validate_commit("g", "a", 1, 0, transactional=True) == "NONE"
    assert groups.validate_commit("g", "", -1, 0, transactional=True) == "NONE"
    assert groups.validate_commit("g", "a", 0, 0, transactional=True) == "STALE_MEMBER_EPOCH"
    assert groups.validate_fetch("g", None, -1) == "NONE"
    assert groups.validate_fetch("g", "a", 1) == "NONE"
    assert groups.validate_fetch("g", "a", 4) == "STALE_MEMBER_EPOCH"
    assert groups.validate_fetch("g", "x", 1) == "UNKNOWN_MEMBER_ID"
    groups.heartbeat(Heartbeat("g", "a", -1), topics, 0)
    assert groups.validate_commit("g", "", -1, 9) == "NONE"  # empty: commits from outside


# -- durability: Kafka's records of the group (modern_group_records.py) ---------------------
def stored(groups, group: str, table: dict) -> list:
    """Put what the broker would write (``groups.changes``, each encoded and decoded as a
    record) into ``table`` as __consumer_offsets would hold it; the changes."""
    changes = groups.changes(group)
    for k, v in changes:
        key = cg.decode_key(cg.encode_key(k))
        assert key == k
        value = cg.decode_value(key, None if v is None else cg.encode_value(key, v))
        if value is None:
            table.pop(key, None)
        else:
            table[key] = value
    return changes


def assert_restored(before, g, fields: tuple[str, ...]) -> None:
    """``g``, restored from records, is ``before``: its epochs, targets, and each member's
    ``fields``."""
    assert (g.group_epoch, g.assignment_epoch, g.target) == (
        before.group_epoch, before.assignment_epoch, before.target
    )  # fmt: skip
    assert set(g.members) == set(before.members)
    for mid, m in before.members.items():
        n = g.members[mid]
        assert [getattr(n, f) for f in fields] == [getattr(m, f) for f in fields], mid


def test_a_group_mid_reconciliation_comes_back_from_its_records() -> None:
    groups, topics = ConsumerGroups(session_timeout_ms=1000), Topics(t1=4, t2=1)
    table: dict = {}
    join(groups, topics, "a", names=("t1", "t2"), assignor="range")
    stored(groups, "g", table)
    assert {(k.kind, k.member) for k in table} == {(3, ""), (6, ""), (5, "a"), (7, "a"), (8, "a")}
    b = join(groups, topics, "b")
    a = beat(groups, topics, "a", 1, owned={T1: frozenset(range(4)), T2: frozenset({0})})
    stored(groups, "g", table)
    before = groups.group("g")
    assert before.state == RECONCILING and before.members["a"].pending_revocation

    # A new coordinator (or a restart) loads the records: the same group, members and epochs.
    again = ConsumerGroups(session_timeout_ms=1000)
    assert again.restore(table, topics, now=5000) == 1
    g = again.group("g")
    assert_restored(before, g, ("epoch", "previous_epoch", "state", "assigned",
                                "pending_revocation", "subscribed_topic_names", "server_assignor",
                                "rebalance_timeout_ms"))  # fmt: skip
    assert {m.session_deadline for m in g.members.values()} == {6000}  # new sessions from now
    assert again.changes("g") == []  # nothing to write again
    # The members go on from where they were: a revokes, b gets what a gave up.
    kept = frozenset(parts(a.assignment))
    a2 = again.heartbeat(
        Heartbeat("g", "a", a.member_epoch, owned={T1: kept, T2: frozenset({0})}), topics, 5000
    )
    assert a2.member_epoch == g.assignment_epoch
    b2 = again.heartbeat(Heartbeat("g", "b", b.member_epoch), topics, 5000)
    assert parts(b2.assignment) == parts(g.target["b"]) and b2.member_epoch == g.assignment_epoch


def test_members_that_leave_and_a_deleted_group_leave_tombstones() -> None:
    groups, topics = ConsumerGroups(), Topics(t1=2)
    table: dict = {}
    join(groups, topics, "a")
    join(groups, topics, "b")
    stored(groups, "g", table)
    beat(groups, topics, "b", -1)  # leaves
    changes = dict(groups.changes("g"))
    assert {k.member for k, v in changes.items() if v is None} == {"b"}
    assert {k.kind for k, v in changes.items() if v is None} == {5, 7, 8}
    beat(groups, topics, "a", -1)
    groups.changes("g")
    groups.forget("g")  # DeleteGroups
    gone = groups.changes("g")
    assert gone and all(v is None for _k, v in gone)
    assert {k.kind for k, _v in gone} == {3, 6}
    again = ConsumerGroups()
    assert again.restore({}, topics, now=0) == 0


def test_records_whose_write_failed_are_written_again_with_the_next_change() -> None:
    groups, topics = ConsumerGroups(), Topics(t1=2)
    join(groups, topics, "a")
    first = groups.changes("g")
    groups.unwritten("g", first)  # (the broker's write of them failed)
    assert groups.changes("g") == first  # nothing changed, but none of it is in the log
    join(groups, topics, "b")
    groups.changes("g")
    beat(groups, topics, "b", -1)
    beat(groups, topics, "a", -1)
    groups.forget("g")
    tombstones = groups.changes("g")
    groups.unwritten("g", tombstones)
    assert groups.changes("g") == tombstones  # deleting it is tried again too
    assert all(v is None for _k, v in tombstones)
    assert {(k.kind, k.member) for k, _v in tombstones} >= {(5, "b"), (7, "b"), (8, "b"), (3, "")}
