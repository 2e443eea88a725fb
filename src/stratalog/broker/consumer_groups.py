"""The consumer group protocol (KIP-848): groups the broker assigns, member by member.

Sans-IO: every call takes the time (``now``, milliseconds) and a view of the topics; nothing here
waits, sleeps or schedules. The API layer (``broker/api/consumer_groups.py``) calls
:meth:`ConsumerGroups.expire` now and then to enforce session and rebalance timeouts.

The rules are KIP-848's, as Kafka's group coordinator applies them:

* A member joins with epoch 0 and its subscription; a changed subscription (or the subscribed
  topics' partitions) bumps the *group epoch*. When the group epoch is ahead of the *assignment
  epoch*, the next heartbeat computes a new *target assignment* for every member with the
  group's assignor (``assignors.py``) and the assignment epoch catches up.
* Each member then moves toward its target on its own heartbeats, never all at once
  (``reconciliation.py``: revocation first, and a partition handed over only once nobody else
  holds it). A member whose current assignment is its target is at the assignment epoch.
* A heartbeat with another epoch than the member's is FENCED_MEMBER_EPOCH (the previous epoch is
  accepted while the member only owns partitions still assigned to it: the answer that bumped
  it may have been lost); an unknown member is UNKNOWN_MEMBER_ID; a member of a group the broker
  does not know is GROUP_ID_NOT_FOUND, as in Kafka.
  Epoch -1 leaves (-2: a static member leaves for now; here it leaves as well). A member silent
  past the session timeout, or one not revoking within its rebalance timeout, is removed, and
  its partitions are free.

Membership is durable as Kafka keeps it: :meth:`ConsumerGroups.changes` gives the records
(``modern_group_records.py``, Kafka's types 3 and 5 to 8) that changed since the last call,
for the API layer to write to ``__consumer_offsets`` before it answers, and
:meth:`ConsumerGroups.restore` takes groups back from them (a restart, a new coordinator);
committed offsets are the offset store's.
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from stratalog.broker import assignors
from stratalog.broker import modern_group_records as cg
from stratalog.broker.assignors import Assignment
from stratalog.broker.group_coordinator import GroupError
from stratalog.broker.modern_group_records import ModernGroupKey, frozen, thawed
from stratalog.broker.reconciliation import M_STABLE, Member, Owned, reconcile, within

JOIN_EPOCH = 0
LEAVE_EPOCH = -1
STATIC_LEAVE_EPOCH = -2

# Group states (Kafka's ConsumerGroupState names, as ListGroups and describe answer them).
EMPTY = "Empty"
ASSIGNING = "Assigning"
RECONCILING = "Reconciling"
STABLE = "Stable"


class MemberGroup(Protocol):
    """A group whose members subscribe by topic names or a regular expression."""

    members: dict


class Topics(Protocol):
    """The broker's topics, as the group sees them."""

    def by_name(self, name: str) -> tuple[uuid.UUID, int] | None:
        """(topic id, partition count) of an existing topic."""

    def names(self) -> Iterable[str]:
        """Every topic a regular expression may match (internal topics left out)."""


def clock_ms() -> int:
    """The time the callers give (monotonic milliseconds): deadlines are compared with it."""
    return int(time.monotonic() * 1000)


class TopicTable:
    """The broker's topics (name -> metadata with ``topic_id`` and ``partitions``) as a group
    sees them; ``internal`` names the topics a regular expression never matches."""

    def __init__(self, topics: Mapping[str, Any], internal: Callable[[str], bool]) -> None:
        self.topics = topics
        self.internal = internal

    def by_name(self, name: str) -> tuple[uuid.UUID, int] | None:
        t = self.topics.get(name)
        return (t.topic_id, len(t.partitions)) if t is not None else None

    def names(self) -> Iterable[str]:
        return (n for n in self.topics if not self.internal(n))


@dataclass(frozen=True)
class Heartbeat:
    """A ConsumerGroupHeartbeat request's fields; None means "unchanged since the last one"."""

    group_id: str
    member_id: str
    member_epoch: int
    instance_id: str | None = None
    rack_id: str | None = None
    rebalance_timeout_ms: int = -1
    subscribed_topic_names: tuple[str, ...] | None = None
    subscribed_topic_regex: str | None = None
    server_assignor: str | None = None
    owned: Owned = None
    client_id: str = ""
    client_host: str = ""


@dataclass
class Answer:
    member_id: str
    member_epoch: int
    heartbeat_interval_ms: int
    assignment: Assignment | None = None  # None: unchanged, not sent


@dataclass
class ConsumerGroup:
    group_id: str
    group_epoch: int = 0
    assignment_epoch: int = 0
    members: dict[str, Member] = field(default_factory=dict)
    target: dict[str, Assignment] = field(default_factory=dict)
    # topic name -> (id, partitions) of every topic a member subscribes to that exists: when it
    # changes (a topic created, deleted or grown) the group epoch is bumped.
    subscribed: dict[str, tuple[uuid.UUID, int]] = field(default_factory=dict)

    @property
    def state(self) -> str:
        if not self.members:
            return EMPTY
        if self.group_epoch > self.assignment_epoch:
            return ASSIGNING
        for m in self.members.values():
            if m.state != M_STABLE or m.epoch != self.assignment_epoch:
                return RECONCILING
        return STABLE

    @property
    def assignor(self) -> str:
        """The assignor most members asked for (ties: by name), else the default."""
        votes: dict[str, int] = {}
        for m in self.members.values():
            if m.server_assignor:
                votes[m.server_assignor] = votes.get(m.server_assignor, 0) + 1
        if not votes:
            return assignors.DEFAULT
        return max(sorted(votes), key=lambda a: votes[a])

    def held_by_other(self, member_id: str, topic_id: uuid.UUID, partition: int) -> bool:
        return any(
            m.owns(topic_id, partition) for mid, m in self.members.items() if mid != member_id
        )


class ConsumerGroups:
    def __init__(
        self,
        *,
        session_timeout_ms: int = 45000,
        heartbeat_interval_ms: int = 5000,
        max_size: int = 2**31 - 1,
    ) -> None:
        self.groups: dict[str, ConsumerGroup] = {}
        self._written = cg.Written()  # the groups' records as __consumer_offsets holds them
        self.session_timeout_ms = session_timeout_ms
        self.heartbeat_interval_ms = heartbeat_interval_ms
        self.max_size = max_size

    def group(self, group_id: str) -> ConsumerGroup | None:
        return self.groups.get(group_id)

    def has_members(self, group_id: str) -> bool:
        g = self.groups.get(group_id)
        return g is not None and bool(g.members)

    # -- ConsumerGroupHeartbeat ----------------------------------------------------------------
    def heartbeat(self, hb: Heartbeat, topics: Topics, now: int) -> Answer:
        _validate(hb)
        if hb.member_epoch in (LEAVE_EPOCH, STATIC_LEAVE_EPOCH):
            return self._leave(hb, topics)
        joining = hb.member_epoch == JOIN_EPOCH
        g = self.groups.get(hb.group_id)
        if g is None:
            if not joining:
                # Kafka's answer (its clients take it as fatal): the group's records outlive a
                # restart or a new coordinator, so a member never sees its group vanish.
                raise GroupError("GROUP_ID_NOT_FOUND", f"Group {hb.group_id} not found.")
            g = ConsumerGroup(hb.group_id)
        member = self._member(g, hb, topics)
        self.groups[g.group_id] = g
        before_assigned = member.assigned
        subscription_changed = _update(member, hb)
        member.session_deadline = now + self.session_timeout_ms
        g.members[member.member_id] = member

        subscribed = subscribed_topics(g, topics)
        if subscription_changed or subscribed != g.subscribed:
            g.subscribed = subscribed
            g.group_epoch += 1
        if g.group_epoch > g.assignment_epoch:
            self._new_target(g, topics)
        reconcile(
            member,
            g.target.get(member.member_id, {}),
            g.assignment_epoch,
            lambda tid, p: g.held_by_other(member.member_id, tid, p),
            hb.owned,
            now,
        )

        full = joining or (
            hb.rebalance_timeout_ms != -1
            and hb.subscribed_topic_names is not None
            and hb.owned is not None
        )
        changed = member.assigned != before_assigned
        return Answer(
            member.member_id,
            member.epoch,
            self.heartbeat_interval_ms,
            dict(member.assigned) if full or changed else None,
        )

    def _member(self, g: ConsumerGroup, hb: Heartbeat, topics: Topics) -> Member:
        m = g.members.get(hb.member_id)
        if hb.member_epoch == JOIN_EPOCH:
            if m is not None and not (m.previous_epoch == 0 and within(hb.owned, m.assigned)):
                # A rejoin after being fenced: the old incarnation's partitions are released.
                self._remove(g, m, topics)
                m = None
            if m is None:
                if len(g.members) >= self.max_size:
                    raise GroupError(
                        "GROUP_MAX_SIZE_REACHED",
                        f"The consumer group has reached its maximum capacity of "
                        f"{self.max_size} members.",
                    )
                if hb.instance_id is not None and any(
                    x.instance_id == hb.instance_id for x in g.members.values()
                ):
                    raise GroupError(
                        "UNRELEASED_INSTANCE_ID",
                        f"Static member with instance id {hb.instance_id} is still in the group.",
                    )
                member_id = hb.member_id or str(uuid.uuid4())
                return Member(member_id, epoch=0, previous_epoch=-1)
            return m
        if m is None:
            raise GroupError(
                "UNKNOWN_MEMBER_ID", f"Member {hb.member_id} is not a member of group {g.group_id}."
            )
        if hb.member_epoch > m.epoch:
            raise fenced("greater", hb.member_epoch, m.epoch)
        if hb.member_epoch < m.epoch and (
            hb.member_epoch != m.previous_epoch or not within(hb.owned, m.assigned)
        ):
            raise fenced("smaller", hb.member_epoch, m.epoch)
        return m

    def _new_target(self, g: ConsumerGroup, topics: Topics) -> None:
        subscriptions = {
            mid: frozenset(
                g.subscribed[name][0] for name in _names_of(m, topics) if name in g.subscribed
            )
            for mid, m in g.members.items()
        }
        sizes = {tid: n for tid, n in g.subscribed.values()}
        g.target = assignors.ASSIGNORS[g.assignor](subscriptions, sizes, g.target)
        g.assignment_epoch = g.group_epoch

    # -- leaving, expiry -------------------------------------------------------------------------
    def _leave(self, hb: Heartbeat, topics: Topics) -> Answer:
        g = self.groups.get(hb.group_id)
        if g is None:
            raise GroupError("GROUP_ID_NOT_FOUND", f"Consumer group {hb.group_id} not found.")
        m = g.members.get(hb.member_id)
        if m is None and hb.instance_id is not None:
            m = next((x for x in g.members.values() if x.instance_id == hb.instance_id), None)
        if m is None:
            raise GroupError(
                "UNKNOWN_MEMBER_ID", f"Member {hb.member_id} is not a member of group {g.group_id}."
            )
        self._remove(g, m, topics)
        return Answer(m.member_id, hb.member_epoch, 0)

    def _remove(self, g: ConsumerGroup, m: Member, topics: Topics) -> None:
        # Its partitions are free at once, and the others' new target is computed now (as
        # Kafka does), so they move toward it at their next heartbeat.
        g.members.pop(m.member_id, None)
        g.target.pop(m.member_id, None)
        g.subscribed = subscribed_topics(g, topics)
        g.group_epoch += 1
        self._new_target(g, topics)

    def expire(self, now: int, topics: Topics) -> list[tuple[str, str]]:
        """Remove members past their session timeout, or past their rebalance timeout while
        they still hold partitions to revoke; (group, member) of each one removed."""
        gone = []
        for g in self.groups.values():
            for m in list(g.members.values()):
                late_revoking = m.rebalance_deadline is not None and now >= m.rebalance_deadline
                if now >= m.session_deadline or late_revoking:
                    self._remove(g, m, topics)
                    gone.append((g.group_id, m.member_id))
        return gone

    def next_deadline(self) -> int | None:
        deadlines = [
            d
            for g in self.groups.values()
            for m in g.members.values()
            for d in (m.session_deadline, m.rebalance_deadline)
            if d is not None
        ]
        return min(deadlines, default=None)

    # -- offsets (KIP-848: OffsetCommit v9+ and OffsetFetch v9+ carry the member epoch) ----------
    def validate_commit(
        self,
        group_id: str,
        member_id: str,
        member_epoch: int,
        api_version: int,
        transactional: bool = False,
        instance_id: str | None = None,
    ) -> str | None:
        """Kafka's answer to an OffsetCommit (or TxnOffsetCommit) for this group; None when the
        group is not a consumer group (the classic coordinator judges it)."""
        g = self.groups.get(group_id)
        if g is None:
            return None
        if member_epoch < 0 and not g.members:
            return "NONE"  # an admin client or an assign() consumer, on an empty group
        if transactional and member_epoch < 0 and not member_id and instance_id is None:
            return "NONE"  # a transactional producer that sent no group metadata
        m = g.members.get(member_id)
        if m is None:
            return "UNKNOWN_MEMBER_ID"
        if api_version < 9 and not transactional:
            return "UNSUPPORTED_VERSION"
        return "NONE" if member_epoch == m.epoch else "STALE_MEMBER_EPOCH"

    def validate_fetch(self, group_id: str, member_id: str | None, member_epoch: int) -> str:
        g = self.groups.get(group_id)
        if g is None or (member_id is None and member_epoch < 0):
            return "NONE"
        m = g.members.get(member_id or "")
        if m is None:
            return "UNKNOWN_MEMBER_ID"
        return "NONE" if member_epoch == m.epoch else "STALE_MEMBER_EPOCH"

    # -- durability (modern_group_records.py) --------------------------------------------------
    @staticmethod
    def records(g: ConsumerGroup) -> dict[ModernGroupKey, cg.Value]:
        """The records that describe ``g`` (Kafka's types 3, 5, 6, 7 and 8)."""
        gid = g.group_id
        out: dict[ModernGroupKey, cg.Value] = {
            ModernGroupKey(gid, cg.METADATA): g.group_epoch,
            ModernGroupKey(gid, cg.TARGET_METADATA): g.assignment_epoch,
        }
        for mid, m in g.members.items():
            out[ModernGroupKey(gid, cg.MEMBER, mid)] = cg.MemberMetadata(
                m.instance_id, m.rack_id, m.client_id, m.client_host, m.subscribed_topic_names,
                m.subscribed_topic_regex, m.rebalance_timeout_ms, m.server_assignor,
            )  # fmt: skip
            out[ModernGroupKey(gid, cg.CURRENT, mid)] = cg.CurrentAssignment(
                m.epoch, m.previous_epoch, m.state, frozen(m.assigned),
                frozen(m.pending_revocation),
            )  # fmt: skip
        for mid, a in g.target.items():
            out[ModernGroupKey(gid, cg.TARGET_MEMBER, mid)] = frozen(a)
        return out

    def changes(self, group_id: str) -> list[tuple[ModernGroupKey, cg.Value]]:
        """The group's records that changed since the last call (tombstones, None, for those
        gone: a member that left, a deleted group); from then on they count as written."""
        g = self.groups.get(group_id)
        return self._written.changes(group_id, {} if g is None else self.records(g))

    def restore(self, records: dict[ModernGroupKey, cg.Value], topics: Topics, now: int) -> int:
        """Take back the groups ``records`` describe (as a coordinator loading the offsets
        topic does), each member with a new session; returns how many groups."""
        taken = 0
        for gid, recs in cg.by_group(records, cg.CONSUMER_KINDS).items():
            epoch = recs.get(ModernGroupKey(gid, cg.METADATA))
            if not isinstance(epoch, int) or self.has_members(gid):
                continue  # deleted (or half written), or live here already
            assignment_epoch = recs.get(ModernGroupKey(gid, cg.TARGET_METADATA))
            g = ConsumerGroup(gid, epoch, assignment_epoch if isinstance(assignment_epoch, int)
                              else 0)  # fmt: skip
            for k, v in sorted(recs.items()):
                if k.kind == cg.MEMBER and isinstance(v, cg.MemberMetadata):
                    g.members[k.member] = Member(
                        k.member, v.instance_id, v.rack_id, v.client_id, v.client_host,
                        v.rebalance_timeout_ms, v.subscribed_topic_names,
                        v.subscribed_topic_regex, v.server_assignor,
                    )  # fmt: skip
            for k, v in recs.items():
                m = g.members.get(k.member)
                if k.kind == cg.TARGET_MEMBER and m is not None and isinstance(v, tuple):
                    g.target[k.member] = thawed(v)
                elif k.kind == cg.CURRENT and m is not None and isinstance(v, cg.CurrentAssignment):
                    m.epoch, m.previous_epoch, m.state = v.epoch, v.previous_epoch, v.state
                    m.assigned = thawed(v.assigned)
                    m.pending_revocation = thawed(v.pending_revocation)
            for m in g.members.values():
                m.session_deadline = now + self.session_timeout_ms
                if m.pending_revocation:
                    m.rebalance_deadline = now + m.rebalance_timeout_ms
            # The topics as they are now: a change while no coordinator ran is noticed at the
            # next change of them, not at the first heartbeat.
            g.subscribed = subscribed_topics(g, topics)
            self.groups[gid] = g
            # What the log holds, not what was rebuilt of it: the next change writes the
            # difference (a member's missing record, records of members no longer there).
            self._written.settle(gid, recs)
            taken += 1
        return taken

    def unwritten(self, group_id: str, changes: list[tuple[ModernGroupKey, cg.Value]]) -> None:
        """Their write failed: written again with the group's next change."""
        self._written.unwritten(group_id, changes)

    def drop(self, group_id: str) -> None:
        """Forget the group as this coordinator knew it (another one led its partition since:
        it is restored from the records)."""
        self.groups.pop(group_id, None)
        self._written.drop(group_id)

    def forget(self, group_id: str) -> None:
        """Drop a group without members (DeleteGroups, or a classic group taking the id)."""
        g = self.groups.get(group_id)
        if g is not None and not g.members:
            del self.groups[group_id]


def fenced(than: str, received: int, known: int) -> GroupError:
    return GroupError(
        "FENCED_MEMBER_EPOCH",
        f"The consumer group member has a {than} member epoch ({received}) than the one known "
        f"by the group coordinator ({known}). The member must abandon all its partitions and "
        f"rejoin.",
    )


# -- the request's checks ----------------------------------------------------------------------
def invalid_request(message: str) -> GroupError:
    return GroupError("INVALID_REQUEST", message)


def check_ids(group_id: str, instance_id: str | None, rack_id: str | None) -> None:
    """The checks of a heartbeat's ids both protocols make (None: not sent)."""
    if not group_id:
        raise invalid_request("GroupId can't be empty.")
    if instance_id == "":
        raise invalid_request("InstanceId can't be empty.")
    if rack_id == "":
        raise invalid_request("RackId can't be empty.")


def _validate(hb: Heartbeat) -> None:
    """Kafka's throwIfConsumerGroupHeartbeatRequestIsInvalid."""
    invalid = invalid_request
    check_ids(hb.group_id, hb.instance_id, hb.rack_id)
    if hb.member_epoch == JOIN_EPOCH:
        if hb.rebalance_timeout_ms == -1:
            raise invalid("RebalanceTimeoutMs must be provided in first request.")
        if hb.owned is None or len(hb.owned) > 0:
            raise invalid("TopicPartitions must be empty when (re-)joining.")
        if hb.subscribed_topic_names is None and hb.subscribed_topic_regex is None:
            raise invalid(
                "SubscribedTopicNames or SubscribedTopicRegex must be set in first request."
            )
    elif hb.member_epoch == STATIC_LEAVE_EPOCH:
        if hb.instance_id is None:
            raise invalid("InstanceId can't be null.")
    elif hb.member_epoch < LEAVE_EPOCH:
        raise invalid("MemberEpoch is invalid.")
    if hb.member_epoch != JOIN_EPOCH and not hb.member_id:
        raise invalid("MemberId can't be empty.")
    if hb.subscribed_topic_regex is not None:
        try:
            re.compile(hb.subscribed_topic_regex)
        except re.error as e:
            raise GroupError(
                "INVALID_REGULAR_EXPRESSION",
                f"SubscribedTopicRegex `{hb.subscribed_topic_regex}` is not a valid regular "
                f"expression: {e}.",
            ) from None
    if hb.server_assignor is not None and hb.server_assignor not in assignors.ASSIGNORS:
        raise GroupError(
            "UNSUPPORTED_ASSIGNOR",
            f"ServerAssignor {hb.server_assignor} is not supported. Supported assignors: "
            f"{', '.join(assignors.ASSIGNORS)}.",
        )


# -- helpers -----------------------------------------------------------------------------------
def _update(m: Member, hb: Heartbeat) -> bool:
    """Apply what the heartbeat changed; whether the subscription (or assignor) changed."""
    if hb.instance_id is not None:
        m.instance_id = hb.instance_id
    if hb.rack_id is not None:
        m.rack_id = hb.rack_id
    if hb.rebalance_timeout_ms != -1:
        m.rebalance_timeout_ms = hb.rebalance_timeout_ms
    m.client_id = hb.client_id
    m.client_host = hb.client_host
    changed = m.epoch == JOIN_EPOCH and m.previous_epoch == -1  # a new member
    if hb.subscribed_topic_names is not None:
        names = tuple(sorted(set(hb.subscribed_topic_names)))
        changed |= names != m.subscribed_topic_names
        m.subscribed_topic_names = names
    if hb.subscribed_topic_regex is not None:
        regex = hb.subscribed_topic_regex or None  # "" clears it
        changed |= regex != m.subscribed_topic_regex
        m.subscribed_topic_regex = regex
    if hb.server_assignor is not None:
        changed |= hb.server_assignor != m.server_assignor
        m.server_assignor = hb.server_assignor
    return changed


def _names_of(m: Member, topics: Topics) -> set[str]:
    names = set(m.subscribed_topic_names)
    if m.subscribed_topic_regex:
        pattern = re.compile(m.subscribed_topic_regex)
        names.update(n for n in topics.names() if pattern.fullmatch(n))
    return names


def subscribed_topics(g: MemberGroup, topics: Topics) -> dict[str, tuple[uuid.UUID, int]]:
    out = {}
    for m in g.members.values():
        for name in _names_of(m, topics):
            found = topics.by_name(name)
            if found is not None and found[1] > 0:
                out[name] = found
    return out
