"""Log compaction of partitions (``cleanup.policy=compact``): what to clean, when, and the
switch to the cleaned segments. The record work is compaction.py's, in a worker process.

A virtual log's segments are shared by many partitions, so none is rewritten in place. A
partition is cleaned into segments of its own, in the format of the cold tier (cold_tier.py):
its cold segments (compacted or migrated before) and its hot chunks in sealed segments are read,
and the records kept are written as new per-partition segments, in the cold tier if the broker
has one, else in a local store under the hot tier (``logs/compacted/p<uid>``). One new manifest
generation names them together with the clean point (the first offset not cleaned); only then,
synchronously on the event loop, does the partition's index switch: its cold chunk index is
rebuilt from the new list and the hot chunks below the clean point are released like migrated
ones (their segment goes once no partition refers to it). A kill at any step leaves either the
old manifest (the new files are leftovers, removed at the next start) or the new one (the next
start skips the hot chunks below its clean point), never a mix.

What may be cleaned of a partition, the *cleanable range*, ends at the first of

* the last stable offset (an open transaction's first offset, or the high watermark),
* its first chunk in its log's active segment (Kafka never cleans the active segment),
* its first chunk newer than ``min.compaction.lag.ms`` (running max timestamp),
* a lost range (damage): such partitions are not cleaned at all.

A partition is cleaned when its *dirty ratio* (bytes past the clean point over all bytes of the
range) reaches ``min.cleanable.dirty.ratio``, or when its first dirty chunk is older than
``max.compaction.lag.ms``. The dirtiest partition goes first, one at a time, in one worker
process at a lower priority, its reads and writes paced (``log.cleaner.io.max.bytes.per.
second``, or steered by the journal's fsync latency with ``log.cleaner.fsync_target_ms``), so
that produce latency is not hurt (the isolation migration and catch-up reads have).

Migration and compaction both change a partition's manifest: migration marks a partition while
its commit is under way (``LogStore.cold_committing``) and drops a copy whose hot chunks were
cleaned meanwhile; compaction drops its result if the partition changed while it ran
(retention, migration, DeleteRecords, deletion), and tries again later.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
import time
from collections.abc import Callable
from concurrent.futures import Executor, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from pathlib import Path

from stratalog.storage.chunk_index import ChunkIndex
from stratalog.storage.cold_tier import ColdSegment, ColdSegmentMeta, ColdTierError
from stratalog.storage.compaction import Job, Result, Source, clean, start_cleaner_worker
from stratalog.storage.migration_worker import _plain_main
from stratalog.storage.partition import PartitionLog
from stratalog.storage.segment import mkdir_durable
from stratalog.storage.throttle import SharedRate

log = logging.getLogger(__name__)

NEVER = (1 << 63) - 1
_NO_META = ColdSegmentMeta("", 0, 0, 0, 0, 0)  # (for a partition's directory name)


@dataclass(frozen=True)
class CompactionPolicy:
    """A compacted topic's settings (Kafka's names and defaults)."""

    min_cleanable_dirty_ratio: float = 0.5
    min_compaction_lag_ms: int = 0
    max_compaction_lag_ms: int = NEVER
    delete_retention_ms: int = 24 * 3600 * 1000


@dataclass(frozen=True)
class CleanerSettings:
    io_bytes_per_sec: float = 0.0  # reads and writes of the worker; 0: unlimited
    max_keys: int = 1 << 20  # keys in one cleaning's offset map
    segment_bytes: int = 64 << 20  # size of the segments written
    backoff_ms: int = 15000  # between looks for partitions to clean
    cpus: frozenset[int] = frozenset()
    sched_idle: bool = False  # the worker in SCHED_IDLE and the idle I/O class, not nice +10


@dataclass
class Plan:
    """One cleaning of a partition, as decided on the event loop."""

    uid: int
    limit: int  # first offset not cleaned
    cleaned: int  # the clean point before
    dirty_bytes: int
    total_bytes: int
    hot: int  # how many leading hot chunks are read
    cold_names: list[str]
    hot_first: int  # base offset of the first hot chunk read (-1: none)
    hot_last: int  # base offset of the last one

    @property
    def dirty_ratio(self) -> float:
        return self.dirty_bytes / self.total_bytes if self.total_bytes else 0.0


@dataclass
class CleanerStats:
    cleanings: int = 0
    read_bytes: int = 0
    written_bytes: int = 0
    records_removed: int = 0
    discarded: int = 0  # results dropped because the partition changed meanwhile
    last_error: str | None = None
    recent: list[tuple[float, str]] = field(default_factory=list)


def plan(p: PartitionLog, policy: CompactionPolicy, cleaned: int, now_ms: int) -> Plan | None:
    """What a cleaning of ``p`` would cover now (None: nothing cleanable)."""
    if p.deleted or p.lost or p.sealed:
        return None
    cold, hot = p.cold, p.chunks
    limit = min(p.last_stable_offset, p.high_watermark)
    # Never its chunks in the active segment of its log.
    active = p.vlog.active.seq if p.vlog.opened else None
    k_sealed = hot.count_before_location(active, 0) if active is not None else len(hot)
    limit = min(limit, hot.base_of(k_sealed) if k_sealed < len(hot) else p.next_offset)
    if policy.min_compaction_lag_ms > 0:
        cutoff = now_ms - policy.min_compaction_lag_ms
        i = cold.locate_time(cutoff + 1)
        if i < len(cold):
            limit = min(limit, cold.base_of(i))
        else:
            j = hot.locate_time(cutoff + 1)
            if j < len(hot):
                limit = min(limit, hot.base_of(j))
    k = hot.count_before(limit)  # hot chunks wholly below the limit
    if k < len(hot):
        limit = min(limit, hot.base_of(k))  # (a chunk boundary)
    if not len(cold) and not k:
        return None
    # (Sums the runs' summaries and the chunks in memory: nothing is read from disk while the
    # clean part is cold and the hot chunks past the limit are the active segment's.)
    hot_bytes = hot.total_bytes() - hot.bytes_from(k)
    total = cold.total_bytes() + hot_bytes
    clean_cold = cold.count_before(cleaned) if cleaned > 0 else 0
    clean_hot = min(k, hot.count_before(cleaned)) if cleaned > 0 else 0
    dirty = cold.bytes_from(clean_cold) + hot_bytes - hot.bytes_of_first(clean_hot)
    if dirty <= 0 or limit <= cleaned:
        return None
    names = [s.meta.name for s in _cold_in_order(p)]
    return Plan(
        p.uid,
        limit,
        cleaned,
        dirty,
        total,
        k,
        names,
        hot.base_of(0) if k else -1,
        hot.base_of(k - 1) if k else -1,
    )


def first_dirty_timestamp(p: PartitionLog, cleaned: int) -> int:
    """The max timestamp of the first chunk past the clean point (-1: none)."""
    for chunks in (p.cold, p.chunks):
        i = chunks.count_before(cleaned) if cleaned > 0 else 0
        if i < len(chunks):
            return chunks.max_timestamp_of(i)
    return -1


def due(pl: Plan, p: PartitionLog, policy: CompactionPolicy, now_ms: int) -> bool:
    """Whether a cleaning of plan ``pl`` should run now."""
    if pl.dirty_ratio >= policy.min_cleanable_dirty_ratio:
        return True
    if policy.max_compaction_lag_ms < NEVER:
        ts = first_dirty_timestamp(p, pl.cleaned)
        return 0 <= ts < now_ms - policy.max_compaction_lag_ms
    return False


def _cold_in_order(p: PartitionLog) -> list[ColdSegment]:
    return [p.cold_segments[s] for s in sorted(p.cold_segments)]


class Cleaner:
    """Cleans a LogStore's compacted partitions (one at a time, in a worker process)."""

    def __init__(self, store, settings: CleanerSettings, executor: Executor | None = None) -> None:
        self.store = store
        self.settings = settings
        self.stats = CleanerStats()
        self._pool: Executor | None = executor
        self._own_pool = executor is None
        # The worker's reads and writes, in bytes per second (0: unlimited): the setting, or
        # what the broker steers it to by the journal's fsyncs (throttle.FsyncGuidedRate).
        self.rate = SharedRate(settings.io_bytes_per_sec)
        self._busy = False

    def close(self) -> None:
        if self._own_pool and self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)  # type: ignore[call-arg]
            self._pool = None

    def _executor(self) -> Executor:
        if self._pool is None:
            # A process of its own, nice +10, as migration's copies (migration_worker.py): the
            # record work never shares the event loop's GIL.
            self._pool = ProcessPoolExecutor(
                1,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=start_cleaner_worker,
                initargs=(os.getpid(), self.settings.cpus, self.rate, self.settings.sched_idle),
            )
        return self._pool

    @property
    def available(self) -> bool:
        """Whether this store can compact: not into a shared cold tier (every replica would
        write one partition's manifest)."""
        return not self.store.segment_store.shared

    def cleaned(self, uid: int) -> int:
        return self.store.segment_store.cleaned.get(uid, -1)

    # -- choosing ------------------------------------------------------------------------------
    def candidates(
        self, policies: dict[int, CompactionPolicy], now_ms: int
    ) -> list[tuple[Plan, CompactionPolicy]]:
        """Cleanings due now, dirtiest first."""
        out = []
        for uid, policy in policies.items():
            p = self.store.partitions.get(uid)
            if p is None:
                continue
            pl = plan(p, policy, self.cleaned(uid), now_ms)
            if pl is not None and due(pl, p, policy, now_ms):
                out.append((pl, policy))
        out.sort(key=lambda c: -c[0].dirty_ratio)
        return out

    async def run(self, policies: Callable[[], dict[int, CompactionPolicy]]) -> None:
        """The background loop: every ``backoff_ms``, clean whatever is due."""
        while True:
            await asyncio.sleep(self.settings.backoff_ms / 1000)
            try:
                await self.step(policies())
                self.stats.last_error = None
            except (ColdTierError, OSError, BrokenProcessPool) as e:
                self.stats.last_error = str(e)
                log.error("compaction paused: %s", e)
            except Exception:
                log.exception("compaction step failed")

    async def step(self, policies: dict[int, CompactionPolicy], now_ms: int | None = None) -> int:
        """Clean every partition due now; return how many were cleaned."""
        if not self.available or not policies:
            return 0
        done = 0
        now = int(time.time() * 1000) if now_ms is None else now_ms
        tried: set[int] = set()
        while True:
            todo = [c for c in self.candidates(policies, now) if c[0].uid not in tried]
            if not todo:
                return done
            pl, policy = todo[0]
            tried.add(pl.uid)
            if await self.clean(self.store.partitions[pl.uid], policy, now):
                done += 1

    # -- one cleaning --------------------------------------------------------------------------
    async def clean(
        self, p: PartitionLog, policy: CompactionPolicy, now_ms: int | None = None
    ) -> bool:
        """Clean partition ``p`` now, whatever its dirty ratio; False if there was nothing to
        clean or the result could not be used (the partition changed meanwhile)."""
        if self._busy:
            raise RuntimeError("one cleaning at a time")
        now = int(time.time() * 1000) if now_ms is None else now_ms
        pl = plan(p, policy, self.cleaned(p.uid), now)
        if pl is None or not self.available:
            return False
        self._busy = True
        try:
            return await self._clean(p, pl, policy, now)
        finally:
            self._busy = False

    async def _clean(self, p: PartitionLog, pl: Plan, policy: CompactionPolicy, now: int) -> bool:
        store = self.store
        seg_store = store.segment_store
        held: list = []
        sources: list[Source] = []
        if store.cold is None:
            # The local store (never a cold tier's directory: a missing mount stays missing),
            # made on the first cleaning only (a broker with no compacted topic has none), and
            # durably: a manifest in a directory a crash forgets would be lost with it.
            mkdir_durable(Path(seg_store.root))
            mkdir_durable(Path(seg_store.data_path(p.uid, _NO_META)).parent)
        try:
            for s in _cold_in_order(p):
                held.append(s.acquire())
                sources.append(Source(cold=_meta_dict(s.meta)))
            if pl.hot:
                pos, size = p.chunks.locations(pl.hot)
                at = 0
                for seq, n in p.chunks.count_by_segment_of_first(pl.hot).items():
                    seg = p.vlog.segment(seq)
                    if seg is None:
                        return False  # gone meanwhile (retention): next time
                    held.append(seg.acquire())
                    sources.append(
                        Source(
                            path=str(seg.data_path),
                            positions=pos[at : at + n].tobytes(),
                            sizes=size[at : at + n].tobytes(),
                        )
                    )
                    at += n
            job = Job(
                uid=p.uid,
                location=seg_store.location,
                options=seg_store.options,
                sources=sources,
                cleaned=pl.cleaned,
                limit=pl.limit,
                aborted=[a for a in p.txns.aborted() if a[1] < pl.limit],
                now_ms=now,
                delete_retention_ms=policy.delete_retention_ms,
                max_keys=self.settings.max_keys,
                segment_bytes=self.settings.segment_bytes,
                rate=self.settings.io_bytes_per_sec,
            )
            loop = asyncio.get_running_loop()
            with _plain_main():
                fut = loop.run_in_executor(self._executor(), clean, job)
            try:
                result: Result = await fut
            except BrokenProcessPool:
                self.close()  # a worker died: a new pool next time; nothing was committed
                raise
        finally:
            for h in held:
                h.release()
        new = [m for kind, m, *_ in result.segments if kind == "new"]
        # The switch: nothing awaited from the check to the end, but a migration's commit of
        # this partition under way (an await) is waited for first.
        while p.uid in store.cold_committing:
            await asyncio.sleep(0.01)
        if not self._still(p, pl):
            self.stats.discarded += 1
            for m in new:
                seg_store.remove_files(p.uid, m)
            log.info("%s-%d changed while it was compacted: tried again later", p.topic, p.index)
            return False
        self._switch(p, pl, result)
        self.stats.cleanings += 1
        self.stats.read_bytes += result.read_bytes
        self.stats.written_bytes += result.written_bytes
        self.stats.records_removed += result.records_removed
        log.info(
            "compacted %s-%d below offset %d: %d records kept, %d removed, %d B written",
            p.topic,
            p.index,
            result.limit,
            result.records_kept,
            result.records_removed,
            result.written_bytes,
        )
        return True

    def _still(self, p: PartitionLog, pl: Plan) -> bool:
        """Whether ``p`` is as ``pl`` found it (its cold list and its first hot chunks)."""
        if p.deleted or self.store.partitions.get(p.uid) is not p or p.lost:
            return False
        if [s.meta.name for s in _cold_in_order(p)] != pl.cold_names:
            return False
        if pl.hot:
            hot = p.chunks
            if len(hot) < pl.hot or hot.base_of(0) != pl.hot_first:
                return False
            if hot.base_of(pl.hot - 1) != pl.hot_last:
                return False
        return True

    def _switch(self, p: PartitionLog, pl: Plan, result: Result) -> None:
        """Commit the new segment list with the clean point, then switch the index (on the
        event loop, no await: readers see the old or the new, never a mix)."""
        store = self.store
        seg_store = store.segment_store
        old = _cold_in_order(p)
        by_name = {s.meta.name: s for s in old}
        metas: list[ColdSegmentMeta] = []
        for kind, x, *_ in result.segments:
            metas.append(x if kind == "new" else by_name[x].meta)
        seg_store.commit(p.uid, metas, cleaned=result.limit)
        # The new manifest is durable: switch the index.
        kept = {x for kind, x, *_ in result.segments if kind == "keep"}
        seq = max(p.cold_segments, default=-1) + 1
        p.cold = ChunkIndex()
        p.cold_segments = {}
        for kind, x, *rest in result.segments:
            if kind == "new":
                piece = rest[0]
                p.add_cold_segment(ColdSegment(seg_store, p.uid, x, seq), piece)
            else:
                p.add_cold_segment(ColdSegment(seg_store, p.uid, by_name[x].meta, seq))
            seq += 1
        for s in old:
            if s.meta.name in kept:
                s.release()  # the same files, now under a new ColdSegment
            else:
                s.delete()  # removed once no read holds it
        k = p.chunks.count_before(result.limit)
        if k:
            live = store._live[p.vlog.name]
            for s, n in p.chunks.count_by_segment_of_first(k).items():
                live[s] = live.get(s, 0) - n
            p.migrate_front(k)
            store._collect_garbage()
        self.stats.recent.append((time.time(), f"{p.topic}-{p.index}"))
        del self.stats.recent[:-20]


def _meta_dict(meta: ColdSegmentMeta) -> dict:
    from dataclasses import asdict

    return asdict(meta)
