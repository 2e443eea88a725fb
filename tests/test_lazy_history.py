"""History costs disk, not memory: sealed indexes, the two-level chunk index, producer snapshots
and the cold tier's indexes read on demand.

In-process LogStores on real files: segments roll small, seals run on the event loop's executor
as in the broker, and each test checks both what memory keeps (runs on disk, dense chunks only for
the active segment), what start-up reads (no sealed segment's ``.idx``, no run), and that every
answer (reads, time lookups, producer duplicates) is the same as with everything in memory, also
when the files on disk are damaged, stale or missing.
"""

from __future__ import annotations

import asyncio
import shutil
import struct
from pathlib import Path

import pytest

from stratalog.records import build_batch
from stratalog.storage import producer_snapshot, sealed_index
from stratalog.storage.chunk_index import RUN_CACHE
from stratalog.storage.journal import FsyncPolicy
from stratalog.storage.log_store import LogStore, StorageConfig
from stratalog.storage.recovery import read_checkpoint
from stratalog.storage.segment import Segment

from .stored import stored_records

PARTS = [("t", 0, 1), ("t", 1, 2), ("t", 2, 3)]
T0 = 1_700_000_000_000


def _store(path: Path, layout: str = "virtual", segment_bytes: int = 1000, **kw) -> LogStore:
    store = LogStore(
        StorageConfig(
            path,
            layout=layout,
            virtual_logs=1,
            fsync=FsyncPolicy.parse("never"),
            segment_bytes=segment_bytes,
            io_threads=2,
            **kw,
        )
    )
    store.open(PARTS)
    return store


def _batch(uid: int, k: int, seq: int, n: int = 2) -> bytes:
    return build_batch(
        [(None, b"u%d-k%d-%d" % (uid, k, j), T0 + k * 10 + j) for j in range(n)],
        producer_id=1000 + uid,
        producer_epoch=0,
        base_sequence=seq,
    )


def _fill(store: LogStore, rounds: int, start: int = 0) -> list[bytes]:
    """Append ``rounds`` batches to each partition (idempotent producer 1000+uid); return the
    last batch of each (for a duplicate check)."""
    last = []
    for k in range(start, start + rounds):
        for uid in (1, 2, 3):
            b = _batch(uid, k, 2 * k)
            store.partitions[uid].append(b)
            if k == start + rounds - 1:
                last.append(b)
    return last


def _values(p) -> list[tuple[int, bytes, int]]:
    """Every record of the partition, read back: (offset, value, timestamp)."""
    return [(r.offset, r.value, r.timestamp) for r in stored_records(p)]


def _producers(store: LogStore) -> dict:
    return {
        uid: {
            pid: (e.epoch, [(b.first_seq, b.last_seq, b.base_offset) for b in e.batches])
            for pid, e in sorted(p.producers.producers.items())
        }
        for uid, p in store.partitions.items()
    }


async def _until_sealed(store: LogStore, timeout: float = 20) -> None:
    """Wait for every sealed segment's chunks to leave memory (their seals run on threads)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        left = [
            p.uid
            for p in store.partitions.values()
            if p.chunks.dense_first_segment not in (None, p.vlog.active.seq)
        ]
        if not left:
            return
        assert loop.time() < deadline, f"partitions {left} keep sealed chunks in memory"
        await asyncio.sleep(0.02)


class _IndexReads:
    """Which segments' ``.idx`` files start-up reads (Segment.read_index)."""

    def __init__(self, monkeypatch) -> None:
        self.seqs: list[int] = []
        real = Segment.read_index

        def counted(seg):
            self.seqs.append(seg.seq)
            return real(seg)

        monkeypatch.setattr(Segment, "read_index", counted)


def _check_same(store: LogStore, values: dict, producers: dict) -> None:
    assert {uid: _values(p) for uid, p in store.partitions.items()} == values
    assert _producers(store) == producers
    for uid, p in store.partitions.items():
        rows = values[uid]
        for off, _v, ts in rows[:: max(1, len(rows) // 7)]:
            assert p.offset_for_timestamp(ts) == (off, ts)
        assert p.max_timestamp() == (rows[-1][0], rows[-1][2])


@pytest.mark.parametrize("layout", ["virtual", "per-partition"])
def test_sealed_segments_leave_memory_and_a_clean_start_reads_no_history(
    tmp_path, monkeypatch, layout
):
    async def first():
        store = _store(tmp_path, layout)
        last = _fill(store, 60)
        await _until_sealed(store)
        for p in store.partitions.values():
            assert p.chunks.runs >= 3, "sealed segments are runs on disk"
            assert p.chunks.in_memory < len(p.chunks) // 3
        values = {uid: _values(p) for uid, p in store.partitions.items()}
        producers = _producers(store)
        for uid, b in zip((1, 2, 3), last, strict=True):  # a retry is still a duplicate
            assert store.partitions[uid].append(b).duplicate_of is not None
        await store.close()
        return values, producers, last

    values, producers, last = asyncio.run(first())
    for d in (tmp_path / "logs").iterdir():
        if d.is_dir():
            assert list(d.glob("*.pix")), f"{d} has no sealed index"
            assert list(d.glob("*.snapshot")), f"{d} has no producer snapshot"

    reads = _IndexReads(monkeypatch)
    RUN_CACHE.clear()
    loads = RUN_CACHE.loads
    store = _store(tmp_path, layout)
    try:
        assert all(r.clean for r in store.recovery.values())
        active = {v.active.seq for v in store.logs.values()}
        assert set(reads.seqs) <= active, "a sealed segment's .idx was read at start-up"
        assert RUN_CACHE.loads == loads, "a run was read at start-up"
        for p in store.partitions.values():
            assert p.chunks.runs >= 3
        _check_same(store, values, producers)
        for uid, b in zip((1, 2, 3), last, strict=True):
            assert store.partitions[uid].append(b).duplicate_of is not None
    finally:
        asyncio.run(store.close())


def test_after_a_crash_start_up_reads_only_past_the_checkpoint(tmp_path, monkeypatch):
    async def first():
        store = _store(tmp_path)
        _fill(store, 50)
        await _until_sealed(store)
        await store.checkpoint()
        _fill(store, 3, start=50)  # past the checkpoint: scanned at the next start
        values = {uid: _values(p) for uid, p in store.partitions.items()}
        producers = _producers(store)
        store.abandon()  # kill -9: nothing closed, no marker, no snapshot at the end
        return values, producers

    values, producers = asyncio.run(first())
    ck_seq, _ck_pos = read_checkpoint(_logdir(tmp_path))
    reads = _IndexReads(monkeypatch)
    store = _store(tmp_path)
    try:
        rep = store.recovery["v0"]
        assert not rep.clean and rep.scanned_bytes > 0
        assert reads.seqs and all(s >= ck_seq for s in reads.seqs), (reads.seqs, ck_seq)
        _check_same(store, values, producers)
    finally:
        asyncio.run(store.close())


def _logdir(tmp_path: Path) -> Path:
    return tmp_path / "logs" / "v0"


def test_damaged_stale_or_missing_sealed_indexes_are_rebuilt(tmp_path, caplog):
    async def first():
        store = _store(tmp_path)
        _fill(store, 60)
        await _until_sealed(store)
        values = {uid: _values(p) for uid, p in store.partitions.items()}
        producers = _producers(store)
        await store.close()
        return values, producers

    values, producers = asyncio.run(first())
    d = _logdir(tmp_path)
    pix = sorted(d.glob("*.pix"))
    assert len(pix) >= 4
    # Table damaged (found at start), one missing, one another segment's (stale), and one
    # whose run is damaged (found when read).
    raw = bytearray(pix[0].read_bytes())
    raw[sealed_index.HEADER.size + 5] ^= 0x40
    pix[0].write_bytes(bytes(raw))
    pix[1].unlink()
    shutil.copy(pix[3], pix[2])
    si = sealed_index.load(pix[3])
    row = si.rows[2]
    raw = bytearray(pix[3].read_bytes())
    raw[row.at + 3] ^= 0x01
    pix[3].write_bytes(bytes(raw))

    RUN_CACHE.clear()
    store = _store(tmp_path)
    try:
        for f in pix[:3]:
            assert sealed_index.load(f) is not None  # written again at start-up
        _check_same(store, values, producers)
        assert "header or table fails its CRC" in caplog.text
        assert "rebuilding it from its segment's frames" in caplog.text
        assert len(sealed_index.read_run(pix[3], *_row3(pix[3]))), "rebuilt when read"
    finally:
        asyncio.run(store.close())


def _row3(path: Path) -> tuple[int, int, int]:
    r = sealed_index.load(path).rows[2]
    return r.at, r.count, r.crc


def test_producer_snapshots_damaged_or_past_the_end_are_not_believed(tmp_path):
    async def fill(rounds: int, start: int, close: bool):
        store = _store(tmp_path)
        _fill(store, rounds, start)
        await _until_sealed(store)
        producers = _producers(store)
        if close:
            await store.close()
        else:
            store.abandon()
        return producers

    producers = asyncio.run(fill(40, 0, close=True))
    d = _logdir(tmp_path)
    snaps = producer_snapshot.listed(d)
    assert len(snaps) == producer_snapshot.KEEP
    # The newest damaged: the older one and the entries after it give the same state.
    raw = bytearray(snaps[0].read_bytes())
    raw[-3] ^= 0x10
    snaps[0].write_bytes(bytes(raw))
    store = _store(tmp_path)
    try:
        assert _producers(store) == producers
    finally:
        asyncio.run(store.close())
    # Every snapshot damaged: rebuilt from every entry (and a snapshot written again).
    for s in producer_snapshot.listed(d):
        s.write_bytes(b"SLPS" + b"\0" * 40)
    store = _store(tmp_path)
    try:
        assert _producers(store) == producers
    finally:
        asyncio.run(store.close())
    assert producer_snapshot.load_newest(d, (1 << 62, 0), 0) is not None

    # A power cut takes back the log's last bytes after a clean stop wrote a snapshot there:
    # that snapshot describes batches that are gone, so it must not be believed (a retry of a
    # lost batch is appended again, not answered as a duplicate).
    asyncio.run(fill(2, 40, close=True))
    active = max(d.glob("*.log"))
    store = _store(tmp_path)
    end_before = store.partitions[1].next_offset
    asyncio.run(store.close())
    size = active.stat().st_size
    frames = []
    pos = 0
    data = active.read_bytes()
    while pos < size:
        (blen,) = struct.unpack_from(">i", data, pos + 8 + 8)
        frames.append(pos)
        pos += 8 + blen + 12
    cut_at = frames[-1]  # the last frame (uid 3's last batch) goes
    with open(active, "r+b") as f:
        f.truncate(cut_at)
    (d / ".clean-shutdown").unlink()
    store = _store(tmp_path)
    try:
        p3 = store.partitions[3]
        assert store.partitions[1].next_offset == end_before
        lost = _batch(3, 41, 82)
        res = p3.append(lost)
        assert res.duplicate_of is None and res.base_offset == p3.next_offset - 2
    finally:
        asyncio.run(store.close())


def test_truncation_into_sealed_segments_reads_their_runs_first(tmp_path):
    async def run():
        store = _store(tmp_path)
        _fill(store, 60)
        await _until_sealed(store)
        vlog = store.logs["v0"]
        sealed = sorted(s for s in vlog.segments if s != vlog.active.seq)
        seq = sealed[len(sealed) // 2]
        entries = vlog.segments[seq].read_index()
        cut = entries[len(entries) // 2]
        position = cut.position - 8
        keep = {
            uid: [
                v
                for v in _values(p)
                if v[0] < p.chunks[p.chunks.count_before_location(seq, cut.position)].base_offset
            ]
            for uid, p in store.partitions.items()
        }
        store.truncate_log("v0", seq, position)
        assert not (vlog.segments[seq].pix_path).exists()
        got = {uid: _values(p) for uid, p in store.partitions.items()}
        await store.close()
        return keep, got

    keep, got = asyncio.run(run())
    assert got == keep
    store = _store(tmp_path)
    try:
        assert {uid: _values(p) for uid, p in store.partitions.items()} == keep
    finally:
        asyncio.run(store.close())


def test_cold_indexes_are_read_on_demand_and_rebuilt_when_wrong(tmp_path, monkeypatch):
    from stratalog.storage.cold_tier import ColdStore
    from stratalog.storage.tiering import Migrator, TierSettings

    cold_dir = tmp_path / "cold"

    async def first():
        store = _store(tmp_path, cold_location=str(cold_dir))
        _fill(store, 60)
        await _until_sealed(store)
        migrator = Migrator(store, TierSettings(threads=1), lambda: {})
        try:
            vlog = store.logs["v0"]
            for _ in range(3):
                await migrator.migrate(vlog, vlog.oldest_sealed())
        finally:
            migrator.close()
        for p in store.partitions.values():
            assert p.cold.runs == 3 and p.cold.in_memory == 0
        values = {uid: _values(p) for uid, p in store.partitions.items()}
        producers = _producers(store)
        await store.close()
        return values, producers

    values, producers = asyncio.run(first())
    reads: list[str] = []
    real = ColdStore.read_index_bytes

    def counted(self, uid, meta):
        reads.append(meta.name)
        return real(self, uid, meta)

    monkeypatch.setattr(ColdStore, "read_index_bytes", counted)
    RUN_CACHE.clear()
    store = _store(tmp_path, cold_location=str(cold_dir))
    try:
        assert reads == [], "a cold index was read at start-up"
        assert all(p.cold.runs == 3 for p in store.partitions.values())
        _check_same(store, values, producers)
        assert len(reads) >= 3  # read when the reads reached them
    finally:
        asyncio.run(store.close())

    # A cold index cut short, and one whose entries were shuffled: rebuilt from the batches.
    idx = sorted(cold_dir.glob("p1/*.idx"))
    idx[0].write_bytes(idx[0].read_bytes()[:-10])
    raw = idx[1].read_bytes()
    half = (len(raw) // 46 // 2) * 46
    idx[1].write_bytes(raw[half:] + raw[:half])
    RUN_CACHE.clear()
    store = _store(tmp_path, cold_location=str(cold_dir))
    try:
        _check_same(store, values, producers)
    finally:
        asyncio.run(store.close())
    assert scrub_clean(tmp_path, cold_dir)


def scrub_clean(data: Path, cold: Path) -> bool:
    from stratalog.storage import scrub

    bad = [f for f in scrub.run(scrub.plan(data, cold=cold)) if f.status != scrub.OK]
    assert not bad, bad[:3]
    return True


def test_what_start_up_keeps_in_memory_does_not_grow_with_history(tmp_path):
    """Four times the history costs start-up memory per sealed segment (its handle, paths and
    one run summary per partition in it: about 2 KiB), not per chunk: with 32 kB segments of
    about 300 chunks that is under 12 bytes per chunk, where an index in memory costs 56 and
    more (with 128 MiB segments, a hundredth of a byte)."""
    import gc
    import tracemalloc

    data = tmp_path / "d"

    async def fill(rounds: int, start: int) -> None:
        store = _store(data, segment_bytes=32_000)
        _fill(store, rounds, start)
        for v in store.logs.values():
            v.roll()  # the active segment empty: history is all that differs
        await _until_sealed(store)
        await store.close()

    def measure() -> tuple[int, int]:
        gc.collect()
        tracemalloc.start()
        store = _store(data, segment_bytes=32_000)
        gc.collect()
        used = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
        chunks = sum(len(p.chunks) for p in store.partitions.values())
        assert all(p.chunks.in_memory == 0 for p in store.partitions.values())
        asyncio.run(store.close())
        return used, chunks

    asyncio.run(fill(1000, 0))
    small, n_small = measure()
    asyncio.run(fill(3000, 1000))
    large, n_large = measure()
    assert n_large == 4 * n_small
    per_chunk = (large - small) / (n_large - n_small)
    assert per_chunk < 12, f"{per_chunk:.1f} bytes of memory per chunk of history"
