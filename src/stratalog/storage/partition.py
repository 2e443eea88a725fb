"""One topic-partition's view of storage: offsets, chunk index, tail cache, producer state.

The partition assigns offsets, appends its chunks to the virtual log it maps to, and answers
reads with whole batches: chunks in the broker's tail cache (if it has one) from memory, the
others as file slices of segments (fresh ones are in the page cache and go out by sendfile).
``high_watermark`` is what consumers may see: under ``fsync=always`` it moves only once a chunk is
durable, so no consumer ever reads a record a crash could take back.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import struct
from bisect import bisect_left, bisect_right
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from stratalog.storage import page_cache
from stratalog.storage.batch import (
    CONTROL_MASK,
    LOG_OVERHEAD,
    TRANSACTIONAL_MASK,
    BatchHeader,
    CorruptBatchError,
    parse_header,
    split_batches,
    stamp_log_append_time,
)
from stratalog.storage.chunk_index import RUN_CACHE, UNKNOWN_TIMESTAMP, ChunkIndex
from stratalog.storage.cold_tier import ColdRun
from stratalog.storage.journal import StorageFailure
from stratalog.storage.producer_state import (
    DETERMINISTIC_PRODUCER_IDS,
    BatchMeta,
    ProducerStateTable,
    SequenceError,
)
from stratalog.storage.replica import NotPrimary
from stratalog.storage.segment import FRAME_SIZE, IndexEntry, Segment
from stratalog.storage.tail_cache import TailCache
from stratalog.storage.txn_index import (
    ABORT,
    COMMIT,
    TRANSACTIONAL_PRODUCER_IDS,
    TxnIndex,
    control_record,
    is_transactional_producer,
)
from stratalog.storage.virtual_log import VirtualLog, WriteBatch

if TYPE_CHECKING:
    from stratalog.records import Record

log = logging.getLogger(__name__)


class _Slot(Protocol):
    """A partition's read slot (read_slots.ReadSlot), as the partition calls it."""

    def publish(self, p: PartitionLog) -> None: ...

    def publish_end(self, p: PartitionLog) -> None: ...


_MARKER_READ = 128  # bytes read to tell a transaction marker (about 80 bytes) from data

# A stored batch's first 16 bytes as the broker rewrites them: baseOffset, batchLength (as
# sent), partitionLeaderEpoch (the log's); all outside the batch CRC.
_HEAD = struct.Struct(">qii")


def _row(r: Record) -> tuple:
    return r.key, r.value, r.headers


class AppendError(Exception):
    def __init__(self, error: str, message: str) -> None:
        super().__init__(message)
        self.error = error


def _check_transactional(h: BatchHeader, markers: bool) -> None:
    """A transactional or control batch: control batches are the broker's own (transaction
    markers); a transactional producer's id comes from the coordinator's range, which is what
    lets the transaction index be rebuilt from the chunk index (storage/txn_index.py)."""
    if h.is_control and not markers:
        raise AppendError("INVALID_RECORD", "control batches are written by the broker only")
    if h.producer_id >= 0 and not is_transactional_producer(h.producer_id):
        raise AppendError(
            "INVALID_PRODUCER_ID_MAPPING",
            f"producer id {h.producer_id} was not given to a transactional producer",
        )


@dataclass(frozen=True, slots=True)
class FileSlice:
    """Bytes of a segment to send; holds a reference on the segment until released."""

    segment: Segment
    position: int
    size: int

    def read(self, skip: int = 0) -> bytes:
        """The slice's bytes (from ``skip`` on); a short read is an error, never sent."""
        want = self.size - skip
        data = self.segment.read(self.position + skip, want)
        if len(data) != want:
            raise OSError(
                f"{self.segment}: short read at {self.position + skip}: {len(data)} of {want} B"
            )
        return data

    def resident(self) -> bool:
        """Whether the slice is in the page cache (storage/page_cache.py).

        Reads of resident data may run on the event loop (and go out with sendfile); the rest
        go to the read pool so a cold read never stalls the loop.
        """
        try:
            return page_cache.resident(self.segment.fd, self.position, self.size)
        except (OSError, ValueError):
            return False

    def release(self) -> None:
        self.segment.release()


@dataclass(slots=True)
class AppendResult:
    """What one partition's append became. Under a WriteBatch the bytes are written at its
    commit: until then ``written`` is False; after it, either ``written`` (with the ``lsn`` to
    wait on for durability) or ``failure`` is set."""

    base_offset: int
    last_offset: int
    log_append_time: int  # -1 unless the topic uses LogAppendTime
    lsn: int = 0  # 0 until written, and for a duplicate (nothing appended)
    duplicate_of: BatchMeta | None = None
    written: bool = False
    failure: StorageFailure | None = None


@dataclass(slots=True)
class ReadResult:
    parts: list[bytes | memoryview | FileSlice]
    size: int
    at_end: bool = False  # the read reached the high watermark: the reader is at the tail
    next_offset: int = -1  # the offset after the last batch read (-1: nothing read)
    first_offset: int = -1  # the base offset of the first batch read (-1: nothing read)

    def release(self) -> None:
        for p in self.parts:
            if isinstance(p, FileSlice):
                p.release()


class PartitionLog:
    def __init__(
        self,
        topic: str,
        index: int,
        uid: int,
        vlog: VirtualLog,
        *,
        tail_cache: TailCache,
    ) -> None:
        self.topic = topic
        self.index = index
        self.uid = uid
        self.vlog = vlog
        self.chunks = ChunkIndex()  # hot: chunks in the virtual log
        self.cold = ChunkIndex()  # cold: chunks in per-partition cold segments, older offsets
        self.cold_segments: dict = {}
        self.log_start_offset = 0
        self.next_offset = 0
        self.high_watermark = 0
        self.producers = ProducerStateTable()
        self.txns = TxnIndex()  # open and aborted transactions, the last stable offset
        self._tail = tail_cache  # the broker's, shared by every partition
        self._waiters: list[asyncio.Future[None]] = []
        self.deleted = False
        self.size_bytes = 0
        self.appended_bytes = 0  # produced here since the start: the rate splits look at
        self.on_append: Callable[[PartitionLog, int, int], None] | None = None
        # Being moved to another virtual log (a reassignment): no more appends here, so the
        # copy's end is final (cluster/reassignment.py).
        self.sealed = False
        # The leader epochs of records copied here from the partition's previous log (a
        # reassignment): (epoch, start offset) of offsets below ``inherited_end``, as their
        # batches carry them, since this log's own epoch history does not cover them.
        self.inherited_epochs: list[tuple[int, int]] = []
        self.inherited_end = 0
        # (first, last) offset ranges whose chunks were in damaged bytes (storage/damage.py),
        # sorted: a read of them answers CORRUPT_MESSAGE, a read before them stops short.
        self.lost: list[tuple[int, int]] = []
        # Co-located readers' view of this partition (read_slots.py), published on each change.
        self.slot: _Slot | None = None

    # -- write path ----------------------------------------------------------------------------
    @property
    def leading(self) -> bool:
        """Whether local appends are taken (False: a replicated log another broker leads)."""
        return self.vlog.leading

    def append(
        self,
        records: bytes | memoryview,
        *,
        log_append_time_ms: int = -1,
        max_batch_bytes: int = 1024 * 1024 + 12,
        timestamp_check=None,
        now_ms: int = -1,
        writes: WriteBatch | None = None,
        markers: bool = False,
        transactional_check: Callable[[BatchHeader], None] | None = None,
    ) -> AppendResult:
        """Validate, assign offsets and append; raises AppendError, CorruptBatchError or
        StorageFailure. With ``writes`` the bytes are staged and written at its commit; the
        result says then whether they were (nothing is recorded for bytes never written).

        Nothing is appended unless every batch in ``records`` is valid. ``timestamp_check(h)``
        may raise, or return True to have that batch stamped with broker time ``now_ms``.
        Control batches (transaction markers) are the broker's own: taken only with
        ``markers``. ``transactional_check(h)`` may raise for the first batch when it is
        transactional, once every batch is known valid (the Produce handler's checks of the
        transaction).
        """
        if self.deleted:
            raise AppendError("UNKNOWN_TOPIC_OR_PARTITION", f"{self.topic} was deleted")
        if not self.vlog.leading:
            raise NotPrimary(f"{self.topic}-{self.index}: this broker is not its leader")
        if self.sealed:
            raise NotPrimary(f"{self.topic}-{self.index} is moving to other replicas")
        mv = memoryview(records)
        found = split_batches(mv)
        restamp: set[int] | None = None
        for n, (_pos, h) in enumerate(found):
            if h.batch_length + LOG_OVERHEAD > max_batch_bytes:
                raise AppendError(
                    "MESSAGE_TOO_LARGE",
                    f"batch of {h.size} bytes exceeds max.message.bytes {max_batch_bytes}",
                )
            if h.attributes & (TRANSACTIONAL_MASK | CONTROL_MASK):
                _check_transactional(h, markers)
            elif TRANSACTIONAL_PRODUCER_IDS <= h.producer_id < DETERMINISTIC_PRODUCER_IDS:
                raise AppendError(
                    "INVALID_PRODUCER_ID_MAPPING",
                    f"producer id {h.producer_id} is a transactional producer's: its batches "
                    "must be transactional",
                )
            if timestamp_check is not None and timestamp_check(h):
                if restamp is None:
                    restamp = set()
                restamp.add(n)
        first = found[0][1]
        if transactional_check is not None and first.attributes & (
            TRANSACTIONAL_MASK | CONTROL_MASK
        ):
            transactional_check(first)
        duplicate = self._check_sequences(found)
        if duplicate is not None:
            if found[0][1].producer_id >= DETERMINISTIC_PRODUCER_IDS:
                self._check_repeat(mv, *found[0])
            return AppendResult(
                duplicate.base_offset, duplicate.last_offset, -1, 0, duplicate, written=True
            )

        items: list[tuple[bytes, memoryview, BatchHeader, int]] = []
        offset = self.next_offset
        epoch = self.vlog.write_epoch
        for n, (pos, h) in enumerate(found):
            batch = mv[pos : pos + h.batch_length + LOG_OVERHEAD]
            stamp = log_append_time_ms
            if stamp < 0 and restamp is not None and n in restamp:
                stamp = now_ms
            if stamp >= 0:
                copy = bytearray(batch)
                stamp_log_append_time(copy, 0, stamp)
                batch = memoryview(bytes(copy))
                h = h._replace(
                    attributes=h.attributes | 0x08,
                    max_timestamp=stamp,
                    crc=int.from_bytes(batch[17:21], "big"),
                )
            items.append((_HEAD.pack(offset, h.batch_length, epoch), batch, h, offset))
            offset += h.last_offset_delta + 1

        base = self.next_offset
        result = AppendResult(base, offset - 1, log_append_time_ms)

        def written(seg: Segment, positions: list[int], lsn: int) -> None:
            # Only now, with the bytes in the segment, do index, producer state and (once
            # durable) the high watermark learn of them.
            seq = seg.seq
            chunks_append = self.chunks.append
            record = self.producers.record
            tail_put = self._tail.put
            uid = self.uid
            for (head, batch, h, b), p in zip(items, positions, strict=True):
                size = h.batch_length + LOG_OVERHEAD
                chunks_append(b, b + h.last_offset_delta, seq, p, size, h.max_timestamp)
                if h.producer_id >= 0:
                    record(
                        h.producer_id,
                        h.producer_epoch,
                        h.base_sequence,
                        h.record_count,
                        b,
                        h.max_timestamp,
                    )
                    if TRANSACTIONAL_PRODUCER_IDS <= h.producer_id < DETERMINISTIC_PRODUCER_IDS:
                        self._note_transactional(h, b, batch)
                tail_put(uid, b, head, batch[16:])
                self.size_bytes += size
                self.appended_bytes += size
            if self.on_append is not None:
                self.on_append(self, seq, len(items))
            result.lsn = lsn
            result.written = True
            self.vlog.when_durable(lsn, lambda ok: ok and self.advance_high_watermark(offset))

        def failed(failure: StorageFailure) -> None:
            # Every append of a failed write fails: the earliest one's base is where to go on.
            self.next_offset = min(self.next_offset, base)
            result.failure = failure

        if writes is not None:
            writes.join(self.vlog)
        self.vlog.append(self.uid, items, written, failed)
        # Tentatively at once, so a later append of this request continues from here.
        self.next_offset = offset
        return result

    def append_copy(self, records: bytes | memoryview) -> int | None:
        """Append batches copied from this partition's previous log (a reassignment), byte for
        byte as stored there: their offsets, leader epochs, timestamps and producer ids and
        sequences stay as they are. Batches below ``next_offset`` (already copied) are
        skipped; a later base offset leaves a gap, as compaction or retention did there.
        Returns the LSN to wait on for the last one (None: nothing new)."""
        if self.deleted:
            raise AppendError("UNKNOWN_TOPIC_OR_PARTITION", f"{self.topic} was deleted")
        if not self.vlog.leading:
            raise NotPrimary(f"{self.topic}-{self.index}: this broker is not its leader")
        mv = memoryview(records)
        items: list[tuple[bytes, memoryview, BatchHeader, int]] = []
        nxt = self.next_offset
        # (Stored batches: compaction may have left fewer records than offsets.)
        for pos, h in split_batches(mv, compacted=True):
            if h.base_offset < nxt:
                continue
            batch = mv[pos : pos + h.batch_length + LOG_OVERHEAD]
            items.append((bytes(batch[:16]), batch, h, h.base_offset))
            nxt = h.last_offset + 1
        if not items:
            return None
        if not len(self.chunks) and not len(self.cold):
            self.log_start_offset = max(self.log_start_offset, items[0][3])
            self.high_watermark = max(self.high_watermark, self.log_start_offset)
        done: list[int] = []

        def written(seg: Segment, positions: list[int], lsn: int) -> None:
            for (head, batch, h, b), p in zip(items, positions, strict=True):
                size = h.batch_length + LOG_OVERHEAD
                self.chunks.append(b, h.last_offset, seg.seq, p, size, h.max_timestamp)
                if h.producer_id >= 0:
                    self.producers.record(
                        h.producer_id,
                        h.producer_epoch,
                        h.base_sequence,
                        h.last_offset_delta + 1,  # (the sequences it took, whatever is left)
                        b,
                        h.max_timestamp,
                    )
                    if TRANSACTIONAL_PRODUCER_IDS <= h.producer_id < DETERMINISTIC_PRODUCER_IDS:
                        self._note_transactional(h, b, batch)
                self._tail.put(self.uid, b, head, batch[16:])
                self.size_bytes += size
            if self.on_append is not None:
                self.on_append(self, seg.seq, len(items))
            done.append(lsn)
            self.vlog.when_durable(lsn, lambda ok: ok and self.advance_high_watermark(nxt))

        base = self.next_offset

        def failed(_failure: StorageFailure) -> None:
            self.next_offset = min(self.next_offset, base)

        self.vlog.append(self.uid, items, written, failed)
        self.next_offset = nxt
        return done[0] if done else self.vlog.lsn

    def apply_replica(self, seg: Segment, entries: list[IndexEntry]) -> None:
        """A backup's view of frames of this partition its log took from the primary
        (VirtualLog.append_replica, through LogStore): learn of them exactly as ``append``'s
        ``written`` does on the primary (chunk index, producer state for dedup after a
        failover, next offset), and move the high watermark once they are durable here and
        the primary says they are committed, so that a backup promoted later never serves
        records that were not (``vlog.lsn`` is the replicated write's LSN)."""
        seq = seg.seq
        if not len(self.chunks) and not len(self.cold):
            # The first chunk here may follow others the primary no longer has (retention).
            self.log_start_offset = max(self.log_start_offset, entries[0].base_offset)
        chunks_append = self.chunks.append
        record = self.producers.record
        for e in entries:
            chunks_append(e.base_offset, e.last_offset, seq, e.position, e.size, e.max_timestamp)
            record(
                e.producer_id,
                e.producer_epoch,
                e.base_sequence,
                e.last_offset_delta + 1,
                e.base_offset,
                e.max_timestamp,
            )
            if is_transactional_producer(e.producer_id):
                if e.base_sequence >= 0:
                    self.txns.on_data(e.producer_id, e.base_offset)
                else:  # a marker or a transactional offset commit: its bytes tell
                    batch = seg.read(e.position, e.size)
                    self._note_transactional(parse_header(batch), e.base_offset, batch)
            self.size_bytes += e.size
        end = entries[-1].last_offset + 1
        self.next_offset = end
        if self.on_append is not None:
            self.on_append(self, seq, len(entries))
        last = entries[-1]
        self.vlog.when_committed_at(
            seq, last.position + last.size, self.vlog.lsn, lambda: self.advance_high_watermark(end)
        )

    def leader_epochs(self) -> list[tuple[int, int]]:
        """(epoch, start offset) of each leader epoch this partition has a batch of, oldest
        first, from its log's epoch history (Kafka's leader-epoch cache); a primary adds its
        current epoch at the log end offset if it wrote nothing yet (Kafka's leader assigns
        its epoch when elected). Chunks in the cold tier are not looked at."""
        hist = self.vlog.epoch_history
        chunks = self.chunks
        out: list[tuple[int, int]] = []
        for i, (epoch, seq, position) in enumerate(hist):
            k = chunks.count_before_location(seq, position + FRAME_SIZE)
            if k >= len(chunks):
                continue
            first = chunks[k]
            if i + 1 < len(hist):
                _, nseq, npos = hist[i + 1]
                if (first.segment, first.position) >= (nseq, npos + FRAME_SIZE):
                    continue  # its first batch here is of a later epoch
            out.append((epoch, first.base_offset))
        if self.inherited_epochs:
            # Copied from the previous log: its epochs below inherited_end, then this log's
            # epochs for what was written here after the move.
            until = self.inherited_end
            ends = [start for _e, start in out[1:]]
            if out:
                ends.append(self.next_offset)
            own = [(e, max(s, until)) for (e, s), end in zip(out, ends, strict=True) if end > until]
            out = list(self.inherited_epochs) + own
        current = self.vlog.write_epoch
        if self.vlog.leading and hist and (not out or out[-1][0] < current):
            out.append((current, self.next_offset))
        return out

    def stored_epochs(self) -> list[tuple[int, int]]:
        """(epoch, start offset) of each run of hot batches by the leader epoch stamped in
        them, after those inherited: what a reassignment hands on as ``inherited_epochs``
        (one read of a batch head per chunk)."""
        out: list[tuple[int, int]] = list(self.inherited_epochs)
        chunks = self.chunks
        for i in range(len(chunks)):
            loc = chunks[i]
            seg = self.vlog.segment(loc.segment)
            if seg is None:
                continue
            head = seg.read(loc.position, 16)
            if len(head) < 16:
                continue
            base, _length, epoch = _HEAD.unpack(head)
            if not out or epoch > out[-1][0]:
                out.append((epoch, base))
        return out

    def epoch_end(self, epoch: int) -> tuple[int, int]:
        """Kafka's OffsetForLeaderEpoch answer for ``epoch``: the newest epoch at or below it
        this partition has, and the offset its records end at (the start of the next epoch,
        or the log end for the latest); (-1, -1) for an epoch newer than any here."""
        cache = self.leader_epochs()
        if epoch < 0 or not cache:
            return -1, -1
        if epoch == cache[-1][0]:
            return epoch, self.next_offset
        higher = next((start for e, start in cache if e > epoch), None)
        if higher is None:
            return -1, -1
        floor = [e for e, _ in cache if e <= epoch]
        return (floor[-1] if floor else epoch), higher

    def truncate_to(self, seq: int, position: int, lost_from: int | None = None) -> dict[int, int]:
        """Forget the hot chunks whose frames lie at or past (seq, position) of the log (its
        truncation): next offset, high watermark and producer state go back with them.
        ``lost_from``: the first offset that damaged bytes in the cut had lost (they are
        written again from there). Returns the cut chunks' counts per segment."""
        chunks = self.chunks
        keep = chunks.count_before_location(seq, position + FRAME_SIZE)
        first_cut = chunks.base_of(keep) if keep < len(chunks) else None
        if lost_from is not None and lost_from < self.next_offset:
            first_cut = lost_from if first_cut is None else min(first_cut, lost_from)
        if first_cut is None:
            return {}
        counts: dict[int, int] = {}
        if keep < len(chunks):
            counts = chunks.count_by_segment_from(keep)
            self._tail.drop_many(self.uid, chunks.bases_from(keep))
            self.size_bytes -= chunks.bytes_from(keep)
            chunks.drop_back(keep)
        self.lost = [r for r in self.lost if r[0] < first_cut]  # cut with the log
        self.next_offset = first_cut
        self.high_watermark = min(self.high_watermark, first_cut)
        self.producers.truncate(first_cut)
        if not self.txns.truncate(first_cut):
            self.rebuild_txns(self.scan_transactional())
        self.publish()
        self._wake()
        return counts

    def when_durable(self, lsn: int, callback: Callable[[bool], None]) -> None:
        """``callback(True)`` once the append at ``lsn`` is committed (durable here and, in
        cluster mode, on every in-sync backup), ``callback(False)`` if its log failed first."""
        self.vlog.when_durable(lsn, callback)

    @property
    def failure(self) -> BaseException | None:
        """Why this partition's log stopped acknowledging, if it did."""
        return self.vlog.journal.failed

    @property
    def spilling(self) -> bool:
        """Whether appends now land in the cold tier's directory (the hot tier is full)."""
        return self.vlog.active.directory != self.vlog.directory

    def next_sequence(self, producer_id: int, epoch: int) -> int | None:
        """The sequence this partition expects next from an idempotent producer's epoch."""
        return self.producers.next_sequence(producer_id, epoch)

    def written_duplicate(self, records: bytes | memoryview) -> BatchMeta | None:
        """The written batch that ``records`` (one idempotent batch) repeats, if it is a retry
        of one; None otherwise, or when that cannot be told. Checks nothing else."""
        try:
            found = split_batches(memoryview(records))
        except CorruptBatchError:
            return None
        if len(found) != 1 or found[0][1].producer_id >= DETERMINISTIC_PRODUCER_IDS:
            return None
        try:
            return self.producers.check(found[0][1])
        except SequenceError:
            return None

    def _check_sequences(self, found: list[tuple[int, BatchHeader]]) -> BatchMeta | None:
        try:
            if len(found) == 1:
                return self.producers.check(found[0][1])
            headers = [h for _, h in found]
            # Several batches in one request: each must continue the previous one.
            first = self.producers.check(headers[0])
            if first is not None:
                return first
            for prev, h in itertools.pairwise(headers):
                same = h.producer_id >= 0 and h.producer_id == prev.producer_id
                if same and h.base_sequence != (prev.last_sequence + 1) & 0x7FFFFFFF:
                    raise SequenceError(
                        "OUT_OF_ORDER_SEQUENCE_NUMBER",
                        f"batch sequence {h.base_sequence} does not follow "
                        f"{prev.last_sequence} in the same request",
                    )
            return None
        except SequenceError as e:
            raise AppendError(e.error, str(e)) from None

    def _check_repeat(self, mv: memoryview, pos: int, h: BatchHeader) -> None:
        """A deterministic producer (a Spark write task) repeats sequences it wrote before: its
        records must be the ones it wrote then. They differ when a re-run sees its rows in
        another order (after a shuffle); dropping the batch as a duplicate would then lose some
        rows and repeat others, so it is refused with INVALID_RECORD and the sink goes on at
        least once. When every record the batch repeats can be read back, the same rows in
        another order are still the duplicate (each row is in the log once), so a batch
        that holds the same rows as before stays exact. Rows count as the same by key, value
        and headers: a sink stamps rows that have no event time when it sends them. What
        retention removed cannot be compared and is taken as the duplicate its sequence says."""
        from stratalog.records import iter_records

        wrote: dict[int, Record] = {}
        for meta in self.producers.originals(h.producer_id, h.base_sequence, h.last_sequence):
            if meta.base_offset < self.log_start_offset or meta.last_offset >= self.high_watermark:
                continue
            try:
                for rec in iter_records(self._chunk_bytes(meta.base_offset)):
                    seq = meta.first_seq + rec.offset - meta.base_offset
                    if h.base_sequence <= seq <= h.last_sequence:
                        wrote[seq] = rec
            except CorruptBatchError:
                continue
        batch = mv[pos : pos + h.batch_length + LOG_OVERHEAD]
        sent = {h.base_sequence + r.offset - h.base_offset: r for r in iter_records(batch, h)}
        if len(wrote) == len(sent):
            if Counter(map(_row, wrote.values())) == Counter(map(_row, sent.values())):
                return
            differ = next(s for s in sorted(sent) if _row(sent[s]) != _row(wrote[s]))
        else:
            differ = next((s for s, r in wrote.items() if _row(r) != _row(sent[s])), None)
            if differ is None:
                return
        raise AppendError(
            "INVALID_RECORD",
            f"producer {h.producer_id} repeats sequences {h.base_sequence}..{h.last_sequence} "
            f"of {self.topic}-{self.index} with other records than it wrote (sequence "
            f"{differ} was offset {wrote[differ].offset}): a re-run that saw other rows",
        )

    def advance_high_watermark(self, offset: int) -> None:
        if offset > self.high_watermark:
            self.high_watermark = offset
            if self.txns.completing:
                self.txns.on_high_watermark(offset)
            if self.slot is not None:
                self.slot.publish_end(self)
            self._wake()

    def publish(self) -> None:
        """Tell co-located readers (read slots) that the readable range changed."""
        if self.slot is not None:
            self.slot.publish(self)

    @property
    def last_stable_offset(self) -> int:
        """What a read_committed consumer may read up to: the high watermark, or the first
        offset of a transaction not complete below it (storage/txn_index.py)."""
        txns = self.txns
        if not txns.open and not txns.completing:
            return self.high_watermark
        return txns.last_stable_offset(self.high_watermark)

    # -- transactions --------------------------------------------------------------------------
    def _note_transactional(self, h: BatchHeader, base: int, batch: bytes | memoryview) -> None:
        """A batch of a transactional producer was written at ``base``: a data batch opens its
        transaction here (if not open yet), a marker ends it."""
        if not h.is_control:
            if h.is_transactional:
                self.txns.on_data(h.producer_id, base)
            return
        control = control_record(batch)
        if control is not None and control[0] in (ABORT, COMMIT):
            self.txns.on_marker(h.producer_id, base, control[0] == ABORT)
            self.producers.fence(h.producer_id, h.producer_epoch, control[1])

    def rebuild_txns(self, chunks: list[tuple[int, int, int, int]]) -> None:
        """Rebuild the transaction index from ``chunks``, (base offset, producer id, epoch,
        base sequence) of every chunk of a transactional producer in offset order (at open,
        from the index entries; after a truncation the index could not follow, from the
        batches' headers)."""
        epochs = {base: (pid, epoch) for base, pid, epoch, _seq in chunks}
        markers = self.txns.rebuild(
            ((base, pid, seq) for base, pid, _epoch, seq in chunks),
            self._control_record_at,
            self.high_watermark,
        )
        for pid, base, coordinator_epoch in markers:
            self.producers.fence(pid, epochs[base][1], coordinator_epoch)

    def _control_record_at(self, base: int) -> tuple[int, int] | None:
        """The control record of the chunk at ``base`` (None: a data batch), from one small
        read of its file: a marker is about 80 bytes, and only its header decides the rest."""
        try:
            for chunks in (self.cold, self.chunks):
                i = chunks.locate(base)
                if i < len(chunks) and chunks.base_of(i) == base:
                    head = self._chunk_prefix(chunks, i, _MARKER_READ)
                    if len(head) < 61 or not parse_header(head).is_control:
                        return None
                    if len(head) < chunks.size_of(i):
                        head = self._chunk_prefix(chunks, i, chunks.size_of(i))
                    return control_record(head)
            return control_record(self.batch_at(base))
        except (OSError, CorruptBatchError, ValueError) as e:
            log.warning("%s-%d: cannot read the batch at %d: %s", self.topic, self.index, base, e)
            return None

    def batch_at(self, base: int) -> bytes:
        """The stored bytes of the batch at ``base`` (whatever the high watermark)."""
        rr = self.read(base, 1, min_one=True, upto=self.next_offset)
        try:
            data = b"".join(p.read() if isinstance(p, FileSlice) else bytes(p) for p in rr.parts)
        finally:
            rr.release()
        return data[: parse_header(data).size] if len(data) >= 61 else data

    def scan_transactional(self) -> list[tuple[int, int, int, int]]:
        """(base offset, producer id, epoch, base sequence) of every transactional producer's
        chunk, read from the batches' headers (both tiers): what rebuilds the transaction index
        when the chunk index entries are not at hand."""
        out: list[tuple[int, int, int, int]] = []
        for chunks in self._both():
            for i in range(len(chunks)):
                base = chunks.base_of(i)
                if base < self.log_start_offset:
                    continue
                try:
                    head = self.batch_head(chunks, i)
                except (OSError, CorruptBatchError) as e:
                    log.warning(
                        "%s-%d: header at %d unreadable: %s", self.topic, self.index, base, e
                    )
                    continue
                if is_transactional_producer(head.producer_id):
                    out.append((base, head.producer_id, head.producer_epoch, head.base_sequence))
        return out

    def batch_head(self, chunks: ChunkIndex, i: int) -> BatchHeader:
        return parse_header(self._chunk_prefix(chunks, i, 61))

    def _chunk_prefix(self, chunks: ChunkIndex, i: int, size: int) -> bytes:
        """The first ``size`` bytes (at most the chunk's) of chunk ``i`` of ``chunks`` (the
        hot or the cold index), read from its segment file."""
        if chunks is self.cold:
            seg = self.cold_segments[chunks.segment_of(i)]
        else:
            seg = self.vlog.segment(chunks.segment_of(i))
            if seg is None:
                raise OSError(f"segment {chunks.segment_of(i)} is gone")
        return seg.read(chunks[i].position, min(size, chunks.size_of(i)))

    def _wake(self) -> None:
        waiters, self._waiters = self._waiters, []
        for w in waiters:
            if not w.done():
                w.set_result(None)

    def waiter(self) -> asyncio.Future[None]:
        """A future completed the next time the high watermark (or the log) changes."""
        fut = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        return fut

    # -- read path -----------------------------------------------------------------------------
    def lost_at(self, offset: int) -> tuple[int, int] | None:
        """The lost range (first, last) holding ``offset``, if any."""
        i = bisect_right(self.lost, (offset, 1 << 62)) - 1
        if i >= 0 and self.lost[i][1] >= offset:
            return self.lost[i]
        return None

    def _lost_after(self, offset: int) -> int | None:
        """The first offset of the first lost range after ``offset``: a read stops there."""
        i = bisect_right(self.lost, (offset, 1 << 62))
        return self.lost[i][0] if i < len(self.lost) else None

    def order_marks(self, parent: PartitionLog, first: int, end: int) -> list[tuple[int, int]]:
        """For each hot chunk of this partition with ``first <= base < end``: (its base, the
        first offset of ``parent`` placed after it in the virtual log they share), which is the
        parent's next offset when the chunk was appended: every parent record below it came
        first. Nothing for partitions in different logs."""
        if parent.vlog is not self.vlog:
            return []
        out = self._cold_marks(parent, first, end)
        mine, theirs = self.chunks, parent.chunks
        n, m = len(mine), len(theirs)
        i = mine.locate(first)
        j = 0
        while i < n:
            loc = mine[i]
            if loc.base_offset >= end:
                break
            key = (loc.segment, loc.position)
            hi = m  # the answers only move forward: search from the previous one
            while j < hi:
                mid = (j + hi) // 2
                there = theirs[mid]
                if (there.segment, there.position) > key:
                    hi = mid
                else:
                    j = mid + 1
            out.append((loc.base_offset, theirs.base_of(j) if j < m else parent.next_offset))
            i += 1
        return out

    def _cold_marks(self, parent: PartitionLog, first: int, end: int) -> list[tuple[int, int]]:
        """Order marks of this partition's cold chunks from ``first`` below ``end``, by virtual
        log segment: migration keeps each partition's chunks apart, but moves a segment's
        chunks of every partition together, so a chunk from segment S comes after all of the
        parent's records in segments up to S. (Coarser than a hot chunk's mark: the reader may
        wait for parent records appended after the chunk, in the same segment; each producer's
        order holds.) None for chunks or parents whose cold segments do not say their segment
        (compaction wrote them)."""
        cold = self.cold
        if not len(cold) or first > cold.next_offset - 1:
            return []
        theirs = sorted((s.meta.base, s.meta.vseg) for s in parent.cold_segments.values())
        if any(v is None for _, v in theirs):
            return []
        hot_first = parent.chunks.base_of(0) if len(parent.chunks) else parent.next_offset
        out = []
        i = cold.locate(first)
        while i < len(cold) and cold.base_of(i) < end:
            vseg = self.cold_segments[cold.segment_of(i)].meta.vseg
            if vseg is not None:
                w = next((b for b, v in theirs if v > vseg), hot_first)
                out.append((cold.base_of(i), w))
            i += 1
        return out

    def read(
        self, offset: int, max_bytes: int, *, min_one: bool = True, upto: int | None = None
    ) -> ReadResult:
        """Whole batches from the one holding ``offset`` up to ``max_bytes`` below the HWM (or
        below ``upto``: the last stable offset of a read_committed consumer).

        At least one batch is returned even past ``max_bytes`` when ``min_one`` (KIP-74). A read
        may span tiers: cold chunks first (as one slice per run of contiguous chunks), then hot.
        """
        parts: list[bytes | memoryview | FileSlice] = []
        try:
            return self._read(offset, max_bytes, min_one, parts, upto)
        except BaseException:
            # An index run that cannot be read (OSError): give back what was taken so far.
            for p in parts:
                if isinstance(p, FileSlice):
                    p.release()
            raise

    def _read(
        self,
        offset: int,
        max_bytes: int,
        min_one: bool,
        parts: list[bytes | memoryview | FileSlice],
        upto: int | None,
    ) -> ReadResult:
        size = 0
        cold = self.cold
        hwm = self.high_watermark if upto is None else upto
        first = -1
        if len(cold) and offset <= cold.next_offset - 1:
            size, first, offset = self._read_cold(offset, max_bytes, min_one, parts, hwm)
            if size and size >= max_bytes:
                return ReadResult(parts, size, next_offset=offset, first_offset=first)
            if offset <= cold.next_offset - 1:
                # stopped inside the cold tier (budget, or the stable offset)
                return ReadResult(
                    parts, size, next_offset=offset if size else -1, first_offset=first
                )
        chunks = self.chunks
        n = len(chunks)
        i = chunks.locate(offset)
        nxt = offset if size else -1
        tail_get = self._tail.get
        uid = self.uid
        at_end = False
        # Never read across a lost range: the offsets after it would look like the next ones.
        stop = self._lost_after(offset) if self.lost else None
        while True:
            if i >= n or chunks.last_of(i) >= hwm:
                at_end = True
                break
            base = chunks.base_of(i)
            if stop is not None and base >= stop:
                break
            s = chunks.size_of(i)
            if size + s > max_bytes and (size > 0 or not min_one):
                break
            cached = tail_get(uid, base)
            if cached is not None:
                parts.append(cached)
            else:
                seg = self.vlog.segment(chunks.segment_of(i))
                if seg is None:
                    break
                loc = chunks[i]
                parts.append(FileSlice(seg.acquire(), loc.position, loc.size))
            if first < 0:
                first = base
            size += s
            nxt = chunks.last_of(i) + 1
            i += 1
        return ReadResult(parts, size, at_end, nxt, first)

    def _read_cold(
        self, offset: int, max_bytes: int, min_one: bool, parts: list, upto: int
    ) -> tuple[int, int, int]:
        """Append slices of cold chunks from ``offset`` below ``upto``; return (bytes, base
        offset of the first chunk taken or -1, next offset)."""
        cold = self.cold
        n = len(cold)
        i = cold.locate(offset)
        first = cold.base_of(i) if i < n else -1
        size = 0
        nxt = offset
        while i < n:
            seq = cold.segment_of(i)
            start = cold[i].position
            run = 0
            # Chunks of one cold segment lie back to back: one slice covers the whole run.
            while i < n and cold.segment_of(i) == seq:
                if cold.last_of(i) >= upto:
                    n = i  # nothing from here on (a transaction still open)
                    break
                s = cold.size_of(i)
                if size + run + s > max_bytes and (size + run > 0 or not min_one):
                    break
                run += s
                nxt = cold.last_of(i) + 1
                i += 1
            if run:
                parts.append(FileSlice(self.cold_segments[seq].acquire(), start, run))
                size += run
            if i < n and cold.segment_of(i) == seq:
                break  # the budget ran out inside this segment
        return size, (first if size else -1), nxt

    # -- the cold tier -------------------------------------------------------------------------
    def add_cold_segment(self, seg, piece: ChunkIndex | None = None, after: int = -1) -> None:
        """Take a migrated (or loaded) cold segment into the index, from its first chunk that
        is past offset ``after`` and not below the log start on. Its entries stay in its index
        file (a run, read when needed: ColdRun); ``piece``, if given, is the segment's last
        entries, built off the event loop (a fresh migration's: kept in the run cache)."""
        self.cold_segments[seg.seq] = seg
        meta = seg.meta
        source = ColdRun(seg)
        start = self.log_start_offset
        if piece is None and meta.base > after and meta.base >= start:
            # All of it: the manifest's description is the summary; nothing is read.
            self.cold.add_run(
                seg.seq, source, meta.entries, meta.base, meta.last, meta.max_timestamp,
                UNKNOWN_TIMESTAMP, meta.size,
            )  # fmt: skip
            return
        if piece is not None:
            cols = piece.columns()
            first = meta.entries - len(cols)  # where the piece starts in the segment's entries
            if first == 0:
                RUN_CACHE.put(source, cols)
        else:
            cols = RUN_CACHE.get(source)
            first = 0
        n = len(cols)
        j = max(bisect_right(cols.base, after), bisect_left(cols.last, start))
        if j >= n:
            return
        maxts = cols.maxts[j:]
        self.cold.add_run(
            seg.seq, source, n - j, cols.base[j], cols.last[n - 1], max(maxts), min(maxts),
            sum(cols.size[j:]), skip=first + j,
        )  # fmt: skip

    def migrate_front(self, count: int) -> None:
        """Forget the first ``count`` hot chunks: they now live in the cold tier. Unlike
        retention this moves no offsets: the data is still there, one tier down."""
        self._tail.drop_many(self.uid, self.chunks.bases(count))
        self.size_bytes -= self.chunks.bytes_of_first(count)
        self.chunks.drop_front(count)
        self.publish()

    def drop_cold_front(self, count: int) -> list:
        """Retention in the cold tier: forget the first ``count`` cold chunks; return the cold
        segments no chunk refers to any more (the caller deletes them)."""
        if count <= 0:
            return []
        self.cold.drop_front(count)
        still = self.cold.segments()
        gone = [s for seq, s in self.cold_segments.items() if seq not in still]
        for s in gone:
            del self.cold_segments[s.seq]
        first = self.cold.first_offset
        if first is None:
            first = (
                self.chunks.first_offset
                if self.chunks.first_offset is not None
                else (self.next_offset)
            )
        self.log_start_offset = max(self.log_start_offset, first)
        self.txns.drop_before(self.log_start_offset)
        self.publish()
        return gone

    @property
    def cold_bytes(self) -> int:
        return self.cold.total_bytes()

    def _both(self) -> list[ChunkIndex]:
        return [self.cold, self.chunks]

    # -- retention -----------------------------------------------------------------------------
    def drop_before(self, keep_from: int) -> dict[int, int]:
        """Drop the first chunks so that chunk ``keep_from`` is first; return per-segment counts."""
        dropped = self.chunks.count_by_segment_of_first(keep_from)
        self._tail.drop_many(self.uid, self.chunks.bases(keep_from))
        if keep_from < len(self.chunks):
            self.log_start_offset = max(self.log_start_offset, self.chunks.base_of(keep_from))
        else:
            self.log_start_offset = max(self.log_start_offset, self.next_offset)
        self.chunks.drop_front(keep_from)
        self.txns.drop_before(self.log_start_offset)
        self.publish()
        return dropped

    def offset_for_timestamp(self, timestamp: int) -> tuple[int, int] | None:
        """(offset, timestamp) of the first record at or after ``timestamp``, below the HWM;
        the time index covers both tiers (cold first: it holds the older offsets)."""
        from stratalog.records import iter_records

        for chunks in self._both():
            i = chunks.locate_time(timestamp)
            while i < len(chunks) and chunks.last_of(i) < self.high_watermark:
                if chunks.max_timestamp_of(i) >= timestamp:
                    data = self._chunk_bytes(chunks.base_of(i))
                    try:
                        for rec in iter_records(data):
                            if rec.timestamp >= timestamp and rec.offset >= self.log_start_offset:
                                return rec.offset, rec.timestamp
                    except CorruptBatchError:
                        pass
                i += 1
        return None

    def _chunk_bytes(self, base: int) -> bytes:
        rr = self.read(base, 1, min_one=True)
        try:
            data = b"".join(p.read() if isinstance(p, FileSlice) else bytes(p) for p in rr.parts)
        finally:
            rr.release()
        from stratalog.storage.batch import parse_header

        return data[: parse_header(data).size] if len(data) >= 61 else data

    def max_timestamp(self) -> tuple[int, int] | None:
        """(offset, timestamp) of the record with the largest timestamp (ListOffsets -3)."""
        from stratalog.records import iter_records

        best, best_base, best_last = -1, -1, -1
        for chunks in self._both():
            # The summaries of the runs on disk say which run holds it: that one is read.
            i = chunks.argmax_timestamp(self.high_watermark)
            if i >= 0 and chunks.max_timestamp_of(i) > best:
                best, best_base, best_last = (
                    chunks.max_timestamp_of(i), chunks.base_of(i), chunks.last_of(i)
                )  # fmt: skip
        if best_base < 0:
            return None
        for rec in iter_records(self._chunk_bytes(best_base)):
            if rec.timestamp == best:
                return rec.offset, best
        return best_last, best
