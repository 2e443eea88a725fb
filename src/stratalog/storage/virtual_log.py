"""A virtual log (KerA): one append-only sequence of segments shared by many partitions.

Partitioning is separate from the physical log: every partition maps to one virtual log, and a
virtual log interleaves the chunks of all partitions mapped to it, so a broker with thousands of
partitions still writes and fsyncs a handful of files. With ``storage.layout=per-partition`` each
partition gets a log of its own, as in Kafka, so both layouts run on the same code.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
from collections import deque
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass
from pathlib import Path

from crc32c import crc32c

from stratalog.storage import reaper
from stratalog.storage.batch import LOG_OVERHEAD, BatchHeader
from stratalog.storage.fsync_ring import FsyncRing
from stratalog.storage.journal import FsyncPolicy, GroupCommit, StorageFailure
from stratalog.storage.recovery import (
    CLEAN_SHUTDOWN,
    RecoveryReport,
    recover_log,
    write_checkpoint,
)
from stratalog.storage.segment import (
    DIRECT_MIN_BYTES,
    FRAME,
    FRAME_SIZE,
    IndexEntry,
    Segment,
    fsync_dir,
    list_segments,
    uid_crc,
)

log = logging.getLogger(__name__)

_IOV_MAX = 1000


def _write(seg: Segment, parts: list[bytes | memoryview], nbytes: int) -> None:
    for i in range(0, len(parts), _IOV_MAX):
        chunk = parts[i : i + _IOV_MAX]
        seg.write(chunk, nbytes if len(parts) <= _IOV_MAX else sum(len(p) for p in chunk))


class WriteFailed(StorageFailure):
    """A segment write failed for want of space (ENOSPC, EDQUOT, EFBIG): what it carried was cut
    back, nothing of it was recorded, and the log stays writable (a retry is appended once space
    returns)."""


# Errors a write can meet without the disk having failed: the bytes are cut back and the log
# goes on. Anything else (EIO, ...) fails the log as a failed fsync does.
_SPACE_ERRORS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})

# Called once a staged append is written: (segment, the batches' positions, the append's LSN).
OnWritten = Callable[[Segment, list[int], int], None]


class WriteBatch:
    """The appends of one Produce request: each virtual log it touches stages them and writes
    them with one writev at commit (KerA: one write for many streams), instead of one per
    partition. Nothing is recorded for a staged append (index, producer state, high watermark)
    until its bytes are written: each append's ``on_written`` runs then, or its ``on_failed`` if
    the write failed. Commit runs before the request handler yields, so nothing can observe the
    staged state in between."""

    __slots__ = ("failed", "vlogs")

    def __init__(self) -> None:
        self.vlogs: list[VirtualLog] = []
        # Virtual logs whose write failed at commit, and why.
        self.failed: dict[VirtualLog, StorageFailure] = {}

    def join(self, vlog: VirtualLog) -> None:
        if vlog._batched is None:
            vlog.begin_batch()
            self.vlogs.append(vlog)

    def commit(self) -> StorageFailure | None:
        """Write every staged append; the first failure, if any (``failed`` has them all)."""
        failure = None
        for v in self.vlogs:
            try:
                v.flush_batch(end=True)
            except StorageFailure as e:
                self.failed[v] = e
                failure = failure or e
        self.vlogs.clear()
        return failure


class VirtualLog:
    def __init__(
        self,
        directory: Path,
        name: str,
        *,
        policy: FsyncPolicy,
        executor: Executor,
        segment_bytes: int,
        segment_ms: int,
        group_commit_ms: float,
        group_commit_bytes: int,
        direct_io: bool = False,
        direct_min_bytes: int = DIRECT_MIN_BYTES,
        ring: FsyncRing | None = None,
    ) -> None:
        self.directory = directory
        self.direct_io = direct_io
        self.direct_min_bytes = direct_min_bytes
        self.name = name
        self.segment_bytes = segment_bytes
        self.segment_ms = segment_ms
        self._executor = executor
        self.journal = GroupCommit(
            policy,
            executor,
            self._durable,
            group_ms=group_commit_ms,
            group_bytes=group_commit_bytes,
            ring=ring,
        )
        self.segments: dict[int, Segment] = {}
        self.active: Segment
        self.lsn = 0
        # (lsn, callback) in LSN order: called once the append at that LSN is durable.
        self._pending: deque[tuple[int, Callable[[bool], None]]] = deque()
        self._checkpointed: tuple[int, int] = (-1, 0)
        self._checkpointing = False
        self.report = RecoveryReport()
        self.opened = False
        # Where new segments go while the hot tier is full (a local cold tier only).
        self.spill_directory: Path | None = None
        self.spill = False
        # Asked at each roll whether a new segment of this size still fits in the hot tier
        # (set by the migrator), so a burst cannot overrun the capacity between its checks.
        self.spill_policy: Callable[[int], bool] | None = None
        # A WriteBatch in progress: appends are staged here and written with one writev (and
        # handed to the journal once) when it commits, instead of one writev per partition.
        self._batched: list[bytes | memoryview] | None = None
        self._batched_bytes = 0
        self._staged: list[_Staged] = []

    # -- opening and closing -------------------------------------------------------------------
    def open(self) -> dict[int, list[IndexEntry]]:
        """Open (recovering if needed) and return the index entries of every segment."""
        self.directory.mkdir(parents=True, exist_ok=True)
        reaper.sweep(self.directory)
        seqs = list_segments(self.directory)
        spilled: dict[int, Path] = {}
        if self.spill_directory is not None and self.spill_directory.is_dir():
            reaper.sweep(self.spill_directory)
            spilled = {s: self.spill_directory for s in list_segments(self.spill_directory)}
        segs, entries, self.report = recover_log(
            self.directory, sorted(set(seqs) | set(spilled)), spilled
        )
        for seg in segs:
            self.segments[seg.seq] = seg
        if segs:
            self.active = segs[-1]
        else:
            self.active = Segment(self.directory, 0, create=True)
            self.segments[0] = self.active
            fsync_dir(self.directory)
        for seg in segs[:-1]:
            seg.sealed = True
        if self.direct_io:
            self.active.enable_direct(self.direct_min_bytes)
        self._checkpointed = (self.active.seq, self.active.size)
        self.opened = True
        return entries

    async def close(self) -> None:
        """Flush everything and leave a clean-shutdown marker so the next start skips the scan."""
        await self.journal.drain()
        self.journal.close()
        ok = self.journal.failed is None
        for seg in self.segments.values():
            seg.flush_index(sync=True)
        if self.active.direct:
            self.active.finish_direct()  # the last block's padding goes before the marker
            self.active.sync()
        if ok:
            write_checkpoint(self.directory, self.active.seq, self.active.size)
            (self.directory / CLEAN_SHUTDOWN).touch()
            fsync_dir(self.directory)
        for seg in self.segments.values():
            seg.close()
        self.segments.clear()

    def abandon(self) -> None:
        """Close file descriptors without flushing (a crash, as far as the disk can tell)."""
        self.journal.close()
        for seg in self.segments.values():
            seg.release()
        self.segments.clear()

    # -- appending -----------------------------------------------------------------------------
    def append(
        self,
        uid: int,
        batches: list[tuple[bytes, memoryview, BatchHeader, int]],
        on_written: OnWritten,
        on_failed: Callable[[StorageFailure], None] | None = None,
    ) -> None:
        """Append the frames of one partition's batches in one write (or stage them in the
        WriteBatch in progress).

        Each item is (new 8-byte baseOffset, the batch as received, its header, the new base
        offset as an int); the batch's own first 8 bytes are replaced by the new offset without
        copying the rest (zero copy). Once the bytes are written, their index entries are added
        and ``on_written(segment, positions, lsn)`` runs (the LSN to wait on for durability);
        if the write fails, ``on_failed(failure)`` runs instead and StorageFailure is raised (at
        once, or from the WriteBatch's commit).
        """
        if self.journal.failed:
            raise self.journal.failed
        self._maybe_roll()
        seg = self.active
        parts: list[bytes | memoryview] = []
        positions = []
        start = pos = seg.size
        start_crc = uid_crc(uid)
        pack_frame = FRAME.pack
        for off8, batch, _h, _base in batches:
            # Frame CRC over uid + the rewritten first 21 bytes, chained without concatenating.
            fh = pack_frame(uid, crc32c(batch[8:21], crc32c(off8, start_crc)))
            parts += (fh, off8, batch[8:])
            positions.append(pos + FRAME_SIZE)
            pos += FRAME_SIZE + len(batch)
        nbytes = pos - start
        staged = _Staged(uid, batches, positions, nbytes, on_written, on_failed)
        if self._batched is not None:
            self._batched += parts
            self._batched_bytes += nbytes
            self._staged.append(staged)
            seg.size += nbytes  # reserved now, written by flush_batch
            return
        self._write_staged(seg, parts, start, nbytes, [staged])

    def _write_staged(
        self,
        seg: Segment,
        parts: list[bytes | memoryview],
        start: int,
        nbytes: int,
        staged: list[_Staged],
    ) -> None:
        """Write ``parts`` at ``start`` (where ``seg.size`` stands) and record the staged
        appends, or cut the bytes back and tell each append it failed."""
        try:
            _write(seg, parts, nbytes)
        except OSError as e:
            self._cut_back(seg, start)
            failure: StorageFailure
            if e.errno in _SPACE_ERRORS:
                log.warning(
                    "%s: write of %d B failed (%s); cut back, the log stays writable",
                    self.name,
                    nbytes,
                    e,
                )
                failure = WriteFailed(f"write failed: {e}")
            else:
                self.journal.fail(StorageFailure(f"write failed: {e}"))
                failure = self.journal.failed  # type: ignore[assignment]
            for st in staged:
                if st.on_failed is not None:
                    st.on_failed(failure)
            raise failure from None
        add_index = seg.add_index_fields
        lsn = self.lsn
        for st in staged:
            lsn += st.nbytes
            for (_off8, _batch, h, base), p in zip(st.batches, st.positions, strict=True):
                add_index(
                    st.uid,
                    base,
                    h.last_offset_delta,
                    p,
                    h.batch_length + LOG_OVERHEAD,
                    h.max_timestamp,
                    h.producer_id,
                    h.producer_epoch,
                    h.base_sequence,
                )
        self.lsn = lsn
        self.journal.note_append(seg, lsn, nbytes)
        lsn -= nbytes
        for st in staged:
            lsn += st.nbytes
            st.on_written(seg, st.positions, lsn)

    def _cut_back(self, seg: Segment, start: int) -> None:
        """Forget a failed write: the segment ends at ``start`` again, on disk too, so a
        partly written frame is neither overwritten half-way nor found by recovery."""
        seg.size = start
        try:
            if os.fstat(seg.fd).st_size > start:
                os.ftruncate(seg.fd, start)
        except OSError as e:  # recovery cuts it (no index entry vouches for it)
            log.warning("%s: cannot cut back a failed write: %s", seg, e)

    def begin_batch(self) -> None:
        """Stage appends until flush_batch (see WriteBatch)."""
        self._batched = []
        self._batched_bytes = 0
        self._staged = []

    def flush_batch(self, end: bool = False) -> None:
        """Write what was staged in one writev and record it; ``end`` stops staging. A failed
        write is cut back and every staged append is told (raises StorageFailure)."""
        parts, nbytes, staged = self._batched, self._batched_bytes, self._staged
        self._batched = None if end else []
        self._batched_bytes = 0
        self._staged = []
        if not parts:
            return
        seg = self.active
        start = seg.size - nbytes
        seg.size = start
        self._write_staged(seg, parts, start, nbytes, staged)

    def when_durable(self, lsn: int, callback: Callable[[bool], None]) -> None:
        """Call ``callback(True)`` once ``lsn`` is durable (or ``callback(False)`` on failure)."""
        if self.journal.durable >= lsn:
            callback(True)
        else:
            self._pending.append((lsn, callback))

    def _durable(self, lsn: int) -> None:
        pending = self._pending
        if lsn < 0:
            while pending:
                pending.popleft()[1](False)
            return
        while pending and pending[0][0] <= lsn:
            pending.popleft()[1](True)

    def _maybe_roll(self) -> None:
        seg = self.active
        if seg.size == 0:
            return
        if seg.size >= self.segment_bytes or seg.age_seconds() * 1000 >= self.segment_ms:
            self.roll()

    def roll(self) -> Segment:
        if self._batched:
            self.flush_batch()  # staged bytes belong to the segment about to be sealed
        old = self.active
        old.sealed = True
        old.flush_index()
        if self.spill_policy is not None and self.spill_directory is not None:
            self.spill = self.spill_policy(self.segment_bytes)
        new: Segment | None = None
        if self.spill and self.spill_directory is not None:
            # The hot tier is full: new segments go to the cold tier's directory (Pafka).
            try:
                self.spill_directory.mkdir(parents=True, exist_ok=True)
                new = Segment(self.spill_directory, old.seq + 1, create=True)
            except OSError as e:
                # A cold tier that went away or turned read-only must not fail a write the
                # hot device can still take: past its capacity is better than an error.
                log.warning("cannot spill to the cold tier (%s): segment stays hot", e)
        if new is None:
            try:
                new = Segment(self.directory, old.seq + 1, create=True)
            except OSError as e:
                # No room for a new file: the old segment stays active; the next append tries
                # again (an ENOSPC here must not make the log read-only).
                old.sealed = False
                log.warning("%s: cannot start a new segment: %s", self.name, e)
                raise WriteFailed(f"cannot start a new segment: {e}") from None
        if self.direct_io:
            new.enable_direct(self.direct_min_bytes)
        # Cut the sealed segment's padding now: recovery treats a segment that ends short of its
        # file as torn unless the rest is padding, and the seal's fdatasync makes the cut durable.
        old.finish_direct()
        self.segments[new.seq] = new
        self.active = new
        # The sealed segment's index must be durable before a checkpoint can point past it.
        old.acquire()
        self._executor.submit(_seal, old)
        return new

    # -- reading -------------------------------------------------------------------------------
    def segment(self, seq: int) -> Segment | None:
        return self.segments.get(seq)

    def delete_segment(self, seq: int) -> None:
        seg = self.segments.pop(seq, None)
        if seg is not None and seg is not self.active:
            seg.delete()
        elif seg is not None:
            self.segments[seq] = seg

    def size_bytes(self) -> int:
        return sum(s.size for s in self.segments.values())

    def hot_bytes(self) -> int:
        """Bytes of this log's segments in the hot directory (not spilled ones)."""
        return sum(s.size for s in self.segments.values() if s.directory == self.directory)

    def oldest_sealed(self) -> Segment | None:
        for seq in sorted(self.segments):
            seg = self.segments[seq]
            if seg is not self.active:
                return seg
        return None

    # -- index checkpoint ----------------------------------------------------------------------
    async def checkpoint(self) -> None:
        """Make the index durable up to the current end and record that position."""
        if self._checkpointing or self.journal.failed:
            return
        seg = self.active
        if (seg.seq, seg.size) == self._checkpointed:
            return
        self._checkpointing = True
        try:
            seg.flush_index()
            position = seg.size
            seg.acquire()
            loop = asyncio.get_running_loop()
            try:
                await loop.run_in_executor(
                    self._executor, _checkpoint, self.directory, seg, position
                )
            finally:
                seg.release()
            self._checkpointed = (seg.seq, position)
        finally:
            self._checkpointing = False


@dataclass(slots=True)
class _Staged:
    """One partition's append waiting for its write."""

    uid: int
    batches: list[tuple[bytes, memoryview, BatchHeader, int]]
    positions: list[int]
    nbytes: int
    on_written: OnWritten
    on_failed: Callable[[StorageFailure], None] | None


def _seal(seg: Segment) -> None:
    try:
        seg.sync()
        os.fdatasync(seg.index_fd)
    finally:
        seg.release()


def _checkpoint(directory: Path, seg: Segment, position: int) -> None:
    # Data first, then its index entries, then the checkpoint that vouches for both.
    seg.sync()
    os.fdatasync(seg.index_fd)
    write_checkpoint(directory, seg.seq, position)
