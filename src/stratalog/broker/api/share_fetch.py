"""ShareFetch (78) and ShareAcknowledge (79): share consumers fetch records they acquire and
acknowledge them one by one (KIP-932).

A ShareFetch first applies the acknowledgements it carries, then, for each partition of the
member's share session (``broker/share_sessions.py``), reads the log from the share-partition's
first acquirable offset and acquires what the read covered (``broker/share_partition.py``). The
answer carries the batches as stored plus the acquired offset ranges with their delivery counts;
the client hands out only acquired records. With nothing acquired it waits, up to ``max_wait``,
for new records or for records to come back (released, or a lock run out).

The share-partitions live on the broker that leads the partition, in memory; their state is
durable in ``__share_group_state`` (``broker/share_state.py``): read back when a share-partition
is first used after a start or a change of leader, and written before an answer hands records
out (the delivery counted) or confirms acknowledgements.
"""

from __future__ import annotations

import asyncio
import time
import uuid

from stratalog.broker.group_coordinator import GroupError
from stratalog.broker.group_timers import keep_expiring_share_groups, wake_share_fetches
from stratalog.broker.share_groups import ShareGroup
from stratalog.broker.share_partition import Acquired, ShareError, SharePartition
from stratalog.broker.share_sessions import FINAL_EPOCH, OPEN_EPOCH, ShareSession
from stratalog.broker.share_state import restore
from stratalog.protocol.connection import Request
from stratalog.storage.journal import StorageFailure
from stratalog.storage.partition import FileSlice, ReadResult

from . import leader_hints
from .common import NONE, err, reply, sub
from .consumer_groups import _now

TopicPartition = tuple[uuid.UUID, int]

# A share-partition whose durable state could not be read or written now (its coordinator is
# moving, or the write failed). An acknowledgement that was not made durable is answered with
# it (as Kafka's share-partition leader answers its persister's failures); a fetch leaves such a
# partition out of its answer, without an error, as Kafka does while a share-partition is not
# initialized (librdkafka takes an error there as fatal), and the client fetches again.
STATE_UNAVAILABLE = "COORDINATOR_NOT_AVAILABLE"


class _Outcome:
    """One partition's part of an answer."""

    __slots__ = ("ack_error", "ack_message", "acquired", "error", "message", "records")

    def __init__(self) -> None:
        self.error = "NONE"
        self.message: str | None = None
        self.ack_error = "NONE"
        self.ack_message: str | None = None
        self.records: bytes | None = None
        self.acquired: list[Acquired] = []


def _group(core, group_id: str) -> ShareGroup:
    """The group whose share-partitions this broker keeps (a leader that is not the group's
    coordinator keeps them for a group it has no members of)."""
    groups = core.share_groups
    g = groups.group(group_id)
    if g is None:
        g = groups.groups[group_id] = ShareGroup(group_id)
    return g


def _share_partition(core, g: ShareGroup, tp: TopicPartition) -> tuple[SharePartition | None, str]:
    """The share-partition of ``tp`` loaded by :func:`_load_share_partitions`, or why not."""
    t = core.topic_by_id(tp[0])
    if t is None:
        return None, "UNKNOWN_TOPIC_ID"
    lead = core.leader_error(t.name, tp[1])
    if lead is not None:
        return None, lead
    p = core.partition(t.name, tp[1])
    if p is None:
        return None, "UNKNOWN_TOPIC_OR_PARTITION"
    sp = g.partitions.get(tp)
    if sp is None or sp.leader_epoch != core.leadership_epoch(t.name, tp[1]):
        return None, STATE_UNAVAILABLE
    sp.move_start(p.log_start_offset)
    return sp, "NONE"


async def _load_share_partitions(core, g: ShareGroup, tps) -> None:
    """Make sure each share-partition of ``tps`` this broker leads is in memory at its current
    leadership: read its durable state (or start it where ``share.auto.offset.reset`` says when
    none was written). One that cannot be read now stays out (STATE_UNAVAILABLE)."""
    cfg = core.config
    for tp in dict.fromkeys(tps):
        t = core.topic_by_id(tp[0])
        if t is None or core.leader_error(t.name, tp[1]) is not None:
            continue
        epoch = core.leadership_epoch(t.name, tp[1])
        sp = g.partitions.get(tp)
        if sp is not None and sp.leader_epoch == epoch:
            continue
        try:
            state = await core.share_state.read((g.group_id, tp[0], tp[1]), epoch)
        except StorageFailure:  # (FencedLeader too: a newer leader exists)
            continue
        p = core.partition(t.name, tp[1])
        sp = g.partitions.get(tp)
        if p is None or (sp is not None and sp.leader_epoch == epoch):
            continue  # (gone, or loaded by another request meanwhile)
        earliest = cfg["share.auto.offset.reset"] == "earliest"
        sp = SharePartition(
            p.log_start_offset if earliest else p.high_watermark,
            lock_ms=cfg["group.share.record.lock.duration.ms"],
            delivery_limit=cfg["group.share.delivery.count.limit"],
            max_locks=cfg["group.share.partition.max.record.locks"],
            leader_epoch=epoch,
        )
        if state is not None:
            restore(sp, state)
        g.partitions[tp] = sp


async def _persist(core, g: ShareGroup, member: str, acked, acquired, out: dict) -> None:
    """Make the state of the share-partitions ``acked`` and ``acquired`` durable, one write
    each; where it failed, an acknowledgement gets STATE_UNAVAILABLE as its error and an
    acquisition is undone (the partition hands out nothing)."""
    acked, acquired = set(acked), set(acquired)
    tps = [tp for tp in dict.fromkeys([*acked, *acquired]) if tp in g.partitions]
    results = await asyncio.gather(
        *(core.share_state.persist((g.group_id, *tp), g.partitions[tp]) for tp in tps),
        return_exceptions=True,
    )
    for tp, r in zip(tps, results, strict=True):
        if r is None:
            continue
        if not isinstance(r, StorageFailure):
            raise r
        o = out.setdefault(tp, _Outcome())
        if tp in acked:
            o.ack_error, o.ack_message = STATE_UNAVAILABLE, str(r)
        if tp in acquired:
            g.partitions[tp].unacquire(member, o.acquired)
            o.acquired = []
            o.records = None


def _acknowledge(
    core, g: ShareGroup, member: str, topics, out: dict
) -> tuple[bool, list[TopicPartition]]:
    """Apply every acknowledgement batch; whether any record came back for others, and the
    share-partitions changed (their state to be made durable before the answer)."""
    now = _now()
    released = False
    changed: list[TopicPartition] = []
    for t in topics:
        for part in t.partitions:
            batches = part.acknowledgement_batches
            if not batches:
                continue
            tp = (t.topic_id, part.partition_index)
            o = out.setdefault(tp, _Outcome())
            sp, error = _share_partition(core, g, tp)
            if sp is None:
                o.ack_error = error
                continue
            before = sp.fetch_from()
            changed.append(tp)
            try:
                for b in batches:
                    sp.acknowledge(
                        member, b.first_offset, b.last_offset, tuple(b.acknowledge_types), now
                    )
            except ShareError as e:
                o.ack_error, o.ack_message = e.error, e.message
            released |= sp.fetch_from() != before
    return released, changed


def _ack_partitions(topics) -> list[TopicPartition]:
    return [
        (t.topic_id, p.partition_index)
        for t in topics
        for p in t.partitions
        if p.acknowledgement_batches
    ]


def _session(core, req: Request, added: list[TopicPartition], forgotten: list[TopicPartition]):
    b = req.body
    return core.share_sessions.begin(
        b.group_id, b.member_id, b.share_session_epoch, added, forgotten
    )


def _check_ids(group_id: str | None, member_id: str | None) -> None:
    # Kafka does not ask the group whether the member belongs to it: the share session is the
    # member's word, and records are locked to the member id it gives.
    if not group_id:
        raise GroupError("INVALID_REQUEST", "Group id can't be empty.")
    if not member_id:
        raise GroupError("INVALID_REQUEST", "Member id can't be empty.")


def _tie_to_connection(core, conn, g: ShareGroup, session: ShareSession) -> None:
    """A share session lasts as long as the connection that opened it: when that connection
    goes, the session closes and the member's records are released at once, as in Kafka."""
    key = (session.group_id, session.member_id)

    def lost() -> None:
        if core.share_sessions.sessions.get(key) is session:
            core.share_sessions.close(*key)
            if _release_member(g, session.member_id):
                wake_share_fetches(core)

    on_lost = getattr(conn, "on_lost", None)
    if on_lost is not None:
        on_lost.append(lost)


def _error_answer(req: Request, error: str, message: str | None) -> bytes:
    return reply(
        req,
        error_code=err(error),
        error_message=message,
        acquisition_lock_timeout=0,  # as Kafka: no lock in a refusal
        responses=(),
        node_endpoints=(),
    )


def _release_member(g: ShareGroup, member: str) -> bool:
    return sum(sp.release_member(member) for sp in g.partitions.values()) > 0


# -- ShareFetch ------------------------------------------------------------------------------
async def handle_share_fetch(core, req: Request, conn) -> bytes:
    b = req.body
    lock_ms = core.config["group.share.record.lock.duration.ms"]
    epoch = b.share_session_epoch
    added = [(t.topic_id, p.partition_index) for t in b.topics for p in t.partitions]
    forgotten = [(t.topic_id, p) for t in b.forgotten_topics_data for p in t.partitions]
    acks = any(p.acknowledgement_batches for t in b.topics for p in t.partitions)
    try:
        _check_ids(b.group_id, b.member_id)
        if epoch == OPEN_EPOCH and acks:
            raise GroupError(
                "INVALID_REQUEST", "Acknowledge data present on initial fetch request."
            )
        session = _session(core, req, added if epoch != FINAL_EPOCH else [], forgotten)
    except (GroupError, ShareError) as e:
        return _error_answer(req, e.error, e.message)
    g = _group(core, b.group_id)
    out: dict[TopicPartition, _Outcome] = {}
    if epoch == OPEN_EPOCH:
        _tie_to_connection(core, conn, g, session)
        # The answer that opens a session names every partition of it, records or not.
        for tp in session.partitions:
            out[tp] = _Outcome()
    await _load_share_partitions(core, g, [*_ack_partitions(b.topics), *session.partitions])
    released, acked = _acknowledge(core, g, b.member_id, b.topics, out)
    if released:
        wake_share_fetches(core)
    if epoch == FINAL_EPOCH:
        await _persist(core, g, b.member_id, acked, (), out)
        core.share_sessions.close(b.group_id, b.member_id)
        if _release_member(g, b.member_id):
            wake_share_fetches(core)
    else:
        await _fetch(core, req, g, session, out, acked)
    keep_expiring_share_groups(core)
    return _answer(core, req, out, lock_ms)


async def _fetch(
    core, req: Request, g: ShareGroup, session: ShareSession, out: dict, acked: list
) -> None:
    """Acquire records (waiting up to ``max_wait`` for some) and make the acquisitions and the
    request's acknowledgements (``acked``) durable before the answer: in one write per
    share-partition when records come at once (a consumer acknowledges what it fetched in its
    next fetch of the same partitions), else the acknowledgements first, while it waits."""
    b = req.body
    max_wait = b.max_wait.total_seconds()
    deadline = time.monotonic() + max(0.0, max_wait)
    loop = asyncio.get_running_loop()
    acks_durable: asyncio.Future | None = None
    try:
        while True:
            await _load_share_partitions(core, g, session.partitions)  # (one that failed)
            got = _acquire(core, g, b.member_id, session, b.max_records, b.max_bytes, out)
            if got or any(o.error != "NONE" for o in out.values()):
                # The acquisitions are durable (their delivery counted) before the records go.
                durable = _persist(core, g, b.member_id, () if acks_durable else acked,
                                   [tp for tp, _o, _r in got], out)  # fmt: skip
                reads = asyncio.gather(
                    *(loop.run_in_executor(core.read_executor, _bytes_of, rr) for *_x, rr in got)
                )
                _none, data = await asyncio.gather(durable, reads)
                for (_tp, o, _rr), records in zip(got, data, strict=True):
                    if o.acquired:
                        o.records = records
                return
            if acks_durable is None and acked:
                acks_durable = asyncio.ensure_future(_persist(core, g, b.member_id, acked, (), out))
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            fut = loop.create_future()
            core.share_waiters.append(fut)
            waiters = [fut] + [p.waiter() for p in _logs(core, session)]
            await asyncio.wait(waiters, timeout=remaining, return_when=asyncio.FIRST_COMPLETED)
            for w in waiters:
                w.cancel()
    finally:
        if acks_durable is not None:
            await acks_durable


def _logs(core, session: ShareSession) -> list:
    logs = []
    for tid, index in session.partitions:
        t = core.topic_by_id(tid)
        p = core.partition(t.name, index) if t is not None else None
        if p is not None:
            logs.append(p)
    return logs


def _acquire(
    core,
    g: ShareGroup,
    member: str,
    session: ShareSession,
    max_records: int,
    max_bytes: int,
    out: dict,
):
    """Acquire records for ``member`` in each partition of its session, up to ``max_records``
    over all of them; (partition, outcome, read) of each partition that got some."""
    now = _now()
    reads: list[tuple[TopicPartition, _Outcome, ReadResult]] = []
    budget_records = max(1, max_records)
    budget_bytes = max_bytes
    for tp in session.rotated():
        sp, error = _share_partition(core, g, tp)
        if sp is None:
            if error != STATE_UNAVAILABLE:
                out.setdefault(tp, _Outcome()).error = error
            continue
        if budget_records <= 0 or budget_bytes <= 0:
            break
        t = core.topic_by_id(tp[0])
        p = core.partition(t.name, tp[1])
        start = sp.fetch_from()
        if start is None or start >= p.high_watermark:
            continue
        # Read no further than the records this fetch may acquire; a first batch that goes
        # past that is still read whole (its records beyond stay available to others).
        until = min(sp.acquirable_until(start, budget_records), p.high_watermark)
        rr = p.read(start, budget_bytes, min_one=True, upto=until)
        if not rr.size:
            rr.release()
            rr = p.read(start, 1, min_one=True)
        if not rr.size:
            rr.release()
            continue
        acquired = sp.acquire(member, start, rr.next_offset, budget_records, now)
        if not acquired:
            rr.release()
            continue
        o = out.setdefault(tp, _Outcome())
        o.acquired = acquired
        budget_records -= sum(a.last_offset - a.first_offset + 1 for a in acquired)
        budget_bytes -= rr.size
        reads.append((tp, o, rr))
    return reads


def _bytes_of(rr: ReadResult) -> bytes:
    try:
        return b"".join(p.read() if isinstance(p, FileSlice) else bytes(p) for p in rr.parts)
    finally:
        rr.release()


def _answer(core, req: Request, out: dict[TopicPartition, _Outcome], lock_ms: int) -> bytes:
    by_topic: dict[uuid.UUID, list] = {}
    for (tid, index), o in out.items():
        t = core.topic_by_id(tid)
        leader = leader_hints.current_leader(core, t.name, index) if t is not None else None
        leader_id, leader_epoch = leader or (-1, -1)
        by_topic.setdefault(tid, []).append(
            sub(
                req,
                "PartitionData",
                partition_index=index,
                error_code=err(o.error),
                error_message=o.message,
                acknowledge_error_code=err(o.ack_error),
                acknowledge_error_message=o.ack_message,
                current_leader=sub(
                    req, "LeaderIdAndEpoch", leader_id=leader_id, leader_epoch=leader_epoch
                ),
                records=o.records or b"",  # Kafka sends empty records, never null
                acquired_records=tuple(
                    sub(
                        req,
                        "AcquiredRecords",
                        first_offset=a.first_offset,
                        last_offset=a.last_offset,
                        delivery_count=a.delivery_count,
                    )
                    for a in o.acquired
                ),
            )
        )
    return reply(
        req,
        error_code=NONE,
        error_message=None,
        acquisition_lock_timeout=lock_ms,
        responses=tuple(
            sub(req, _TOPIC_ENTITY[req.api_key], topic_id=tid, partitions=tuple(parts))
            for tid, parts in by_topic.items()
        ),
        node_endpoints=(),
    )


_TOPIC_ENTITY = {78: "ShareFetchableTopicResponse", 79: "ShareAcknowledgeTopicResponse"}


# -- ShareAcknowledge --------------------------------------------------------------------------
async def handle_share_acknowledge(core, req: Request, conn) -> bytes:
    b = req.body
    lock_ms = core.config["group.share.record.lock.duration.ms"]
    try:
        _check_ids(b.group_id, b.member_id)
        if b.share_session_epoch == OPEN_EPOCH:
            raise ShareError(
                "INVALID_SHARE_SESSION_EPOCH", "Acknowledge requests cannot open a share session."
            )
        _session(core, req, [], [])
    except (GroupError, ShareError) as e:
        return _error_answer(req, e.error, e.message)
    g = _group(core, b.group_id)
    out: dict[TopicPartition, _Outcome] = {}
    await _load_share_partitions(core, g, _ack_partitions(b.topics))
    released, acked = _acknowledge(core, g, b.member_id, b.topics, out)
    await _persist(core, g, b.member_id, acked, (), out)
    if b.share_session_epoch == FINAL_EPOCH:
        core.share_sessions.close(b.group_id, b.member_id)
        released |= _release_member(g, b.member_id)
    if released:
        wake_share_fetches(core)
    keep_expiring_share_groups(core)
    for o in out.values():
        # ShareAcknowledge has one error per partition: the acknowledgement's.
        o.error, o.message = o.ack_error, o.ack_message
    return _answer(core, req, out, lock_ms)
