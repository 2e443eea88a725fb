"""Property tests of the storage engine: chunk index, segment rolling, recovery, batch checks.

Everything runs on real files in temporary directories; hypothesis picks the shapes (chunk sizes,
timestamps, batch sizes, segment.bytes, where a byte gets corrupted) and compares the engine with
a brute-force model.
"""

from __future__ import annotations

import asyncio
import struct
import tempfile
from contextlib import contextmanager
from pathlib import Path

import pytest
from crc32c import crc32c
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from stratalog.records import GZIP, NONE, build_batch, iter_records
from stratalog.storage.batch import (
    HEADER_SIZE,
    CorruptBatchError,
    parse_header,
    split_batches,
    validate_batch,
)
from stratalog.storage.chunk_index import RUN_CACHE, ChunkIndex, Columns
from stratalog.storage.journal import FsyncPolicy
from stratalog.storage.log_store import LogStore, StorageConfig
from stratalog.storage.partition import FileSlice
from stratalog.storage.segment import FRAME_SIZE

FAST = settings(
    max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow], database=None
)
FILES = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow], database=None
)


# -- ChunkIndex ---------------------------------------------------------------------------------
chunk_st = st.tuples(
    st.integers(0, 3),  # gap before the chunk (offsets removed, e.g. by an earlier truncation)
    st.integers(1, 6),  # records in the chunk
    st.integers(70, 5000),  # size in bytes
    st.integers(-5, 200),  # max timestamp, not necessarily in order
)


def _build(specs, start: int = 0):
    idx = ChunkIndex()
    model = []  # (base, last, seg, pos, size, maxts)
    nxt = start
    for i, (gap, n, size, ts) in enumerate(specs):
        base = nxt + gap
        row = (base, base + n - 1, i // 3, i * 100, size, ts)
        idx.append(*row)
        model.append(row)
        nxt = base + n
    return idx, model


def _brute_locate(model, offset: int) -> int:
    return next((i for i, r in enumerate(model) if r[1] >= offset), len(model))


def _brute_locate_time(model, t: int) -> int:
    return next((i for i, r in enumerate(model) if r[5] >= t), len(model))


def _check_index(idx: ChunkIndex, model) -> None:
    assert len(idx) == len(model)
    assert [tuple(vars_of(idx[i])) for i in range(len(idx))] == model
    if not model:
        assert idx.first_offset is None and idx.next_offset is None
        assert idx.locate(0) == 0 and idx.locate_time(0) == 0
        return
    assert idx.first_offset == model[0][0]
    assert idx.next_offset == model[-1][1] + 1
    assert idx.total_bytes() == sum(r[4] for r in model)
    for o in range(model[0][0] - 2, model[-1][1] + 3):
        i = idx.locate(o)
        assert i == _brute_locate(model, o), f"locate({o})"
        if i < len(model) and model[i][0] <= o:
            assert idx.base_of(i) <= o <= idx.last_of(i)
    times = {r[5] + d for r in model for d in (-1, 0, 1)} | {-100, 10_000}
    for t in sorted(times):
        assert idx.locate_time(t) == _brute_locate_time(model, t), f"locate_time({t})"


def vars_of(loc):
    return (
        loc.base_offset,
        loc.last_offset,
        loc.segment,
        loc.position,
        loc.size,
        loc.max_timestamp,
    )


@FAST
@given(st.lists(chunk_st, max_size=30), st.integers(0, 1000))
def test_chunk_index_locate_and_locate_time_match_a_scan(specs, start):
    idx, model = _build(specs, start)
    _check_index(idx, model)


@FAST
@given(st.lists(chunk_st, min_size=1, max_size=20))
def test_chunk_index_refuses_overlapping_chunks(specs):
    idx, model = _build(specs)
    last = model[-1][1]
    for base in (last, last - 1, model[0][0]):
        with pytest.raises(ValueError):
            idx.append(base, base + 1, 0, 0, 100, 0)
    _check_index(idx, model)


@FAST
@given(st.lists(chunk_st, min_size=1, max_size=20))
def test_chunk_index_refuses_a_chunk_in_an_earlier_segment(specs):
    """Segments only grow along the index: the bulk operations bisect them."""
    idx, model = _build(specs)
    last_seg = model[-1][2]
    nxt = model[-1][1] + 1
    if last_seg > 0:
        with pytest.raises(ValueError, match="segment"):
            idx.append(nxt, nxt, last_seg - 1, 0, 100, 0)
        piece = ChunkIndex.from_columns([nxt], [nxt], [0], [100], [0])
        with pytest.raises(ValueError, match="segment"):
            idx.extend(piece, last_seg - 1)
    with pytest.raises(ValueError, match="follow"):
        idx.extend(ChunkIndex.from_columns([nxt - 1], [nxt], [0], [100], [0]), last_seg)
    with pytest.raises(ValueError, match="out of order"):
        ChunkIndex.from_columns([nxt, nxt], [nxt, nxt + 1], [0, 1], [1, 1], [0, 0])
    _check_index(idx, model)


class ChunkIndexMachine(RuleBasedStateMachine):
    """Appends, migrated pieces (extend), retention and migration (drop_front) and recovery
    truncation (drop_back) in any order."""

    def __init__(self) -> None:
        super().__init__()
        self.idx = ChunkIndex()
        self.model: list[tuple] = []
        self.next = 0
        self.n = 0

    @rule(spec=chunk_st)
    def append(self, spec) -> None:
        gap, n, size, ts = spec
        base = self.next + gap
        row = (base, base + n - 1, self.n // 3, self.n * 100, size, ts)
        self.n += 1
        self.idx.append(*row)
        self.model.append(row)
        self.next = base + n

    @precondition(lambda self: self.model)
    @rule(data=st.data())
    def drop_front(self, data) -> None:
        k = data.draw(st.integers(0, len(self.model)))
        self.idx.drop_front(k)
        del self.model[:k]

    @rule(specs=st.lists(chunk_st, max_size=8), data=st.data())
    def extend(self, specs, data) -> None:
        """A migrated cold segment's chunks join at once, from the first one kept on."""
        rows = []
        nxt = self.next
        for gap, n, size, ts in specs:
            base = nxt + gap
            rows.append((base, base + n - 1, len(rows) * 100, size, ts))
            nxt = base + n
        cols = [[r[c] for r in rows] for c in range(5)]
        piece = ChunkIndex.from_columns(*cols)
        start = data.draw(st.integers(0, len(rows)))
        seg = self.n // 3 + data.draw(st.integers(0, 2))
        self.n = seg * 3 + 1
        self.idx.extend(piece, seg, start)
        kept = [(b, la, seg, pos, size, ts) for b, la, pos, size, ts in rows[start:]]
        self.model.extend(kept)
        if kept:
            self.next = kept[-1][1] + 1

    @precondition(lambda self: self.model)
    @rule(data=st.data())
    def drop_back(self, data) -> None:
        keep = data.draw(st.integers(0, len(self.model)))
        self.idx.drop_back(keep)
        del self.model[keep:]
        # Appends continue after what is left (the recovered end of the log).
        self.next = self.model[-1][1] + 1 if self.model else self.next

    @precondition(lambda self: self.model)
    @rule(extra=st.integers(0, 2))
    def seal(self, extra) -> None:
        """The first segment in memory gets its sealed index: its chunks become a run on
        "disk", whose first ``extra`` entries were dropped before (retention, migration)."""
        idx = self.idx
        k = idx.lazy_chunks
        if k >= len(self.model):
            return
        seg = self.model[k][2]
        rows = [r for r in self.model[k:] if r[2] == seg]
        fake = [
            (rows[0][0] - 10 * (extra - e), rows[0][0] - 10 * (extra - e), seg, e, 7, 1)
            for e in range(extra)
        ]
        run = fake + rows
        src = _DiskRun(
            [r[0] for r in run],
            [r[1] for r in run],
            [r[3] for r in run],
            [r[4] for r in run],
            [r[5] for r in run],
        )
        assert idx.seal(seg, src, len(run), rows[-1][1])
        assert idx.lazy_chunks == k + len(rows)
        if self.data_seal_loads:
            RUN_CACHE.clear()  # every lookup in a run reads it again

    @precondition(lambda self: self.idx.runs)
    @rule(data=st.data())
    def unseal_from(self, data) -> None:
        segs = sorted({r[2] for r in self.model})
        self.idx.unseal_from(data.draw(st.sampled_from(segs)))

    data_seal_loads = False

    @invariant()
    def consistent(self) -> None:
        _check_index(self.idx, self.model)
        rng = self.idx.timestamp_range()
        if self.model:
            assert rng == (min(r[5] for r in self.model), max(r[5] for r in self.model))
            for below in {r[1] for r in self.model} | {self.model[-1][1] + 1}:
                cands = [(r[5], -i) for i, r in enumerate(self.model) if r[1] < below]
                want = -max(cands)[1] if cands else -1
                assert self.idx.argmax_timestamp(below) == want
                # Where the readable bytes end below it (read slots): the last such chunk's.
                ends = [(r[2], r[3] + r[4]) for r in self.model if r[1] < below]
                assert self.idx.end_below(below) == (ends[-1] if ends else (-1, -1))
        else:
            assert rng is None
        assert self.idx.segments() == {r[2] for r in self.model}
        counts: dict[int, int] = {}
        for r in self.model:
            counts[r[2]] = counts.get(r[2], 0) + 1
        assert self.idx.count_by_segment() == counts
        # The bulk operations migration and retention use on the event loop.
        m = self.model
        for n in range(len(m) + 1):
            pos, size = self.idx.locations(n)
            assert list(pos) == [r[3] for r in m[:n]] and list(size) == [r[4] for r in m[:n]]
            assert list(self.idx.bases(n)) == [r[0] for r in m[:n]]
            assert self.idx.bytes_of_first(n) == sum(r[4] for r in m[:n])
            firsts: dict[int, int] = {}
            for r in m[:n]:
                firsts[r[2]] = firsts.get(r[2], 0) + 1
            assert self.idx.count_by_segment_of_first(n) == firsts
            assert self.idx.max_timestamp_of_first(n) == max((r[5] for r in m[:n]), default=-1)
        for seg in {r[2] for r in m} | {-1, 10_000}:
            lead = next((i for i, r in enumerate(m) if r[2] != seg), len(m))
            assert self.idx.leading(seg) == lead
        for o in range(m[0][0] - 1, m[-1][1] + 2) if m else ():
            assert self.idx.count_through(o) == sum(1 for r in m if r[1] <= o)
            assert self.idx.count_before(o) == sum(1 for r in m if r[1] < o)


class _DiskRun:
    """A run "on disk": its columns are built afresh at each load, as a read would."""

    def __init__(self, *cols) -> None:
        self.raw = cols
        self.loads = 0

    def load(self) -> Columns:
        self.loads += 1
        from array import array

        return Columns(*(array("q", c) for c in self.raw))


class ColdCacheChunkIndexMachine(ChunkIndexMachine):
    """The same, with the run cache emptied at every seal."""

    data_seal_loads = True


TestChunkIndexMachine = ChunkIndexMachine.TestCase
TestChunkIndexMachine.settings = settings(
    max_examples=60, stateful_step_count=25, deadline=None, database=None
)
TestColdCacheChunkIndexMachine = ColdCacheChunkIndexMachine.TestCase
TestColdCacheChunkIndexMachine.settings = settings(
    max_examples=40, stateful_step_count=25, deadline=None, database=None
)


# -- segment rolling, reading back, reopening ----------------------------------------------------
@contextmanager
def temp_dir():
    with tempfile.TemporaryDirectory(prefix="stratalog-prop-") as d:
        yield Path(d)


PARTS = [("t", 0, 1), ("t", 1, 2), ("t", 2, 3)]


def open_store(path: Path, segment_bytes: int, layout: str = "virtual") -> LogStore:
    store = LogStore(
        StorageConfig(
            path,
            layout=layout,
            virtual_logs=1,
            fsync=FsyncPolicy.parse("never"),
            segment_bytes=segment_bytes,
            io_threads=2,
        )
    )
    store.open(PARTS)
    return store


append_st = st.tuples(
    st.sampled_from([1, 2, 3]),  # partition uid
    st.integers(1, 4),  # records
    st.integers(0, 700),  # value length
)


def _make_batch(k: int, n: int, vlen: int) -> bytes:
    return build_batch(
        [(b"k%d" % k, bytes([65 + (k + j) % 26]) * vlen, 1_700_000_000_000 + k) for j in range(n)]
    )


def _with_offset(batch: bytes, base: int) -> bytes:
    return struct.pack(">q", base) + batch[8:]


def _append_all(store: LogStore, appends, first_k: int = 0) -> list[tuple[int, int, bytes]]:
    """Append; return (uid, base offset, the batch as it must be stored) per append."""
    out = []
    for k, (uid, n, vlen) in enumerate(appends, first_k):
        b = _make_batch(k, n, vlen)
        r = store.partitions[uid].append(b)
        assert r.last_offset - r.base_offset == n - 1
        out.append((uid, r.base_offset, _with_offset(b, r.base_offset)))
    return out


def _chunks(store: LogStore) -> dict[int, list[tuple]]:
    return {
        uid: [vars_of(p.chunks[i]) for i in range(len(p.chunks))]
        for uid, p in store.partitions.items()
    }


def _check_contents(
    store: LogStore,
    written: list[tuple[int, int, bytes]],
    lost: dict[int, list[tuple[int, int]]] | None = None,
) -> None:
    """Every written chunk is stored and read back; offsets are dense but for the ``lost``
    ranges (uid -> (first, last)), which the partition must fence."""
    expected: dict[int, list[tuple[int, bytes]]] = {1: [], 2: [], 3: []}
    for uid, base, data in written:
        expected[uid].append((base, data))
    for uid, p in store.partitions.items():
        want = expected[uid]
        assert len(p.chunks) == len(want)
        assert p.lost == (lost or {}).get(uid, [])
        nxt = 0
        for i, (base, data) in enumerate(want):
            if base != nxt:
                assert (nxt, base - 1) in p.lost, "offsets are dense but for lost ranges"
            loc = p.chunks[i]
            assert (loc.base_offset, loc.size) == (base, len(data))
            seg = p.vlog.segment(loc.segment)
            assert seg is not None
            # Byte-identical on disk, behind a frame header.
            assert seg.read(loc.position, loc.size) == data
            # And through the partition's read path (tail cache or file slice).
            rr = p.read(base, 1, min_one=True)
            try:
                got = b"".join(x.read() if isinstance(x, FileSlice) else bytes(x) for x in rr.parts)
            finally:
                rr.release()
            assert got == data
            nxt = base + parse_header(data).record_count
        assert p.next_offset == nxt
        assert p.high_watermark == nxt


def _check_rolling(store: LogStore, segment_bytes: int) -> None:
    vlog = store.logs["v0"]
    seqs = sorted(vlog.segments)
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), "segment numbers are consecutive"
    for seq in seqs:
        seg = vlog.segments[seq]
        data = seg.read(0, seg.size)
        assert len(data) == seg.size == seg.data_path.stat().st_size
        # Walk the frames: the file is nothing but whole frames.
        pos, last = 0, 0
        while pos < len(data):
            (blen,) = struct.unpack_from(">i", data, pos + FRAME_SIZE + 8)
            last = FRAME_SIZE + 12 + blen
            pos += last
        assert pos == len(data)
        if seq == vlog.active.seq:
            continue
        assert seg.size > 0
        # Rolled exactly when the limit was reached: it was below it before its last frame.
        assert seg.size >= segment_bytes
        assert seg.size - last < segment_bytes


@FILES
@example(
    appends=[(1, 4, 300), (2, 1, 0), (3, 2, 700)] * 4, more=[(1, 1, 50)] * 3, segment_bytes=100
)
@given(
    st.lists(append_st, min_size=1, max_size=40),
    st.lists(append_st, max_size=10),
    st.integers(100, 6000),
)
def test_segments_roll_and_every_batch_reads_back_after_crash_and_clean_reopen(
    appends, more, segment_bytes
):
    with temp_dir() as d:
        store = open_store(d, segment_bytes)
        written = _append_all(store, appends)
        _check_contents(store, written)
        _check_rolling(store, segment_bytes)
        total = sum(len(w) + FRAME_SIZE for _, _, w in written)
        if total > segment_bytes + 2 * (FRAME_SIZE + 12 + 700 * 4 + 200):
            assert len(store.logs["v0"].segments) >= 2, "no roll although over the limit"
        before = _chunks(store)
        seg_sizes = {s: v.size for s, v in store.logs["v0"].segments.items()}

        store.abandon()  # a crash: unflushed index entries are lost, the data is in the files
        store = open_store(d, segment_bytes)
        try:
            assert not store.recovery["v0"].clean
            assert store.recovery["v0"].truncated_bytes == 0
            assert _chunks(store) == before
            assert {s: v.size for s, v in store.logs["v0"].segments.items()} == seg_sizes
            _check_contents(store, written)
            written += _append_all(store, more, len(written))
            _check_contents(store, written)
            _check_rolling(store, segment_bytes)
            before = _chunks(store)
        finally:
            asyncio.run(store.close())

        store = open_store(d, segment_bytes)
        try:
            rep = store.recovery["v0"]
            assert rep.clean and rep.scanned_bytes == 0
            assert _chunks(store) == before
            _check_contents(store, written)
        finally:
            asyncio.run(store.close())


@FILES
@given(st.lists(append_st, min_size=1, max_size=15), st.integers(100, 3000))
def test_per_partition_layout_rolls_and_reopens_too(appends, segment_bytes):
    with temp_dir() as d:
        store = open_store(d, segment_bytes, layout="per-partition")
        written = _append_all(store, appends)
        before = _chunks(store)
        store.abandon()
        store = open_store(d, segment_bytes, layout="per-partition")
        try:
            assert set(store.logs) == {"p1", "p2", "p3"}
            assert _chunks(store) == before
            _check_contents(store, written)
            for name, vlog in store.logs.items():
                for seg in vlog.segments.values():
                    if seg is not vlog.active:
                        assert seg.size >= segment_bytes, name
        finally:
            asyncio.run(store.close())


# -- recovery: any damage ends the log exactly at the damaged frame -------------------------------
def _frame_bounds(path: Path) -> list[tuple[int, int]]:
    data = path.read_bytes()
    out, pos = [], 0
    while pos < len(data):
        (blen,) = struct.unpack_from(">i", data, pos + FRAME_SIZE + 8)
        out.append((pos, pos + FRAME_SIZE + 12 + blen))
        pos = out[-1][1]
    return out


@FILES
@given(st.lists(append_st, min_size=1, max_size=12), st.data())
def test_a_flipped_byte_costs_its_frame_only_unless_it_ends_the_log(appends, data):
    with temp_dir() as d:
        store = open_store(d, 1 << 30)
        written = _append_all(store, appends)
        store.abandon()
        seg = d / "logs" / "v0" / "00000000000000000000.log"
        bounds = _frame_bounds(seg)
        assert len(bounds) == len(written)
        pos = data.draw(st.integers(0, bounds[-1][1] - 1), label="position")
        mask = data.draw(st.integers(1, 255), label="mask")
        raw = bytearray(seg.read_bytes())
        raw[pos] ^= mask
        seg.write_bytes(bytes(raw))
        hit = next(i for i, (a, b) in enumerate(bounds) if a <= pos < b)

        uid, base, batch = written[hit]
        later = [w for w in written[hit + 1 :] if w[0] == uid]

        store = open_store(d, 1 << 30)
        try:
            if hit == len(written) - 1:
                # The log's last frame: a torn tail as far as recovery can tell, cut.
                assert seg.stat().st_size == bounds[hit][0]
                _check_contents(store, written[:hit])
            elif later:
                # Stepped over: the partition's next chunk shows what it lost; nothing is cut.
                assert seg.stat().st_size == bounds[-1][1]
                last = base + parse_header(batch).record_count - 1
                _check_contents(store, written[:hit] + written[hit + 1 :], {uid: [(base, last)]})
            else:
                # Stepped over, but nothing tells this partition lost a chunk (its index entry
                # was never written): it goes on from the lost chunk's offsets, as after a tear.
                assert seg.stat().st_size == bounds[-1][1]
                _check_contents(store, written[:hit] + written[hit + 1 :])
        finally:
            asyncio.run(store.close())


@FILES
@given(st.lists(append_st, min_size=1, max_size=12), st.data())
def test_a_cut_anywhere_keeps_exactly_the_whole_frames_before_it(appends, data):
    with temp_dir() as d:
        store = open_store(d, 1 << 30)
        written = _append_all(store, appends)
        store.abandon()
        seg = d / "logs" / "v0" / "00000000000000000000.log"
        bounds = _frame_bounds(seg)
        size = data.draw(st.integers(0, bounds[-1][1]), label="cut at")
        with open(seg, "r+b") as f:
            f.truncate(size)
        whole = sum(1 for _, b in bounds if b <= size)

        store = open_store(d, 1 << 30)
        try:
            assert seg.stat().st_size == (bounds[whole - 1][1] if whole else 0)
            _check_contents(store, written[:whole])
        finally:
            asyncio.run(store.close())


# -- batch validation ----------------------------------------------------------------------------
record_st = st.tuples(
    st.one_of(st.none(), st.binary(max_size=20)),
    st.one_of(st.none(), st.binary(max_size=200)),
    st.integers(0, 2**40),
)
batch_st = st.builds(
    lambda recs, comp, base: build_batch(recs, compression=comp, base_offset=base),
    st.lists(record_st, min_size=1, max_size=6),
    st.sampled_from([NONE, GZIP]),
    st.integers(0, 2**40),
)

# Bytes outside the batch CRC that the broker itself assigns: baseOffset, partitionLeaderEpoch.
# Kafka leaves them out of the CRC on purpose, so changing them cannot be detected and is fine.
BASE_OFFSET = range(0, 8)
LEADER_EPOCH = range(12, 16)


@FAST
@given(batch_st)
def test_valid_batches_pass(batch):
    h = validate_batch(batch)
    assert h.size == len(batch) and h.magic == 2
    assert h.record_count == h.last_offset_delta + 1
    assert split_batches(batch) == [(0, h)]
    assert len(list(iter_records(batch))) == h.record_count


@FAST
@given(
    batch_st,
    st.lists(
        # Positions biased towards the header, where the unprotected fields are.
        st.tuples(st.one_of(st.integers(0, 20), st.integers(0, 10**6)), st.integers(1, 255)),
        min_size=1,
        max_size=4,
    ),
)
def test_mutated_batches_are_rejected_unless_only_unprotected_fields_changed(batch, flips):
    orig = validate_batch(batch)
    m = bytearray(batch)
    positions = set()
    for pos, mask in flips:
        p = pos % len(batch)
        m[p] ^= mask
        positions.add(p)
    assume(bytes(m) != batch)
    changed = {i for i in positions if m[i] != batch[i]}
    if changed <= set(BASE_OFFSET) | set(LEADER_EPOCH):
        h = validate_batch(bytes(m))
        assert h.base_offset == struct.unpack_from(">q", m, 0)[0]
        assert h.leader_epoch == struct.unpack_from(">i", m, 12)[0]
        assert (h.crc, h.record_count, h.max_timestamp) == (
            orig.crc,
            orig.record_count,
            orig.max_timestamp,
        )
        assert split_batches(bytes(m)) == [(0, h)]
    else:
        with pytest.raises(CorruptBatchError):
            validate_batch(bytes(m))
        with pytest.raises(CorruptBatchError):
            split_batches(bytes(m))


@FAST
@given(batch_st, st.data())
def test_truncated_or_padded_batches_are_rejected(batch, data):
    cut = data.draw(st.integers(0, len(batch) - 1), label="cut")
    with pytest.raises(CorruptBatchError):
        split_batches(batch[:cut])
    pad = data.draw(st.binary(min_size=1, max_size=HEADER_SIZE + 10), label="pad")
    with pytest.raises(CorruptBatchError):
        split_batches(batch + pad)
    # Two whole batches are fine.
    assert [p for p, _ in split_batches(batch + batch)] == [0, len(batch)]


@FAST
@given(batch_st, st.integers(-5, 100))
def test_record_count_must_match_last_offset_delta(batch, delta):
    h = parse_header(batch)
    assume(delta != h.last_offset_delta)
    m = bytearray(batch)
    struct.pack_into(">i", m, 23, delta)
    struct.pack_into(">I", m, 17, crc32c(bytes(m[21:])))
    with pytest.raises(CorruptBatchError) as e:
        validate_batch(bytes(m))
    assert e.value.error == "INVALID_RECORD"
