"""Produce and InitProducerId.

Every partition's records are validated and appended in request order as soon as the request
arrives; only the acknowledgement waits. ``acks=0`` gets no response at all (a client that gets
one anyway loses messages), ``acks=1`` is answered once appended, ``acks=-1`` once the append is
durable under the fsync policy (with ``fsync=always``: after the group commit's fsync).
"""

from __future__ import annotations

import asyncio
import time

from stratalog.broker import metrics
from stratalog.protocol.connection import Request
from stratalog.protocol.errors import code
from stratalog.protocol.produce import PartitionProduceResult, encode_produce_response
from stratalog.storage.batch import BatchHeader, CorruptBatchError
from stratalog.storage.journal import StorageFailure
from stratalog.storage.partition import AppendError, PartitionLog

from .common import NONE, err, reply


class _TimestampRejected(Exception):
    pass


def _timestamp_checker(before_ms: int, after_ms: int, now: int, stamp: bool):
    """KIP-937's window around broker time. Out of it, a batch is rejected (INVALID_TIMESTAMP)
    or, with late.event.policy=stamp, accepted and re-stamped with broker time (returns True)."""

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
        return False

    return check


def handle_produce(core, req: Request, conn):
    body = req.body
    acks = body.acks
    now = int(time.time() * 1000)
    results: list[tuple[str, list[PartitionProduceResult]]] = []
    waits: list[asyncio.Future] = []
    any_error = False
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
        return encode_produce_response(req.api_version, req.correlation_id, results)
    for td in body.topic_data:
        name = td.name
        topic = core.metadata.topics.get(name)
        parts: list[PartitionProduceResult] = []
        results.append((name, parts))
        for pd in td.partition_data:
            r = PartitionProduceResult(pd.index)
            parts.append(r)
            p: PartitionLog | None = core.partition(name, pd.index) if topic else None
            if p is None:
                r.error_code = code("UNKNOWN_TOPIC_OR_PARTITION")
                any_error = True
                continue
            if body.transactional_id is not None:
                r.error_code = code("TRANSACTIONAL_ID_AUTHORIZATION_FAILED")
                r.error_message = "transactions are not supported by Stratalog"
                any_error = True
                continue
            view = core.topic_config(topic)
            try:
                if pd.records is None:
                    raise CorruptBatchError("null records", "INVALID_RECORD")
                res = p.append(
                    pd.records,
                    log_append_time_ms=(
                        now if view.get("message.timestamp.type") == "LogAppendTime" else -1
                    ),
                    max_batch_bytes=view.get_int("max.message.bytes"),
                    timestamp_check=_timestamp_checker(
                        view.get_int("message.timestamp.before.max.ms"),
                        view.get_int("message.timestamp.after.max.ms"),
                        now,
                        view.get("late.event.policy") == "stamp",
                    ),
                    now_ms=now,
                )
            except (AppendError, CorruptBatchError) as e:
                r.error_code = code(e.error)
                r.error_message = str(e)
                any_error = True
                continue
            except StorageFailure as e:
                r.error_code = code("KAFKA_STORAGE_ERROR")
                r.error_message = str(e)
                any_error = True
                continue
            if res.duplicate_of is None:
                metrics.PRODUCED_BYTES.inc(len(pd.records))
            r.base_offset = res.base_offset
            r.log_append_time = res.log_append_time
            r.log_start_offset = p.log_start_offset
            if acks == -1:
                if res.duplicate_of is not None:
                    if p.high_watermark <= res.last_offset:
                        waits.append(asyncio.ensure_future(_visible(p, res.last_offset)))
                else:
                    waits.append(_durable(p, res.lsn, r))
    if acks == 0:
        if any_error:
            # Kafka's answer to a failed acks=0 produce: drop the connection so the client sees.
            conn.abort()
        return None
    if not waits:
        return encode_produce_response(req.api_version, req.correlation_id, results)
    return _respond_when_durable(req, results, waits)


def _durable(p: PartitionLog, lsn: int, r: PartitionProduceResult) -> asyncio.Future:
    fut = asyncio.get_running_loop().create_future()

    def done(ok: bool) -> None:
        if not ok:
            r.error_code = code("KAFKA_STORAGE_ERROR")
            r.error_message = "fsync failed; the write may not be durable"
            r.base_offset = -1
        if not fut.done():
            fut.set_result(None)

    p.vlog.when_durable(lsn, done)
    return fut


async def _visible(p: PartitionLog, last_offset: int) -> None:
    while p.high_watermark <= last_offset and not p.deleted:
        await p.waiter()


async def _respond_when_durable(req: Request, results, waits) -> bytes:
    await asyncio.gather(*waits)
    return encode_produce_response(req.api_version, req.correlation_id, results)


def handle_init_producer_id(core, req: Request, conn) -> bytes:
    body = req.body
    if body.transactional_id is not None:
        return reply(
            req,
            error_code=err("TRANSACTIONAL_ID_AUTHORIZATION_FAILED"),
            producer_id=-1,
            producer_epoch=-1,
        )
    pid = getattr(body, "producer_id", -1)
    epoch = getattr(body, "producer_epoch", -1)
    if pid >= 0 and 0 <= epoch < 32766:
        # KIP-360: an idempotent producer may bump its own epoch after a sequence error.
        return reply(req, error_code=NONE, producer_id=pid, producer_epoch=epoch + 1)
    new = core.metadata.allocate_producer_id()
    return reply(req, error_code=NONE, producer_id=new, producer_epoch=0)
