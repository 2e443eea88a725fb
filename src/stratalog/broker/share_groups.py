"""Share groups (KIP-932): membership, assignment, and the group's share-partitions.

Sans-IO, like ``consumer_groups.py``: every call takes the time (``now``, milliseconds) and a
view of the topics. Members of a share group consume the same partitions together, records
handed out one by one (``share_partition.py``), so there is nothing to revoke: a member takes
its target assignment (the ``simple`` assignor) at its next heartbeat.

The rules are Kafka's ShareGroupHeartbeat's: a member joins with epoch 0 and its subscribed
topic names; a join, a leave or a changed subscription (or a subscribed topic appearing or
growing) bumps the group epoch and recomputes the target; a heartbeat with another epoch than
the member's (or its previous one) is FENCED_MEMBER_EPOCH, an unknown member UNKNOWN_MEMBER_ID;
epoch -1 leaves. A member silent for the session timeout is removed. The records a member holds
are not released when it leaves: its share session (``share_sessions.py``) closing releases
them, or their locks running out.

Membership is durable as Kafka keeps it (``modern_group_records.py``, types 10 to 14, in
``__consumer_offsets``): :meth:`ShareGroups.changes` gives what changed, written before the
member is answered, and :meth:`ShareGroups.restore` takes the groups back. The share-partitions'
state is durable in ``__share_group_state`` (``share_state.py``); a share-partition never
written starts where ``share.auto.offset.reset`` says.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field

from stratalog.broker import modern_group_records as mg
from stratalog.broker.assignors import SIMPLE, Assignment, simple
from stratalog.broker.consumer_groups import (
    JOIN_EPOCH,
    LEAVE_EPOCH,
    Topics,
    check_ids,
    fenced,
    invalid_request,
    subscribed_topics,
)
from stratalog.broker.group_coordinator import GroupError
from stratalog.broker.modern_group_records import ModernGroupKey, frozen, thawed
from stratalog.broker.reconciliation import M_STABLE
from stratalog.broker.share_partition import SharePartition

EMPTY = "Empty"
STABLE = "Stable"

TopicPartition = tuple[uuid.UUID, int]


@dataclass(frozen=True)
class ShareHeartbeat:
    """A ShareGroupHeartbeat request's fields; None means "unchanged since the last one"."""

    group_id: str
    member_id: str
    member_epoch: int
    rack_id: str | None = None
    subscribed_topic_names: tuple[str, ...] | None = None
    client_id: str = ""
    client_host: str = ""


@dataclass
class ShareAnswer:
    member_id: str
    member_epoch: int
    heartbeat_interval_ms: int
    assignment: Assignment | None = None  # None: unchanged, not sent


@dataclass
class ShareMember:
    member_id: str
    rack_id: str | None = None
    client_id: str = ""
    client_host: str = ""
    subscribed_topic_names: tuple[str, ...] = ()
    subscribed_topic_regex: None = None  # share groups subscribe by names only
    epoch: int = 0
    previous_epoch: int = 0
    assigned: Assignment = field(default_factory=dict)
    session_deadline: int = 0


@dataclass
class ShareGroup:
    group_id: str
    group_epoch: int = 0
    assignment_epoch: int = 0
    members: dict[str, ShareMember] = field(default_factory=dict)
    target: dict[str, Assignment] = field(default_factory=dict)
    subscribed: dict[str, tuple[uuid.UUID, int]] = field(default_factory=dict)
    partitions: dict[TopicPartition, SharePartition] = field(default_factory=dict)

    @property
    def state(self) -> str:
        return STABLE if self.members else EMPTY

    @property
    def assignor(self) -> str:
        return SIMPLE


class ShareGroups:
    def __init__(
        self,
        *,
        session_timeout_ms: int = 45000,
        heartbeat_interval_ms: int = 5000,
        max_size: int = 200,
    ) -> None:
        self.groups: dict[str, ShareGroup] = {}
        self._written = mg.Written()  # the groups' records as __consumer_offsets holds them
        self.session_timeout_ms = session_timeout_ms
        self.heartbeat_interval_ms = heartbeat_interval_ms
        self.max_size = max_size

    def group(self, group_id: str) -> ShareGroup | None:
        return self.groups.get(group_id)

    def member(self, group_id: str, member_id: str) -> ShareMember | None:
        g = self.groups.get(group_id)
        return g.members.get(member_id) if g is not None else None

    # -- ShareGroupHeartbeat ---------------------------------------------------------------------
    def heartbeat(self, hb: ShareHeartbeat, topics: Topics, now: int) -> ShareAnswer:
        _validate(hb)
        g = self.groups.get(hb.group_id)
        if hb.member_epoch == LEAVE_EPOCH:
            if g is None:
                raise GroupError("GROUP_ID_NOT_FOUND", f"Group {hb.group_id} not found.")
            m = g.members.get(hb.member_id)
            if m is None:
                raise _unknown(hb.member_id, hb.group_id)
            self._remove(g, m, topics)
            return ShareAnswer(hb.member_id, LEAVE_EPOCH, 0)
        joining = hb.member_epoch == JOIN_EPOCH
        if g is None:
            if not joining:  # (its records outlive restarts: it never was, or was deleted)
                raise GroupError("GROUP_ID_NOT_FOUND", f"Group {hb.group_id} not found.")
            g = ShareGroup(hb.group_id)
        m = g.members.get(hb.member_id)
        if m is None:
            if not joining:
                raise _unknown(hb.member_id, hb.group_id)
            if len(g.members) >= self.max_size:
                raise GroupError(
                    "GROUP_MAX_SIZE_REACHED",
                    f"The share group has reached its maximum capacity of {self.max_size} members.",
                )
            m = ShareMember(hb.member_id or str(uuid.uuid4()))
        elif hb.member_epoch > m.epoch or (
            hb.member_epoch < m.epoch and hb.member_epoch != m.previous_epoch
        ):
            raise fenced(
                "greater" if hb.member_epoch > m.epoch else "smaller", hb.member_epoch, m.epoch
            )
        self.groups[g.group_id] = g
        changed = m.member_id not in g.members
        g.members[m.member_id] = m
        if hb.rack_id is not None:
            m.rack_id = hb.rack_id
        m.client_id, m.client_host = hb.client_id, hb.client_host
        if hb.subscribed_topic_names is not None:
            names = tuple(sorted(set(hb.subscribed_topic_names)))
            changed |= names != m.subscribed_topic_names
            m.subscribed_topic_names = names
        m.session_deadline = now + self.session_timeout_ms

        subscribed = subscribed_topics(g, topics)
        if changed or subscribed != g.subscribed:
            g.subscribed = subscribed
            g.group_epoch += 1
        if g.group_epoch > g.assignment_epoch:
            self._new_target(g)
        before = m.assigned
        if m.epoch != g.assignment_epoch:
            # No revocation in a share group: the member moves to its target at once.
            m.previous_epoch, m.epoch = m.epoch, g.assignment_epoch
            m.assigned = g.target.get(m.member_id, {})
        send = joining or m.assigned != before
        return ShareAnswer(
            m.member_id,
            m.epoch,
            self.heartbeat_interval_ms,
            dict(m.assigned) if send else None,
        )

    def _new_target(self, g: ShareGroup) -> None:
        subscriptions = {
            mid: frozenset(
                g.subscribed[n][0] for n in m.subscribed_topic_names if n in g.subscribed
            )
            for mid, m in g.members.items()
        }
        sizes = {tid: n for tid, n in g.subscribed.values()}
        g.target = simple(subscriptions, sizes, g.target)
        g.assignment_epoch = g.group_epoch

    # -- leaving, expiry -------------------------------------------------------------------------
    def _remove(self, g: ShareGroup, m: ShareMember, topics: Topics) -> None:
        # Its records stay locked until their locks run out (or its share session closes), as
        # in Kafka: leaving the group does not release them.
        g.members.pop(m.member_id, None)
        g.target.pop(m.member_id, None)
        g.subscribed = subscribed_topics(g, topics)
        g.group_epoch += 1
        self._new_target(g)

    def expire(self, now: int, topics: Topics) -> list[tuple[str, str]]:
        """Remove members past their session timeout and release records past their locks;
        (group, member) of each member removed."""
        gone = []
        for g in self.groups.values():
            for m in list(g.members.values()):
                if now >= m.session_deadline:
                    self._remove(g, m, topics)
                    gone.append((g.group_id, m.member_id))
            for sp in g.partitions.values():
                sp.expire(now)
        return gone

    def next_deadline(self) -> int | None:
        deadlines = [m.session_deadline for g in self.groups.values() for m in g.members.values()]
        deadlines += [
            d for _g, _tp, sp in self.share_partitions() if (d := sp.next_deadline()) is not None
        ]
        return min(deadlines, default=None)

    def share_partitions(self) -> Iterator[tuple[ShareGroup, TopicPartition, SharePartition]]:
        for g in self.groups.values():
            for tp, sp in g.partitions.items():
                yield g, tp, sp

    # -- durability (modern_group_records.py) ----------------------------------------------------
    @staticmethod
    def records(g: ShareGroup) -> dict[ModernGroupKey, mg.Value]:
        """The records that describe ``g``'s membership (Kafka's types 10 to 14)."""
        gid = g.group_id
        out: dict[ModernGroupKey, mg.Value] = {
            ModernGroupKey(gid, mg.SHARE_METADATA): g.group_epoch,
            ModernGroupKey(gid, mg.SHARE_TARGET_METADATA): g.assignment_epoch,
        }
        for mid, m in g.members.items():
            out[ModernGroupKey(gid, mg.SHARE_MEMBER, mid)] = mg.ShareMemberMetadata(
                m.rack_id, m.client_id, m.client_host, m.subscribed_topic_names
            )
            out[ModernGroupKey(gid, mg.SHARE_CURRENT, mid)] = mg.CurrentAssignment(
                m.epoch, m.previous_epoch, M_STABLE, frozen(m.assigned), ()
            )
        for mid, a in g.target.items():
            out[ModernGroupKey(gid, mg.SHARE_TARGET_MEMBER, mid)] = frozen(a)
        return out

    def changes(self, group_id: str) -> list[tuple[ModernGroupKey, mg.Value]]:
        """The group's records that changed since the last call (None: deleted)."""
        g = self.groups.get(group_id)
        return self._written.changes(group_id, {} if g is None else self.records(g))

    def restore(self, records: dict[ModernGroupKey, mg.Value], topics: Topics, now: int) -> int:
        """Take back the share groups ``records`` describe, each member with a new session
        (their share-partitions load from ``__share_group_state`` when fetched); returns how
        many groups."""
        taken = 0
        for gid, recs in mg.by_group(records, mg.SHARE_KINDS).items():
            epoch = recs.get(ModernGroupKey(gid, mg.SHARE_METADATA))
            live = self.groups.get(gid)
            if not isinstance(epoch, int) or (live is not None and live.members):
                continue
            assignment_epoch = recs.get(ModernGroupKey(gid, mg.SHARE_TARGET_METADATA))
            g = ShareGroup(gid)
            if live is not None:
                g.partitions = live.partitions  # the share-partitions led here, as they are
            g.group_epoch = epoch
            g.assignment_epoch = assignment_epoch if isinstance(assignment_epoch, int) else 0
            for k, v in recs.items():
                if k.kind == mg.SHARE_MEMBER and isinstance(v, mg.ShareMemberMetadata):
                    g.members[k.member] = ShareMember(
                        k.member, v.rack_id, v.client_id, v.client_host, v.subscribed_topic_names,
                        session_deadline=now + self.session_timeout_ms,
                    )  # fmt: skip
            for k, v in recs.items():
                m = g.members.get(k.member)
                if k.kind == mg.SHARE_TARGET_MEMBER and m is not None and isinstance(v, tuple):
                    g.target[k.member] = thawed(v)
                elif k.kind == mg.SHARE_CURRENT and m is not None:
                    assert isinstance(v, mg.CurrentAssignment)
                    m.epoch, m.previous_epoch = v.epoch, v.previous_epoch
                    m.assigned = thawed(v.assigned)
            g.subscribed = subscribed_topics(g, topics)
            self.groups[gid] = g
            self._written.settle(gid, recs)  # (what the log holds: see ConsumerGroups)
            taken += 1
        return taken

    def unwritten(self, group_id: str, changes: list[tuple[ModernGroupKey, mg.Value]]) -> None:
        """Their write failed: written again with the group's next change."""
        self._written.unwritten(group_id, changes)

    def drop_membership(self, group_id: str) -> None:
        """Forget the members as this coordinator knew them (another one led the group's
        partition since: they are restored from the records); the share-partitions led here
        stay."""
        g = self.groups.get(group_id)
        if g is not None:
            self.groups[group_id] = ShareGroup(group_id, partitions=g.partitions)
        self._written.drop(group_id)

    def forget(self, group_id: str) -> None:
        """Drop a group without members (DeleteGroups)."""
        g = self.groups.get(group_id)
        if g is not None and not g.members:
            del self.groups[group_id]


def _unknown(member_id: str, group_id: str) -> GroupError:
    return GroupError(
        "UNKNOWN_MEMBER_ID", f"Member {member_id} is not a member of group {group_id}."
    )


def _validate(hb: ShareHeartbeat) -> None:
    """Kafka's checks of a ShareGroupHeartbeat request."""
    check_ids(hb.group_id, None, hb.rack_id)
    if hb.member_epoch > 0 or hb.member_epoch == LEAVE_EPOCH:
        if not hb.member_id:
            raise invalid_request("MemberId can't be empty.")
    elif hb.member_epoch == JOIN_EPOCH:
        if not hb.subscribed_topic_names:
            raise invalid_request("SubscribedTopicNames must be set in first request.")
    else:
        raise invalid_request("MemberEpoch is invalid.")
