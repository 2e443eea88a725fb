"""Fetch with long-poll.

A Fetch is answered when it has ``min_bytes`` or ``max_wait`` has passed (an idle consumer costs
one request per ``max_wait``, not a busy loop). Chunks come back whole, starting with the one
holding the fetch offset; the first non-empty partition always gets at least one chunk even if
it is larger than the limits (KIP-74). Tail chunks are served from memory; older ones are read
from segment files on the bounded read pool, off the event loop and off the write path.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import time
import uuid

from stratalog import splits
from stratalog.broker import metrics
from stratalog.broker.backlog_sender import BacklogAnswer
from stratalog.protocol.connection import Request
from stratalog.protocol.errors import code
from stratalog.protocol.fetch import PartitionFetchResult, encode_fetch_response
from stratalog.storage import page_cache
from stratalog.storage.backlog_loader import BacklogLoader
from stratalog.storage.direct_read import DirectReader
from stratalog.storage.partition import FileSlice, PartitionLog, ReadResult
from stratalog.storage.throttle import PacedResponse

from . import leader_hints

_ZERO_UUID = uuid.UUID(int=0)
log = logging.getLogger(__name__)


def _resolve_topic(core, req: Request, ft) -> tuple[str, uuid.UUID | None, object | None, str]:
    """(name, topic id, TopicMeta or None, error name if unknown)."""
    if req.api_version >= 13:
        t = core.topic_by_id(ft.topic_id)
        if t is None:
            return "", ft.topic_id, None, "UNKNOWN_TOPIC_ID"
        return t.name, t.topic_id, t, ""
    t = core.metadata.topics.get(ft.topic)
    return ft.topic, t.topic_id if t else None, t, "UNKNOWN_TOPIC_OR_PARTITION"


def _leader_endpoints(core, topics: list, conn) -> list[tuple[int, str, int]]:
    """KIP-951: the endpoints of the leaders that refused partitions name (error path only)."""
    named = leader_hints.named_leaders(r for _name, _tid, results in topics for r in results)
    return leader_hints.endpoints(core, named, conn)


# Errors answered with the current leader (KIP-951), as Kafka's Fetch does.
_HINTED = (leader_hints.NOT_LEADER, "FENCED_LEADER_EPOCH")


def _epoch_error(core, name: str, fp) -> str | None:
    """KIP-320: a leader answers a Fetch whose current leader epoch is older than its own
    FENCED_LEADER_EPOCH and a newer one UNKNOWN_LEADER_EPOCH, and serves no records (-1: not
    checked, as Kafka). Served, a stale-epoch fetch in flight moves a consumer's position while
    librdkafka validates it at the new epoch, and a Metadata answer meanwhile makes it compare
    the leader's end offset with the moved position: a false truncation, and a seek forward over
    records fetched but not handed over (the likely cause of the soak's poll-skip, issue 27)."""
    current = getattr(fp, "current_leader_epoch", -1)
    if current < 0 or core.cluster is None:
        return None
    v = core.cluster.vlog_of(name, fp.partition)
    if v is None or current == v.epoch:
        return None
    return "FENCED_LEADER_EPOCH" if current < v.epoch else "UNKNOWN_LEADER_EPOCH"


def _gather(core, req: Request, plan, max_bytes: int, read_committed: bool = False):
    """Read every requested partition once; return (topics, size, reads, partitions, errors).
    A read_committed consumer reads up to each partition's last stable offset and gets the
    aborted transactions its records overlap."""
    topics = []
    total = 0
    reads: list[ReadResult] = []
    logs: list[PartitionLog] = []
    errors = False
    for name, tid, t, missing, fparts in plan:
        results = []
        topics.append((name, tid, results))
        for fp in fparts:
            r = PartitionFetchResult(fp.partition)
            results.append(r)
            lead = core.leader_error(name, fp.partition) if t is not None else None
            if lead is None and t is not None:
                lead = _epoch_error(core, name, fp)
            p = core.partition(name, fp.partition) if t is not None and lead is None else None
            if p is None:
                r.error_code = code(missing or lead or "UNKNOWN_TOPIC_OR_PARTITION")
                if lead in _HINTED and req.api_version >= 16:
                    r.current_leader = leader_hints.current_leader(core, name, fp.partition)
                errors = True
                continue
            logs.append(p)
            r.high_watermark = p.high_watermark
            r.last_stable_offset = lso = p.last_stable_offset
            r.log_start_offset = p.log_start_offset
            offset = fp.fetch_offset
            if offset < p.log_start_offset or offset > p.next_offset:
                r.error_code = code("OFFSET_OUT_OF_RANGE")
                # As Kafka: an out-of-range answer carries no watermarks.
                r.high_watermark = r.last_stable_offset = r.log_start_offset = -1
                errors = True
                continue
            lost = p.lost_at(offset) if p.lost else None
            if lost is not None:
                # Its chunk was in damaged bytes (storage/damage.py): Kafka clients raise this
                # to the application, which may seek past ``lost[1]``.
                r.error_code = code("CORRUPT_MESSAGE")
                errors = True
                log.info(
                    "fetch of %s-%d at %d: offsets %d..%d were lost to damaged storage",
                    name,
                    fp.partition,
                    offset,
                    *lost,
                )
                continue
            remaining = max_bytes - total
            if remaining <= 0 and total > 0:
                continue
            limit = min(fp.partition_max_bytes, remaining) if total else fp.partition_max_bytes
            try:
                if read_committed:
                    rr = p.read(offset, limit, min_one=total == 0, upto=lso)
                    if rr.size and p.txns.aborted_count:
                        r.aborted = p.txns.aborted_between(offset, rr.next_offset)
                else:
                    rr = p.read(offset, limit, min_one=total == 0)
            except OSError as e:
                # An index run on disk that cannot be read (chunk_index.py): that partition
                # only, as a read error of its data would be.
                log.error("fetch of %s-%d at %d: %s", name, fp.partition, offset, e)
                r.error_code = code("KAFKA_STORAGE_ERROR")
                errors = True
                continue
            if rr.size:
                if req.api_version >= 12 and splits.SPLIT_HISTORY in t.configs:
                    r.order = _order_marks(core, name, fp.partition, p, rr, t.configs)
                if rr.first_offset > offset:
                    _answered_later(core, name, fp, p, rr)
                reads.append(rr)
                r.records = rr.parts
                r.records_size = rr.size
                total += rr.size
    return topics, total, reads, logs, errors


def _order_marks(core, name: str, index: int, p: PartitionLog, rr: ReadResult, configs):
    """A split child's order marks for the batches read (stratalog.splits); None for a
    partition the topic was created with."""
    parent = splits.parent_of(index, splits.parse_history(configs[splits.SPLIT_HISTORY]))
    pp = core.partition(name, parent) if parent is not None else None
    if pp is None:
        return None
    return splits.encode_marks(p.order_marks(pp, rr.first_offset, rr.next_offset))


def _answered_later(core, name: str, fp, p: PartitionLog, rr: ReadResult) -> None:
    """A read that begins past the offset asked for: a client takes the offsets between for
    absent and moves past them. Legitimate where compaction or a reassignment's copy left a gap;
    anywhere else it is a consumer skipping records (the soak's poll-skip, issue 27), so it is
    logged with what the leader knew, to tell that case from a client's own seek."""
    v = core.cluster.vlog_of(name, fp.partition) if core.cluster is not None else None
    log.info(
        "fetch of %s-%d at %d (client's leader epoch %d) answered from %d: high watermark %d, "
        "log end %d, start %d, epoch %s",
        name,
        fp.partition,
        fp.fetch_offset,
        getattr(fp, "current_leader_epoch", -1),
        rr.first_offset,
        p.high_watermark,
        p.next_offset,
        p.log_start_offset,
        v.epoch if v is not None else "-",
    )


_MIN_PACED_AHEAD = 256 * 1024
# A partition read that reaches the high watermark within this many bytes is a caught-up
# consumer's: its answer is not paced by the backlog budget (tail reads come first, as
# BookKeeper's), unless its bytes had to come from the disk.
_TAIL_READ_BYTES = 1024 * 1024


def _at_tail(rr: ReadResult) -> bool:
    return rr.at_end and rr.size <= _TAIL_READ_BYTES


def _file_bytes(parts: list) -> int:
    return sum(p.size for p in parts if isinstance(p, FileSlice))


def _spans(parts: list) -> list[tuple]:
    """(segment, first byte, end) of the region each segment's slices of one answer cover."""
    spans: dict[int, list] = {}
    for p in parts:
        if isinstance(p, FileSlice):
            s = spans.get(id(p.segment))
            if s is None:
                spans[id(p.segment)] = [p.segment, p.position, p.position + p.size]
            else:
                s[1] = min(s[1], p.position)
                s[2] = max(s[2], p.position + p.size)
    return [tuple(s) for s in spans.values()]


def _resident(parts: list) -> bool:
    """Whether one partition's answer can be sent without the disk: one check per segment span
    (a cachestat and two probes) rather than one per chunk, since this runs on the event loop
    and a catch-up answer holds dozens of chunks. The span includes the chunks of the other
    partitions in between (a virtual log), so it may say no where each chunk would say yes:
    those go to the read pool, which checks chunk by chunk."""
    for segment, lo, hi in _spans(parts):
        try:
            if not page_cache.resident(segment.fd, lo, hi - lo):
                return False
        except (OSError, ValueError):
            return False
    return True


def _load(parts: list, ahead: int, loader: BacklogLoader) -> None:
    """Bring the span of each segment this answer touches, plus ``ahead`` bytes past it, into
    the page cache in the loader's small requests, one at a time (storage/backlog_loader.py).

    In a virtual log the chunks of one partition sit between other partitions' chunks: read one
    by one, a catch-up consumer issues many small random reads. One sequential span serves this
    partition's next fetches and the other partitions sharing the log, whose consumers drain the
    same region; read in small requests, it never queues in the disk as one large burst ahead of
    the journal's next fsync.
    """
    for segment, lo, hi in _spans(parts):
        try:
            loader.load(segment, lo, hi + ahead)
        except OSError as e:
            raise _named(e, segment) from None


def _named(e: OSError, segment) -> OSError:
    """``e`` naming the file it came from (a pread's EIO names none), for the broker's log."""
    if e.filename is None:
        e.filename = str(getattr(segment, "data_path", None) or segment)
    return e


def _read_cold(
    parts: list,
    ahead: int,
    direct: DirectReader | None,
    loader: BacklogLoader,
    copy: bool = False,
) -> str | None:
    """Make one partition's answer sendable without the disk (on the read pool): its slices
    are loaded into the page cache and stay slices (sent with sendfile), or, with direct reads
    or where a page is gone again, replaced by their bytes; returns an error text instead if the
    storage fails. With ``copy`` (a TLS connection, which cannot sendfile) every slice is
    replaced by its bytes."""
    failure = None
    # (A TLS answer's slices already in the page cache are copied as they are; the others are
    # loaded the backlog's way first, so a TLS catch-up keeps the same I/O isolation.)
    if direct is None and not (
        copy and all(p.resident() for p in parts if isinstance(p, FileSlice))
    ):
        try:
            _load(parts, ahead, loader)
        except OSError as e:
            failure = str(e)
    for i, p in enumerate(parts):
        if not isinstance(p, FileSlice) or (failure is None and not copy and p.resident()):
            continue  # memory, or a slice in the page cache: sent with sendfile
        if failure is None:
            try:
                if direct is None:
                    parts[i] = p.read()
                else:
                    parts[i] = direct.read(p.segment, p.position, p.size)
                metrics.FETCH_COPIED_BYTES.inc(p.size)
            except OSError as e:
                failure = str(_named(e, p.segment))
                parts[i] = b""  # released below, not again in the clean-up
            finally:
                p.release()
    if failure is not None:
        # Nothing of this partition is sent: release the slices still held (read ones were
        # replaced by their bytes).
        for p in parts:
            if isinstance(p, FileSlice):
                p.release()
        parts.clear()
    return failure


async def handle_fetch(core, req: Request, conn, denied: frozenset[str] = frozenset()):
    """``denied``: with the authorizer on, the topics this client may not read (answered
    TOPIC_AUTHORIZATION_FAILED; broker/authorization/)."""
    body = req.body
    v = req.api_version
    max_wait = (
        body.max_wait.total_seconds()
        if hasattr(body.max_wait, "total_seconds")
        else (body.max_wait / 1000)
    )
    min_bytes = body.min_bytes
    max_bytes = getattr(body, "max_bytes", 0x7FFFFFFF)
    read_committed = getattr(body, "isolation_level", 0) == 1
    plan = []
    for ft in body.topics:
        name, tid, t, missing = _resolve_topic(core, req, ft)
        if denied and name in denied:
            t, missing = None, "TOPIC_AUTHORIZATION_FAILED"
        plan.append((name, tid, t, missing if t is None else "", ft.partitions))
    deadline = time.monotonic() + max(0.0, max_wait)
    while True:
        topics, total, reads, logs, errors = _gather(core, req, plan, max_bytes, read_committed)
        remaining = deadline - time.monotonic()
        if total >= min_bytes or errors or remaining <= 0 or not logs:
            break
        for rr in reads:
            rr.release()
        waiters = [p.waiter() for p in logs]
        try:
            await asyncio.wait(waiters, timeout=remaining, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waiters:
                if not w.done():
                    w.cancel()
    memory = sum(len(p) for rr in reads for p in rr.parts if not isinstance(p, FileSlice))
    metrics.FETCH_MEMORY_BYTES.inc(memory)
    # History: a partition read short of the tail with bytes from segment files. Decided before
    # the cold reads, which may replace slices by their bytes (direct reads).
    history = any(not _at_tail(rr) and _file_bytes(rr.parts) for rr in reads)
    budget = core.backlog_rate
    sender = core.backlog_sender
    # Over TLS nothing goes out by sendfile: every slice is read on the read pool instead.
    copy = not getattr(conn, "zero_copy", True)
    if (
        history
        and not copy
        and sender is not None
        and (budget.rate <= 0 or core.backlog_pacer is None)
        and sender.takes([p for rr in reads for p in rr.parts])
    ):
        # History: the sender process loads and sends it at idle priority (backlog_sender.py),
        # at a fixed budget's rate if there is one (a steered budget changes as the loop runs,
        # so those answers stay with the loop); the loop neither checks the page cache nor
        # waits for the read pool.
        parts, _size = encode_fetch_response(
            v,
            req.correlation_id,
            topics,
            session_id=0,
            read_committed=read_committed,
            node_endpoints=_leader_endpoints(core, topics, conn) if errors and v >= 16 else None,
        )
        return BacklogAnswer(parts, sender)
    # Slices already in the page cache stay slices (the connection sends them with sendfile);
    # cold ones are read on the bounded read pool, never on the event loop.
    cold = [rr.parts for rr in reads if (copy and _file_bytes(rr.parts)) or not _resident(rr.parts)]
    paced = budget.rate > 0 and history
    ahead = core.config["fetch.read_ahead.bytes"]
    started: list[concurrent.futures.Future] = []

    def read(parts: list) -> asyncio.Future:
        started.append(
            core.read_executor.submit(
                _read_cold, parts, ahead, core.direct_reader, core.backlog_loader, copy
            )
        )
        return asyncio.wrap_future(started[-1])

    try:
        if budget.rate > 0:
            # With a budget the disk reads themselves are paced: one partition at a time, each
            # admitted just before it runs, with the read-ahead the budget allows in about
            # 20 ms. A whole fetch read at once queues in the disk ahead of the journal's
            # fsyncs however far apart the fetches are spaced.
            ahead = min(ahead, max(_MIN_PACED_AHEAD, int(budget.rate * 0.02)))
            failures = []
            for parts in cold:
                if not (copy and _resident(parts)):  # (TLS copies of the page cache: unpaced)
                    await budget.admit(_file_bytes(parts))
                failures.append(await read(parts))
        else:
            # One task per partition: a Fetch over many partitions of history reads them at once.
            failures = await asyncio.gather(*(read(parts) for parts in cold))
    except asyncio.CancelledError:
        # The client went away while this fetch waited: no response will carry (and release)
        # its slices. Reads already running finish first; what they did not read is released.
        running = [asyncio.wrap_future(f) for f in started if not f.cancel()]
        if running:
            await asyncio.wait(running)
        for rr in reads:
            rr.release()
        raise
    if cold:
        # A read error (EIO, a cold-tier file gone) fails that partition's answer only, and
        # only this once: the next Fetch reads again (a transient error is no state).
        failed = {id(parts): f for parts, f in zip(cold, failures, strict=True) if f}
        if failed:
            for name, _tid, results in topics:
                for r in results:
                    if id(r.records) in failed:
                        log.error(
                            "fetch of %s-%d failed, answered KAFKA_STORAGE_ERROR: %s",
                            name,
                            r.index,
                            failed[id(r.records)],
                        )
                        r.error_code = code("KAFKA_STORAGE_ERROR")
                        r.records_size = 0
    parts, size = encode_fetch_response(
        v,
        req.correlation_id,
        topics,
        session_id=0,
        read_committed=read_committed,
        node_endpoints=_leader_endpoints(core, topics, conn) if errors and v >= 16 else None,
    )
    if paced:
        # History goes to the socket at the budget's rate, a piece per turn of the loop
        # (server.py), on its own schedule: the disk reads above have theirs.
        return PacedResponse(parts, core.backlog_send_rate, size)
    return parts
