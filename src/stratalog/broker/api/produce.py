"""Produce and InitProducerId.

Every partition's records are validated and appended in request order as soon as the request
arrives; only the acknowledgement waits. ``acks=0`` gets no response at all (a client that gets
one anyway loses messages), ``acks=1`` is answered once appended, ``acks=-1`` once the append is
durable under the fsync policy (with ``fsync=always``: after the group commit's fsync).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from stratalog.broker import metrics
from stratalog.protocol.connection import Request
from stratalog.protocol.errors import code
from stratalog.protocol.produce import PartitionProduceResult, encode_produce_response
from stratalog.storage.batch import HEADER_SIZE, BatchHeader, CorruptBatchError, parse_header
from stratalog.storage.compaction import keyless_records
from stratalog.storage.journal import StorageFailure
from stratalog.storage.partition import AppendError, AppendResult, PartitionLog
from stratalog.storage.replica import NotPrimary
from stratalog.storage.virtual_log import WriteBatch

from . import leader_hints
from .common import NONE, reply
from .leader_hints import NOT_LEADER


def _timestamp_checker(
    before_ms: int,
    after_ms: int,
    now: int,
    stamp: bool,
    retention_ms: int = -1,
    past_retention: Callable[[int], None] | None = None,
):
    """KIP-937's window around broker time. Out of it, a batch is rejected (INVALID_TIMESTAMP)
    or, with late.event.policy=stamp, accepted and re-stamped with broker time (returns True).
    A batch already older than ``retention_ms`` (retention will delete it within moments: a
    user loading last year's events meets this first) is told to ``past_retention`` with its
    record count."""

    def check(h: BatchHeader) -> bool:
        if h.is_log_append_time:
            return False
        lo = min(h.base_timestamp, h.max_timestamp)
        if now - lo > before_ms or h.max_timestamp - now > after_ms:
            if stamp:
                return True
            raise AppendError(
                "INVALID_TIMESTAMP",
                f"timestamp {h.max_timestamp} is outside the allowed range around broker time "
                f"{now} (message.timestamp.before.max.ms={before_ms}, "
                f"message.timestamp.after.max.ms={after_ms})",
            )
        expired = retention_ms >= 0 and now - h.max_timestamp > retention_ms
        if expired and past_retention is not None:
            past_retention(h.record_count)
        return False

    return check


def handle_produce(core, req: Request, conn):
    body = req.body
    acks = body.acks
    now = int(time.time() * 1000)
    results: list[tuple[str, list[PartitionProduceResult]]] = []
    if acks not in (-1, 0, 1):
        for td in body.topic_data:
            results.append(
                (
                    td.name,
                    [
                        PartitionProduceResult(pd.index, code("INVALID_REQUIRED_ACKS"))
                        for pd in td.partition_data
                    ],
                )
            )
        return encode_produce_response(
            req.api_version, req.correlation_id, results, req.throttle_ms
        )
    if core.disk.low:
        # Under the free-space reserve: refused before anything is written (disk_guard.py).
        return _refuse_all(
            core, req, results, acks, conn, "KAFKA_STORAGE_ERROR", core.disk.reason()
        )
    hints = req.api_version >= 10  # KIP-951: a refused partition names its leader
    pending = _Pending(req, results, core, hints, conn) if acks == -1 else None
    writes = WriteBatch()
    appended: list[tuple[PartitionLog, AppendResult, PartitionProduceResult, int, bool]] = []
    try:
        any_error = _append_all(core, body, now, results, appended, writes, hints, req.api_version)
    finally:
        # Always, so no virtual log is left staging if an append raised unexpectedly.
        writes.commit()
    if pending is not None and any_error and hints:
        pending.hinted = True
    # Only now is it known which appends were written: a failed write's partitions answer
    # KAFKA_STORAGE_ERROR at once (nothing of them was recorded, so a retry is appended).
    produced = spilled = 0
    for p, res, r, nbytes, spilling in appended:
        if res.failure is not None or not res.written:
            r.error_code = code("KAFKA_STORAGE_ERROR")
            r.error_message = str(res.failure or "the write was not made")
            r.base_offset = -1
            any_error = True
            continue
        if res.duplicate_of is None:
            produced += nbytes
            if spilling:
                spilled += nbytes
        if pending is not None:
            if res.duplicate_of is not None:
                if p.high_watermark <= res.last_offset:
                    pending.wait_visible(p, res.last_offset, r)
            else:
                pending.wait_durable(p, res.lsn, r)
    if produced:
        metrics.PRODUCED_BYTES.inc(produced)
    if spilled:
        metrics.SPILLED_BYTES.inc(spilled)
    if acks == 0:
        if any_error:
            # Kafka's answer to a failed acks=0 produce: drop the connection so the client sees.
            conn.abort()
        return None
    if pending is None or pending.all_registered(_timeout_ms(body)):
        answer = encode_produce_response(
            req.api_version,
            req.correlation_id,
            results,
            req.throttle_ms,
            node_endpoints=_leader_endpoints(core, results, conn) if any_error and hints else None,
        )
    else:
        answer = pending.future
    cold_rate = core.migrator.cold_rate
    if spilled and cold_rate.rate > 0:
        # Written to the slow tier: answer at its pace, like a quota delays a response, so
        # producers slow to what the cold device takes (Pafka once the hot tier is full).
        return _after(cold_rate.admit(spilled), answer)
    return answer


def _leader_endpoints(core, results: list, conn=None) -> list[tuple[int, str, int]]:
    return leader_hints.endpoints(
        core, leader_hints.named_leaders(r for _name, parts in results for r in parts), conn
    )


def _append_all(
    core,
    body,
    now: int,
    results: list,
    appended: list,
    writes: WriteBatch,
    hints: bool,
    version: int,
):
    """Validate and stage every partition of a Produce request, in request order, filling
    ``results`` and ``appended`` (what was staged, its size, whether it spilled to the cold
    tier); returns whether any partition failed. With ``hints`` a partition this broker does not
    lead names its current leader (KIP-951)."""
    any_error = False
    for td in body.topic_data:
        name = td.name
        topic = core.metadata.topics.get(name)
        parts: list[PartitionProduceResult] = []
        results.append((name, parts))
        if topic is not None:
            # Topic settings once per topic, not once per partition.
            view = core.topic_config(topic)
            stamped = view.get("message.timestamp.type") == "LogAppendTime"
            log_append_time = now if stamped else -1
            max_batch_bytes = view.get_int("max.message.bytes")
            compacted = "compact" in view.policies()
            deletes = "delete" in view.policies()
            check = _timestamp_checker(
                view.get_int("message.timestamp.before.max.ms"),
                view.get_int("message.timestamp.after.max.ms"),
                now,
                view.get("late.event.policy") == "stamp",
                view.get_int("retention.ms") if deletes else -1,
                lambda n, name=name: core.note_past_retention(name, n),
            )
        for pd in td.partition_data:
            r = PartitionProduceResult(pd.index)
            parts.append(r)
            lead = core.leader_error(name, pd.index) if topic else None
            if lead is None and topic is not None and body.acks == -1:
                lead = core.in_sync_error(name, pd.index, view.get_int("min.insync.replicas"))
                p = core.partition(name, pd.index) if lead is not None else None
                written = p.written_duplicate(pd.records) if p and pd.records else None
                if written is not None:
                    # A retry of a batch this leader wrote before the in-sync set shrank: it
                    # is answered as that batch, once committed. NOT_ENOUGH_REPLICAS would tell
                    # librdkafka it was never written, and after a producer-epoch bump it would
                    # send it again as new records (the fault harness's duplicates).
                    res = AppendResult(written.base_offset, written.last_offset, -1, 0, written)
                    res.written = True
                    r.base_offset = written.base_offset
                    r.log_start_offset = p.log_start_offset
                    appended.append((p, res, r, len(pd.records), False))
                    continue
            if lead is not None:
                r.error_code = code(lead)
                if lead in _REFUSED_UNWRITTEN:
                    core.refusals.note(name, pd.index, pd.records, lead)
                if hints and lead == leader_hints.NOT_LEADER:
                    r.current_leader = leader_hints.current_leader(core, name, pd.index)
                any_error = True
                continue
            p: PartitionLog | None = core.partition(name, pd.index) if topic else None
            if p is None:
                r.error_code = code("UNKNOWN_TOPIC_OR_PARTITION")
                any_error = True
                continue
            if core.refusals and (
                again := core.refusals.instead_of_gap(name, pd.index, pd.records, p)
            ):
                # An earlier batch of this producer was refused unwritten: refused alike.
                r.error_code, r.error_message = code(again[0]), again[1]
                any_error = True
                continue
            try:
                if pd.records is None:
                    raise CorruptBatchError("null records", "INVALID_RECORD")
                if compacted:
                    _require_keys(pd.records, p)
                res = p.append(
                    pd.records,
                    log_append_time_ms=log_append_time,
                    max_batch_bytes=max_batch_bytes,
                    timestamp_check=check,
                    now_ms=now,
                    writes=writes,
                    transactional_check=lambda h, p=p: _verify_transaction(
                        core, body, h, p, version
                    ),
                )
            except (AppendError, CorruptBatchError) as e:
                r.error_code = code(e.error)
                r.error_message = str(e)
                any_error = True
                continue
            except StorageFailure as e:
                # Deposed between the leader check and the append: the client looks again.
                deposed = isinstance(e, NotPrimary)
                r.error_code = code("NOT_LEADER_OR_FOLLOWER" if deposed else "KAFKA_STORAGE_ERROR")
                r.error_message = str(e)
                if deposed:
                    core.refusals.note(name, pd.index, pd.records, "NOT_LEADER_OR_FOLLOWER")
                if deposed and hints:
                    r.current_leader = leader_hints.current_leader(core, name, pd.index)
                any_error = True
                continue
            r.base_offset = res.base_offset
            r.log_append_time = res.log_append_time
            r.log_start_offset = p.log_start_offset
            appended.append((p, res, r, len(pd.records), p.spilling))
    return any_error


# Refusals of a whole batch before any of it is written, which librdkafka retries as not
# persisted (broker/refusals.py).
_REFUSED_UNWRITTEN = frozenset({"NOT_LEADER_OR_FOLLOWER", "NOT_ENOUGH_REPLICAS"})


def _require_keys(records, p: PartitionLog) -> None:
    """A compacted topic keeps each key's latest record: a record without a key is refused
    (INVALID_RECORD, with Kafka's message), the whole request of this partition with it.
    Damaged batches are left to the append's own checks."""
    mv = memoryview(records)
    errors: list[int] = []
    pos = 0
    try:
        while pos + HEADER_SIZE <= len(mv):
            h = parse_header(mv, pos)
            if h.size < HEADER_SIZE or pos + h.size > len(mv):
                return
            errors += keyless_records(h, mv[pos : pos + h.size])
            pos += h.size
    except CorruptBatchError:
        return
    if errors:
        shown = ", ".join(
            f"RecordError(batchIndex={i}, message='Compacted topic cannot accept message "
            f"without key in topic partition {p.topic}-{p.index}.')"
            for i in errors[:3]
        )
        raise AppendError(
            "INVALID_RECORD",
            f"One or more records have been rejected due to {len(errors)} record errors in "
            f"total, and only showing the first three errors at most: [{shown}]",
        )


def _verify_transaction(core, body, h: BatchHeader, p: PartitionLog, version: int) -> None:
    """A transactional batch needs the request's transactional id (Kafka answers
    TRANSACTIONAL_ID_AUTHORIZATION_FAILED without one) and, when it opens its transaction in
    this partition, a transaction that holds the partition (KIP-890's server-side defence,
    checked here when this broker is the id's coordinator)."""
    if body.transactional_id is None:
        raise AppendError(
            "TRANSACTIONAL_ID_AUTHORIZATION_FAILED",
            "a transactional batch needs the request's transactional id",
        )
    if h.producer_id < 0 or h.is_control or h.producer_id in p.txns.open:
        return  # (control batches are refused by the partition)
    error = core.txn.verify(
        body.transactional_id, h.producer_id, h.producer_epoch, (p.topic, p.index)
    )
    if error is None:
        return
    if error in _RETRIABLE_VERIFY:
        # As Kafka: the producer retries (the coordinator was busy or not found).
        raise AppendError(
            "NOT_ENOUGH_REPLICAS",
            "Unable to verify the partition has been added to the transaction. "
            f"Underlying error: {error}",
        )
    if error == "PRODUCER_FENCED":
        error = "INVALID_PRODUCER_EPOCH"
    if error == "TRANSACTION_ABORTABLE" and version < 11:
        error = "INVALID_TXN_STATE"
    raise AppendError(error, "the partition is not in the producer's transaction")


_RETRIABLE_VERIFY = {
    "CONCURRENT_TRANSACTIONS",
    "COORDINATOR_NOT_AVAILABLE",
    "COORDINATOR_LOAD_IN_PROGRESS",
    "NOT_COORDINATOR",
}


def _refuse_all(core, req: Request, results: list, acks: int, conn, error: str, message: str):
    for td in req.body.topic_data:
        results.append(
            (
                td.name,
                [
                    PartitionProduceResult(pd.index, code(error), error_message=message)
                    for pd in td.partition_data
                ],
            )
        )
    if acks == 0:
        conn.abort()  # Kafka's answer to a failed acks=0 produce: the client sees the drop
        return None
    return encode_produce_response(req.api_version, req.correlation_id, results, req.throttle_ms)


def _timeout_ms(body) -> int:
    """The request's own timeout (kio gives a timedelta)."""
    t = body.timeout
    return int(t.total_seconds() * 1000) if hasattr(t, "total_seconds") else int(t)


async def _after(delay, answer):
    await delay
    return await answer if isinstance(answer, asyncio.Future) else answer


class _Pending:
    """An acks=all Produce waiting for its partitions: one future for the whole request,
    completed (with the response) by the last partition to become durable or visible, or by the
    request's own timeout, whichever comes first: no answer waits for what may never happen."""

    __slots__ = (
        "conn", "core", "future", "hinted", "hints", "left", "req", "results", "timer", "waiting"
    )  # fmt: skip

    def __init__(self, req: Request, results: list, core, hints: bool, conn=None) -> None:
        self.req = req
        self.conn = conn  # the client's connection: hints name its listener's addresses
        self.results = results
        self.core = core
        self.hints = hints  # v10+: a partition refused as not led names its leader (KIP-951)
        self.hinted = False  # some partition may name one: the endpoints are worth collecting
        self.future: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        # One extra count until every partition is registered: a callback that runs at once
        # (already durable) must not answer before later partitions are appended.
        self.left = 1
        self.waiting: set[int] = set()  # id() of the results still waited for
        self.timer: asyncio.TimerHandle | None = None

    def wait_durable(self, p: PartitionLog, lsn: int, r: PartitionProduceResult) -> None:
        self._register(r)

        def done(ok: bool) -> None:
            if not ok and id(r) in self.waiting:
                r.base_offset = -1
                core = self.core
                if core.leader_error(p.topic, p.index) == NOT_LEADER:
                    # Deposed before the write was committed (a failover or an election): as
                    # Kafka, the producer is sent to the new leader, where its retry is appended
                    # or recognised as a duplicate.
                    r.error_code = code("NOT_LEADER_OR_FOLLOWER")
                    r.error_message = "the leader changed before the write was committed"
                    if self.hints:
                        r.current_leader = leader_hints.current_leader(core, p.topic, p.index)
                        self.hinted = True
                else:
                    r.error_code = code("KAFKA_STORAGE_ERROR")
                    r.error_message = "fsync failed; the write may not be durable"
            elif ok and self.core.cluster is not None and id(r) in self.waiting:
                # Committed, but by an in-sync set that shrank below min.insync.replicas while
                # it waited (a backup dropped for lag): written, not acknowledged (Kafka).
                core = self.core
                t = core.metadata.topics.get(p.topic)
                if t is not None and core.in_sync_error(
                    p.topic, p.index, core.topic_config(t).get_int("min.insync.replicas")
                ):
                    r.error_code = code("NOT_ENOUGH_REPLICAS_AFTER_APPEND")
                    r.error_message = "the in-sync set shrank below min.insync.replicas"
            self._one_done(r)

        p.when_durable(lsn, done)

    def wait_visible(self, p: PartitionLog, last_offset: int, r: PartitionProduceResult) -> None:
        self._register(r)
        asyncio.ensure_future(_visible(p, last_offset, r)).add_done_callback(
            lambda _t: self._one_done(r)
        )

    def _register(self, r: PartitionProduceResult) -> None:
        self.left += 1
        self.waiting.add(id(r))

    def all_registered(self, timeout_ms: int) -> bool:
        """Drop the registration count; True if nothing is left to wait for. Otherwise the
        answer is given after ``timeout_ms`` at the latest (the request's own timeout)."""
        self.left -= 1
        if self.left == 0:
            return True
        delay = (timeout_ms if timeout_ms > 0 else 30_000) / 1000
        self.timer = asyncio.get_running_loop().call_later(delay, self._timed_out)
        return False

    def _timed_out(self) -> None:
        for _name, parts in self.results:
            for r in parts:
                if id(r) in self.waiting:
                    r.error_code = code("REQUEST_TIMED_OUT")
                    r.error_message = "not durable within the request's timeout"
        self.waiting.clear()
        self._answer()

    def _one_done(self, r: PartitionProduceResult) -> None:
        self.waiting.discard(id(r))
        self.left -= 1
        if self.left == 0:
            self._answer()

    def _answer(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if not self.future.done():
            endpoints = None
            if self.hinted and self.hints:
                # Only on the error path: partitions refused at append time or deposed since.
                endpoints = _leader_endpoints(self.core, self.results, self.conn)
            self.future.set_result(
                encode_produce_response(
                    self.req.api_version,
                    self.req.correlation_id,
                    self.results,
                    self.req.throttle_ms,
                    node_endpoints=endpoints,
                )
            )


async def _visible(p: PartitionLog, last_offset: int, r: PartitionProduceResult) -> None:
    """A retried batch's original: wait until consumers can see it (its log may fail first)."""
    while p.high_watermark <= last_offset and not p.deleted:
        if p.failure is not None:
            r.error_code = code("KAFKA_STORAGE_ERROR")
            r.error_message = str(p.failure)
            r.base_offset = -1
            return
        if not p.leading:
            # Paused or deposed: a deposed leader's tail may be cut and other records take
            # those offsets, so its high watermark says nothing about this batch any more.
            # Possibly written: the client retries it with the same sequence wherever it leads.
            r.error_code = code("REQUEST_TIMED_OUT")
            r.error_message = "the leader stopped leading before the batch was committed"
            r.base_offset = -1
            return
        await p.waiter()


def handle_init_producer_id(core, req: Request, conn) -> bytes:
    body = req.body
    if body.transactional_id is not None:
        from .transactions import init_transactional_producer_id

        return init_transactional_producer_id(core, req)
    pid = getattr(body, "producer_id", -1)
    epoch = getattr(body, "producer_epoch", -1)
    if pid >= 0 and 0 <= epoch < 32766:
        # KIP-360: an idempotent producer may bump its own epoch after a sequence error.
        return reply(req, error_code=NONE, producer_id=pid, producer_epoch=epoch + 1)
    if core.cluster is not None:
        # Ids unique cluster-wide: from blocks this broker takes from etcd.
        async def from_cluster() -> bytes:
            new = await core.cluster.allocate_producer_id()
            return reply(req, error_code=NONE, producer_id=new, producer_epoch=0)

        return from_cluster()
    new = core.metadata.allocate_producer_id()
    return reply(req, error_code=NONE, producer_id=new, producer_epoch=0)
