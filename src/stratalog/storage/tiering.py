"""Migration between the tiers (Pafka's threshold, ChronoLog's story builder).

A background task watches the hot tier. When its usage passes ``threshold x capacity``, or a
partition's hot data is older or bigger than its local retention, the oldest sealed segment of a
virtual log is migrated: each partition's chunks in it are copied into a cold segment of that
partition's own (in worker processes, ``threads`` partitions at a time, at most
``max_bytes_per_sec``), synced, named in the partition's manifest, and only then switched in the
index; the hot segment is deleted once no partition refers to it. A SIGKILL at any step leaves
either the hot copy or both (start-up drops hot chunks the cold tier already has), never
neither. When the hot tier is full, new segments are created in the cold tier's directory
instead of failing writes, and the log and the metrics say so.

In a cluster (``cluster``, cluster/tiers.py) only a virtual log's primary picks segments; its
backups move the segments it tells them of. With a shared cold tier (ColdStore.shared) a
segment's chunks that the tier already holds (a primary's upload) are taken into the index
instead of copied (``_adopt``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Protocol

from stratalog.storage import reaper
from stratalog.storage.cold_tier import ColdSegment, ColdTierError, entries_index
from stratalog.storage.log_store import LogStore
from stratalog.storage.migration_worker import CopyWorkers
from stratalog.storage.partition import PartitionLog
from stratalog.storage.segment import Segment
from stratalog.storage.throttle import ByteRate
from stratalog.storage.virtual_log import VirtualLog

log = logging.getLogger(__name__)
PROBE_INTERVAL = 5.0  # seconds between checks that the cold tier is still there and writable


@dataclass
class TierSettings:
    hot_capacity: int = 0  # bytes; 0: unbounded
    threshold: float = 0.5  # fraction of capacity; < 0: no migration by usage
    max_bytes_per_sec: int = 0  # 0: unlimited
    cold_bytes_per_sec: int = 0  # the cold tier's write bandwidth, shared with spilled writes
    threads: int = 2
    interval_ms: int = 1000
    promote: bool = False  # below the threshold, cache the newest cold segments in the hot tier
    # CPUs the copy workers may use; empty: the broker's (fetch.backlog.sender_cpus widens them)
    worker_cpus: frozenset[int] = frozenset()


@dataclass
class TierStats:
    migrated_bytes: int = 0
    migrated_segments: int = 0
    spilling: bool = False
    promoted_segments: int = 0
    adopted_segments: int = 0  # found already in a shared cold tier, not copied
    evicted_segments: int = 0
    last_error: str | None = None
    recent: list[tuple[float, int]] = field(default_factory=list)  # (time, bytes) per segment

    def rate(self, window: float = 60.0) -> float:
        """Migrated bytes per second over the last ``window`` seconds."""
        now = time.monotonic()
        self.recent = [(t, b) for t, b in self.recent if now - t <= window]
        return sum(b for _, b in self.recent) / window


# uid -> (local retention ms, local retention bytes); -1 means no limit
LocalPolicies = Callable[[], dict[int, tuple[int, int]]]


class ClusterRole(Protocol):
    """Which replica migrates what (cluster/tiers.py)."""

    def may_choose(self, vlog: VirtualLog, seg: Segment) -> bool:
        """Whether this broker may decide to migrate ``seg`` of ``vlog``."""
        ...

    def migrated(self, vlog: VirtualLog) -> None:
        """This broker migrated a segment of ``vlog`` it chose."""
        ...

    async def follow(self, migrator: Migrator) -> int:
        """Migrate what a primary said is cold; how many segments went."""
        ...


class Migrator:
    def __init__(self, store: LogStore, settings: TierSettings, local: LocalPolicies) -> None:
        self.store = store
        self.settings = settings
        self.local = local
        self.stats = TierStats()
        self._backoff = 0.0
        self._rate = ByteRate(settings.max_bytes_per_sec)
        # The cold device's write budget: migration and produce requests that spilled to the
        # cold tier draw from the same one, as they share the device (Pafka's slow tier).
        self.cold_rate = ByteRate(settings.cold_bytes_per_sec)
        self._probed = 0.0
        self._copier = (
            CopyWorkers(store.cold, settings.threads, settings.worker_cpus) if store.cold else None
        )
        self.cluster: ClusterRole | None = None

    def close(self) -> None:
        """Stop the copy worker processes (a copy under way is abandoned uncommitted)."""
        if self._copier is not None:
            self._copier.close()

    # -- accounting ----------------------------------------------------------------------------
    def hot_usage(self) -> int:
        return sum(v.hot_bytes() for v in self.store.logs.values()) + self.promoted_bytes()

    def _cold_segments(self) -> list[ColdSegment]:
        return [s for p in self.store.partitions.values() for s in p.cold_segments.values()]

    def promoted_bytes(self) -> int:
        return sum(s.meta.size for s in self._cold_segments() if s.promoted is not None)

    def _over_threshold(self) -> bool:
        s = self.settings
        return (
            s.hot_capacity > 0
            and s.threshold >= 0
            and (self.hot_usage() > s.threshold * s.hot_capacity)
        )

    def backlog_bytes(self) -> int:
        """Hot bytes above the threshold: what migration still has to move."""
        s = self.settings
        if s.hot_capacity <= 0 or s.threshold < 0:
            return 0
        return max(0, self.hot_usage() - int(s.threshold * s.hot_capacity))

    # -- the loop ------------------------------------------------------------------------------
    async def run(self) -> None:
        if self._copier is not None:
            try:
                await self._copier.start()
            except Exception:
                log.exception("cannot start the migration workers (retried at each step)")
        while True:
            await asyncio.sleep(self.settings.interval_ms / 1000 + self._backoff)
            try:
                await self.step()
                self._backoff = 0.0
            except ColdTierError as e:
                self.stats.last_error = str(e)
                self.store.cold_error = str(e)
                self._backoff = min(30.0, max(1.0, self._backoff * 2))
                log.error(
                    "migration paused, cold tier unavailable: %s (retry in %.0f s)",
                    e,
                    self._backoff,
                )
            except Exception:
                log.exception("migration step failed")

    async def step(self) -> int:
        """Migrate what is due now; return how many segments moved."""
        if self.store.cold is None:
            return 0
        if time.monotonic() - self._probed > PROBE_INTERVAL:
            # Even with nothing to move, notice (and report) a cold tier that went away.
            self._probed = time.monotonic()
            await asyncio.get_running_loop().run_in_executor(
                self.store.executor, self.store.cold.check
            )
            self.stats.last_error = None
            self.store.cold_error = None
        self._evict_promoted()
        self._update_spill()
        moved = 0
        if self.cluster is not None:
            moved += await self.cluster.follow(self)
        while True:
            pick = self._next_segment()
            if pick is None:
                break
            vlog, seg = pick
            await self.migrate(vlog, seg)
            if self.cluster is not None:
                self.cluster.migrated(vlog)
            moved += 1
            self._update_spill()
            if vlog.segments.get(seg.seq) is seg:
                log.warning("segment %s of %s is still there after migration", seg, vlog.name)
                break
        if moved:
            self.stats.last_error = None
            self.store.cold_error = None
        await self._promote()
        return moved

    # -- promotion (Pafka) ---------------------------------------------------------------------
    def _promote_limit(self) -> int:
        s = self.settings
        if not s.promote or s.hot_capacity <= 0 or s.threshold < 0:
            return 0
        return int(s.threshold * s.hot_capacity)

    def _evict_promoted(self) -> None:
        """Over the threshold, promoted copies go first (they are only a cache)."""
        limit = self._promote_limit()
        usage = self.hot_usage()
        promoted = sorted(
            (s for s in self._cold_segments() if s.promoted is not None),
            key=lambda s: s.meta.max_timestamp,
        )
        for seg in promoted:
            if usage <= limit and self.settings.promote:
                break
            path, seg.promoted = seg.promoted, None
            # Open descriptors keep reading the unlinked copy: unlinked whole, never cut.
            reaper.unlink(path, shrink=False)
            usage -= seg.meta.size
            self.stats.evicted_segments += 1

    async def _promote(self) -> None:
        """Below the threshold, copy the newest cold segments back to the hot tier."""
        limit = self._promote_limit()
        if not limit:
            return
        cold = self.store.cold
        assert cold is not None
        usage = self.hot_usage()
        todo = sorted(
            (s for s in self._cold_segments() if s.promoted is None),
            key=lambda s: -s.meta.max_timestamp,
        )
        loop = asyncio.get_running_loop()
        for seg in todo:
            if usage + seg.meta.size > limit:
                break
            target = self.store.root / "promoted" / f"p{seg.uid}" / f"{seg.meta.name}.log"
            await loop.run_in_executor(self.store.executor, _copy_down_up, seg, target)
            seg.promoted = target
            usage += seg.meta.size
            self.stats.promoted_segments += 1

    def _can_spill(self) -> bool:
        cold = self.store.cold
        return (
            cold is not None
            and cold.local
            and not cold.shared  # see LogStore._new_log
            and self.settings.hot_capacity > 0
        )

    def hot_full(self, segment_bytes: int = 0) -> bool:
        """Whether a new segment of ``segment_bytes`` should go to the cold tier (asked at
        every roll): it would not fit in the hot tier's capacity."""
        if not self._can_spill() or self.store.cold_error is not None:
            return False  # a cold tier known to be failing takes no new segments
        return self.hot_usage() + segment_bytes > self.settings.hot_capacity

    def _update_spill(self) -> None:
        if not self._can_spill():
            return
        full = self.hot_full()
        if full != self.stats.spilling:
            self.stats.spilling = full
            if full:
                log.warning(
                    "hot tier full (%d of %d bytes): new segments go to the cold tier",
                    self.hot_usage(),
                    self.settings.hot_capacity,
                )
            else:
                log.info("hot tier below capacity again: new segments go to the hot tier")
        for vlog in self.store.logs.values():
            vlog.spill_policy = self.hot_full
            if vlog.spill != full and vlog.opened:
                vlog.spill = full
                in_hot = vlog.active.directory == vlog.directory
                # A backup's segments follow its primary's (seq, position): only it rolls.
                if vlog.leading and ((full and vlog.active.size > 0) or (not full and not in_hot)):
                    vlog.roll()

    def _next_segment(self) -> tuple[VirtualLog, Segment] | None:
        candidates = []
        for vlog in self.store.logs.values():
            if not vlog.opened:
                continue
            seg = vlog.oldest_sealed()
            if seg is not None and (self.cluster is None or self.cluster.may_choose(vlog, seg)):
                candidates.append((seg.created, vlog, seg))
        if not candidates:
            return None
        candidates.sort(key=lambda c: (c[0], c[2].seq))
        if self._over_threshold():
            _, vlog, seg = candidates[0]
            return vlog, seg
        policies = self.local()
        now = time.time() * 1000
        for _, vlog, seg in candidates:
            # A log that spilled segments to the cold directory has them rewritten into the
            # cold tier's own format, oldest segment first, pressure or not.
            spilled = any(
                s.directory != vlog.directory
                for s in vlog.segments.values()
                if s is not vlog.active
            )
            if spilled or self._locally_expired(vlog, seg, policies, now):
                return vlog, seg
        return None

    def _locally_expired(self, vlog, seg, policies, now: float) -> bool:
        """Whether every partition with chunks in ``seg`` wants them out of the hot tier."""
        found = False
        for p in self.store.partitions.values():
            if p.vlog is not vlog or not len(p.chunks) or p.chunks.segment_of(0) != seg.seq:
                continue
            found = True
            local_ms, local_bytes = policies.get(p.uid, (-1, -1))
            by_size = local_bytes >= 0 and p.size_bytes > local_bytes
            by_time = (
                not by_size
                and local_ms >= 0
                and p.chunks.max_timestamp_of_first(p.chunks.leading(seg.seq)) < now - local_ms
            )
            if not (by_time or by_size):
                return False
        return found

    # -- one segment ---------------------------------------------------------------------------
    async def migrate(self, vlog: VirtualLog, seg: Segment, *, copy: bool = True) -> None:
        """Move ``seg``'s chunks to the cold tier; ``copy=False``: only take in what a shared
        cold tier holds already (a backup's), keeping the segment if that is not all."""
        store = self.store
        cold = store.cold
        assert cold is not None
        loop = asyncio.get_running_loop()
        if cold.shared:
            await self._adopt(vlog, seg)
            parts = store.partitions.values()
            if not any(p.vlog is vlog and p.chunks.leading(seg.seq) for p in parts):
                store._collect_garbage()
                self.stats.adopted_segments += 1
                log.info("took %s of %s from the shared cold tier", seg, vlog.name)
                return
        if not copy:
            log.warning("%s of %s is not all in the shared cold tier: it stays hot", seg, vlog.name)
            return
        # Everything on the event loop below is slices and bisects of the index columns; the
        # per-chunk work (reading, parsing, building the cold index) runs in a worker process
        # (migration_worker.py), off this process's GIL.
        plan = []
        for p in list(store.partitions.values()):
            if p.vlog is vlog:
                k = p.chunks.leading(seg.seq)
                if k:
                    plan.append((p, p.chunks.locations(k), p.chunks.base_of(0)))
        seg.acquire()
        try:
            workers = max(1, self.settings.threads)
            gate = asyncio.Semaphore(workers)
            # On a local cold tier a rate limit paces the copies' writes themselves (shared by
            # those running at once) rather than letting each go at full speed and waiting
            # afterwards; an object store's copies still wait afterwards (on _rate), and only
            # they, else a paced copy would wait for its bytes twice.
            share = min(workers, max(1, len(plan)))
            rate = self.settings.max_bytes_per_sec / share if cold.local else 0.0

            async def copy(p: PartitionLog, locs, first: int):
                async with gate:
                    assert self._copier is not None
                    meta, piece = await self._copier.copy_down(
                        p.uid, str(seg.data_path), locs, rate
                    )
                    await asyncio.gather(
                        self._rate.admit(0 if rate else meta.size),
                        self.cold_rate.admit(meta.size),
                    )
                    return p, meta, piece, first

            copied = await asyncio.gather(*(copy(p, *rest) for p, *rest in plan))
            moved = 0
            for p, meta, piece, first in copied:
                # (A shared tier is its primary's alone: one deposed meanwhile commits nothing.)
                gone = p.deleted or store.partitions.get(p.uid) is not p
                # Compaction (cleaner.py) replaced the chunks copied meanwhile: the copy is stale.
                stale = not len(p.chunks) or p.chunks.base_of(0) != first
                if gone or stale or (cold.shared and not vlog.leading):
                    cold.remove_files(p.uid, meta)
                    continue
                meta = replace(meta, vseg=seg.seq)
                metas = [s.meta for s in p.cold_segments.values()] + [meta]
                store.cold_committing.add(p.uid)
                try:
                    await loop.run_in_executor(store.executor, cold.commit, p.uid, metas)
                finally:
                    store.cold_committing.discard(p.uid)
                # The manifest is durable: switch the index (no await from here on).
                seq = max(p.cold_segments, default=-1) + 1
                p.add_cold_segment(ColdSegment(cold, p.uid, meta, seq), piece)
                k = min(p.chunks.leading(seg.seq), p.chunks.count_through(meta.last))
                p.migrate_front(k)
                live = store._live[vlog.name]
                live[seg.seq] = live.get(seg.seq, 0) - k
                moved += meta.size
            # Chunks of deleted partitions do not count: the segment may go now.
            live = store._live[vlog.name]
            if live.get(seg.seq, 0) > 0:
                log.warning("segment %s still referenced after migration", seg)
            store._collect_garbage()
            self.stats.migrated_bytes += moved
            self.stats.migrated_segments += 1
            self.stats.recent.append((time.monotonic(), moved))
            log.info("migrated %s of %s (%d bytes) to the cold tier", seg, vlog.name, moved)
        finally:
            seg.release()

    async def _adopt(self, vlog: VirtualLog, seg: Segment) -> None:
        """Take into each partition's index the cold segments the (shared) cold tier holds of
        its chunks in ``seg`` (written by another broker, the log's primary then), and drop
        those hot chunks. Only a run that continues the partition's cold chunks and covers its
        first hot chunk is taken, so the two tiers never leave a gap."""
        store, cold = self.store, self.store.cold
        assert cold is not None
        loop = asyncio.get_running_loop()
        for p in list(store.partitions.values()):
            if p.vlog is not vlog or not p.chunks.leading(seg.seq):
                continue
            metas = await loop.run_in_executor(store.executor, cold.load, p.uid)
            known = {s.meta.name for s in p.cold_segments.values()}
            last = p.cold.last_of(len(p.cold) - 1) if len(p.cold) else -1
            new = [m for m in metas if m.name not in known and m.last > last]
            new.sort(key=lambda m: m.base)
            loaded = []
            for m in new:
                entries = await loop.run_in_executor(store.executor, cold.read_entries, p.uid, m)
                loaded.append((m, entries))
            if store.partitions.get(p.uid) is not p or not p.chunks.leading(seg.seq):
                continue  # deleted, or moved meanwhile
            for m, entries in loaded:
                keep = [e for e in entries if e[0] > last]
                if not keep or keep[0][0] > max(last + 1, p.chunks.base_of(0)):
                    break  # a gap before it: not ours to bridge
                at = max(p.cold_segments, default=-1) + 1
                p.add_cold_segment(ColdSegment(cold, p.uid, m, at), entries_index(keep))
                last = keep[-1][0] + keep[-1][1]
            k = min(p.chunks.leading(seg.seq), p.chunks.count_through(last))
            if k:
                p.migrate_front(k)
                live = store._live[vlog.name]
                live[seg.seq] = live.get(seg.seq, 0) - k


def _copy_down_up(seg: ColdSegment, target) -> None:
    data = seg.read(0, seg.meta.size)
    if len(data) != seg.meta.size:
        raise ColdTierError(f"{seg}: short read while promoting")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(data)
