"""Durable committed offsets of consumer groups, kept in the internal topic __consumer_offsets.

The table the group APIs answer from lives in memory. A commit is appended as records of
Kafka's own formats (offset_records.py) to the offsets topic's partition of its group, through
the storage layer's PartitionLog like any produce, and is applied to the table, and answered,
only once durable (fsynced under ``fsync=always``). At start the table is rebuilt by reading the
topic from each partition's log start: the last record of a key wins, a tombstone deletes it.
Cluster mode replicates the topic's partitions like any other, and with them the offsets.

Stratalog has no log compaction, so the topic is kept short another way: when a partition holds
more than twice its live keys (plus ``COMPACT_SLACK``) records, the live values are appended
again as one snapshot and, once that is durable, the partition's log start moves to it. Readers
of the topic see the snapshot as repeated commits.

A data directory from before the topic (``meta/offsets.log``, JSON lines) is migrated once: its
live entries are written to the topic before the broker listens, then the file is renamed
``offsets.log.migrated`` and never read again.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

from stratalog.broker import modern_group_records as cg
from stratalog.broker.group_records import (
    GroupKey,
    GroupRecord,
    decode_group_key,
    decode_group_value,
    encode_group_key,
    encode_group_value,
)
from stratalog.broker.modern_group_records import ModernGroupKey
from stratalog.broker.offset_records import (
    CommittedOffset,
    Key,
    OffsetRecordError,
    decode_key,
    decode_value,
    encode_key,
    encode_value,
    partition_for,
)
from stratalog.records import Record, build_batch, iter_records
from stratalog.storage.batch import BatchHeader, CorruptBatchError, parse_header
from stratalog.storage.journal import StorageFailure
from stratalog.storage.partition import AppendError, AppendResult, FileSlice, PartitionLog
from stratalog.storage.segment import fsync_dir
from stratalog.storage.txn_index import COMMIT, control_type
from stratalog.storage.virtual_log import WriteBatch

__all__ = ["CommittedOffset", "Key", "OffsetStore", "OffsetsHost"]

log = logging.getLogger(__name__)

# An offset commit, or a classic group's metadata (group_records.py); None: a tombstone.
MetaKey = GroupKey | ModernGroupKey  # a group's own records (not an offset commit)
Entry = tuple[Key | MetaKey, Any]

COMPACT_SLACK = 1000  # records a partition may hold beyond twice its live keys
_BATCH_BYTES = 512 * 1024  # records per batch, so no batch nears max.message.bytes
_MAX_BATCH_BYTES = 16 * 1024 * 1024
_READ_BYTES = 1024 * 1024


class OffsetsHost(Protocol):
    """What the store needs of the broker: the topic, and a way to move a log start."""

    def offsets_partitions(self, create: bool) -> list[PartitionLog | None]:
        """The offsets topic's partitions, in order (None for one another broker of a cluster
        holds); creates the topic if ``create``, else [] when it does not exist."""
        ...

    def delete_records(self, p: PartitionLog, before: int) -> None:
        """Drop the records of ``p`` below ``before`` (whole batches)."""
        ...


def _now_ms() -> int:
    return int(time.time() * 1000)


def _batches(entries: list[Entry], now: int, producer: tuple[int, int] | None = None) -> bytes:
    """Record batches of ``entries``: key and value as Kafka writes them, the commit time as the
    record's timestamp (deletion time for a tombstone). With ``producer`` (id, epoch): the
    transactional batches of a TxnOffsetCommit, settled by the transaction's marker."""
    txn = {}
    if producer is not None:
        txn = {"producer_id": producer[0], "producer_epoch": producer[1], "transactional": True}
    out: list[bytes] = []
    batch: list[tuple[bytes | None, bytes | None, int]] = []
    size = 0
    for k, c in entries:
        if isinstance(k, GroupKey):
            key = encode_group_key(k.group)
            value = None if c is None else encode_group_value(c)  # type: ignore[arg-type]
            stamp = now
        elif isinstance(k, ModernGroupKey):
            key = cg.encode_key(k)
            value = None if c is None else cg.encode_value(k, c)
            stamp = now
        else:
            key = encode_key(*k)
            value = None if c is None else encode_value(c)  # type: ignore[arg-type]
            stamp = now if c is None else c.commit_time  # type: ignore[union-attr]
        batch.append((key, value, stamp))
        size += len(key) + len(value or b"")
        if size >= _BATCH_BYTES:
            out.append(build_batch(batch, **txn))
            batch, size = [], 0
    if batch:
        out.append(build_batch(batch, **txn))
    return b"".join(out)


def _read_batches(p: PartitionLog) -> Iterator[tuple[BatchHeader, memoryview]]:
    """Every batch of ``p`` from its log start to its high watermark, control batches too."""
    offset = p.log_start_offset
    while offset < p.high_watermark:
        rr = p.read(offset, _READ_BYTES)
        try:
            data = b"".join(x.read() if isinstance(x, FileSlice) else bytes(x) for x in rr.parts)
        finally:
            rr.release()
        if not data:
            return
        pos = 0
        while pos < len(data):
            h = parse_header(data, pos)
            batch = memoryview(data)[pos : pos + h.size]
            pos += h.size
            offset = h.base_offset + h.last_offset_delta + 1
            yield h, batch


def _read_records(p: PartitionLog) -> Iterator[Record]:
    """Every record of ``p`` from its log start to its high watermark (control batches are
    skipped, transactional records are not told apart)."""
    for h, batch in _read_batches(p):
        if h.is_control:
            continue
        for rec in iter_records(batch, h):
            if rec.offset >= p.log_start_offset:
                yield rec


async def cancel_all(tasks: set[asyncio.Task]) -> None:
    """Cancel a coordinator's or store's background tasks and wait for them to end."""
    tasks = set(tasks)
    for t in tasks:
        t.cancel()
    for t in tasks:
        try:
            await t
        except (asyncio.CancelledError, Exception):
            pass


class OffsetStore:
    def __init__(self, data_dir: Path, host: OffsetsHost) -> None:
        self.legacy_path = Path(data_dir) / "meta" / "offsets.log"
        self.offsets: dict[Key, CommittedOffset] = {}
        # Groups' own records, as last written: classic groups' metadata (membership) and
        # consumer-protocol groups' records; the coordinators restore them.
        self.group_meta: dict[MetaKey, Any] = {}
        self._host = host
        # Offsets partition -> the keys whose latest record is there (its live keys).
        self._keys: dict[int, set[Key | MetaKey]] = {}
        # Offsets partition -> records from its log start (written ones; for compaction).
        self._records: dict[int, int] = {}
        # Offsets partition -> written appends not durable yet, in log order: a snapshot must
        # carry them, since it moves the log start past them.
        self._unsynced: dict[int, dict[int, list[Entry]]] = {}
        self._next_write = 0
        self._compacting: set[int] = set()
        self._tasks: set[asyncio.Task] = set()
        self._legacy: list[Entry] = []
        # (offsets partition, producer id) -> offsets a transaction committed there (durable,
        # in the log), applied when its COMMIT marker is durable, dropped at ABORT.
        self._txn_pending: dict[tuple[int, int], list[Entry]] = {}

    # -- start ---------------------------------------------------------------------------------
    def load(self) -> None:
        """Rebuild the table from the offsets topic (and read a legacy offsets.log to migrate)."""
        self._legacy = self._read_legacy()
        parts = self._host.offsets_partitions(False)
        n = len(parts)
        # A key is in one partition unless partitions were added to the topic (which moves
        # groups): then the newer record wins, and at equal times the group's partition now.
        found: dict[Key | MetaKey, tuple[tuple[int, bool], int, Any]] = {}
        for idx, p in enumerate(parts):
            if p is None:
                continue  # in a cluster: a partition another broker replicates
            latest: dict[Key | MetaKey, tuple[int, Any]] = {}
            count = 0
            # Transactional commits wait for their marker: producer id -> (key, time, value).
            pending: dict[int, list[tuple[Key | MetaKey, int, Any]]] = {}
            for h, batch in _read_batches(p):
                if h.is_control:
                    settled = pending.pop(h.producer_id, [])
                    if control_type(batch) == COMMIT:
                        for key, stamp, value in settled:
                            latest[key] = (stamp, value)
                    continue
                transactional = h.is_transactional and h.producer_id >= 0
                for rec in iter_records(batch, h):
                    if rec.offset < p.log_start_offset:
                        continue
                    count += 1
                    try:
                        key: Key | MetaKey | None = decode_key(rec.key)
                        if key is not None:
                            value: Any = decode_value(rec.value)
                        elif (group := decode_group_key(rec.key)) is not None:
                            key, value = GroupKey(group), decode_group_value(rec.value)
                        elif (ck := cg.decode_key(rec.key)) is not None:
                            key, value = ck, cg.decode_value(ck, rec.value)
                        else:
                            continue  # another record type (share groups')
                    except OffsetRecordError as e:
                        log.warning(
                            "%s-%d offset %d: not an offset commit: %s", p.topic, idx, rec.offset, e
                        )
                        continue
                    if transactional:
                        pending.setdefault(h.producer_id, []).append((key, rec.timestamp, value))
                    else:
                        latest[key] = (rec.timestamp, value)
            for pid, items in pending.items():  # transactions still open
                self._txn_pending[(idx, pid)] = [(key, value) for key, _t, value in items]
            self._records[idx] = count
            for key, (stamp, value) in latest.items():
                rank = (stamp, partition_for(key[0], n) == idx)
                old = found.get(key)
                if old is None or rank >= old[0]:
                    found[key] = (rank, idx, value)
        # What the partitions read hold replaces what was known of them (another coordinator
        # may have deleted keys meanwhile, and compacted their tombstones away).
        for idx, p in enumerate(parts):
            if p is not None:
                for key in self._keys.pop(idx, set()):
                    (self.group_meta if isinstance(key, MetaKey) else self.offsets).pop(key, None)
        for key, (_rank, idx, value) in found.items():
            self._apply(idx, key, value)
        if n:
            log.info("loaded %d committed offsets from %d partitions", len(self.offsets), n)

    def _read_legacy(self) -> list[Entry]:
        if not self.legacy_path.exists():
            return []
        live: dict[Key, CommittedOffset | None] = {}
        with open(self.legacy_path, "rb") as f:
            for raw in f:
                try:
                    rec = json.loads(raw)
                except ValueError:
                    break  # a torn last line: it was never acknowledged
                key = (rec["g"], rec["t"], rec["p"])
                live[key] = (
                    None
                    if rec.get("d")
                    else CommittedOffset(rec["o"], rec["e"], rec["m"], rec["ts"])
                )
        return [(k, c) for k, c in live.items() if c is not None]

    async def start(self) -> None:
        """Migrate a legacy offsets.log (before the broker listens), then compact what needs it."""
        if self.legacy_path.exists():
            # An interrupted migration runs again: only what the topic does not say yet.
            todo = [(k, c) for k, c in self._legacy if self.offsets.get(k) != c]
            if todo:
                await self.write(todo)
                log.info("migrated %d committed offsets from %s", len(todo), self.legacy_path)
            os.replace(self.legacy_path, self.legacy_path.with_name("offsets.log.migrated"))
            fsync_dir(self.legacy_path.parent)
        self._legacy = []
        for idx, p in enumerate(self._host.offsets_partitions(False)):
            if p is not None:
                self._maybe_compact(idx, p)

    async def close(self) -> None:
        await cancel_all(self._tasks)

    def abandon(self) -> None:
        for t in list(self._tasks):
            t.cancel()

    # -- writing -------------------------------------------------------------------------------
    async def write(self, entries: list[Entry]) -> None:
        """Append ``entries`` to the offsets topic (created if need be) and return once they are
        durable and in the table. Raises StorageFailure if they were not all made durable (those
        of other offsets partitions may have been), OffsetRecordError if one cannot be encoded."""
        if not entries:
            return
        parts, by_idx, data, now = self._encoded(entries)  # may raise
        writes = WriteBatch()
        staged: list[tuple[int, PartitionLog, list[Entry], AppendResult]] = []
        failure: BaseException | None = None
        try:
            for idx, items in by_idx.items():
                p = parts[idx]
                if p is None:  # in a cluster: not this broker's partition (not its group)
                    failure = failure or StorageFailure(f"offsets partition {idx} is not here")
                    continue
                try:
                    res = p.append(
                        data[idx], max_batch_bytes=_MAX_BATCH_BYTES, now_ms=now, writes=writes
                    )
                except (AppendError, CorruptBatchError, StorageFailure) as e:
                    failure = failure or e
                    continue
                staged.append((idx, p, items, res))
        finally:
            writes.commit()
        waits = []
        for idx, p, items, res in staged:
            if res.failure is not None or not res.written:
                failure = failure or res.failure or StorageFailure("the write was not made")
                continue
            waits.append((p, self._when_durable(idx, p, items, res)))
        for p, ok in zip(
            [p for p, _ in waits], await asyncio.gather(*(w for _, w in waits)), strict=True
        ):
            if not ok:
                failure = failure or p.failure or StorageFailure("fsync failed")
        if failure is not None:
            raise failure if isinstance(failure, StorageFailure) else StorageFailure(str(failure))

    def _encoded(self, entries: list[Entry], producer: tuple[int, int] | None = None):
        """The offsets partitions (created if need be), ``entries`` by partition index, each
        index's batches (transactional ones of ``producer`` if given), and their timestamp."""
        parts = self._host.offsets_partitions(True)
        by_idx: dict[int, list[Entry]] = {}
        for e in entries:
            by_idx.setdefault(partition_for(e[0][0], len(parts)), []).append(e)
        now = _now_ms()
        data = {idx: _batches(items, now, producer) for idx, items in by_idx.items()}
        return parts, by_idx, data, now

    async def write_txn(self, producer_id: int, epoch: int, entries: list[Entry]) -> None:
        """TxnOffsetCommit: append ``entries`` as the transaction's records (transactional
        batches of the producer) and return once durable. They take effect when the
        transaction's COMMIT marker is durable in their partition (:meth:`complete_txn`), and
        never if it aborts. Raises as :meth:`write`, or AppendError (a fenced epoch)."""
        if not entries:
            return
        parts, by_idx, data, now = self._encoded(entries, (producer_id, epoch))
        writes = WriteBatch()
        staged: list[tuple[int, PartitionLog, list[Entry], AppendResult]] = []
        try:
            for idx, items in by_idx.items():
                p = parts[idx]
                if p is None:
                    raise StorageFailure(f"offsets partition {idx} is not here")
                res = p.append(
                    data[idx], max_batch_bytes=_MAX_BATCH_BYTES, now_ms=now, writes=writes
                )
                staged.append((idx, p, items, res))
        finally:
            writes.commit()
        loop = asyncio.get_running_loop()
        for idx, p, items, res in staged:
            if res.failure is not None or not res.written:
                raise res.failure or StorageFailure("the write was not made")
            fut: asyncio.Future[bool] = loop.create_future()
            p.when_durable(res.lsn, lambda ok, f=fut: f.done() or f.set_result(ok))
            if not await fut:
                raise (
                    p.failure
                    if isinstance(p.failure, StorageFailure)
                    else StorageFailure("fsync failed")
                )
            self._records[idx] = self._records.get(idx, 0) + len(items)
            self._txn_pending.setdefault((idx, producer_id), []).extend(items)

    def complete_txn(self, idx: int, producer_id: int, commit: bool) -> None:
        """The transaction's marker is durable in offsets partition ``idx``: its offset commits
        there take effect (COMMIT) or are dropped (ABORT)."""
        items = self._txn_pending.pop((idx, producer_id), None)
        if not items or not commit:
            return
        for key, c in items:
            self._apply(idx, key, c)
        parts = self._host.offsets_partitions(False)
        if idx < len(parts) and parts[idx] is not None:
            self._maybe_compact(idx, parts[idx])

    def unstable(self, group: str) -> set[tuple[str, int]]:
        """(topic, partition) of ``group`` with a transactional commit not settled yet (an
        OffsetFetch with require_stable answers UNSTABLE_OFFSET_COMMIT for them)."""
        return {
            (t, p) for items in self._txn_pending.values() for (g, t, p), _c in items if g == group
        }

    def _when_durable(
        self, idx: int, p: PartitionLog, items: list[Entry], res: AppendResult
    ) -> asyncio.Future[bool]:
        """Apply ``items`` once their append is durable; the future says whether it became so."""
        wid = self._next_write
        self._next_write += 1
        self._unsynced.setdefault(idx, {})[wid] = items
        self._records[idx] = self._records.get(idx, 0) + len(items)
        fut: asyncio.Future[bool] = asyncio.get_running_loop().create_future()

        def done(ok: bool) -> None:
            self._unsynced.get(idx, {}).pop(wid, None)
            # Durability callbacks come in log order, so the table follows the log. A deleted
            # topic's late appends are not applied: its offsets went with it.
            if ok and not p.deleted:
                for key, c in items:
                    self._apply(idx, key, c)
                self._maybe_compact(idx, p)
            if not fut.done():
                fut.set_result(ok)

        p.when_durable(res.lsn, done)
        return fut

    def _apply(self, idx: int, key: Key | MetaKey, c: Any) -> None:
        table: dict = self.group_meta if isinstance(key, MetaKey) else self.offsets
        if c is None:
            table.pop(key, None)
            for keys in self._keys.values():
                keys.discard(key)
            return
        table[key] = c
        here = self._keys.setdefault(idx, set())
        if key not in here:
            for keys in self._keys.values():  # (moved: partitions were added to the topic)
                keys.discard(key)
            here.add(key)

    def forget_topic(self, topic: str) -> None:
        """A data topic was deleted: its offsets go from the table now, and tombstones for them
        are written to the offsets topic (as Kafka does, without holding up the deletion)."""
        keys = sorted(k for k in self.offsets if k[1] == topic)
        if not keys:
            return
        for k in keys:
            self._apply(0, k, None)
        self._spawn(self._write_logged([(k, None) for k in keys], f"the offsets of {topic}"))

    def reset(self) -> None:
        """The offsets topic was deleted: every committed offset went with it (as in Kafka)."""
        self.offsets.clear()
        self.group_meta.clear()
        self._keys.clear()
        self._records.clear()
        self._unsynced.clear()
        self._compacting.clear()
        self._txn_pending.clear()

    async def _write_logged(self, entries: list[Entry], what: str) -> None:
        try:
            await self.write(entries)
        except (StorageFailure, OffsetRecordError) as e:
            log.error("cannot write the tombstones of %s: %s", what, e)

    def _spawn(self, coro) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- compaction ----------------------------------------------------------------------------
    def _maybe_compact(self, idx: int, p: PartitionLog) -> None:
        if idx in self._compacting or p.deleted or not p.leading:
            return  # (a backup's copy changes only by its primary's bytes)
        if self._records.get(idx, 0) <= 2 * len(self._keys.get(idx, ())) + COMPACT_SLACK:
            return
        self._compacting.add(idx)
        self._spawn(self._compact(idx, p))

    async def _compact(self, idx: int, p: PartitionLog) -> None:
        """Append the partition's live values as one snapshot; once it is durable, move the log
        start to it."""
        try:
            snapshot: dict[Key | MetaKey, Any] = {
                k: self.group_meta[k] if isinstance(k, MetaKey) else self.offsets[k]
                for k in self._keys.get(idx, ())
            }
            for items in self._unsynced.get(idx, {}).values():
                snapshot.update(items)
            live = [(k, c) for k, c in snapshot.items() if c is not None]
            before = self._records.get(idx, 0)
            if not live:
                if not self._unsynced.get(idx) and p.txns.first_unstable() is None:
                    # Nothing live and nothing in flight: everything written so far can go.
                    self._host.delete_records(p, p.high_watermark)
                    self._records[idx] = 0
                return
            writes = WriteBatch()
            try:
                res = p.append(
                    _batches(live, _now_ms()), max_batch_bytes=_MAX_BATCH_BYTES, writes=writes
                )
            finally:
                writes.commit()
            if res.failure is not None or not res.written:
                return
            self._records[idx] = self._records.get(idx, 0) + len(live)
            durable: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
            p.when_durable(res.lsn, lambda ok: durable.done() or durable.set_result(ok))
            if await durable and not p.deleted:
                # Never past an open transaction's commits: they settle at its marker.
                unstable = p.txns.first_unstable()
                self._host.delete_records(
                    p, res.base_offset if unstable is None else min(unstable, res.base_offset)
                )
                self._records[idx] = max(0, self._records.get(idx, 0) - before)
                log.info(
                    "%s-%d: %d live offsets rewritten at %d, earlier records dropped",
                    p.topic,
                    idx,
                    len(live),
                    res.base_offset,
                )
        except (StorageFailure, AppendError, CorruptBatchError) as e:
            log.warning("%s-%d: compaction failed: %s", p.topic, idx, e)
        finally:
            self._compacting.discard(idx)

    # -- reading -------------------------------------------------------------------------------
    def get(self, group: str, topic: str, partition: int) -> CommittedOffset | None:
        return self.offsets.get((group, topic, partition))

    def group_offsets(self, group: str) -> dict[tuple[str, int], CommittedOffset]:
        return {(t, p): c for (g, t, p), c in self.offsets.items() if g == group}

    def group_records(self) -> dict[str, GroupRecord]:
        """The classic groups' metadata of the offsets partitions this broker leads (in a
        cluster, a backup's copy is not its to restore)."""
        parts = self._host.offsets_partitions(False)
        led = {i for i, p in enumerate(parts) if p is not None and p.leading}
        return {
            k.group: self.group_meta[k]
            for i, keys in self._keys.items()
            if i in led
            for k in keys
            if isinstance(k, GroupKey) and k in self.group_meta
        }

    def modern_group_records(self) -> dict[ModernGroupKey, Any]:
        """The consumer-protocol groups' records of the offsets partitions led here."""
        parts = self._host.offsets_partitions(False)
        led = {i for i, p in enumerate(parts) if p is not None and p.leading}
        return {
            k: self.group_meta[k]
            for i, keys in self._keys.items()
            if i in led
            for k in keys
            if isinstance(k, ModernGroupKey) and k in self.group_meta
        }

    def groups(self) -> set[str]:
        return {g for g, _, _ in self.offsets}

    def keys_for_topic(self, topic: str) -> list[Key]:
        return [k for k in self.offsets if k[1] == topic]
