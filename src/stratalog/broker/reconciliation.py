"""A consumer-protocol member and how it moves toward its target assignment (KIP-848's
reconciliation, the rules of Kafka's CurrentAssignmentBuilder).

One step per heartbeat of the member: partitions it must give up are revoked first, and it keeps
its epoch until a heartbeat no longer reports them; partitions it gains are handed over only once
no other member holds them (assigned or still revoking), so a partition never has two owners.
Pure: the group (``consumer_groups.py``) says what the target is and who else holds what.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from stratalog.broker.assignors import Assignment

# Member states (Kafka's MemberState).
M_STABLE = "stable"
M_UNREVOKED = "unrevoked_partitions"
M_UNRELEASED = "unreleased_partitions"

# What a heartbeat says the member owns (topic id -> partitions); None: unchanged, not said.
Owned = Mapping[uuid.UUID, frozenset[int]] | None


@dataclass
class Member:
    member_id: str
    instance_id: str | None = None
    rack_id: str | None = None
    client_id: str = ""
    client_host: str = ""
    rebalance_timeout_ms: int = 300000
    subscribed_topic_names: tuple[str, ...] = ()
    subscribed_topic_regex: str | None = None
    server_assignor: str | None = None
    epoch: int = 0
    previous_epoch: int = -1
    state: str = M_STABLE
    assigned: Assignment = field(default_factory=dict)
    pending_revocation: Assignment = field(default_factory=dict)
    session_deadline: int = 0
    rebalance_deadline: int | None = None

    def owns(self, topic_id: uuid.UUID, partition: int) -> bool:
        return partition in self.assigned.get(topic_id, ()) or partition in (
            self.pending_revocation.get(topic_id, ())
        )


def reconcile(
    m: Member,
    target: Assignment,
    assignment_epoch: int,
    held_elsewhere: Callable[[uuid.UUID, int], bool],
    owned: Owned,
    now: int,
) -> None:
    """One step of ``m`` toward ``target``; a member left revoking gets a rebalance deadline."""
    if m.state == M_STABLE and m.epoch == assignment_epoch:
        return
    if m.state == M_UNREVOKED:
        if holds_any(owned, m.pending_revocation):
            return
        _next_assignment(m, target, assignment_epoch, held_elsewhere, m.epoch + 1, owned)
    else:
        _next_assignment(m, target, assignment_epoch, held_elsewhere, m.epoch, owned)
    if m.state == M_UNREVOKED:
        if m.rebalance_deadline is None:
            m.rebalance_deadline = now + m.rebalance_timeout_ms
    else:
        m.rebalance_deadline = None


def within(owned: Owned, assigned: Assignment) -> bool:
    """Whether the partitions a heartbeat reports owning are all in ``assigned``."""
    if owned is None:
        return False
    return all(ps <= assigned.get(tid, frozenset()) for tid, ps in owned.items())


def holds_any(owned: Owned, partitions: Assignment) -> bool:
    """Whether the member may still hold some of ``partitions`` (not reporting counts as yes)."""
    if owned is None:
        return True
    return any(ps & partitions.get(tid, frozenset()) for tid, ps in owned.items())


def _next_assignment(
    m: Member,
    target: Assignment,
    assignment_epoch: int,
    held_elsewhere: Callable[[uuid.UUID, int], bool],
    epoch: int,
    owned: Owned,
) -> None:
    """Kafka's computeNextAssignment: keep what stays, revoke what goes (the member keeps
    ``epoch`` until it has), then take the target's new partitions that nobody else holds."""
    assigned: dict[uuid.UUID, frozenset[int]] = {}
    revoking: dict[uuid.UUID, frozenset[int]] = {}
    adding: dict[uuid.UUID, frozenset[int]] = {}
    unreleased = False
    for tid in set(target) | set(m.assigned):
        want = target.get(tid, frozenset())
        have = m.assigned.get(tid, frozenset())
        keep = have & want
        gone = have - keep
        free = {p for p in want - keep if not held_elsewhere(tid, p)}
        unreleased |= len(free) < len(want - keep)
        if keep:
            assigned[tid] = keep
        if gone:
            revoking[tid] = gone
        if free:
            adding[tid] = frozenset(free)
    if revoking and holds_any(owned, revoking):
        m.state = M_UNREVOKED
        _set_epoch(m, epoch)
        m.assigned = assigned
        m.pending_revocation = revoking
        return
    for tid, ps in adding.items():
        assigned[tid] = assigned.get(tid, frozenset()) | ps
    m.state = M_UNRELEASED if unreleased else M_STABLE
    _set_epoch(m, assignment_epoch)
    m.assigned = assigned
    m.pending_revocation = {}


def _set_epoch(m: Member, epoch: int) -> None:
    if epoch != m.epoch:
        m.previous_epoch = m.epoch
        m.epoch = epoch
