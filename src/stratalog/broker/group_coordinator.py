"""The classic consumer-group protocol: membership, rebalances, assignments, session expiry.

A group moves Empty -> PreparingRebalance -> CompletingRebalance -> Stable, as in Kafka's
GroupCoordinator. JoinGroup requests park until every known member has rejoined (or the
rebalance timeout throws out those that did not); the leader's SyncGroup hands out the
assignment. Members that stop heartbeating past their session timeout are removed, which starts
a rebalance for the rest. Outcomes are plain values; the API layer turns them into responses.

A settled generation and an emptied group are written to ``__consumer_offsets`` as Kafka's
group metadata records (``persist``, group_records.py), before the members learn of a new
generation; :meth:`GroupCoordinator.restore` takes the groups back after a restart or on a new
coordinator, so their members go on heartbeating instead of rejoining.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from stratalog.broker.group_records import GroupRecord, MemberRecord

log = logging.getLogger(__name__)

EMPTY = "Empty"
PREPARING = "PreparingRebalance"
COMPLETING = "CompletingRebalance"
STABLE = "Stable"
DEAD = "Dead"


class GroupError(Exception):
    """A group request refused: ``error`` is Kafka's error name, ``message`` its text."""

    def __init__(self, error: str, message: str = "") -> None:
        super().__init__(message or error)
        self.error = error
        self.message = message or None


@dataclass
class JoinResult:
    error: str = "NONE"
    generation: int = -1
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader: str = ""
    member_id: str = ""
    members: list[tuple[str, str | None, bytes]] = field(default_factory=list)


@dataclass
class Member:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocol_type: str
    protocols: list[tuple[str, bytes]]
    assignment: bytes = b""
    join_future: asyncio.Future[JoinResult] | None = None
    sync_future: asyncio.Future[tuple[str, bytes]] | None = None
    expiry: asyncio.TimerHandle | None = None

    def metadata_for(self, protocol: str) -> bytes:
        for name, meta in self.protocols:
            if name == protocol:
                return meta
        return b""


class Group:
    def __init__(self, group_id: str) -> None:
        self.group_id = group_id
        self.state = EMPTY
        self.generation = 0
        self.protocol_type: str | None = None
        self.protocol_name: str | None = None
        self.leader: str | None = None
        self.members: dict[str, Member] = {}
        self.pending: dict[str, asyncio.TimerHandle] = {}  # ids handed out by MEMBER_ID_REQUIRED
        self.rebalance_timer: asyncio.TimerHandle | None = None
        self.emptied_at: float | None = None  # when its last member went (monotonic)

    def supports(self, protocol_type: str, protocols: list[tuple[str, bytes]]) -> bool:
        if not self.members:
            return bool(protocol_type) and bool(protocols)
        if protocol_type != self.protocol_type:
            return False
        names = {n for n, _ in protocols}
        return all(names & {n for n, _ in m.protocols} for m in self.members.values())

    def select_protocol(self) -> str:
        candidates = None
        for m in self.members.values():
            names = {n for n, _ in m.protocols}
            candidates = names if candidates is None else candidates & names
        assert candidates
        # Each member votes for its most preferred candidate; ties go to the first seen.
        votes: dict[str, int] = {}
        for m in self.members.values():
            for n, _ in m.protocols:
                if n in candidates:
                    votes[n] = votes.get(n, 0) + 1
                    break
        return max(votes, key=lambda n: votes[n])


class GroupCoordinator:
    def __init__(
        self,
        *,
        min_session_ms: int = 6000,
        max_session_ms: int = 1800000,
        initial_rebalance_delay_ms: int = 0,
        empty_group_ms: int = 600000,
    ) -> None:
        self.groups: dict[str, Group] = {}
        # Writes a group's metadata record (None: its tombstone) to __consumer_offsets, so a
        # restarted or new coordinator takes the group back (group_records.py); set by the
        # broker, None in tests of the coordinator alone.
        self.persist: Callable[[str, GroupRecord | None], Awaitable[None]] | None = None
        self._writes: set[asyncio.Task] = set()
        self.min_session_ms = min_session_ms
        self.max_session_ms = max_session_ms
        self.initial_delay_ms = initial_rebalance_delay_ms
        self.empty_group_ms = empty_group_ms

    def group(self, group_id: str) -> Group | None:
        return self.groups.get(group_id)

    # -- JoinGroup -----------------------------------------------------------------------------
    async def join(
        self,
        group_id: str,
        member_id: str,
        group_instance_id: str | None,
        client_id: str,
        client_host: str,
        session_timeout_ms: int,
        rebalance_timeout_ms: int,
        protocol_type: str,
        protocols: list[tuple[str, bytes]],
        require_known_member_id: bool,
    ) -> JoinResult:
        if not group_id:
            return JoinResult("INVALID_GROUP_ID", member_id=member_id)
        if not self.min_session_ms <= session_timeout_ms <= self.max_session_ms:
            return JoinResult("INVALID_SESSION_TIMEOUT", member_id=member_id)
        if rebalance_timeout_ms < 0:
            rebalance_timeout_ms = session_timeout_ms
        g = self.groups.get(group_id)
        if g is None:
            g = self.groups[group_id] = Group(group_id)
            self._store_later(g)  # as Kafka: a new group's (empty) metadata comes first
        if not g.supports(protocol_type, protocols):
            return JoinResult("INCONSISTENT_GROUP_PROTOCOL", member_id=member_id)
        loop = asyncio.get_running_loop()

        if not member_id:
            new_id = f"{client_id or 'member'}-{uuid.uuid4()}"
            if group_instance_id:
                for m in list(g.members.values()):
                    if m.group_instance_id == group_instance_id:
                        self._remove_member(g, m, rebalance=False)
            if require_known_member_id:
                # Kafka's two-step join (KIP-394): hand out an id, expect a rejoin with it.
                g.pending[new_id] = loop.call_later(
                    session_timeout_ms / 1000, self._expire_pending, g, new_id
                )
                return JoinResult("MEMBER_ID_REQUIRED", member_id=new_id)
            member_id = new_id
        elif member_id in g.pending:
            g.pending.pop(member_id).cancel()
        elif member_id not in g.members:
            return JoinResult("UNKNOWN_MEMBER_ID", member_id=member_id)

        m = g.members.get(member_id)
        if m is None:
            m = Member(
                member_id,
                group_instance_id,
                client_id,
                client_host,
                session_timeout_ms,
                rebalance_timeout_ms,
                protocol_type,
                protocols,
            )
            g.members[member_id] = m
            g.emptied_at = None
            if len(g.members) == 1:  # the first member names the type of an empty group
                g.protocol_type = protocol_type
        else:
            changed = protocols != m.protocols
            m.protocols = protocols
            m.session_timeout_ms = session_timeout_ms
            m.rebalance_timeout_ms = rebalance_timeout_ms
            # A follower rejoining with unchanged protocols (or a retried join) gets the current
            # generation; the leader rejoining always rebalances, as its view may have changed.
            if not changed and (
                g.state == COMPLETING or (g.state == STABLE and member_id != g.leader)
            ):
                self._schedule_expiry(g, m)
                return self._join_result(g, m)
        if m.join_future is not None and not m.join_future.done():
            m.join_future.set_result(JoinResult("REBALANCE_IN_PROGRESS", member_id=member_id))
        fut: asyncio.Future[JoinResult] = loop.create_future()
        m.join_future = fut
        self._cancel_expiry(m)
        if g.state in (EMPTY, STABLE, COMPLETING):
            self._prepare_rebalance(g, initial=g.state == EMPTY)
        else:
            self._maybe_complete_join(g)
        return await fut

    def _prepare_rebalance(self, g: Group, initial: bool = False) -> None:
        if g.state == COMPLETING:
            for m in g.members.values():
                if m.sync_future is not None and not m.sync_future.done():
                    m.sync_future.set_result(("REBALANCE_IN_PROGRESS", b""))
                m.sync_future = None
        g.state = PREPARING
        loop = asyncio.get_running_loop()
        timeout = max((m.rebalance_timeout_ms for m in g.members.values()), default=0)
        if initial and self.initial_delay_ms > 0:
            timeout = min(timeout, self.initial_delay_ms) if timeout else self.initial_delay_ms
            if g.rebalance_timer is not None:
                g.rebalance_timer.cancel()
            g.rebalance_timer = loop.call_later(timeout / 1000, self._complete_join, g, True)
            return
        if g.rebalance_timer is not None:
            g.rebalance_timer.cancel()
        g.rebalance_timer = loop.call_later(timeout / 1000, self._complete_join, g, True)
        self._maybe_complete_join(g)

    def _maybe_complete_join(self, g: Group) -> None:
        if g.state != PREPARING:
            return
        if self.initial_delay_ms > 0 and g.generation == 0:
            return  # the initial delay timer completes it
        if g.pending:
            return
        if all(m.join_future is not None and not m.join_future.done() for m in g.members.values()):
            self._complete_join(g, False)

    def _complete_join(self, g: Group, timed_out: bool) -> None:
        if g.state != PREPARING:
            return
        if g.rebalance_timer is not None:
            g.rebalance_timer.cancel()
            g.rebalance_timer = None
        for m in list(g.members.values()):
            if m.join_future is None or m.join_future.done():
                # Did not rejoin in time: out of the group.
                self._remove_member(g, m, rebalance=False)
        for pid, timer in list(g.pending.items()):
            timer.cancel()
            g.pending.pop(pid)
        if not g.members:
            self._emptied(g)
            return
        g.generation += 1
        g.protocol_name = g.select_protocol()
        if g.leader not in g.members:
            g.leader = next(iter(g.members))
        g.state = COMPLETING
        for m in g.members.values():
            fut = m.join_future
            m.join_future = None
            if fut is not None and not fut.done():
                fut.set_result(self._join_result(g, m))
            self._schedule_expiry(g, m)

    def _join_result(self, g: Group, m: Member) -> JoinResult:
        members = []
        if m.member_id == g.leader:
            members = [
                (x.member_id, x.group_instance_id, x.metadata_for(g.protocol_name or ""))
                for x in g.members.values()
            ]
        return JoinResult(
            "NONE",
            g.generation,
            g.protocol_type,
            g.protocol_name,
            g.leader or "",
            m.member_id,
            members,
        )

    # -- SyncGroup -----------------------------------------------------------------------------
    async def sync(
        self,
        group_id: str,
        generation: int,
        member_id: str,
        assignments: dict[str, bytes],
    ) -> tuple[str, bytes]:
        g = self.groups.get(group_id)
        if g is None:
            return "UNKNOWN_MEMBER_ID", b""
        m = g.members.get(member_id)
        if m is None:
            return "UNKNOWN_MEMBER_ID", b""
        if generation != g.generation:
            return "ILLEGAL_GENERATION", b""
        if g.state == PREPARING:
            return "REBALANCE_IN_PROGRESS", b""
        self._schedule_expiry(g, m)
        if g.state == STABLE:
            return "NONE", m.assignment
        # COMPLETING
        if member_id == g.leader:
            for mid, member in g.members.items():
                member.assignment = assignments.get(mid, b"")
            g.state = STABLE
            # As Kafka: the settled generation is stored before the members learn of it.
            await self._store(g)
            for member in g.members.values():
                fut = member.sync_future
                member.sync_future = None
                if fut is not None and not fut.done():
                    fut.set_result(("NONE", member.assignment))
            return "NONE", m.assignment
        fut = asyncio.get_running_loop().create_future()
        m.sync_future = fut
        return await fut

    # -- Heartbeat and LeaveGroup --------------------------------------------------------------
    def heartbeat(self, group_id: str, generation: int, member_id: str) -> str:
        g = self.groups.get(group_id)
        if g is None or member_id not in g.members:
            return "UNKNOWN_MEMBER_ID"
        m = g.members[member_id]
        if generation != g.generation:
            return "ILLEGAL_GENERATION"
        self._schedule_expiry(g, m)
        if g.state == PREPARING:
            return "REBALANCE_IN_PROGRESS"
        return "NONE"

    def leave(self, group_id: str, member_id: str, group_instance_id: str | None = None) -> str:
        g = self.groups.get(group_id)
        if g is None:
            return "UNKNOWN_MEMBER_ID"
        m = g.members.get(member_id)
        if m is None and group_instance_id:
            m = next(
                (x for x in g.members.values() if x.group_instance_id == group_instance_id), None
            )
        if m is None:
            if member_id in g.pending:
                g.pending.pop(member_id).cancel()
                return "NONE"
            return "UNKNOWN_MEMBER_ID"
        self._remove_member(g, m, rebalance=True)
        return "NONE"

    # -- membership plumbing -------------------------------------------------------------------
    def _remove_member(self, g: Group, m: Member, rebalance: bool) -> None:
        self._cancel_expiry(m)
        g.members.pop(m.member_id, None)
        if m.join_future is not None and not m.join_future.done():
            m.join_future.set_result(JoinResult("UNKNOWN_MEMBER_ID", member_id=m.member_id))
        if m.sync_future is not None and not m.sync_future.done():
            m.sync_future.set_result(("UNKNOWN_MEMBER_ID", b""))
        if g.leader == m.member_id:
            g.leader = next(iter(g.members), None)
        if not rebalance:
            return
        if not g.members and g.state != PREPARING:
            self._emptied(g)
        elif g.state in (STABLE, COMPLETING):
            self._prepare_rebalance(g)
        elif g.state == PREPARING:
            self._maybe_complete_join(g)

    def _emptied(self, g: Group) -> None:
        # Its protocol type stays (Kafka lists and describes an empty group with it) until a
        # first member of any type joins again.
        g.state = EMPTY
        g.generation += 1
        g.protocol_name = None
        g.leader = None
        g.emptied_at = time.monotonic()
        self._store_later(g)

    # -- the group's metadata record -----------------------------------------------------------
    @staticmethod
    def record_of(g: Group) -> GroupRecord:
        return GroupRecord(
            g.protocol_type or "",
            g.generation,
            g.protocol_name,
            g.leader,
            int(time.time() * 1000),
            tuple(
                MemberRecord(
                    m.member_id,
                    m.group_instance_id,
                    m.client_id,
                    m.client_host,
                    m.rebalance_timeout_ms,
                    m.session_timeout_ms,
                    m.metadata_for(g.protocol_name or ""),
                    m.assignment,
                )
                for m in g.members.values()
            ),
        )

    async def _store(self, g: Group) -> None:
        if self.persist is not None:
            await self.persist(g.group_id, self.record_of(g))

    def _store_later(self, g: Group) -> None:
        """Write the group's record as it is now, without waiting for it."""
        if self.persist is not None:
            self._spawn(self.persist(g.group_id, self.record_of(g)))

    def _spawn(self, coro) -> None:
        if self.persist is None:
            coro.close()
            return
        task = asyncio.ensure_future(coro)
        self._writes.add(task)
        task.add_done_callback(self._writes.discard)

    def restore(self, records: dict[str, GroupRecord]) -> int:
        """Take back the groups of ``records`` this coordinator does not know (a restart, or
        the offsets partitions it now leads): their members stay, each with a full session
        from now to heartbeat in, as Kafka's coordinator loads them. Returns how many."""
        taken = 0
        for gid, r in records.items():
            if gid in self.groups:
                continue
            g = Group(gid)
            g.protocol_type = r.protocol_type or None
            g.generation = r.generation
            g.protocol_name = r.protocol
            g.leader = r.leader
            for mr in r.members:
                g.members[mr.member_id] = Member(
                    mr.member_id, mr.group_instance_id, mr.client_id, mr.client_host,
                    mr.session_timeout_ms, mr.rebalance_timeout_ms, r.protocol_type,
                    [(r.protocol or "", mr.subscription)], mr.assignment,
                )  # fmt: skip
            if g.members:
                g.state = STABLE
                for m in g.members.values():
                    self._schedule_expiry(g, m)
            else:
                g.state = EMPTY
                g.emptied_at = time.monotonic()
            self.groups[gid] = g
            taken += 1
        return taken

    def kept(self, g: Group) -> bool:
        """Whether an empty group without members is still known: one whose members all left
        stays (Empty) until Kafka's periodic clean-up would drop it, if it has no offsets."""
        if g.members or g.pending or g.state != EMPTY:
            return True
        return g.emptied_at is not None and (
            time.monotonic() - g.emptied_at < self.empty_group_ms / 1000
        )

    def sweep(self, has_offsets: Callable[[str], bool]) -> None:
        """Drop the empty groups no longer kept. One with committed offsets stays, as Kafka
        keeps a group (and its protocol type) until its offsets expire."""
        for gid in [gid for gid, g in self.groups.items() if not self.kept(g)]:
            if not has_offsets(gid):
                self.forget(gid)
                if self.persist is not None:
                    self._spawn(self.persist(gid, None))  # nor taken back at a restart

    def _schedule_expiry(self, g: Group, m: Member) -> None:
        self._cancel_expiry(m)
        loop = asyncio.get_running_loop()
        m.expiry = loop.call_later(m.session_timeout_ms / 1000, self._expire, g, m)

    @staticmethod
    def _cancel_expiry(m: Member) -> None:
        if m.expiry is not None:
            m.expiry.cancel()
            m.expiry = None

    def _expire(self, g: Group, m: Member) -> None:
        if g.members.get(m.member_id) is not m:
            return
        if m.join_future is not None and not m.join_future.done():
            return  # parked in a join: alive
        if m.sync_future is not None and not m.sync_future.done():
            return
        log.info("group %s: member %s session expired", g.group_id, m.member_id)
        self._remove_member(g, m, rebalance=True)

    def _expire_pending(self, g: Group, member_id: str) -> None:
        if g.pending.pop(member_id, None) is not None:
            self._maybe_complete_join(g)

    # -- offsets -------------------------------------------------------------------------------
    def validate_commit(self, group_id: str, generation: int, member_id: str) -> str:
        """Whether an OffsetCommit from this member and generation may be applied."""
        g = self.groups.get(group_id)
        if generation < 0 and not member_id:
            # A commit from outside the group protocol (admin tools, assign() consumers).
            if g is not None and g.members:
                return "UNKNOWN_MEMBER_ID"
            return "NONE"
        if g is None:
            return "GROUP_ID_NOT_FOUND"
        if member_id not in g.members:
            return "UNKNOWN_MEMBER_ID"
        if generation != g.generation:
            return "ILLEGAL_GENERATION"
        if g.state == COMPLETING:
            return "REBALANCE_IN_PROGRESS"
        self._schedule_expiry(g, g.members[member_id])
        return "NONE"

    def forget(self, group_id: str) -> None:
        """Drop a group that has no members (DeleteGroups); one that gained a member meanwhile
        stays."""
        g = self.groups.get(group_id)
        if g is None or g.members:
            return
        del self.groups[group_id]
        self._stop_timers(g)

    @staticmethod
    def _stop_timers(g: Group) -> None:
        if g.rebalance_timer is not None:
            g.rebalance_timer.cancel()
        for t in g.pending.values():
            t.cancel()

    def unload(self, group_id: str) -> None:
        """Drop a group, members and all: another coordinator led its partition since, so what
        this one knows may be stale (it is restored from the records). Requests parked in it
        are answered NOT_COORDINATOR, and the clients look for the coordinator again."""
        g = self.groups.pop(group_id, None)
        if g is None:
            return
        self._stop_timers(g)
        for m in g.members.values():
            self._cancel_expiry(m)
            if m.join_future is not None and not m.join_future.done():
                m.join_future.set_result(JoinResult("NOT_COORDINATOR", member_id=m.member_id))
            if m.sync_future is not None and not m.sync_future.done():
                m.sync_future.set_result(("NOT_COORDINATOR", b""))

    def shutdown(self) -> None:
        for t in self._writes:
            t.cancel()
        for g in self.groups.values():
            self._stop_timers(g)
            for m in g.members.values():
                self._cancel_expiry(m)
                for fut in (m.join_future, m.sync_future):
                    if fut is not None and not fut.done():
                        fut.cancel()
