"""The storage engine of one broker: its logs, their partitions, retention and checkpoints.

``storage.layout=virtual`` maps each partition to one of V shared virtual logs
(``logs/v<N>``); ``per-partition`` gives each partition its own log (``logs/p<uid>``), as Kafka
does; in cluster mode the caller names the log (``logs/<name>``, the cluster-wide virtual log
id). The engine remembers which log a partition lives in and its start/end offsets in
``partition-state.json`` so that a partition whose chunks were all removed by retention keeps
its offsets across a restart.

On a backup the engine routes the frames a replicated log takes (VirtualLog.append_replica) to
their partitions (PartitionLog.apply_replica), and ``truncate_log`` cuts a log and its
partitions back together.
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import logging
import os
import re
import shutil
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from crc32c import crc32c

from stratalog.colocated_format import SLOTS_DIR
from stratalog.storage import commit_checkpoint, producer_snapshot, reaper
from stratalog.storage.cold_tier import ColdRun, ColdSegment, ColdStore, ColdTierError
from stratalog.storage.fsync_ring import open_ring
from stratalog.storage.journal import FsyncPolicy
from stratalog.storage.partition import PartitionLog
from stratalog.storage.producer_state import ProducerStateTable
from stratalog.storage.read_slots import ReadSlots
from stratalog.storage.recovery import RecoveryReport
from stratalog.storage.sealed_index import PixRun, Row, SealedIndex
from stratalog.storage.segment import (
    DIRECT_MIN_BYTES,
    FRAME_SIZE,
    IndexEntry,
    Segment,
    fsync_dir,
    mkdir_durable,
)
from stratalog.storage.tail_cache import TailCache
from stratalog.storage.txn_index import is_transactional_producer
from stratalog.storage.virtual_log import VirtualLog

log = logging.getLogger(__name__)

STATE_FILE = "partition-state.json"
# A log named by the caller is a directory of the hot tier: a plain name, and not one the
# engine gives itself (p<uid> logs of deleted partitions are removed at start) or uses.
_LOG_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}")
_RESERVED = re.compile(r"p[0-9]+|promoted|compacted")
# Without a cold tier, compacted partitions' segments (cold_tier.py's per-partition format) live
# here, under the hot tier (cleaner.py); with one, in the cold tier.
COMPACTED_DIR = "compacted"
_LAYOUT_NAME = re.compile(r"[vp][0-9]+")  # the logs storage.layout names itself

# (topic, partition, uid) or (topic, partition, uid, log name or None)
PartitionSpec = tuple[str, int, int] | tuple[str, int, int, str | None]


LOCK_FILE = ".lock"


class DataDirInUse(OSError):
    """Another process (a running broker) holds the data directory."""


def data_dir_lock(root: Path, *, shared: bool = False) -> int:
    """Take the hot tier's lock (flock on ``<root>/.lock``), held as long as the returned
    descriptor is open: a broker takes it exclusively for its life, ``stratalog scrub`` shared
    for its run, so neither reads a directory the other is changing. DataDirInUse if taken."""
    fd = os.open(root / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise DataDirInUse(f"{root} is in use by another process (a running broker?)") from None
    return fd


def parse_state(raw: bytes) -> dict[str, dict]:
    """The partition state of ``partition-state.json``'s bytes; ValueError if damaged. Files
    written before the state carried a CRC are taken as they are."""
    doc = json.loads(raw)
    if not isinstance(doc, dict):
        raise ValueError("not an object")
    if all(k.isdigit() for k in doc):
        return doc  # the old format: uid -> state, no CRC
    if set(doc) != {"partitions", "crc32c"}:
        raise ValueError(f"unexpected keys {sorted(doc)}")
    body = json.dumps(doc["partitions"], sort_keys=True)
    if crc32c(body.encode()) != doc.get("crc32c"):
        raise ValueError("CRC mismatch")
    return doc["partitions"]


def load_state(path: Path) -> tuple[dict[str, dict], bool]:
    """(the partition state, whether it was damaged). A damaged state is rebuilt from the data
    (each partition's log, offsets from its chunks): only the start offsets retention moved past
    every chunk, and the offsets of partitions it emptied, are lost with it."""
    try:
        return parse_state(path.read_bytes()), False
    except FileNotFoundError:
        return {}, False
    except (ValueError, UnicodeDecodeError) as e:
        log.error("%s is damaged (%s): rebuilding the partitions' state from their data", path, e)
        return {}, True


def check_log_name(name: str) -> str:
    if not _LOG_NAME.fullmatch(name) or _RESERVED.fullmatch(name):
        raise ValueError(f"{name!r} cannot name a virtual log")
    return name


@dataclass
class StorageConfig:
    data_dir: Path
    layout: str = "virtual"
    virtual_logs: int = 4
    fsync: FsyncPolicy = field(default_factory=lambda: FsyncPolicy("always"))
    group_commit_ms: float = 0.0  # adaptive (journal.py)
    group_commit_bytes: int = 512 * 1024
    segment_bytes: int = 128 * 1024 * 1024
    segment_ms: int = 7 * 24 * 3600 * 1000
    tail_cache_bytes: int = 0  # the whole broker's (TailCache); 0: none
    io_threads: int = 8
    fsync_via: str = "auto"  # the group commit's fsyncs: "io_uring", "thread" or "auto"
    direct_io: bool = False  # append through O_DIRECT (Segment.enable_direct) ...
    direct_min_bytes: int = DIRECT_MIN_BYTES  # ... writes of at least this many bytes
    verify_on_open: bool = False  # check every frame's CRCs at open (storage.verify_on_open)
    hot_path: Path | None = None  # default: <data_dir>/logs
    cold_location: str | None = None  # a directory or an fsspec URL; None: no cold tier
    cold_options: dict | None = None  # fsspec storage options for a URL
    # Cluster mode: every broker's cold tier is the same one (ColdStore.shared).
    cold_shared: bool = False
    # Cluster mode: a log takes local appends only while this broker is its primary
    # (VirtualLog.leading, set by the replicator); otherwise only its primary's bytes.
    replicated: bool = False
    # Co-located reads: publish read slots (read_slots.py) with this file mode; None: none.
    read_slots_mode: int | None = None

    def __post_init__(self) -> None:
        if self.layout not in ("virtual", "per-partition"):
            raise ValueError(
                f"storage.layout must be 'virtual' or 'per-partition', not {self.layout!r}"
            )
        if self.virtual_logs < 1:
            raise ValueError("storage.virtual_logs must be at least 1")
        if self.fsync_via not in ("auto", "io_uring", "thread"):
            raise ValueError(
                f"storage.fsync_via must be 'auto', 'io_uring' or 'thread', not {self.fsync_via!r}"
            )


@dataclass(frozen=True)
class RetentionPolicy:
    retention_ms: int = 7 * 24 * 3600 * 1000  # -1: keep forever
    retention_bytes: int = -1


class LogStore:
    def __init__(self, config: StorageConfig) -> None:
        self.config = config
        self.root = Path(config.hot_path) if config.hot_path else Path(config.data_dir) / "logs"
        self.tail_cache = TailCache(config.tail_cache_bytes)
        self.cold = (
            ColdStore(config.cold_location, config.cold_options) if config.cold_location else None
        )
        if self.cold is not None:
            self.cold.shared = config.cold_shared
        # Where a partition's per-partition segments live (migrated or compacted): the cold
        # tier, or without one a local store of the same format for compaction's output.
        self.segment_store: ColdStore = self.cold or ColdStore(str(self.root / COMPACTED_DIR))
        # Partitions whose cold manifest a migration is committing (an await): compaction,
        # which switches synchronously, waits for them (cleaner.py).
        self.cold_committing: set[int] = set()
        self.cold_error: str | None = None  # why the cold tier is unusable right now
        self._saved_commits: dict[str, tuple[int, int]] = {}
        self.executor = ThreadPoolExecutor(config.io_threads, thread_name_prefix="stratalog-io")
        self.fsync_ring = open_ring(config.fsync_via) if config.fsync.mode == "always" else None
        self.logs: dict[str, VirtualLog] = {}
        self.partitions: dict[int, PartitionLog] = {}
        self._state: dict[str, dict] = {}
        # log name -> segment seq -> live chunks referring to it
        self._live: dict[str, dict[int, int]] = {}
        self.recovery: dict[str, RecoveryReport] = {}
        # Replicated frames of partitions not added yet (their metadata may trail the data):
        # uid -> (log name, segment seq, entry), applied by add_partition.
        self._orphans: dict[int, list[tuple[str, int, IndexEntry]]] = {}
        self._lock_fd: int | None = None
        self.state_damaged = False  # partition-state.json was unreadable at open
        self.slots = (
            ReadSlots(self.root, config.read_slots_mode)
            if config.read_slots_mode is not None
            else None
        )
        # Per log: sealed indexes written whose segments' chunks some partition still holds in
        # memory (waiting for an earlier segment's seal): seq -> (segment, sealed index).
        self._sealing: dict[str, dict[int, tuple[Segment, SealedIndex]]] = {}

    # -- start and stop ------------------------------------------------------------------------
    def open(self, partitions: Iterable[PartitionSpec]) -> None:
        """Open every log and load the given (topic, partition, uid) triples; a fourth item,
        when not None, names the log the partition lives in (cluster mode)."""
        try:
            self._open(partitions)
        except BaseException:
            self._unlock()  # a caller may fix what was refused and open the directory again
            raise

    def _open(self, partitions: Iterable[PartitionSpec]) -> None:
        mkdir_durable(self.root)
        # Promoted copies are a cache of cold segments: start without them.
        shutil.rmtree(self.root / "promoted", ignore_errors=True)
        if self.cold is not None and not (self.root / STATE_FILE).exists():
            self.cold.create()  # a new broker; later a missing cold directory is an error
        self._lock_fd = data_dir_lock(self.root)
        if self.slots is not None:
            self.slots.open()
        compacted = self.root / COMPACTED_DIR
        if self.cold is not None and compacted.is_dir() and any(compacted.glob("p*/manifest-*")):
            # Cleaned segments written before the cold tier was configured: loading only the
            # cold tier would lose them (the hot chunks they replaced are gone).
            raise ColdTierError(
                f"{compacted} holds compacted partitions written without a cold tier; a cold "
                "tier cannot be added to this data directory yet (remove tiers.cold.*)"
            )
        self._state, self.state_damaged = load_state(self.root / STATE_FILE)
        wanted: dict[int, tuple[str, int]] = {}
        for topic, idx, uid, *named in partitions:
            wanted[uid] = (topic, idx)
            if named and named[0] is not None:
                self._assign_log(uid, named[0])
        names = {
            p.name
            for p in self.root.iterdir()
            if p.is_dir() and p.name not in (COMPACTED_DIR, SLOTS_DIR)
        }
        for uid in wanted:
            names.add(self._log_name(uid))
        # Per partition, what each log holds of it, segment by segment: an entry in memory (the
        # active segment's, or a sealed one's whose sealed index could not be written), or
        # a run of a sealed index (one row of its table: nothing more is read for it here).
        entries_by_uid: dict[int, list[tuple[str, int, IndexEntry | tuple[Segment, Row]]]] = {}
        commits = commit_checkpoint.load(self.root) if self.config.replicated else None
        lost_by_uid: dict[int, list[tuple[str, tuple[int, int]]]] = {}
        snapshots: dict[str, producer_snapshot.Snapshot | None] = {}
        now_ms = int(time.time() * 1000)
        for name in sorted(names):
            if name.startswith("p") and name[1:].isdigit() and int(name[1:]) not in wanted:
                shutil.rmtree(self.root / name, ignore_errors=True)  # a deleted topic's log
                continue
            vlog = self._make_log(name)
            by_seq = vlog.open()
            self.recovery[name] = vlog.report
            snapshots[name] = producer_snapshot.load_newest(vlog.directory, vlog.end, now_ms)
            live = self._live[name]
            # A log the caller named (cluster mode) holds replicated chunks of partitions this
            # broker may not know of yet: kept for add_partition, not collected as garbage.
            named = not _LAYOUT_NAME.fullmatch(name)
            if commits is not None and named:
                vlog.restore_commit(commits.get(name))
            for r in vlog.damaged:
                for uid, span in r.lost.items():
                    lost_by_uid.setdefault(uid, []).append((name, span))
            for seq, entries in by_seq.items():
                live.setdefault(seq, 0)
                if isinstance(entries, SealedIndex):
                    seg = vlog.segments[seq]
                    for uid, row in entries.rows.items():
                        if uid in wanted:
                            entries_by_uid.setdefault(uid, []).append((name, seq, (seg, row)))
                        elif named:
                            run = self._run_entries(vlog, seg, uid, row)
                            self._orphans.setdefault(uid, []).extend((name, seq, e) for e in run)
                            live[seq] += len(run)
                    continue
                for e in entries:
                    if e.uid in wanted:
                        entries_by_uid.setdefault(e.uid, []).append((name, seq, e))
                    elif named:
                        self._orphans.setdefault(e.uid, []).append((name, seq, e))
                        live[seq] += 1
        for uid, (topic, idx) in wanted.items():
            if self.state_damaged and str(uid) not in self._state:
                # Which log a partition lives in was in the damaged state file: the data says.
                held = {name for name, _seq, _e in entries_by_uid.get(uid, [])}
                if len(held) == 1:
                    self._state[str(uid)] = {"log": held.pop()}
            p = self._make_partition(topic, idx, uid)
            p.lost = sorted(span for name, span in lost_by_uid.get(uid, []) if name == p.vlog.name)
            st = self._state.get(str(uid), {})
            start = int(st.get("start", 0))
            end = int(st.get("end", 0))
            p.log_start_offset = start
            # Cold first: it holds the older offsets. Hot chunks it already has are stale
            # copies of an interrupted migration's switch and are skipped.
            # Chunks of transactional producers: (base, producer id, epoch, sequence).
            txn: list[tuple[int, int, int, int]] = []
            cold_last = self._load_cold(p, txn)
            held = [(seq, e) for name, seq, e in entries_by_uid.get(uid, []) if name == p.vlog.name]
            # Compaction replaced the hot chunks below its clean point, also those it removed
            # whole after the last batch it kept: they stay gone.
            cleaned = self.segment_store.cleaned.get(uid, -1)
            floor = max(start, cold_last + 1, cleaned)
            self._load_hot(p, held, floor)
            txn.extend(self._hot_txn_chunks(p, held, floor))
            snap = snapshots.get(p.vlog.name)
            if snap is not None:
                self._replay_after(p, snap, held)
            else:
                self._rebuild_producers(p, held)
            first = p.cold.first_offset if len(p.cold) else p.chunks.first_offset
            if cleaned >= 0 and first is not None and start <= first:
                first = start  # a gap compaction left at the front: the start stays
            p.log_start_offset = start if first is None else max(start, first)
            floor = p.cold.next_offset if len(p.cold) else start
            hot_first = p.chunks.first_offset
            if (
                p.vlog.damaged
                and not self.state_damaged  # else ``start`` is not known, only guessed
                and hot_first is not None
                and floor is not None
                and hot_first > floor
                and not p.lost_at(floor)
            ):
                # Its log holds damage and its first hot chunk starts past where it should: the
                # chunks before it were lost there (no earlier frame of it showed the jump).
                p.lost = sorted([*p.lost, (floor, hot_first - 1)])
                p.log_start_offset = min(p.log_start_offset, floor)
            # The data decides where the log ends; the saved end only matters once retention
            # removed every chunk (then it keeps offsets from being reused).
            if p.chunks.next_offset is not None:
                p.next_offset = p.chunks.next_offset
            elif p.cold.next_offset is not None:
                p.next_offset = max(p.cold.next_offset, end)
            else:
                p.next_offset = max(end, p.log_start_offset)
            # (Compaction may have removed the last batches below its clean point: never reused.)
            p.next_offset = max(p.next_offset, cleaned)
            if p.lost:  # a lost offset is never given out again
                p.next_offset = max(p.next_offset, max(last for _first, last in p.lost) + 1)
            p.high_watermark = p.next_offset
            p.size_bytes = p.chunks.total_bytes()
            if commits is not None:
                _hold_uncommitted(p)
            if txn:
                # Derived from the log, never stored apart from it (storage/txn_index.py).
                # Once per chunk (tiers may overlap on an interrupted switch), in offset order.
                kept = {t[0]: t for t in txn if t[0] >= p.log_start_offset}
                p.rebuild_txns(sorted(kept.values()))
        self._collect_garbage()
        self.save_state()
        # Producer state as of where each log ends now, so the next start replays nothing
        # read here again (and rebuilds from every entry at most once).
        for name, snap in snapshots.items():
            vlog = self.logs[name]
            if snap is None or snap.at != vlog.end:
                try:
                    vlog.snapshot_producers()
                except OSError as e:
                    log.warning("%s: cannot write a producer snapshot: %s", name, e)
        if commits is not None:
            self._saved_commits = commits

    def _run_entries(self, vlog: VirtualLog, seg: Segment, uid: int, row: Row) -> list[IndexEntry]:
        """A partition's entries in a sealed segment (its run of the sealed index, read)."""
        run = PixRun(seg, uid, row, vlog.rebuild_sealed_index).entries()
        return [
            IndexEntry(uid, int(b), int(d), int(pos), int(sz), int(t), int(pid), int(ep), int(sq))
            for b, d, pos, sz, t, pid, ep, sq in run.tolist()
        ]

    def _load_hot(
        self, p: PartitionLog, held: list[tuple[int, IndexEntry | tuple[Segment, Row]]], floor: int
    ) -> None:
        """Index the partition's hot chunks from ``floor`` on: sealed segments' as runs (their
        summary only), the others' entries in memory."""
        chunks = p.chunks
        live = self._live[p.vlog.name]
        rebuild = p.vlog.rebuild_sealed_index
        for seq, e in held:
            if isinstance(e, IndexEntry):
                if e.last_offset >= floor:
                    chunks.append(
                        e.base_offset, e.last_offset, seq, e.position, e.size, e.max_timestamp
                    )
                    live[seq] += 1
                continue
            seg, row = e
            if row.last < floor:
                continue  # removed by retention, or migrated
            if chunks.in_memory:
                # After a sealed segment whose sealed index could not be written: in memory too.
                for x in self._run_entries(p.vlog, seg, p.uid, row):
                    if x.last_offset >= floor:
                        chunks.append(
                            x.base_offset, x.last_offset, seq, x.position, x.size, x.max_timestamp
                        )
                        live[seq] += 1
                continue
            chunks.add_run(
                seq, PixRun(seg, p.uid, row, rebuild), row.count, row.first, row.last,
                row.max_ts, row.min_ts, row.nbytes,
            )  # fmt: skip
            live[seq] += row.count
        k = chunks.count_before(floor)  # a run that starts below it (one read)
        if k:
            for seq, n in chunks.count_by_segment_of_first(k).items():
                live[seq] -= n
            chunks.drop_front(k)

    def _replay_after(
        self,
        p: PartitionLog,
        snap: producer_snapshot.Snapshot,
        held: list[tuple[int, IndexEntry | tuple[Segment, Row]]],
    ) -> None:
        """Producer state: the snapshot's, then every entry of the partition written after it
        (normally those of the active segment, already in memory)."""
        table = snap.tables.get(p.uid)
        if table is not None:
            p.producers = table
        after = snap.at
        for seq, e in held:
            if isinstance(e, IndexEntry):
                if (seq, e.position - FRAME_SIZE) >= after:
                    _record(p.producers, e)
                continue
            seg, row = e
            if (seq, seg.size) <= after:
                continue
            for x in self._run_entries(p.vlog, seg, p.uid, row):
                if (seq, x.position - FRAME_SIZE) >= after:
                    _record(p.producers, x)

    def _rebuild_producers(
        self, p: PartitionLog, held: list[tuple[int, IndexEntry | tuple[Segment, Row]]]
    ) -> None:
        """Producer state from every entry kept, cold and hot (a log with no snapshot: a data
        directory from before them; once)."""
        p.producers = ProducerStateTable()
        record = p.producers.record
        for seq in sorted(p.cold_segments):
            try:
                run = ColdRun(p.cold_segments[seq]).entries()
            except ColdTierError as e:
                log.error("producer state of %s-%d: %s", p.topic, p.index, e)
                continue
            for b, d, _pos, _sz, t, pid, ep, sq in run.tolist():
                if b + d >= p.log_start_offset:
                    record(pid, ep, sq, d + 1, b, t)
        floor = p.chunks.first_offset
        for _seq, e in held:
            entries = (
                [e] if isinstance(e, IndexEntry) else self._run_entries(p.vlog, e[0], p.uid, e[1])
            )
            for x in entries:
                if floor is not None and x.last_offset >= floor:
                    _record(p.producers, x)

    def _hot_txn_chunks(
        self, p: PartitionLog, held: list[tuple[int, IndexEntry | tuple[Segment, Row]]], floor: int
    ) -> list[tuple[int, int, int, int]]:
        """(base, producer id, epoch, sequence) of the partition's hot chunks of transactional
        producers from ``floor`` on: a sealed segment's run is read only if its row counts some."""
        out = []
        for _seq, e in held:
            if isinstance(e, IndexEntry):
                entries = [e]
            elif e[1].txn and e[1].last >= floor:
                entries = self._run_entries(p.vlog, e[0], p.uid, e[1])
            else:
                continue
            for x in entries:
                if x.last_offset >= floor and is_transactional_producer(x.producer_id):
                    out.append((x.base_offset, x.producer_id, x.producer_epoch, x.base_sequence))
        return out

    def _load_cold(self, p: PartitionLog, txn: list[tuple[int, int, int, int]]) -> int:
        """Attach the partition's cold segments (their manifest's description: their indexes
        are read when needed); return the last offset they hold (or -1). The chunks of
        transactional producers go to ``txn`` (read from the segments whose description counts
        some, or does not say: a manifest written before it did)."""
        store = self.segment_store
        try:
            metas = sorted(store.load(p.uid), key=lambda m: m.base)
        except ColdTierError as e:
            self.cold_error = str(e)
            log.error("cold tier unavailable for partition %s-%d: %s", p.topic, p.index, e)
            return -1
        last = -1
        for seq, m in enumerate(metas):
            try:
                p.add_cold_segment(ColdSegment(store, p.uid, m, seq), after=last)
            except ColdTierError as e:
                self.cold_error = str(e)
                log.error("cold segment %s of %s-%d unreadable: %s", m.name, p.topic, p.index, e)
                continue
            if len(p.cold):
                last = p.cold.next_offset - 1
        for seg in p.cold_segments.values():
            if seg.meta.txn == 0:
                continue
            try:
                run = ColdRun(seg).entries()
            except ColdTierError as e:
                log.error("transactions of %s-%d in %s: %s", p.topic, p.index, seg, e)
                continue
            for b, d, _pos, _sz, _t, pid, ep, sq in run.tolist():
                if b + d >= p.log_start_offset and is_transactional_producer(pid):
                    txn.append((b, pid, ep, sq))
        return last

    async def close(self) -> None:
        if self.slots is not None:
            self.slots.close()
        self.save_state()
        if self.config.replicated:
            commit_checkpoint.save(self.root, self._commit_points())
        for vlog in self.logs.values():
            if vlog.opened and vlog.journal.failed is None:
                try:
                    vlog.snapshot_producers()  # the next start replays nothing
                except OSError as e:
                    log.warning("%s: cannot write a producer snapshot: %s", vlog.name, e)
            await vlog.close()
        if self.fsync_ring is not None:
            self.fsync_ring.close()
        self.executor.shutdown(wait=True)
        await asyncio.get_running_loop().run_in_executor(None, reaper.drain)
        self._unlock()

    def abandon(self) -> None:
        for vlog in self.logs.values():
            vlog.abandon()
        if self.fsync_ring is not None:
            self.fsync_ring.close()
        # As a crash would: queued work (seals writing sealed indexes and snapshots) is dropped,
        # not run after the lock is released, when a new store may have opened the directory.
        self.executor.shutdown(wait=False, cancel_futures=True)
        self._unlock()

    def _unlock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # closing the descriptor drops the flock
            self._lock_fd = None

    # -- partitions ----------------------------------------------------------------------------
    def _log_name(self, uid: int) -> str:
        st = self._state.get(str(uid))
        if st and "log" in st:
            return st["log"]
        if self.config.layout == "per-partition":
            return f"p{uid}"
        return f"v{uid % self.config.virtual_logs}"

    def log_of(self, uid: int) -> str:
        """The name of the virtual log partition ``uid`` lives in."""
        return self._log_name(uid)

    def _assign_log(self, uid: int, name: str) -> None:
        check_log_name(name)
        st = self._state.setdefault(str(uid), {})
        if st.get("log", name) != name:
            raise ValueError(f"partition {uid} lives in log {st['log']!r}, not {name!r}")
        st["log"] = name

    def _make_log(self, name: str) -> VirtualLog:
        vlog = self.logs.get(name)
        if vlog is None:
            vlog = self._new_log(name)
        return vlog

    def _new_log(self, name: str) -> VirtualLog:
        c = self.config
        vlog = VirtualLog(
            self.root / name,
            name,
            policy=c.fsync,
            executor=self.executor,
            segment_bytes=c.segment_bytes,
            segment_ms=c.segment_ms,
            group_commit_ms=c.group_commit_ms,
            group_commit_bytes=c.group_commit_bytes,
            direct_io=c.direct_io,
            direct_min_bytes=c.direct_min_bytes,
            ring=self.fsync_ring,
            verify_on_open=c.verify_on_open,
        )
        # (Not into a shared cold tier: every replica of the log would spill to one path.)
        if self.cold is not None and self.cold.local and not self.cold.shared:
            vlog.spill_directory = Path(self.cold.root) / "spill" / name
        vlog.on_replica_entries = lambda seg, entries: self._replica_entries(name, seg, entries)
        vlog.on_sealed = lambda seg, si: self._sealed(name, seg, si)
        vlog.producer_state = lambda seq, position: producer_snapshot.encode(
            seq,
            position,
            ((p.uid, p.producers) for p in self.partitions.values() if p.vlog.name == name),
        )
        vlog.leading = not c.replicated
        self.logs[name] = vlog
        self._live[name] = {}
        return vlog

    def _make_partition(self, topic: str, idx: int, uid: int) -> PartitionLog:
        name = self._log_name(uid)
        vlog = self._make_log(name)
        p = PartitionLog(topic, idx, uid, vlog, tail_cache=self.tail_cache)
        p.on_append = self._note_append
        self.partitions[uid] = p
        if self.slots is not None:
            self.slots.add(p)
        self._state.setdefault(str(uid), {})["log"] = name
        return p

    def add_partition(
        self, topic: str, idx: int, uid: int, log_name: str | None = None
    ) -> PartitionLog:
        """A new partition, in log ``log_name`` if given (cluster mode: the cluster-wide
        virtual log id), else in the one the layout maps it to."""
        if log_name is not None:
            self._assign_log(uid, log_name)
        name = self._log_name(uid)
        vlog = self._make_log(name)
        if not vlog.opened:
            vlog.open()
        p = self._make_partition(topic, idx, uid)
        p.size_bytes = 0
        self._adopt_orphans(p)
        self.save_state()
        return p

    def open_log(self, name: str) -> VirtualLog:
        """The virtual log ``name`` (cluster mode), created and opened if need be: a backup
        takes replicated frames into it before it knows their partitions."""
        vlog = self.logs.get(name) or self._new_log(check_log_name(name))
        if not vlog.opened:
            for seq in vlog.open():
                self._live[name].setdefault(seq, 0)
        return vlog

    # -- replication ---------------------------------------------------------------------------
    def _replica_entries(self, name: str, seg: Segment, entries: list[IndexEntry]) -> None:
        """Route the entries of a replicated write to their partitions (VirtualLog's
        ``on_replica_entries``)."""
        by_uid: dict[int, list[IndexEntry]] = {}
        for e in entries:
            by_uid.setdefault(e.uid, []).append(e)
        for uid, mine in by_uid.items():
            p = self.partitions.get(uid)
            if p is not None and p.vlog.name == name:
                p.apply_replica(seg, mine)
                continue
            # Not known here yet: kept for add_partition, and the segment kept alive for it.
            self._orphans.setdefault(uid, []).extend((name, seg.seq, e) for e in mine)
            live = self._live[name]
            live[seg.seq] = live.get(seg.seq, 0) + len(mine)

    def _adopt_orphans(self, p: PartitionLog) -> None:
        orphans = self._orphans.pop(p.uid, None)
        if not orphans:
            return
        name = p.vlog.name
        live = self._live[name]
        runs: list[tuple[Segment, list[IndexEntry]]] = []
        for n, seq, e in orphans:
            seg = p.vlog.segment(seq)
            if n != name or seg is None:
                continue
            live[seq] = live.get(seq, 0) - 1  # apply_replica counts it again
            if runs and runs[-1][0] is seg:
                runs[-1][1].append(e)
            else:
                runs.append((seg, [e]))
        for seg, entries in runs:
            p.apply_replica(seg, entries)

    def drop_orphans(self, uid: int) -> None:
        """Forget the replicated chunks of partition ``uid``, which will never be added here
        (deleted cluster-wide): their segments may go."""
        for name, seq, _e in self._orphans.pop(uid, []):
            live = self._live.get(name)
            if live is not None and seq in live:
                live[seq] -= 1
        self._collect_garbage()

    def truncate_log(self, name: str, seq: int, position: int) -> None:
        """Cut log ``name`` at (seq, position) (VirtualLog.truncate_to) and every partition in
        it with it: their chunks past the cut, next offsets, high watermarks, producer state."""
        vlog = self.logs[name]
        for p in self.partitions.values():
            if p.vlog is vlog:
                p.chunks.unseal_from(seq)  # read while the sealed indexes are there
        self._sealing.get(name, {}).clear()
        lost = vlog.lost_from(seq, position)  # before the cut forgets the damaged ranges
        vlog.truncate_to(seq, position)
        live = self._live[name]
        for p in self.partitions.values():
            if p.vlog is vlog:
                for s, n in p.truncate_to(seq, position, lost.get(p.uid)).items():
                    live[s] = live.get(s, 0) - n
        cut = (seq, position + FRAME_SIZE)
        for uid in list(self._orphans):
            kept = []
            for n, s, e in self._orphans[uid]:
                if n != name or (s, e.position) < cut:
                    kept.append((n, s, e))
                else:
                    live[s] = live.get(s, 0) - 1
            if kept:
                self._orphans[uid] = kept
            else:
                del self._orphans[uid]
        for s in [s for s in live if s not in vlog.segments]:
            del live[s]
        self.save_state()

    def remove_partition(self, uid: int) -> None:
        p = self.partitions.pop(uid, None)
        if p is None:
            return
        p.deleted = True
        if self.slots is not None:
            self.slots.remove(p)
        self.tail_cache.drop_partition(uid)
        live = self._live[p.vlog.name]
        for seq, n in p.chunks.count_by_segment().items():
            live[seq] = live.get(seq, 0) - n
        p._wake()
        self._state.pop(str(uid), None)
        self.save_state()
        if self.cold is not None or p.cold_segments or uid in self.segment_store.cleaned:
            for seg in list(p.cold_segments.values()):
                seg.release()
            p.cold_segments.clear()
            try:
                self.segment_store.drop_partition(uid)
            except ColdTierError as e:
                log.error("cannot remove the cold data of deleted partition %d: %s", uid, e)
        if self.config.layout == "per-partition" and p.vlog.name == f"p{uid}":
            vlog = self.logs.pop(p.vlog.name)
            vlog.abandon()
            self._live.pop(p.vlog.name, None)
            shutil.rmtree(vlog.directory, ignore_errors=True)
            if vlog.spill_directory is not None:
                shutil.rmtree(vlog.spill_directory, ignore_errors=True)
        else:
            self._collect_garbage()

    def _sealed(self, name: str, seg: Segment, si: SealedIndex) -> None:
        """A sealed segment's sealed index is written (VirtualLog.on_sealed): its chunks leave
        memory, partition by partition, in segment order (seals may finish out of order)."""
        vlog = self.logs.get(name)
        if vlog is None:
            return
        pending = self._sealing.setdefault(name, {})
        pending[seg.seq] = (seg, si)
        rebuild = vlog.rebuild_sealed_index
        firsts = []
        for p in self.partitions.values():
            if p.vlog is not vlog:
                continue
            chunks = p.chunks
            while (first := chunks.dense_first_segment) in pending:
                s, sx = pending[first]
                row = sx.rows.get(p.uid)
                if row is None or not chunks.seal(
                    first, PixRun(s, p.uid, row, rebuild), row.count, row.last
                ):
                    log.warning(
                        "%s-%d: its chunks in %s disagree with the sealed index: kept in memory",
                        p.topic,
                        p.index,
                        s,
                    )
                    break
            if chunks.dense_first_segment is not None:
                firsts.append(chunks.dense_first_segment)
        low = min(firsts, default=None)
        for q in [q for q in pending if low is None or q < low]:
            del pending[q]

    def _note_append(self, p: PartitionLog, seq: int, n: int) -> None:
        live = self._live[p.vlog.name]
        live[seq] = live.get(seq, 0) + n

    # -- retention -----------------------------------------------------------------------------
    def apply_retention(
        self, policies: dict[int, RetentionPolicy], now_ms: int | None = None
    ) -> int:
        """Drop expired chunks, oldest first across both tiers; return how many were dropped.

        ``policies`` maps partition uid -> policy. A chunk goes when its newest timestamp is
        older than retention.ms, or while what is left stays at least retention.bytes.
        """
        now = int(time.time() * 1000) if now_ms is None else now_ms
        drops = []
        for uid, policy in policies.items():
            p = self.partitions.get(uid)
            if p is None or not (len(p.chunks) or len(p.cold)):
                continue
            drop_cold, drop_hot = _expired(p, policy, now)
            if drop_cold or drop_hot:
                drops.append((p, drop_cold, drop_hot))
        return self._drop_fronts(drops)

    def delete_records(self, uid: int, before: int) -> int:
        """Move the partition's log start to ``before`` (at most its high watermark), as
        Kafka's DeleteRecords does; return how many chunks went (see ``move_log_starts``)."""
        return self.move_log_starts({uid: before})

    def move_log_starts(self, starts: dict[int, int], *, up_to: str = "high_watermark") -> int:
        """Move each partition's (uid's) log start forward to the offset given, exactly (it may
        fall inside a chunk: reads from there return that whole chunk, as Kafka's do), capped
        at the partition's ``up_to`` ("high_watermark", or "next_offset" for a replica applying
        its leader's start, whose high watermark may trail the leader's); never backwards.
        Chunks ending below the new start are dropped; the new starts are durable
        (partition-state.json) before this returns and before any segment file goes. Returns
        how many chunks went."""
        drops = []
        moved = False
        for uid, before in starts.items():
            p = self.partitions.get(uid)
            if p is None:
                continue
            before = min(before, getattr(p, up_to))
            if before <= p.log_start_offset:
                continue
            drop_cold = p.cold.count_before(before)
            drop_hot = p.chunks.count_before(before) if drop_cold == len(p.cold) else 0
            if drop_cold or drop_hot:
                drops.append((p, drop_cold, drop_hot, before))
            else:
                p.log_start_offset = before
                p.publish()
                moved = True
        if drops:  # (saves every partition's state, the moved ones' too)
            starts_of = {p.uid: before for p, _c, _h, before in drops}
            return self._drop_fronts([(p, c, h) for p, c, h, _ in drops], starts_of)
        if moved:
            self.save_state()
        return 0

    def _drop_fronts(
        self, drops: list[tuple[PartitionLog, int, int]], starts: dict[int, int] | None = None
    ) -> int:
        """Drop each partition's first (cold, hot) chunks, moving its log start (to the first
        chunk kept, or further to ``starts[uid]``)."""
        dropped_total = 0
        dead_cold: list[tuple[PartitionLog, list]] = []
        for uid, start in (starts or {}).items():
            p = self.partitions[uid]
            p.log_start_offset = max(p.log_start_offset, start)
            p.publish()
        for p, drop_cold, drop_hot in drops:
            if drop_cold:
                dead_cold.append((p, p.drop_cold_front(drop_cold)))
            if drop_hot:
                removed_bytes = p.chunks.bytes_of_first(drop_hot)
                dropped = p.drop_before(drop_hot)
                p.size_bytes -= removed_bytes
                live = self._live[p.vlog.name]
                for seq, k in dropped.items():
                    live[seq] = live.get(seq, 0) - k
            dropped_total += drop_cold + drop_hot
        if drops:
            # The new start offsets are durable before any segment file goes.
            self.save_state()
            self._collect_garbage()
            for p, gone in dead_cold:
                if gone:
                    self._forget_cold(p, gone)
        return dropped_total

    def _forget_cold(self, p: PartitionLog, gone: list) -> None:
        store = self.segment_store
        if store.shared and not p.vlog.leading:
            # A shared cold tier is its primary's to change: a backup only forgets them.
            for s in gone:
                s.release()
            return
        try:
            store.commit(p.uid, [s.meta for s in p.cold_segments.values()])
        except ColdTierError as e:
            self.cold_error = str(e)
            log.error("cannot update the cold manifest of %s-%d: %s", p.topic, p.index, e)
            return  # the files stay; a later start drops chunks below the log start again
        for s in gone:
            s.delete()

    def _collect_garbage(self) -> None:
        for name, live in self._live.items():
            vlog = self.logs.get(name)
            if vlog is None or not vlog.opened:
                continue
            # Any sealed segment no live chunk refers to goes (also ones that never got one).
            for seq in [s for s in vlog.segments if live.get(s, 0) <= 0]:
                if seq == vlog.active.seq:
                    continue
                vlog.delete_segment(seq)
                live.pop(seq, None)

    # -- checkpoints ---------------------------------------------------------------------------
    def save_state(self) -> None:
        for uid, p in self.partitions.items():
            st = self._state.setdefault(str(uid), {})
            st["start"] = p.log_start_offset
            st["end"] = p.next_offset
        tmp = self.root / (STATE_FILE + ".tmp")
        body = json.dumps(self._state, sort_keys=True)
        with open(tmp, "w") as f:
            f.write(json.dumps({"partitions": json.loads(body), "crc32c": crc32c(body.encode())}))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.root / STATE_FILE)
        fsync_dir(self.root)

    async def checkpoint(self) -> None:
        await asyncio.gather(*(v.checkpoint() for v in list(self.logs.values())))
        if self.config.replicated:
            points = self._commit_points()
            if points != self._saved_commits:
                loop = asyncio.get_running_loop()
                await loop.run_in_executor(self.executor, commit_checkpoint.save, self.root, points)
                self._saved_commits = points

    def _commit_points(self) -> dict[str, tuple[int, int]]:
        """Each replicated log's commit point (commit_checkpoint.py)."""
        return {
            name: v.commit_point
            for name, v in self.logs.items()
            if v.opened and not _LAYOUT_NAME.fullmatch(name)
        }


def _hold_uncommitted(p: PartitionLog) -> None:
    """A replicated partition just opened shows its records up to its log's commit point
    only; the rest once the primary (or, leading, its in-sync set) commits them."""
    vlog, chunks = p.vlog, p.chunks
    seq, position = vlog.primary_commit
    k = chunks.count_before_location(seq, position + FRAME_SIZE)
    if k >= len(chunks):
        return
    p.high_watermark = chunks.base_of(k)
    last = chunks[len(chunks) - 1]
    end = p.next_offset
    vlog.when_commit_passes(
        (last.segment, last.position + last.size), lambda: p.advance_high_watermark(end)
    )


def _expired(p: PartitionLog, policy: RetentionPolicy, now: int) -> tuple[int, int]:
    """How many leading (cold, hot) chunks retention removes: oldest first, cold before hot."""
    tiers = [p.cold, p.chunks]
    counts = [0, 0]
    if policy.retention_ms >= 0:
        cutoff = now - policy.retention_ms
        for t, chunks in enumerate(tiers):
            # The leading chunks whose running max timestamp is older than the cutoff.
            k = min(chunks.locate_time(cutoff), chunks.count_before(p.high_watermark))
            counts[t] = k
            if k < len(chunks):
                break
    if policy.retention_bytes >= 0:
        size = p.cold_bytes + p.size_bytes
        size -= sum(tiers[t].bytes_of_first(counts[t]) for t in (0, 1))
        for t, chunks in enumerate(tiers):
            # Chunks go while what is left stays at least retention.bytes.
            k, excess = chunks.advance_while_bytes(
                counts[t], p.high_watermark, size - policy.retention_bytes
            )
            size = policy.retention_bytes + excess
            counts[t] = k
            if k < len(chunks):
                break
    return counts[0], counts[1]


def _record(table: ProducerStateTable, e: IndexEntry) -> None:
    table.record(
        e.producer_id,
        e.producer_epoch,
        e.base_sequence,
        e.last_offset_delta + 1,
        e.base_offset,
        e.max_timestamp,
    )
