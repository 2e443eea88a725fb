"""A virtual log (KerA): one append-only sequence of segments shared by many partitions.

Partitioning is separate from the physical log: every partition maps to one virtual log, and a
virtual log interleaves the chunks of all partitions mapped to it, so a broker with thousands of
partitions still writes and fsyncs a handful of files. With ``storage.layout=per-partition`` each
partition gets a log of its own, as in Kafka, so both layouts run on the same code.

In cluster mode a virtual log is also the unit of replication: its bytes are identical on every
replica, segment boundaries included, so a position (segment seq, byte position) names the same
bytes everywhere. On the primary ``on_write`` hands each written run of frames over for shipping
and ``require_replicas``/``replica_acked`` hold ``when_durable`` back until the in-sync backups
have the bytes; on a backup ``append_replica`` appends them, ``truncate_to`` cuts a divergent
tail and ``read_range`` serves a lagging backup. Nothing here knows of networks (storage/replica.py
has the errors and the epoch history).
"""

from __future__ import annotations

import asyncio
import copy
import errno
import itertools
import logging
import os
from bisect import bisect_right, insort
from collections import ChainMap, deque
from collections.abc import Callable, Iterable
from concurrent.futures import Executor
from dataclasses import dataclass
from pathlib import Path

from crc32c import crc32c
from prometheus_client import Counter

from stratalog.storage import damage, producer_snapshot, reaper, sealed_index
from stratalog.storage.batch import LOG_OVERHEAD, BatchHeader
from stratalog.storage.fsync_ring import FsyncRing
from stratalog.storage.journal import FsyncPolicy, GroupCommit, StorageFailure
from stratalog.storage.recovery import (
    CLEAN_SHUTDOWN,
    RecoveryReport,
    _chain,
    _Damage,
    frame_size,
    pack_entries,
    parse_frames,
    read_checkpoint,
    recover_log,
    scan,
    write_checkpoint,
)
from stratalog.storage.replica import (
    CorruptReplica,
    EpochHistory,
    NotPrimary,
    PositionUnavailable,
    ReplicaGap,
    StaleEpoch,
)
from stratalog.storage.sealed_index import SealedIndex
from stratalog.storage.segment import (
    DIRECT_MIN_BYTES,
    FRAME,
    FRAME_SIZE,
    IndexEntry,
    Segment,
    fsync_dir,
    list_segments,
    mkdir_durable,
    seal_pause,
    uid_crc,
)

__all__ = [
    "CorruptReplica",
    "OnReplicaEntries",
    "OnWrite",
    "PositionUnavailable",
    "ReplicaGap",
    "StaleEpoch",
    "VirtualLog",
    "WriteBatch",
    "WriteFailed",
]

log = logging.getLogger(__name__)

WRITE_ERRORS = Counter(
    "stratalog_log_write_errors",
    "Segment writes that failed and were cut back (nothing recorded), by errno",
    ["errno"],
)

_IOV_MAX = 1000


def _write(seg: Segment, parts: list[bytes | memoryview], nbytes: int) -> None:
    for i in range(0, len(parts), _IOV_MAX):
        chunk = parts[i : i + _IOV_MAX]
        seg.write(chunk, nbytes if len(parts) <= _IOV_MAX else sum(len(p) for p in chunk))


class WriteFailed(StorageFailure):
    """A segment write failed (ENOSPC, EIO, EROFS, ...): what it carried was cut back, nothing
    of it was recorded, and the log stays writable (a retry is appended once the error is
    gone)."""


# A write that fails leaves no promise broken: nothing of it was recorded or acknowledged, the
# bytes are cut back, and the next write goes at the same position (writes are positional, so
# even bytes a failed cut-back left are overwritten). So every write error fails that write
# only, and the log takes the next one; it is a failed fsync that stops a log (journal.py).
# These name the log's state in /status while they last.
_SPACE_ERRORS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})
READ_ONLY = "read-only"

# Called once a staged append is written: (segment, the batches' positions, the append's LSN).
OnWritten = Callable[[Segment, list[int], int], None]
# VirtualLog.on_write: (segment seq, start position, the parts written, the LSN at their end).
OnWrite = Callable[[int, int, list[bytes | memoryview], int], None]
# VirtualLog.on_replica_entries: (segment, index entries of the frames a backup appended).
OnReplicaEntries = Callable[[Segment, list[IndexEntry]], None]
# VirtualLog.on_sealed: (a sealed segment, its sealed index, written and synced), on the loop.
OnSealed = Callable[[Segment, SealedIndex], None]
# What a segment's entries are at open: in memory, or its sealed index (sealed_index.py).
SegmentEntries = list[IndexEntry] | SealedIndex


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
        verify_on_open: bool = False,
    ) -> None:
        self.directory = directory
        # Check every frame's CRCs at open, not only those past the checkpoint.
        self.verify_on_open = verify_on_open
        # Damaged ranges recovery stepped over, at this start or earlier ones (damage.py).
        self.damaged: list[damage.DamagedRange] = []
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
            name=name,
        )
        # The error of the last write if it failed (None once one succeeds): /status.
        self.write_error: OSError | None = None
        self._checkpoint_error = ""  # the last index write's error, logged once
        self.segments: dict[int, Segment] = {}
        self.active: Segment
        self.lsn = 0
        # (lsn, callback) in LSN order: called once the append at that LSN is committed.
        self._pending: deque[tuple[int, Callable[[bool], None]]] = deque()
        # The commit gate (cluster mode): backups whose acknowledgement a commit needs, what
        # each acknowledged (a local LSN), and the LSN committed while the set is not empty.
        self._required: frozenset[int] = frozenset()
        self._acked: dict[int, int] = {}
        self._committed = 0
        # Primary: called with every run of frames written, before its fsync, for shipping.
        # The parts are the objects written (bytes, memoryviews of the requests' immutable
        # buffers) in a list nothing reuses: keep them as they are, never mutate them.
        self.on_write: OnWrite | None = None
        # False for a replicated log this broker does not lead: local appends are refused.
        self.leading = True
        # Stamped as partitionLeaderEpoch into every batch appended here (Kafka's leader
        # epoch; 0 for a single node's whole life, the log's epoch on a cluster's primary).
        self.write_epoch = 0
        # A backup: the primary's commit point (Commit), and what waits for it to pass a
        # position (partitions' high watermarks). Opened logs start with everything they hold.
        self.primary_commit: tuple[int, int] = (-1, -1)
        self._commit_waiters: deque[tuple[tuple[int, int], Callable[[], None]]] = deque()
        # Backup: called with the entries of every replicated write (LogStore routes them to
        # the partitions).
        self.on_replica_entries: OnReplicaEntries | None = None
        # Called (on the loop) once a sealed segment's sealed index is written: its chunks'
        # entries may leave memory (LogStore turns them into runs of the chunk index).
        self.on_sealed: OnSealed | None = None
        # Called at each roll, before the next segment takes a byte: the producer state of
        # this log's partitions as of the end of the segment being sealed, encoded
        # (producer_snapshot.py), written with the seal.
        self.producer_state: Callable[[int, int], bytes] | None = None
        # Next offset of each partition whose frames this log holds (what recovery checks):
        # a replicated frame must continue it.
        self._next_offsets: dict[int, int] = {}
        # (LSN, seq, position) where a run of contiguous bytes began in this process (open,
        # each roll, each truncation): maps a position to the LSN it was written at.
        self._runs: list[tuple[int, int, int]] = []
        self._truncations = 0
        self.epochs: EpochHistory
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
    def open(self) -> dict[int, SegmentEntries]:
        """Open (recovering if needed) and return the index entries of every segment: a sealed
        segment's as its sealed index (sealed_index.py), the active one's in memory."""
        mkdir_durable(self.directory)
        reaper.sweep(self.directory)
        for d in (self.directory, self.spill_directory):
            for tmp in (*d.glob("*.pix.tmp-*"), *d.glob("*.snapshot.tmp-*")) if d else ():
                tmp.unlink(missing_ok=True)  # a seal a crash interrupted: written again
        seqs = list_segments(self.directory)
        spilled: dict[int, Path] = {}
        if self.spill_directory is not None and self.spill_directory.is_dir():
            reaper.sweep(self.spill_directory)
            spilled = {s: self.spill_directory for s in list_segments(self.spill_directory)}
        verify = self.verify_on_open
        try:
            known = damage.load(self.directory)
        except damage.DamageRecordError as e:
            # The record of earlier damage is itself damaged: find the damage again by checking
            # every frame (what each partition lost is told again where the data shows it).
            log.error("%s: %s; checking every frame", self.name, e)
            known, verify = [], True
        segs, entries, self.report = recover_log(
            self.directory,
            sorted(set(seqs) | set(spilled)),
            spilled,
            holes=damage.holes_by_segment(known),
            verify=verify,
            sealed=True,
        )
        # Segments a tear cut off take their recorded ranges along. A segment deleted because
        # no chunk lived in it any more (all were lost, or retention took them) leaves them:
        # what its partitions lost stays lost, and their offsets jump past it.
        cut = set(self.report.deleted_segments)
        self.damaged, _ = damage.merge(
            [copy.deepcopy(r) for r in known if r.seq not in cut], self.report.damaged
        )
        record = self.directory / damage.DAMAGE_FILE
        if self.damaged and (self.damaged != known or verify):
            damage.save(self.directory, self.damaged)  # before the log takes a write
        elif not self.damaged and record.exists():
            record.unlink()
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
        nxt = self._next_offsets
        for seq in sorted(entries):
            got = entries[seq]
            if isinstance(got, SealedIndex):
                for uid, row in got.rows.items():
                    nxt[uid] = row.last + 1
                continue
            for e in got:
                nxt[e.uid] = e.last_offset + 1
        for r in self.damaged:  # a lost offset is never given out again
            for uid, (_first, last) in r.lost.items():
                nxt[uid] = max(nxt.get(uid, 0), last + 1)
        self._runs = [(0, self.active.seq, self.active.size)]
        # What a restart finds counts as committed unless a replicated log's commit point
        # was kept on disk (restore_commit).
        self.primary_commit = self.end
        self.epochs = EpochHistory.load(self.directory)
        if self.epochs.cut(*self._after_end()):  # epochs whose bytes recovery cut
            self.epochs.save()
        self.opened = True
        return entries

    def restore_commit(self, point: tuple[int, int] | None) -> None:
        """A replicated log just opened: the commit point checkpointed before the restart
        (None: none was, so nothing is known committed). The bytes after it count as written
        at LSNs 0.. in this process, so that a broker promoted now commits them only once its
        in-sync backups acknowledge them, as for bytes it took from its primary
        (PrimaryLog: ``lsn_at(primary_commit)``), where positions read at open were all LSN 0
        (durable, hence committed) before."""
        first = (min(self.segments), 0)
        point = min(max(point or first, first), self.end)
        self.primary_commit = point
        if point == self.end:
            return
        runs = []
        lsn = 0
        for seq in sorted(s for s in self.segments if s >= point[0]):
            start = point[1] if seq == point[0] else 0
            runs.append((lsn, seq, start))
            lsn += self.segments[seq].size - start
        self._runs = runs
        self.lsn = lsn
        self.journal.appended = self.journal.durable = lsn  # recovered: on disk already

    @property
    def commit_point(self) -> tuple[int, int]:
        """Where the committed bytes end, for the checkpoint: a primary's own commit point,
        a backup's last word from its primary."""
        point = self.primary_commit
        if self.leading:
            point = max(point, self.position_at(self.committed))
        return min(point, self.end)

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

        Each item is (new 16-byte head: baseOffset, batchLength, partitionLeaderEpoch; the
        batch as received, its header, the new base offset as an int); the batch's own first
        16 bytes are replaced by the head without copying the rest (zero copy). Once the bytes
        are written, their index entries are added and ``on_written(segment, positions, lsn)``
        runs (the LSN to wait on for durability);
        if the write fails, ``on_failed(failure)`` runs instead and StorageFailure is raised (at
        once, or from the WriteBatch's commit).
        """
        if self.journal.failed:
            raise self.journal.failed
        if not self.leading:
            raise NotPrimary(f"{self.name}: this broker is not its primary")
        self._maybe_roll()
        seg = self.active
        parts: list[bytes | memoryview] = []
        positions = []
        start = pos = seg.size
        start_crc = uid_crc(uid)
        pack_frame = FRAME.pack
        for head, batch, _h, _base in batches:
            # Frame CRC over uid + the rewritten first 21 bytes, chained without concatenating.
            fh = pack_frame(uid, crc32c(batch[16:21], crc32c(head, start_crc)))
            parts += (fh, head, batch[16:])
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
            failure = self._write_failed(seg, start, nbytes, e)
            for st in staged:
                if st.on_failed is not None:
                    st.on_failed(failure)
            raise failure from None
        if self.write_error is not None:
            self._write_recovered()
        add_index = seg.add_index_fields
        nxt = self._next_offsets
        lsn = self.lsn
        for st in staged:
            lsn += st.nbytes
            for (_head, _batch, h, base), p in zip(st.batches, st.positions, strict=True):
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
            nxt[st.uid] = base + h.last_offset_delta + 1
        self.lsn = lsn
        if self.on_write is not None:
            self._ship(seg.seq, start, parts, lsn)
        self.journal.note_append(seg, lsn, nbytes)
        lsn -= nbytes
        for st in staged:
            lsn += st.nbytes
            st.on_written(seg, st.positions, lsn)

    def _write_failed(self, seg: Segment, start: int, nbytes: int, e: OSError) -> StorageFailure:
        """Cut a failed write back; what to raise (the log stays writable)."""
        self._cut_back(seg, start)
        first = self.write_error is None or self.write_error.errno != e.errno
        self.write_error = e
        WRITE_ERRORS.labels(errno.errorcode.get(e.errno or 0, str(e.errno))).inc()
        # Logged when the error starts or changes, not at every retry of every producer.
        (log.error if first else log.debug)(
            "virtual log %s: write of %d B to %s failed (%s); cut back, nothing of it recorded; "
            "the log takes the next write",
            self.name,
            nbytes,
            seg.data_path,
            e.strerror or e,
        )
        return WriteFailed(f"virtual log {self.name}: write to {seg.data_path} failed: {e}")

    def _roll_failed(self, what: str, e: OSError) -> WriteFailed:
        first = self.write_error is None or self.write_error.errno != e.errno
        self.write_error = e
        WRITE_ERRORS.labels(errno.errorcode.get(e.errno or 0, str(e.errno))).inc()
        (log.error if first else log.debug)("virtual log %s: %s: %s", self.name, what, e)
        return WriteFailed(f"virtual log {self.name}: {what}: {e}")

    def _write_recovered(self) -> None:
        log.warning("virtual log %s: writes succeed again (after %s)", self.name, self.write_error)
        self.write_error = None

    @property
    def state(self) -> str:
        """``online``, ``read-only`` (the last write met EROFS), ``write-error`` (it failed
        otherwise) or ``failed`` (an fsync failed: no more acknowledgements)."""
        if self.journal.failed is not None:
            return "failed"
        if self.write_error is None:
            return "online"
        return READ_ONLY if self.write_error.errno == errno.EROFS else "write-error"

    def _ship(self, seq: int, start: int, parts: list[bytes | memoryview], lsn: int) -> None:
        assert self.on_write is not None
        try:
            self.on_write(seq, start, parts, lsn)
        except Exception:
            # The bytes are written and must be recorded whatever the hook did; a backup that
            # missed them sees a gap at its next append and catches up (read_range).
            log.exception("%s: on_write failed for (%d, %d)", self.name, seq, start)

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
        """Call ``callback(True)`` once ``lsn`` is committed: durable here and acknowledged by
        every replica ``require_replicas`` named (none: durable here); ``callback(False)`` if the
        log fails first, or if a truncation cuts the bytes."""
        # Inlined ``committed``: the produce path calls this once per partition and request.
        if (self._committed if self._required else self.journal.durable) >= lsn:
            callback(True)
        elif self.journal.failed is not None:
            callback(False)
        else:
            self._pending.append((lsn, callback))

    @property
    def committed(self) -> int:
        """The LSN committed so far (what ``when_durable`` has released)."""
        if not self._required:
            return self.journal.durable
        return self._committed

    def require_replicas(self, ids: Iterable[int], committed: int | None = None) -> None:
        """The in-sync backups whose acknowledgement a commit needs from now on (empty: local
        durability alone, the single-node default). A smaller set releases the waiters it
        now satisfies; a replica that leaves forgets its acknowledgements, so it must
        acknowledge again after it rejoins (it may have been truncated meanwhile).
        ``committed``: the LSN known committed so far, for a backup that starts leading (what
        it took beyond its old primary's commit point is committed only once acknowledged)."""
        new = frozenset(ids)
        if new == self._required and committed is None:
            return
        # Committed never goes back, whoever joins (unless told where a new primary stands).
        base = self.committed if committed is None else min(committed, self.journal.durable)
        for r in self._required - new:
            self._acked.pop(r, None)
        self._required = new
        self._committed = base
        self._release()

    def replica_acked(self, replica_id: int, lsn: int) -> None:
        """Backup ``replica_id`` has every byte up to the primary's local ``lsn`` durably."""
        if lsn > self._acked.get(replica_id, -1):
            self._acked[replica_id] = lsn
            if replica_id in self._required:
                self._release()

    def _commit_point(self) -> int:
        lsn = self.journal.durable
        acked = self._acked
        for r in self._required:
            a = acked.get(r, 0)
            if a < lsn:
                lsn = a
        return lsn

    def _release(self) -> None:
        if self.journal.failed is not None:
            return
        if self._required:
            point = self._commit_point()
            if point <= self._committed:
                return
            self._committed = point
        else:
            point = self.journal.durable
        pending = self._pending
        while pending and pending[0][0] <= point:
            pending.popleft()[1](True)

    def _durable(self, lsn: int) -> None:
        pending = self._pending
        if lsn < 0:
            while pending:
                pending.popleft()[1](False)
            return
        if self._required:
            self._release()
            return
        while pending and pending[0][0] <= lsn:
            pending.popleft()[1](True)

    def _maybe_roll(self) -> None:
        seg = self.active
        if seg.size == 0:
            return
        if seg.size >= self.segment_bytes or seg.age_seconds() * 1000 >= self.segment_ms:
            self.roll()

    def roll(self, seq: int | None = None) -> Segment:
        """Seal the active segment and start segment ``seq`` (default: the next one)."""
        if self._batched:
            self.flush_batch()  # staged bytes belong to the segment about to be sealed
        old = self.active
        seq = old.seq + 1 if seq is None else seq
        old.sealed = True
        try:
            old.flush_index()
        except OSError as e:
            # The index cannot be written (EIO, a read-only file system): the segment stays
            # active and this append fails; the next one tries the roll again.
            old.sealed = False
            raise self._roll_failed(f"cannot write the index of {old}", e) from None
        if self.spill_policy is not None and self.spill_directory is not None:
            self.spill = self.spill_policy(self.segment_bytes)
        new: Segment | None = None
        if self.spill and self.spill_directory is not None:
            # The hot tier is full: new segments go to the cold tier's directory (Pafka).
            try:
                mkdir_durable(self.spill_directory)
                new = Segment(self.spill_directory, seq, create=True)
            except OSError as e:
                # A cold tier that went away or turned read-only must not fail a write the
                # hot device can still take: past its capacity is better than an error.
                log.warning("cannot spill to the cold tier (%s): segment stays hot", e)
        if new is None:
            try:
                new = Segment(self.directory, seq, create=True)
            except OSError as e:
                # No room for a new file: the old segment stays active; the next append tries
                # again (an ENOSPC here must not make the log read-only).
                old.sealed = False
                raise self._roll_failed("cannot start a new segment", e) from None
        if self.direct_io:
            new.enable_direct(self.direct_min_bytes)
        # Cut the sealed segment's padding now: recovery treats a segment that ends short of its
        # file as torn unless the rest is padding, and the seal's fdatasync makes the cut durable.
        old.finish_direct()
        self.segments[new.seq] = new
        self.active = new
        self._runs.append((self.lsn, new.seq, 0))
        # The producer state as of the sealed segment's end (nothing more is written to it).
        snapshot = self.producer_state(old.seq, old.size) if self.producer_state else None
        # The sealed segment's index must be durable before a checkpoint can point past it.
        old.acquire()
        sealing = self._executor.submit(_seal, old, self.directory, snapshot)
        try:
            loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:  # a roll outside the broker's loop (tools, tests)
            loop = None
        sealing.add_done_callback(lambda f: self._sealed(loop, old, f))
        return new

    def _sealed(self, loop: asyncio.AbstractEventLoop | None, seg: Segment, fut) -> None:
        """A seal ended: its sealed index goes to ``on_sealed`` (on the loop; without one, in
        tools and tests, the chunks stay in memory). A seal's fsync failed: its pages may be
        gone, so no later fsync may vouch for them (the rule of journal.py); the log stops, on
        the loop if there is one."""
        exc = fut.exception()
        if exc is None:
            si = fut.result()
            if si is not None and loop is not None and not loop.is_closed():
                loop.call_soon_threadsafe(self._sealed_index_written, seg, si)
            return
        failure = StorageFailure(f"virtual log {self.name}: fsync of {seg} failed: {exc}")
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self.journal.fail, failure)
        else:
            self.journal.fail(failure)

    def _sealed_index_written(self, seg: Segment, si: SealedIndex) -> None:
        if self.segments.get(seg.seq) is not seg or not seg.sealed or si.data_size != seg.size:
            return  # deleted, cut or reopened meanwhile
        if self.on_sealed is not None:
            self.on_sealed(seg, si)

    def snapshot_producers(self) -> None:
        """Write the producer snapshot as of the log's end now (a clean stop, an open)."""
        if self.producer_state is not None:
            seq, position = self.end
            producer_snapshot.write(self.directory, self.producer_state(seq, position), seq)

    def rebuild_sealed_index(self, seg: Segment) -> SealedIndex:
        """Write a sealed segment's sealed index again (one found damaged or gone when read):
        from its ``.idx`` if that accounts for every byte of it, else from its frames. Runs on
        the caller's thread (the loop: a rare repair, a read of the segment)."""
        holes = damage.holes_by_segment(self.damaged).get(seg.seq, {})
        entries, end = _chain(seg.read_index(), seg.size, {}, holes, relaxed=True)
        if end != seg.size:
            log.error("%s: its index does not cover it either: scanning its frames", seg)
            entries, end = scan(seg, 0, {}, _Damage({seg.seq: holes}))
        return sealed_index.write_from_entries(
            seg.fd, seg.size, pack_entries(entries), seg.pix_path
        )

    # -- replication ---------------------------------------------------------------------------
    @property
    def end(self) -> tuple[int, int]:
        """(active segment seq, its size): the position the next written byte takes, the same
        on every replica. Bytes staged in a WriteBatch in progress are not written yet."""
        return self.active.seq, self.active.size - self._batched_bytes

    def _after_end(self) -> tuple[int, int]:
        seq, position = self.end
        return seq, position + 1

    def lsn_at(self, seq: int, position: int) -> int:
        """The local LSN at which this log reached (seq, position), in the LSNs ``when_durable``
        and ``replica_acked`` count (a primary maps a backup's acknowledged end with it).
        Positions written before this process opened the log give 0 (durable since)."""
        if (seq, position) > self.end:
            raise ValueError(f"{self.name}: ({seq}, {position}) is past the end {self.end}")
        runs = self._runs
        i = bisect_right(runs, (seq, position), key=lambda r: (r[1], r[2])) - 1
        if i < 0:
            return 0
        lsn, run_seq, run_position = runs[i]
        if run_seq == seq:
            return lsn + position - run_position
        # In no segment written here (a seq a roll skipped): where the next run starts.
        return runs[i + 1][0] if i + 1 < len(runs) else self.lsn

    def position_at(self, lsn: int) -> tuple[int, int]:
        """Primary: the (seq, position) this log had reached at local ``lsn`` (``lsn_at``'s
        inverse), for a commit point in positions, which every replica shares."""
        runs = self._runs
        i = bisect_right(runs, lsn, key=lambda r: r[0]) - 1
        if i < 0:
            return runs[0][1], runs[0][2]
        run_lsn, seq, position = runs[i]
        return seq, position + lsn - run_lsn

    def when_committed_at(
        self, seq: int, position: int, lsn: int, callback: Callable[[], None]
    ) -> None:
        """Backup: ``callback()`` once the bytes ending at (seq, position), written at local
        ``lsn``, are durable here and the primary's commit point passed them; never if a
        truncation cuts them first."""

        def durable(ok: bool) -> None:
            if not ok:
                return
            if (seq, position) <= self.primary_commit:
                callback()
            else:
                self._commit_waiters.append(((seq, position), callback))

        self.when_durable(lsn, durable)

    def when_commit_passes(self, position: tuple[int, int], callback: Callable[[], None]) -> None:
        """Backup: ``callback()`` once the primary's commit point reaches ``position`` (bytes
        recovered at open, past the checkpointed commit point)."""
        if position <= self.primary_commit:
            callback()
        else:
            insort(self._commit_waiters, (position, callback), key=lambda w: w[0])

    def commit_to(self, seq: int, position: int) -> None:
        """Backup: the primary committed every byte before (seq, position)."""
        point = min((seq, position), self.end)
        if point <= self.primary_commit:
            return
        self.primary_commit = point
        waiters = self._commit_waiters
        while waiters and waiters[0][0] <= point:
            waiters.popleft()[1]()

    def append_replica(
        self,
        seq: int,
        position: int,
        data: bytes | memoryview,
        *,
        epoch: int | None = None,
        data_epoch: int | None = None,
    ) -> int:
        """Backup: append the primary's bytes for (seq, position) as they are; return the local
        LSN to wait on with ``when_durable`` (then acknowledge).

        They must continue this log exactly: at its end in the active segment, or at position
        0 of a later segment, which this log then rolls to (the primary rolled); else
        ReplicaGap says where the log ends. They must be whole frames that pass recovery's
        checks (frame and batch CRC, each partition's offsets continuing), else CorruptReplica.
        With ``epoch`` (the fencing token), an epoch below the promised one is refused
        (StaleEpoch). ``data_epoch`` (default ``epoch``) is the epoch the bytes were written
        under: a newer one than the history's last is recorded as starting here (durably,
        before the bytes), an older one is refused (CorruptReplica: the primary's history and
        ours part before here). Nothing is written when anything is refused. The frames' index
        entries go to ``on_replica_entries`` once written. A write error raises as ``append``
        does (WriteFailed: cut back, writable).
        """
        if self.journal.failed:
            raise self.journal.failed
        if self._batched is not None:
            raise RuntimeError(f"{self.name}: append_replica during a WriteBatch")
        seg = self.active
        if epoch is not None and epoch < self.epochs.promised:
            raise StaleEpoch(epoch, self.epochs.promised)
        if seq == seg.seq:
            if position != seg.size:
                raise ReplicaGap(seg.seq, seg.size)
        elif seq < seg.seq or position != 0:
            raise ReplicaGap(seg.seq, seg.size)
        mv = memoryview(data)
        nbytes = mv.nbytes
        learned: dict[int, int] = {}
        entries, whole = parse_frames(mv, position, ChainMap(learned, self._next_offsets))
        if whole != nbytes:
            raise CorruptReplica(
                f"{self.name}: no valid whole frame at ({seq}, {position + whole}) "
                f"({nbytes - whole} of {nbytes} B refused)"
            )
        written = epoch if data_epoch is None else data_epoch
        if written is not None and nbytes:
            last = self.epochs.last_before(self.end)
            if written < last:
                raise CorruptReplica(
                    f"{self.name}: bytes of epoch {written} at ({seq}, {position}), after "
                    f"bytes of epoch {last}"
                )
        changed = False
        if epoch is not None and epoch > self.epochs.promised:
            self.epochs.promised = epoch
            changed = True
        if written is not None and nbytes:
            # Epochs this log led without writing a byte end where these bytes begin.
            changed |= self.epochs.forget_empty(self.end)
            if written > self.epochs.last:
                self.epochs.starts.append((written, seq, position))
                changed = True
        if changed:
            self.epochs.save()
        if seq != seg.seq:
            old = seg
            seg = self.roll(seq)
            if old.size == 0:
                self.delete_segment(old.seq)  # an empty segment the primary never had
        if not nbytes:
            return self.lsn
        start = seg.size
        try:
            _write(seg, [mv], nbytes)
        except OSError as e:
            raise self._write_failed(seg, start, nbytes, e) from None
        for e in entries:
            seg.add_index(e)
        self._next_offsets.update(learned)
        self.lsn += nbytes
        lsn = self.lsn
        self.journal.note_append(seg, lsn, nbytes)
        if self.on_replica_entries is not None and entries:
            self.on_replica_entries(seg, entries)
        return lsn

    def truncate_to(self, seq: int, position: int) -> None:
        """Cut every byte at or past (seq, position), a frame boundary (KIP-101, one cut for
        every partition of the log): later segments go, the segment is truncated and its index
        rewritten, the checkpoint moves back, epochs that started in the cut are forgotten.
        Waiters for cut bytes get ``callback(False)``. A position at or past the end cuts
        nothing. The partitions are told by the caller (LogStore.truncate_log)."""
        if self._batched is not None:
            raise RuntimeError(f"{self.name}: truncate_to during a WriteBatch")
        if (seq, position) >= self.end:
            # Nothing to cut; but damaged ranges recorded from here (a cut through them that a
            # crash interrupted after the truncation) go, and what they lost is written again.
            for uid, first in self.lost_from(seq, position).items():
                if uid in self._next_offsets:
                    self._next_offsets[uid] = min(self._next_offsets[uid], first)
            self._forget_damage_from(seq, position)
            return
        seg = self.segments.get(seq)
        kept: list[IndexEntry] = []
        cut: list[IndexEntry] = []
        if seg is None:
            if position != 0:
                raise ValueError(f"{self.name}: no segment {seq} to cut at {position}")
        else:
            for e in seg.read_index():
                (kept if e.position - FRAME_SIZE < position else cut).append(e)
            boundary = kept[-1].position + kept[-1].size if kept else 0
            if position != boundary:
                raise ValueError(f"{self.name}: ({seq}, {position}) is not a frame boundary")
        cut_lsn = self.lsn_at(seq, position)
        later = sorted(s for s in self.segments if s > seq)
        for s in later:
            cut += self.segments[s].read_index()
        # A partition with frames left continues where its first cut frame began; one with
        # none left is free to start anywhere, as recovery would find it.
        first_cut: dict[int, int] = {}
        for e in cut:
            first_cut.setdefault(e.uid, e.base_offset)
        # What damaged bytes in the cut held is written again from there (no index entry
        # names it): a partition continues at the first offset lost in the cut.
        for uid, first in self.lost_from(seq, position).items():
            first_cut[uid] = min(first_cut.get(uid, first), first)
        left = self._uids_left(seq, kept, set(first_cut))
        nxt = self._next_offsets
        for uid, base in first_cut.items():
            if uid in left:
                nxt[uid] = base
            else:
                nxt.pop(uid, None)

        # Producer state past the cut must not be believed at the next start; the cut segment's
        # sealed index no longer describes it (the partitions read their runs of it first:
        # LogStore.truncate_log).
        producer_snapshot.remove_past(self.directory, seq, position)
        if seg is not None:
            seg.pix_path.unlink(missing_ok=True)
        # Later segments first, newest first, so a crash midway leaves a prefix of the log.
        directories = set()
        for s in reversed(later):
            gone = self.segments.pop(s)
            self.journal.forget(gone)
            directories.add(gone.directory)
            gone.discard()
        for d in directories:
            fsync_dir(d)
        if seg is None:
            seg = self.segments[max(self.segments)] if self.segments else None
            if seg is None:
                seg = Segment(self.directory, seq, create=True)
                self.segments[seq] = seg
                fsync_dir(self.directory)
        elif position < seg.size:
            seg.truncate(position)  # fsyncs: the bytes below the cut are durable
            seg.rewrite_index(kept)
        if seg is not self.active:
            seg.sealed = False
            self.active = seg
            if self.direct_io:
                seg.enable_direct(self.direct_min_bytes)
        end = (seg.seq, seg.size)
        self._runs = [r for r in self._runs if (r[1], r[2]) < end]
        self._runs.append((self.lsn, *end))

        pending, self._pending = self._pending, deque()
        failed = []
        for lsn, callback in pending:
            (self._pending if lsn <= cut_lsn else failed).append((lsn, callback))
        for r, lsn in self._acked.items():
            self._acked[r] = min(lsn, cut_lsn)
        self._commit_waiters = deque(w for w in self._commit_waiters if w[0] <= (seq, position))
        self.primary_commit = min(self.primary_commit, (seq, position))

        self._forget_damage_from(seq, position)
        # The checkpoint must not vouch for index entries the cut removed.
        ckpt = read_checkpoint(self.directory)
        if ckpt is None or ckpt > end:
            write_checkpoint(self.directory, *end)
        self._checkpointed = min(self._checkpointed, end)
        self._truncations += 1
        if self.epochs.cut(seq, position):
            self.epochs.save()
        log.warning("%s: truncated to (%d, %d): %d frames cut", self.name, seq, position, len(cut))
        for _lsn, callback in failed:
            callback(False)

    def _forget_damage_from(self, seq: int, position: int) -> None:
        """Damaged ranges in a cut go with it: the offsets they lost may be written again."""
        kept = [r for r in self.damaged if (r.seq, r.start) < (seq, position)]
        if kept != self.damaged:
            self.damaged = kept
            if kept:
                damage.save(self.directory, kept)
            else:
                (self.directory / damage.DAMAGE_FILE).unlink(missing_ok=True)

    def lost_from(self, seq: int, position: int) -> dict[int, int]:
        """Partition uid -> the first offset the damaged ranges at or past (seq, position)
        lost (for those whose loss is known)."""
        out: dict[int, int] = {}
        for r in self.damaged:
            if (r.seq, r.start) >= (seq, position):
                for uid, (first, _last) in r.lost.items():
                    out[uid] = min(out.get(uid, first), first)
        return out

    def first_damage(self) -> tuple[int, int] | None:
        """Where to cut this log so that every damaged range of its hot segments goes with the
        cut (a replica then has the bytes from there sent again): the start of the first
        damaged range. None if there is none, or if one has no bytes (frames found missing
        before a valid one, an earlier segment cut short where no index told by how much):
        where those frames were is not known, so no cut is known to bring them back, and the
        log keeps its ranges fenced."""
        hot = [r for r in self.damaged if r.seq in self.segments]  # (the rest left the tier)
        if not hot or any(r.start >= r.end for r in hot):
            return None
        return min((r.seq, r.start) for r in hot)

    def _uids_left(self, seq: int, kept: list[IndexEntry], uids: set[int]) -> set[int]:
        """Which of ``uids`` have frames before a cut in segment ``seq`` (``kept``: its entries
        before the cut). Older segments' indexes are read newest first, and only while some
        partition is not found yet (in a busy log, none is read)."""
        missing = set(uids)
        older = sorted((s for s in self.segments if s < seq), reverse=True)
        for entries in itertools.chain([kept], (self.segments[s].read_index() for s in older)):
            if not missing:
                break
            missing.difference_update(e.uid for e in entries)
        return uids - missing

    def read_range(self, seq: int, position: int, max_bytes: int) -> tuple[int, int, bytes]:
        """Whole frames from (seq, position) for a lagging backup: up to ``max_bytes`` (at least
        one frame) within one segment, and the (seq, position) they start at, which moves to
        the next segment at position 0 when the given one ends. At the end: no bytes. A copy
        read with pread on the calling thread (the event loop's: ``segments`` changes there);
        PositionUnavailable if the segment is gone."""
        if (seq, position) > self.end:
            raise ValueError(f"{self.name}: ({seq}, {position}) is past the end {self.end}")
        while True:
            seg = self.segments.get(seq)
            if seg is None:
                first = min(self.segments)
                if seq < first:
                    raise PositionUnavailable(first, 0)
                if position != 0:
                    raise ValueError(f"{self.name}: no segment {seq}")
                seq = min(s for s in self.segments if s > seq)  # a seq a roll skipped
                continue
            stop = self.end[1] if seg is self.active else seg.size
            if position > stop:
                raise ValueError(f"{self.name}: ({seq}, {position}) is past segment end {stop}")
            if position == stop:
                if seg is self.active:
                    return seq, position, b""
                seq, position = min(s for s in self.segments if s > seq), 0
                continue
            break
        want = min(stop - position, max(max_bytes, _FRAME_HEAD))
        buf = _read_exactly(seg, position, want)
        total = frame_size(buf, 0) if len(buf) >= _FRAME_HEAD else -1
        if total < 0 or total > stop - position:
            raise ValueError(f"{self.name}: no frame starts at ({seq}, {position})")
        if total > len(buf):
            return seq, position, _read_exactly(seg, position, total)
        at = total
        while at + _FRAME_HEAD <= len(buf):
            total = frame_size(buf, at)
            if total < 0 or at + total > len(buf):
                break
            at += total
        return seq, position, buf if at == len(buf) else buf[:at]

    @property
    def promised_epoch(self) -> int:
        """The highest epoch this log promised (-1: none): older ones are refused."""
        return self.epochs.promised

    def promise_epoch(self, epoch: int) -> None:
        """Promise, durably, to take nothing from an epoch below ``epoch`` (a new primary's
        fence, BookKeeper's; BP-46: a promise forgotten in a crash loses data). StaleEpoch if
        a newer epoch was promised."""
        if epoch < self.epochs.promised:
            raise StaleEpoch(epoch, self.epochs.promised)
        if epoch > self.epochs.promised:
            self.epochs.promised = epoch
            self.epochs.save()

    def abandon_waiters(self) -> None:
        """A deposed primary: every append still waiting for its commit is answered False,
        since the backups will not acknowledge it at this epoch any more."""
        self._durable(-1)

    def begin_epoch(self, epoch: int) -> None:
        """Primary: write under ``epoch`` from here on; it is promised and recorded as
        starting at the end (what ``epoch_end`` answers for older epochs)."""
        self.promise_epoch(epoch)
        self.write_epoch = epoch
        if epoch > self.epochs.last:
            self.epochs.starts.append((epoch, *self.end))
            self.epochs.save()

    @property
    def epoch_history(self) -> tuple[tuple[int, int, int], ...]:
        """(epoch, seq, position) of each epoch's first byte, oldest first."""
        return tuple(self.epochs.starts)

    def epoch_at(self, seq: int, position: int) -> tuple[int, tuple[int, int] | None]:
        """The epoch the byte at (seq, position) was written under and where the next epoch
        starts (None: at the end), so a catch-up ships each epoch's bytes as that epoch's."""
        return self.epochs.covering(seq, position)

    def epoch_end(self, epoch: int) -> tuple[int, int]:
        """Where the bytes of ``epoch`` (and older) end here: the start of the first newer
        epoch, or the log's end (Kafka's OffsetForLeaderEpoch, KIP-101): a backup whose last
        epoch is ``epoch`` cuts its log there, or at its own end if that is earlier."""
        for e, s, p in self.epochs.starts:
            if e > epoch:
                return s, p
        return self.end

    # -- reading -------------------------------------------------------------------------------
    def segment(self, seq: int) -> Segment | None:
        return self.segments.get(seq)

    def delete_segment(self, seq: int) -> None:
        seg = self.segments.pop(seq, None)
        if seg is not None and seg is not self.active:
            # Under fsync=never or interval it may still wait for a sync that would meet a
            # closed descriptor (a migrated segment): its bytes need none any more.
            self.journal.forget(seg)
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
        truncations = self._truncations
        try:
            try:
                seg.flush_index()
            except OSError as e:
                # Kept in memory and written at the next checkpoint; appends go on meanwhile
                # (recovery scans past the old checkpoint). Said once, not every interval.
                (log.warning if str(e) != self._checkpoint_error else log.debug)(
                    "virtual log %s: cannot write the index of %s: %s", self.name, seg, e
                )
                self._checkpoint_error = str(e)
                return
            position = seg.size - self._batched_bytes
            seg.acquire()
            loop = asyncio.get_running_loop()
            try:
                await loop.run_in_executor(
                    self._executor, _checkpoint, self.directory, seg, position
                )
            except _SyncFailed as e:
                # As a group commit's: never retried and believed (journal.py).
                self.journal.fail(
                    StorageFailure(f"virtual log {self.name}: fsync of {seg} failed: {e}")
                )
                return
            finally:
                seg.release()
            if truncations != self._truncations:
                # A truncation ran meanwhile: the checkpoint just written may vouch for bytes
                # it cut; put back the one the truncation wrote.
                write_checkpoint(self.directory, *self._checkpointed)
            else:
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


_FRAME_HEAD = FRAME_SIZE + 61  # frame header and batch header: the least a frame can be


def _read_exactly(seg: Segment, position: int, size: int) -> bytes:
    data = seg.read(position, size)
    if len(data) != size:
        raise OSError(f"{seg}: short read at {position}: {len(data)} of {size} B")
    return data


def _seal(seg: Segment, directory: Path, snapshot: bytes | None) -> SealedIndex | None:
    """Make a sealed segment durable (data, then index), then write its sealed index and the
    producer snapshot as of its end; returns the sealed index (None if it could not be
    written: the chunks stay in memory, the next start writes it). A failed fsync raises."""
    try:
        seg.sync()
        os.fdatasync(seg.index_fd)
        seal_pause()
        si = None
        try:
            si = sealed_index.write_for_segment(seg.fd, seg.size, seg.index_fd, seg.pix_path)
        except (OSError, ValueError) as e:
            log.warning("%s: cannot write its sealed index: %s", seg, e)
        if snapshot is not None:
            try:
                producer_snapshot.write(directory, snapshot, seg.seq)
            except OSError as e:
                log.warning("%s: cannot write the producer snapshot: %s", seg, e)
        return si
    finally:
        seg.release()


class _SyncFailed(OSError):
    """An fsync of a log's own data or index failed (not the checkpoint file's write)."""


def _checkpoint(directory: Path, seg: Segment, position: int) -> None:
    # Data first, then its index entries, then the checkpoint that vouches for both. A failed
    # write of the checkpoint file only leaves the old one (recovery scans more): retried.
    try:
        seg.sync()
        os.fdatasync(seg.index_fd)
    except OSError as e:
        raise _SyncFailed(e.errno, e.strerror) from e
    write_checkpoint(directory, seg.seq, position)
