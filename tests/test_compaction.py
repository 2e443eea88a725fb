"""Log compaction in storage (storage/compaction.py, storage/cleaner.py), in-process LogStores on
real files and a real cleaner worker process: each key's latest value stays at its original
offset, superseded records, aborted transactions' records and expired tombstones go, recent
records (min.compaction.lag.ms) and the active segment stay, in both layouts and across a cold
tier, and a reopened store (clean stop or abandoned, as after a crash) reads the same."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from stratalog.records import GZIP, build_batch, iter_records
from stratalog.storage import compaction, scrub
from stratalog.storage.batch import parse_header
from stratalog.storage.cleaner import Cleaner, CleanerSettings, CompactionPolicy, plan
from stratalog.storage.cold_tier import ColdTierError
from stratalog.storage.journal import FsyncPolicy
from stratalog.storage.log_store import LogStore, StorageConfig
from stratalog.storage.tiering import Migrator, TierSettings
from stratalog.storage.txn_index import TRANSACTIONAL_PRODUCER_IDS, marker_batch

from .stored import stored_records

PARTS = [("t", 0, 1), ("t", 1, 2)]
T0 = 1_700_000_000_000
HOUR = 3600 * 1000
EAGER = CompactionPolicy(min_cleanable_dirty_ratio=0.0, delete_retention_ms=HOUR)


def _store(path: Path, layout: str = "virtual", **kw) -> LogStore:
    store = LogStore(
        StorageConfig(
            path,
            layout=layout,
            virtual_logs=1,
            fsync=FsyncPolicy.parse("never"),
            segment_bytes=kw.pop("segment_bytes", 4000),
            io_threads=2,
            **kw,
        )
    )
    store.open(PARTS)
    return store


def _read(p) -> list[tuple[int, bytes | None, bytes | None, int]]:
    """Every record from the log start: (offset, key, value, timestamp); transaction markers
    are skipped, as consumers skip them."""
    return [(r.offset, r.key, r.value, r.timestamp) for r in stored_records(p, controls=False)]


async def _settled(store: LogStore) -> None:
    """Every append durable (high watermark at the end), then a roll: all sealed."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 20
    while any(p.high_watermark < p.next_offset for p in store.partitions.values()):
        assert loop.time() < deadline, "appends never became durable"
        await asyncio.sleep(0.01)


async def _roll(store: LogStore) -> None:
    await _settled(store)
    for vlog in store.logs.values():
        if vlog.active.size:
            vlog.roll()
    await _settled(store)


def _write(p, rounds: int, keys: int, start: int = 0, *, ts=None, tombstone=None, codec=0):
    """``rounds`` batches of ``keys`` records (keys k0.., value r<round>-k<key>); returns the
    records written as (offset, key, value, timestamp)."""
    out = []
    for r in range(start, start + rounds):
        recs = []
        for k in range(keys):
            key = b"k%d" % k
            value = None if tombstone is not None and tombstone(r, k) else b"r%d-k%d" % (r, k)
            stamp = (ts(r) if ts else T0 + r * 10) + k
            recs.append((key, value, stamp))
        res = p.append(build_batch(recs, compression=codec))
        out += [(res.base_offset + i, *recs[i]) for i in range(len(recs))]
    return out


def _compacted(records, limit: int):
    """The model: below ``limit`` each key's last record, the rest as written."""
    last: dict = {}
    for off, key, _v, _t in records:
        if off < limit:
            last[key] = off
    return [r for r in records if r[0] >= limit or last[r[1]] == r[0]]


def _cleaner(store: LogStore, **kw) -> Cleaner:
    return Cleaner(store, CleanerSettings(**kw))


@pytest.mark.parametrize("layout", ["virtual", "per-partition"])
def test_compaction_keeps_each_keys_latest_value_at_its_offset(tmp_path, layout):
    async def run():
        store = _store(tmp_path, layout)
        cleaner = _cleaner(store)
        try:
            p, other = store.partitions[1], store.partitions[2]
            written = _write(p, 40, 5, tombstone=lambda r, k: k == 4 and r == 39)
            other_written = _write(other, 10, 3)
            await _roll(store)
            tail = _write(p, 3, 5, start=40)  # in the active segment: not cleaned
            await _settled(store)
            before = _read(p)
            assert before == written + tail
            assert await cleaner.clean(p, EAGER, T0)
            after = _read(p)
            limit = tail[0][0]
            assert after == _compacted(written + tail, limit)
            offsets = [r[0] for r in after]
            assert offsets == sorted(set(offsets))
            # Each key's last value below the limit, at its original offset; the tombstone
            # (younger than delete.retention.ms) is kept.
            assert [r for r in after if r[0] < limit] == [
                r for r in written if r[0] >= written[-5][0]
            ]
            assert after[4][2] is None
            assert _read(other) == other_written  # other partitions untouched
            assert cleaner.cleaned(p.uid) == limit
            # Superseded hot segments are gone once no partition refers to them (virtual:
            # the other partition still holds its chunks in them).
            assert p.chunks.first_offset == limit
            # Nothing new is dirty: no second cleaning.
            assert plan(p, EAGER, cleaner.cleaned(p.uid), T0) is None
            expect = _read(p)
        finally:
            cleaner.close()
            await store.close()
        store = _store(tmp_path, layout)
        try:
            assert _read(store.partitions[1]) == expect
            assert _read(store.partitions[2]) == other_written
            assert store.partitions[1].next_offset == tail[-1][0] + 1
        finally:
            await store.close()
        # The offline scrub finds the compacted segments sound (gaps and all).
        found = scrub.run(scrub.plan(tmp_path))
        assert any("compacted" in f.path and f.kind == "cold-segment" for f in found)
        assert [f for f in found if f.status != scrub.OK] == []

    asyncio.run(run())


@pytest.mark.parametrize("layout", ["virtual", "per-partition"])
def test_repeated_compaction_and_reopen_after_abandon(tmp_path, layout):
    """Cleaning again takes in the new dirty records; an abandoned store (as after kill -9)
    reopens with the same reads, the replaced hot chunks not coming back."""

    async def run():
        store = _store(tmp_path, layout)
        cleaner = _cleaner(store)
        try:
            p = store.partitions[1]
            written = _write(p, 20, 4, codec=GZIP)
            await _roll(store)
            assert await cleaner.clean(p, EAGER, T0)
            written += _write(p, 20, 4, start=20)
            await _roll(store)
            assert await cleaner.clean(p, EAGER, T0)
            after = _read(p)
            assert after == _compacted(written, written[-1][0] + 1)
            assert [r[2] for r in after] == [b"r39-k%d" % k for k in range(4)]
            p.append(build_batch([(b"k0", b"new", T0 + 999)]))
            await _settled(store)
            expect = _read(p)
            store.abandon()
        except BaseException:
            store.abandon()
            raise
        finally:
            cleaner.close()
        store = _store(tmp_path, layout)
        try:
            assert _read(store.partitions[1]) == expect
            assert store.partitions[1].next_offset == expect[-1][0] + 1
        finally:
            await store.close()

    asyncio.run(run())


def test_tombstones_go_after_delete_retention_and_keep_timestamps(tmp_path):
    async def run():
        store = _store(tmp_path)
        cleaner = _cleaner(store)
        try:
            p = store.partitions[1]
            policy = CompactionPolicy(min_cleanable_dirty_ratio=0.0, delete_retention_ms=1000)
            written = _write(p, 5, 3, tombstone=lambda r, k: r == 4 and k == 1)
            await _roll(store)
            assert await cleaner.clean(p, policy, T0)
            first = _read(p)
            assert first == _compacted(written, written[-1][0] + 1)
            tomb = [r for r in first if r[2] is None]
            assert len(tomb) == 1 and tomb[0][3] == written[-2][3]  # its timestamp is kept
            # The first cleaning stamped its batch with the delete horizon (KIP-534).
            batch = p.batch_at(tomb[0][0])
            h = parse_header(batch)
            assert h.attributes & compaction.DELETE_HORIZON_MASK
            assert h.base_timestamp == T0 + 1000
            more = _write(p, 1, 1, start=5)  # something dirty, so it is cleaned again
            await _roll(store)
            assert await cleaner.clean(p, policy, T0 + 999)
            assert [r for r in _read(p) if r[2] is None] == tomb  # not yet
            more += _write(p, 1, 1, start=6)
            await _roll(store)
            assert await cleaner.clean(p, policy, T0 + 1000)
            after = _read(p)
            assert [r for r in after if r[2] is None] == []
            assert after == [r for r in _compacted(written + more, more[-1][0] + 1) if r[2]]
        finally:
            cleaner.close()
            await store.close()

    asyncio.run(run())


def test_min_compaction_lag_keeps_recent_records(tmp_path):
    async def run():
        store = _store(tmp_path)
        cleaner = _cleaner(store)
        try:
            p = store.partitions[1]
            old = _write(p, 10, 3)
            recent = _write(p, 10, 3, start=10, ts=lambda r: T0 + 2 * HOUR + r)
            await _roll(store)
            policy = CompactionPolicy(min_cleanable_dirty_ratio=0.0, min_compaction_lag_ms=HOUR)
            now = T0 + 2 * HOUR + 30 * 60 * 1000  # the recent ones are 30 minutes old
            assert await cleaner.clean(p, policy, now)
            assert _read(p) == _compacted(old + recent, recent[0][0])
            # An hour later they are cleanable too.
            assert await cleaner.clean(p, policy, now + HOUR)
            assert _read(p) == _compacted(old + recent, recent[-1][0] + 1)
        finally:
            cleaner.close()
            await store.close()

    asyncio.run(run())


def test_dirty_ratio_and_max_lag_decide_when(tmp_path):
    async def run():
        store = _store(tmp_path)
        cleaner = _cleaner(store)
        try:
            p = store.partitions[1]
            _write(p, 10, 20)
            await _roll(store)
            lazy = CompactionPolicy(min_cleanable_dirty_ratio=0.5)
            assert [c[0].uid for c in cleaner.candidates({1: lazy}, T0)] == [1]
            assert await cleaner.step({1: lazy}, T0) == 1
            _write(p, 1, 1, start=10)  # a little dirt over a clean log: below 0.5
            await _roll(store)
            pl = plan(p, lazy, cleaner.cleaned(1), T0)
            assert pl is not None and 0 < pl.dirty_ratio < 0.5
            assert cleaner.candidates({1: lazy}, T0) == []
            # ... unless the dirt is older than max.compaction.lag.ms
            overdue = CompactionPolicy(min_cleanable_dirty_ratio=0.5, max_compaction_lag_ms=1000)
            assert cleaner.candidates({1: overdue}, T0 + 500) == []
            assert await cleaner.step({1: overdue}, T0 + 5000) == 1
        finally:
            cleaner.close()
            await store.close()

    asyncio.run(run())


def test_aborted_transactions_are_removed_and_never_supersede(tmp_path):
    async def run():
        store = _store(tmp_path)
        cleaner = _cleaner(store)
        try:
            p = store.partitions[1]
            pid = TRANSACTIONAL_PRODUCER_IDS + 7
            committed = _write(p, 1, 2)  # k0, k1 plain
            seq = 0

            def txn(values, commit: bool):
                nonlocal seq
                b = build_batch(
                    [(b"k%d" % i, v, T0 + 100 + i) for i, v in enumerate(values)],
                    producer_id=pid,
                    producer_epoch=0,
                    base_sequence=seq,
                    transactional=True,
                )
                seq += len(values)
                res = p.append(b)
                p.append(marker_batch(pid, 0, commit, 0, T0 + 200), markers=True)
                return [(res.base_offset + i, b"k%d" % i, v) for i, v in enumerate(values)]

            ok = txn([b"c0"], True)  # supersedes k0
            txn([b"a0", b"a1"], False)  # aborted: must not supersede anything
            await _roll(store)
            assert p.txns.aborted_count == 1
            assert await cleaner.clean(p, EAGER, T0)
            after = [(o, k, v) for o, k, v, _t in _read(p)]
            assert after == [(committed[1][0], b"k1", b"r0-k1"), ok[0]]
            # The markers are kept: the transaction index rebuilt at the next start agrees.
            await store.close()
            store2 = _store(tmp_path)
            p2 = store2.partitions[1]
            assert [(o, k, v) for o, k, v, _t in _read(p2)] == after
            assert p2.last_stable_offset == p2.high_watermark
            await store2.close()
        finally:
            cleaner.close()
            if not store.partitions[1].deleted and store._lock_fd is not None:
                await store.close()

    asyncio.run(run())


def test_compaction_across_a_cold_tier(tmp_path):
    """Migrated cold segments and hot chunks are cleaned together into the cold tier."""

    async def run():
        store = _store(tmp_path / "hot", cold_location=str(tmp_path / "cold"))
        migrator = Migrator(store, TierSettings(threads=1), lambda: {})
        cleaner = _cleaner(store)
        try:
            p = store.partitions[1]
            written = _write(p, 30, 4)
            await _roll(store)
            for vlog in list(store.logs.values()):
                while (seg := vlog.oldest_sealed()) is not None:
                    await migrator.migrate(vlog, seg)
            assert len(p.cold) and not len(p.chunks)
            written += _write(p, 10, 4, start=30)
            await _roll(store)
            assert len(p.chunks)
            assert await cleaner.clean(p, EAGER, T0)
            assert _read(p) == _compacted(written, written[-1][0] + 1)
            assert not len(p.chunks)
            manifests = list((tmp_path / "cold" / "p1").glob("manifest-*.json"))
            assert len(manifests) == 1
            doc = json.loads(manifests[0].read_text())
            assert doc["cleaned"] == written[-1][0] + 1
            assert not (tmp_path / "hot" / "compacted" / "p1").exists()
            expect = _read(p)
        finally:
            cleaner.close()
            migrator.close()
            await store.close()
        store = _store(tmp_path / "hot", cold_location=str(tmp_path / "cold"))
        try:
            assert _read(store.partitions[1]) == expect
        finally:
            await store.close()

    asyncio.run(run())


def test_leftovers_of_an_interrupted_compaction_are_removed(tmp_path):
    """Segments written but never named in a manifest (a kill before the switch) go at start;
    the partition reads as before."""

    async def run():
        store = _store(tmp_path)
        cleaner = _cleaner(store)
        p = store.partitions[1]
        written = _write(p, 10, 2)
        await _roll(store)
        assert await cleaner.clean(p, EAGER, T0)
        expect = _read(p)
        cleaner.close()
        await store.close()
        d = tmp_path / "logs" / "compacted" / "p1"
        (d / "00000000000000000003-deadbeef.log").write_bytes(b"x" * 100)
        (d / "00000000000000000003-deadbeef.idx").write_bytes(b"y" * 44)
        store = _store(tmp_path)
        try:
            assert _read(store.partitions[1]) == expect == _compacted(written, 1 << 40)
            assert not (d / "00000000000000000003-deadbeef.log").exists()
        finally:
            await store.close()
        # A cold tier added later would not hold them: refused rather than lost.
        with pytest.raises(ColdTierError, match="compacted partitions"):
            _store(tmp_path, cold_location=str(tmp_path / "cold"))

    asyncio.run(run())


def test_rewritten_batch_keeps_offsets_and_timestamps():
    recs = [(b"a", b"1", T0 + 5), (b"b", b"2", T0 + 1), (b"a", None, T0 + 9)]
    for codec in (0, GZIP, 2, 3, 4):
        batch = build_batch(recs, base_offset=100, compression=codec, producer_id=5,
                            producer_epoch=1, base_sequence=10)  # fmt: skip
        h = parse_header(batch)
        raw = compaction.records_of(h, batch)
        out = compaction.rebuild_batch(h, batch, [raw[1], raw[2]], horizon=T0 + 50)
        nh = parse_header(out)
        assert (nh.base_offset, nh.last_offset_delta, nh.record_count) == (100, 2, 2)
        assert (nh.producer_id, nh.producer_epoch, nh.base_sequence) == (5, 1, 10)
        assert nh.attributes & compaction.DELETE_HORIZON_MASK and nh.base_timestamp == T0 + 50
        assert nh.max_timestamp == T0 + 9
        got = [(r.offset, r.key, r.value, r.timestamp) for r in iter_records(out)]
        assert got == [(101, b"b", b"2", T0 + 1), (102, b"a", None, T0 + 9)]
        empty = compaction.empty_batch(h)
        eh = parse_header(empty)
        assert (eh.record_count, eh.last_offset_delta, eh.compression) == (0, 2, 0)
        assert list(iter_records(empty)) == []


def test_java_framed_snappy_stays_java_framed():
    """A Java producer's snappy batches use SnappyOutputStream's framing: kept in it."""
    recs = [(b"a", b"1" * 50, T0), (b"b", b"2" * 50, T0 + 1)]
    plain = build_batch(recs, base_offset=7)
    h = parse_header(plain)
    framed = compaction._frame_xerial(plain[61:])
    batch = compaction._assemble(
        h, h.attributes | 2, h.base_timestamp, h.max_timestamp, h.record_count, framed
    )
    h = parse_header(batch)
    raw = compaction.records_of(h, batch)
    out = compaction.rebuild_batch(h, batch, [raw[1]], horizon=None)
    assert out[61 : 61 + 8] == b"\x82SNAPPY\x00"
    assert [(r.offset, r.key) for r in iter_records(out)] == [(8, b"b")]


def test_a_partition_changed_during_a_cleaning_keeps_its_data(tmp_path, monkeypatch):
    """DeleteRecords drops the first chunks while the worker runs: the result is dropped (its
    files too), nothing is lost, and the next cleaning goes through."""
    monkeypatch.setenv("STRATALOG_COMPACTION_PAUSE_MS", "1500")  # read by the spawned worker

    async def run():
        store = _store(tmp_path)
        cleaner = _cleaner(store)
        try:
            p = store.partitions[1]
            written = _write(p, 10, 3)
            await _roll(store)
            job = asyncio.ensure_future(cleaner.clean(p, EAGER, T0))
            await asyncio.sleep(1.0)
            start = written[6][0]
            assert store.delete_records(1, start) > 0
            assert await job is False
            assert cleaner.stats.discarded == 1
            assert not list((tmp_path / "logs" / "compacted" / "p1").glob("*.log"))
            assert _read(p) == [r for r in written if r[0] >= start]
            assert await cleaner.clean(p, EAGER, T0)
            assert _read(p) == _compacted([r for r in written if r[0] >= start], 1 << 40)
        finally:
            cleaner.close()
            await store.close()

    asyncio.run(run())


def test_the_cleaners_rate_is_the_brokers_to_steer_while_it_runs(tmp_path):
    """The worker process reads the rate its broker steers (``Cleaner.rate``, shared memory) at
    every read and write, and says when it waits for it: at a slow rate it is held back, and
    the same cleaning, let go mid-way, ends with the right records. FsyncGuidedRate steers
    that rate as it steers backlog reads: it grows only while the worker waits."""
    import time

    from stratalog.storage.throttle import FsyncGuidedRate

    async def run():
        store = _store(tmp_path, segment_bytes=64_000)
        cleaner = _cleaner(store)
        try:
            p = store.partitions[1]
            written = []
            for r in range(60):  # ~600 KB: at 20 KB/s it would take half a minute
                recs = [(b"k%d" % k, b"r%d-" % r + b"x" * 1000, T0 + r * 10 + k) for k in range(10)]
                res = p.append(build_batch(recs))
                written += [(res.base_offset + i, *recs[i]) for i in range(len(recs))]
            await _roll(store)
            pacer = FsyncGuidedRate(cleaner.rate, target=0.002, floor=20_000, ceiling=10**9)
            assert cleaner.rate.rate == 20_000
            assert pacer.tick(0.0005) == 20_000  # nobody waits for it: no growth
            task = asyncio.ensure_future(cleaner.clean(p, EAGER, T0))
            deadline = time.monotonic() + 30
            while not cleaner.rate.waiting(time.monotonic()):
                assert not task.done(), "the cleaning ended without waiting for its rate"
                assert time.monotonic() < deadline, "the worker never waited for its rate"
                await asyncio.sleep(0.02)
            assert pacer.tick(0.0005) == 20_000 + FsyncGuidedRate.MIN_STEP  # held back: grows
            # The journal slowed down: halve, down to the floor.
            assert pacer.tick(0.01) == (20_000 + FsyncGuidedRate.MIN_STEP) // 2
            for _ in range(8):
                pacer.tick(0.01)
            assert cleaner.rate.rate == 20_000
            cleaner.rate.set_rate(0)  # unlimited: the worker goes on at once
            assert await asyncio.wait_for(task, 60)
            assert _read(p) == _compacted(written, cleaner.cleaned(p.uid))
            assert cleaner.cleaned(p.uid) > written[0][0]
        finally:
            cleaner.close()
            await store.close()

    asyncio.run(run())


@pytest.mark.parametrize("sched_idle", [False, True])
def test_the_cleaners_worker_runs_below_the_broker(tmp_path, sched_idle):
    """log.cleaner.priority: the worker process at nice +10 (low, the default) or in the
    SCHED_IDLE class (idle), as the kernel reports it while the worker lives."""
    import os

    async def run():
        store = _store(tmp_path)
        cleaner = _cleaner(store, sched_idle=sched_idle)
        try:
            p = store.partitions[1]
            written = _write(p, 20, 5)
            await _roll(store)
            assert await cleaner.clean(p, EAGER, T0)
            assert _read(p) == _compacted(written, cleaner.cleaned(p.uid))
            pids = list(cleaner._pool._processes)  # type: ignore[union-attr]
            assert pids
            for pid in pids:
                policy = os.sched_getscheduler(pid)
                if sched_idle:
                    assert policy == os.SCHED_IDLE
                else:
                    assert policy == os.SCHED_OTHER
                    assert os.getpriority(os.PRIO_PROCESS, pid) >= 10
        finally:
            cleaner.close()
            await store.close()

    asyncio.run(run())
