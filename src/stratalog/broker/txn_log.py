"""The transaction coordinator's durable state: the internal topic ``__transaction_state``.

Every transition of a transactional id (a new producer epoch, partitions added, prepare commit or
abort, complete) is appended as a record of Kafka's own format (txn_records.py) to the topic's
partition of that id, through the storage layer's PartitionLog like any produce, and counts only
once durable (fsynced under ``fsync=always``; in a cluster, on every in-sync replica, since the
topic's partitions replicate like any other). At start, or when this broker starts leading a
partition of the topic, the state is read back from the partition's log start: the last record
of an id wins, a tombstone deletes it.

As for ``__consumer_offsets`` (offset_store.py), Stratalog has no log compaction: a partition
holding more than twice its live ids (plus ``COMPACT_SLACK``) records gets the live values
appended again as one snapshot and, once that is durable, its log start moves to it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Protocol

from stratalog.broker.offset_store import _read_records
from stratalog.broker.txn_records import (
    TxnRecordError,
    TxnValue,
    decode_key,
    decode_value,
    encode_key,
    encode_value,
    partition_for,
)
from stratalog.records import build_batch
from stratalog.storage.batch import CorruptBatchError
from stratalog.storage.journal import StorageFailure
from stratalog.storage.partition import AppendError, PartitionLog
from stratalog.storage.virtual_log import WriteBatch

log = logging.getLogger(__name__)

COMPACT_SLACK = 1000
_MAX_BATCH_BYTES = 16 * 1024 * 1024


class TxnLogHost(Protocol):
    def txn_state_partitions(self, create: bool) -> list[PartitionLog | None]:
        """The topic's partitions in order (None: one another broker of a cluster holds);
        creates the topic if ``create``, else [] when it does not exist."""
        ...

    def delete_records(self, p: PartitionLog, before: int) -> None: ...


def _now_ms() -> int:
    return int(time.time() * 1000)


async def append_durably(p: PartitionLog, data: bytes) -> tuple[int, bool]:
    """Append ``data`` (record batches) to ``p``; return (base offset, whether it became
    durable). Raises StorageFailure, AppendError or CorruptBatchError when not written."""
    writes = WriteBatch()
    try:
        res = p.append(data, max_batch_bytes=_MAX_BATCH_BYTES, writes=writes)
    finally:
        writes.commit()
    if res.failure is not None or not res.written:
        raise res.failure or StorageFailure("the write was not made")
    fut: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
    p.when_durable(res.lsn, lambda ok: fut.done() or fut.set_result(ok))
    return res.base_offset, await fut


class TxnLog:
    def __init__(self, host: TxnLogHost) -> None:
        self._host = host
        self._live: dict[int, dict[str, TxnValue]] = {}  # partition -> id -> durable value
        self._records: dict[int, int] = {}  # partition -> records from its log start
        # partition -> id -> value appended but not durable yet: a snapshot carries them, since
        # it moves the log start past them.
        self._inflight: dict[int, dict[str, TxnValue | None]] = {}
        self._compacting: set[int] = set()
        self._tasks: set[asyncio.Task] = set()

    def partition_of(self, transactional_id: str) -> int | None:
        """The topic's partition of ``transactional_id`` (None: the topic does not exist)."""
        parts = self._host.txn_state_partitions(False)
        return partition_for(transactional_id, len(parts)) if parts else None

    # -- reading -------------------------------------------------------------------------------
    def load_partition(self, idx: int, p: PartitionLog) -> dict[str, TxnValue]:
        """The live state of every transactional id of partition ``idx``, from its log."""
        latest: dict[str, TxnValue | None] = {}
        count = 0
        for rec in _read_records(p):
            count += 1
            try:
                tid = decode_key(rec.key)
                if tid is None:
                    continue
                latest[tid] = decode_value(rec.value)
            except TxnRecordError as e:
                log.warning("%s-%d offset %d: not a transaction record: %s", p.topic, idx,
                            rec.offset, e)  # fmt: skip
        live = {tid: v for tid, v in latest.items() if v is not None}
        self._live[idx] = dict(live)
        self._records[idx] = count
        return live

    def forget_partition(self, idx: int) -> None:
        self._live.pop(idx, None)
        self._records.pop(idx, None)
        self._inflight.pop(idx, None)

    # -- writing -------------------------------------------------------------------------------
    async def write(self, transactional_id: str, value: TxnValue | None) -> None:
        """Append the id's new state (None: delete it) and return once durable; raises
        StorageFailure when it was not made durable (or this broker does not hold the id's
        partition)."""
        parts = self._host.txn_state_partitions(True)
        idx = partition_for(transactional_id, len(parts))
        p = parts[idx]
        if p is None or not p.leading:
            raise StorageFailure(f"partition {idx} of the transaction log is not led here")
        now = _now_ms()
        record = (
            encode_key(transactional_id),
            None if value is None else encode_value(value),
            now,
        )
        inflight = self._inflight.setdefault(idx, {})
        inflight[transactional_id] = value
        try:
            _base, ok = await append_durably(p, build_batch([record]))
        except (AppendError, CorruptBatchError) as e:
            raise StorageFailure(str(e)) from None
        finally:
            if inflight.get(transactional_id, 0) is value:
                del inflight[transactional_id]
        if not ok or p.deleted:
            raise StorageFailure(str(p.failure or "the transaction log's write failed"))
        live = self._live.setdefault(idx, {})
        if value is None:
            live.pop(transactional_id, None)
        else:
            live[transactional_id] = value
        self._records[idx] = self._records.get(idx, 0) + 1
        self._maybe_compact(idx, p)

    # -- compaction ----------------------------------------------------------------------------
    def _maybe_compact(self, idx: int, p: PartitionLog) -> None:
        if idx in self._compacting or p.deleted or not p.leading:
            return
        if self._records.get(idx, 0) <= 2 * len(self._live.get(idx, ())) + COMPACT_SLACK:
            return
        self._compacting.add(idx)
        task = asyncio.ensure_future(self._compact(idx, p))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _compact(self, idx: int, p: PartitionLog) -> None:
        """Append the partition's live values as one snapshot; once durable, move the log start
        to it. Writes after the snapshot's append come after it in the log and win there."""
        try:
            snapshot: dict[str, TxnValue | None] = dict(self._live.get(idx, {}))
            snapshot.update(self._inflight.get(idx, {}))
            live = {t: v for t, v in snapshot.items() if v is not None}
            if not live and not self._inflight.get(idx):
                self._host.delete_records(p, p.high_watermark)
                self._records[idx] = 0
                return
            now = _now_ms()
            if not live:
                return
            data = build_batch([(encode_key(t), encode_value(v), now) for t, v in live.items()])
            before = self._records.get(idx, 0)
            base, ok = await append_durably(p, data)
            if ok and not p.deleted:
                self._host.delete_records(p, base)
                self._records[idx] = max(0, self._records.get(idx, 0) + len(live) - before)
                log.info("%s-%d: %d transactional ids rewritten at %d, earlier records dropped",
                         p.topic, idx, len(live), base)  # fmt: skip
        except (StorageFailure, AppendError, CorruptBatchError) as e:
            log.warning("%s-%d: compaction failed: %s", p.topic, idx, e)
        finally:
            self._compacting.discard(idx)

    async def close(self) -> None:
        for t in list(self._tasks):
            t.cancel()
        for t in list(self._tasks):
            try:
                await t
            except (asyncio.CancelledError, Exception):
                pass

    def abandon(self) -> None:
        for t in list(self._tasks):
            t.cancel()
