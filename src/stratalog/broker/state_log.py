"""A coordinator's keyed state in an internal topic: the machinery the transaction log
(``__transaction_state``, txn_log.py) and the share-group state (``__share_group_state``,
share_state.py) share.

Each key lives in one partition of the topic (``StateCodec.partition_for``). A write appends the
key's new value (None: a tombstone) as a record, through the storage layer's PartitionLog like
any produce; the writes of one call go into one ``WriteBatch`` (one group commit) and count only
once durable (fsynced under ``fsync=always``; in a cluster, on every in-sync replica, since the
topic's partitions replicate like any other). Reading a partition back (at start, or when this
broker starts leading it) replays it from its log start: the last record of a key wins.

Stratalog has no log compaction for these topics: a partition holding more than twice its live
keys (plus ``COMPACT_SLACK``) records gets the live values appended again as one snapshot and,
once that is durable, its log start moves to it (writes made meanwhile come after the snapshot
and win there).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from stratalog.broker.offset_records import OffsetRecordError
from stratalog.broker.offset_store import _read_records, cancel_all
from stratalog.records import build_batch
from stratalog.storage.batch import CorruptBatchError
from stratalog.storage.journal import StorageFailure
from stratalog.storage.partition import AppendError, AppendResult, PartitionLog
from stratalog.storage.virtual_log import WriteBatch

log = logging.getLogger(__name__)

COMPACT_SLACK = 1000
_MAX_BATCH_BYTES = 16 * 1024 * 1024
_BATCH_BYTES = 512 * 1024  # records per batch, so no batch nears max.message.bytes

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


@dataclass(frozen=True)
class StateCodec(Generic[K, V]):
    """How a topic's keys and values are written (Kafka's record formats for that topic)."""

    what: str  # for log lines: "transactional ids", "share-partitions"
    partition_for: Callable[[K, int], int]
    encode_key: Callable[[K], bytes]
    encode_value: Callable[[V], bytes]
    decode_key: Callable[[bytes | None], K | None]  # None: another record type, skipped
    decode_value: Callable[[bytes | None], V | None]  # None: a tombstone


Partitions = Callable[[bool], list[PartitionLog | None]]


def _now_ms() -> int:
    return int(time.time() * 1000)


def _batches(records: list[tuple[bytes, bytes | None, int]]) -> bytes:
    out: list[bytes] = []
    batch: list[tuple[bytes, bytes | None, int]] = []
    size = 0
    for rec in records:
        batch.append(rec)
        size += len(rec[0]) + len(rec[1] or b"")
        if size >= _BATCH_BYTES:
            out.append(build_batch(batch))
            batch, size = [], 0
    if batch:
        out.append(build_batch(batch))
    return b"".join(out)


async def durable(p: PartitionLog, res: AppendResult) -> bool:
    """Whether the append ``res`` of ``p`` became durable."""
    if res.failure is not None or not res.written:
        raise res.failure or StorageFailure("the write was not made")
    fut: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
    p.when_durable(res.lsn, lambda ok: fut.done() or fut.set_result(ok))
    return await fut


async def append_durably(p: PartitionLog, data: bytes) -> tuple[int, bool]:
    """Append ``data`` (record batches) to ``p``; return (base offset, whether it became
    durable). Raises StorageFailure, AppendError or CorruptBatchError when not written."""
    writes = WriteBatch()
    try:
        res = p.append(data, max_batch_bytes=_MAX_BATCH_BYTES, writes=writes)
    finally:
        writes.commit()
    return res.base_offset, await durable(p, res)


class StateLog(Generic[K, V]):
    def __init__(
        self,
        codec: StateCodec[K, V],
        partitions: Partitions,
        delete_records: Callable[[PartitionLog, int], None],
    ) -> None:
        self.codec = codec
        # The topic's partitions in order (None: one another broker of a cluster holds);
        # creates the topic if asked, else [] when it does not exist.
        self._partitions = partitions
        self._delete_records = delete_records
        self._live: dict[int, dict[K, V]] = {}  # partition -> key -> durable value
        self._records: dict[int, int] = {}  # partition -> records from its log start
        # partition -> key -> value appended but not durable yet: a snapshot carries them,
        # since it moves the log start past them.
        self._inflight: dict[int, dict[K, V | None]] = {}
        self._compacting: set[int] = set()
        self._tasks: set[asyncio.Task] = set()

    def partition_of(self, key: K) -> int | None:
        """The topic's partition of ``key`` (None: the topic does not exist)."""
        parts = self._partitions(False)
        return self.codec.partition_for(key, len(parts)) if parts else None

    def live(self, idx: int) -> dict[K, V]:
        """The durable values of partition ``idx`` as loaded and written since."""
        return self._live.get(idx, {})

    # -- reading -------------------------------------------------------------------------------
    def load_partition(self, idx: int, p: PartitionLog) -> dict[K, V]:
        """The live value of every key of partition ``idx``, from its log."""
        latest: dict[K, V | None] = {}
        count = 0
        codec = self.codec
        for rec in _read_records(p):
            count += 1
            try:
                key = codec.decode_key(rec.key)
                if key is None:
                    continue
                latest[key] = codec.decode_value(rec.value)
            except OffsetRecordError as e:
                log.warning("%s-%d offset %d: not a record of %s: %s", p.topic, idx,
                            rec.offset, codec.what, e)  # fmt: skip
        live = {k: v for k, v in latest.items() if v is not None}
        self._live[idx] = dict(live)
        self._records[idx] = count
        return live

    def forget_partition(self, idx: int) -> None:
        self._live.pop(idx, None)
        self._records.pop(idx, None)
        self._inflight.pop(idx, None)

    # -- writing -------------------------------------------------------------------------------
    async def write(self, key: K, value: V | None) -> None:
        """Append the key's new value (None: delete it) and return once durable; raises
        StorageFailure when it was not made durable (or this broker does not lead the key's
        partition)."""
        await self.write_many([(key, value)])

    async def write_many(self, entries: list[tuple[K, V | None]]) -> None:
        """Append the new values of several keys, all in one group commit, and return once
        every one is durable; raises StorageFailure if any was not (the others may be)."""
        if not entries:
            return
        parts = self._partitions(True)
        codec = self.codec
        by_idx: dict[int, dict[K, V | None]] = {}
        for key, value in entries:
            by_idx.setdefault(codec.partition_for(key, len(parts)), {})[key] = value
        now = _now_ms()
        staged: list[tuple[int, PartitionLog, dict[K, V | None], AppendResult]] = []
        failure: BaseException | None = None
        writes = WriteBatch()
        try:
            for idx, items in by_idx.items():
                p = parts[idx]
                if p is None or not p.leading:
                    failure = StorageFailure(f"{codec.what}: partition {idx} is not led here")
                    break
                data = _batches(
                    [
                        (codec.encode_key(k), None if v is None else codec.encode_value(v), now)
                        for k, v in items.items()
                    ]
                )
                try:
                    res = p.append(data, max_batch_bytes=_MAX_BATCH_BYTES, writes=writes)
                except (AppendError, CorruptBatchError, StorageFailure) as e:
                    failure = e
                    break
                self._inflight.setdefault(idx, {}).update(items)
                staged.append((idx, p, items, res))
        finally:
            writes.commit()
        results = await asyncio.gather(
            *(durable(p, res) for _i, p, _it, res in staged), return_exceptions=True
        )
        for (idx, p, items, _res), ok in zip(staged, results, strict=True):
            inflight = self._inflight.get(idx, {})
            for k, v in items.items():
                if k in inflight and inflight[k] is v:
                    del inflight[k]
            if ok is not True or p.deleted:
                failure = failure or (ok if isinstance(ok, BaseException) else None)
                failure = failure or p.failure or StorageFailure(f"{p.topic}: the write failed")
                continue
            live = self._live.setdefault(idx, {})
            for k, v in items.items():
                if v is None:
                    live.pop(k, None)
                else:
                    live[k] = v
            self._records[idx] = self._records.get(idx, 0) + len(items)
            self._maybe_compact(idx, p)
        if failure is not None:
            raise failure if isinstance(failure, StorageFailure) else StorageFailure(str(failure))

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
        codec = self.codec
        try:
            snapshot: dict[Any, Any] = dict(self._live.get(idx, {}))
            snapshot.update(self._inflight.get(idx, {}))
            live = {k: v for k, v in snapshot.items() if v is not None}
            if not live and not self._inflight.get(idx):
                self._delete_records(p, p.high_watermark)
                self._records[idx] = 0
                return
            if not live:
                return
            now = _now_ms()
            data = _batches(
                [(codec.encode_key(k), codec.encode_value(v), now) for k, v in live.items()]
            )
            before = self._records.get(idx, 0)
            base, ok = await append_durably(p, data)
            if ok and not p.deleted:
                self._delete_records(p, base)
                self._records[idx] = max(0, self._records.get(idx, 0) + len(live) - before)
                log.info("%s-%d: %d %s rewritten at %d, earlier records dropped",
                         p.topic, idx, len(live), codec.what, base)  # fmt: skip
        except (StorageFailure, AppendError, CorruptBatchError) as e:
            log.warning("%s-%d: compaction failed: %s", p.topic, idx, e)
        finally:
            self._compacting.discard(idx)

    async def close(self) -> None:
        await cancel_all(self._tasks)

    def abandon(self) -> None:
        for t in list(self._tasks):
            t.cancel()
