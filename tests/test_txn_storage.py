"""The transaction index of a partition (storage/txn_index.py): open transactions hold the last
stable offset back, markers end them, aborted transactions are listed for the range a
read_committed fetch returns, and all of it is rebuilt from the log at start (after a crash, a
clean stop, in both layouts) and follows a replica's truncation.

In-process, on LogStore directly: the broker-level behaviour (coordinator, Fetch, clients) is
tested in tests/conformance/test_transactions.py and tests/test_transactions_crash.py.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from stratalog.records import build_batch
from stratalog.storage.journal import FsyncPolicy
from stratalog.storage.log_store import LogStore, StorageConfig
from stratalog.storage.partition import AppendError, PartitionLog
from stratalog.storage.segment import FRAME_SIZE
from stratalog.storage.txn_index import TRANSACTIONAL_PRODUCER_IDS, TxnIndex, marker_batch

from .stored import stored_records

T0 = 1_700_000_000_000
P1 = TRANSACTIONAL_PRODUCER_IDS + 1
P2 = TRANSACTIONAL_PRODUCER_IDS + 2


def _store(path: Path, layout: str = "virtual") -> LogStore:
    store = LogStore(
        StorageConfig(path, fsync=FsyncPolicy.parse("never"), layout=layout, virtual_logs=1)
    )
    store.open([("t", 0, 1), ("t", 1, 2)])
    return store


def _txn(pid: int, seq: int, n: int = 2, epoch: int = 0, tag: bytes = b"x") -> bytes:
    records = [(None, tag + b"-%d" % j, T0 + j) for j in range(n)]
    return build_batch(
        records, producer_id=pid, producer_epoch=epoch, base_sequence=seq, transactional=True
    )


def _plain(tag: bytes) -> bytes:
    return build_batch([(None, tag, T0)])


def _marker(pid: int, commit: bool, epoch: int = 0) -> bytes:
    return marker_batch(pid, epoch, commit, 0, T0)


def _values(p: PartitionLog, upto: int | None = None) -> list[tuple[int, bytes | None]]:
    return [(r.offset, r.value) for r in stored_records(p, upto=upto, controls=False)]


def _history(p: PartitionLog) -> None:
    """Two producers interleaved with plain records: P1 aborts, P2 commits, P1 opens again."""
    p.append(_plain(b"a"))  # 0
    p.append(_txn(P1, 0, tag=b"p1"))  # 1-2
    p.append(_txn(P2, 0, tag=b"p2"))  # 3-4
    p.append(_plain(b"b"))  # 5
    p.append(_marker(P1, commit=False), markers=True)  # 6: P1 aborted 1-2
    p.append(_txn(P2, 2, tag=b"p2b"))  # 7-8
    p.append(_marker(P2, commit=True), markers=True)  # 9: P2 committed 3-4, 7-8
    p.append(_txn(P1, 2, tag=b"p1b"))  # 10-11, open


def _expect_history(p: PartitionLog) -> None:
    assert p.next_offset == 12
    assert p.high_watermark == 12
    assert p.last_stable_offset == 10
    assert p.txns.open == {P1: 10}
    assert p.txns.aborted() == [(P1, 1, 6)]
    assert p.txns.aborted_between(0, 10) == [(P1, 1)]
    assert p.txns.aborted_between(7, 10) == []  # after the abort marker
    assert p.txns.aborted_between(0, 1) == []  # before the aborted transaction
    # A read_committed read stops at the LSO; an uncommitted one at the high watermark.
    assert [o for o, _ in _values(p, upto=p.last_stable_offset)] == [0, 1, 2, 3, 4, 5, 7, 8]
    assert [o for o, _ in _values(p)][-2:] == [10, 11]


@pytest.mark.parametrize("layout", ["virtual", "per-partition"])
@pytest.mark.parametrize("stop", ["crash", "clean"])
def test_index_follows_appends_and_is_rebuilt_at_start(tmp_path, layout, stop):
    store = _store(tmp_path, layout)
    p = store.partitions[1]
    _history(p)
    store.partitions[2].append(_txn(P1, 0, tag=b"other"))  # P1 in another partition too
    _expect_history(p)
    if stop == "crash":
        store.abandon()
    else:
        asyncio.run(store.close())
    store = _store(tmp_path, layout)
    try:
        p = store.partitions[1]
        _expect_history(p)
        assert store.partitions[2].txns.open == {P1: 0}
        # The open transaction ends; the LSO reaches the high watermark.
        p.append(_marker(P1, commit=True), markers=True)
        assert p.last_stable_offset == p.high_watermark == 13
        assert p.txns.aborted() == [(P1, 1, 6)]
    finally:
        asyncio.run(store.close())
    store = _store(tmp_path, layout)
    try:
        assert store.partitions[1].last_stable_offset == 13
        assert store.partitions[1].txns.open == {}
    finally:
        asyncio.run(store.close())


def test_a_marker_holds_the_stable_offset_until_the_high_watermark_passes_it():
    idx = TxnIndex()
    idx.on_data(P1, 5)
    idx.on_marker(P1, 9, aborted=False)
    assert idx.last_stable_offset(9) == 5  # the marker is not visible yet
    idx.on_high_watermark(10)
    assert idx.last_stable_offset(10) == 10
    idx.on_data(P1, 10)
    assert idx.last_stable_offset(12) == 10


def test_aborted_lookup_stops_at_a_stable_entry_and_covers_long_transactions():
    idx = TxnIndex()
    idx.on_data(P1, 0)  # a long transaction, aborted last
    idx.on_data(P2, 10)
    idx.on_marker(P2, 20, aborted=True)
    idx.on_marker(P1, 30, aborted=True)
    idx.on_high_watermark(31)
    assert idx.aborted_between(0, 31) == [(P2, 10), (P1, 0)]
    assert idx.aborted_between(21, 31) == [(P1, 0)]
    assert idx.aborted_between(25, 26) == [(P1, 0)]
    idx.drop_before(21)
    assert idx.aborted() == [(P1, 0, 30)]


def test_truncation_reopens_the_transaction_whose_marker_it_cut(tmp_path):
    store = _store(tmp_path)
    p = store.partitions[1]
    p.append(_txn(P1, 0))  # 0-1
    p.append(_marker(P1, commit=False), markers=True)  # 2
    assert p.txns.aborted() == [(P1, 0, 2)] and p.last_stable_offset == 3
    # Cut at the marker's frame (as a replica's log is cut back, KIP-101).
    loc = p.chunks[1]
    store.truncate_log(p.vlog.name, loc.segment, loc.position - FRAME_SIZE)
    try:
        assert p.next_offset == 2
        assert p.txns.open == {P1: 0} and p.txns.aborted() == []
        assert p.last_stable_offset == 0
    finally:
        asyncio.run(store.close())


def test_truncation_below_what_the_index_remembers_rebuilds_it_from_the_log(tmp_path):
    store = _store(tmp_path)
    p = store.partitions[1]
    p.append(_txn(P1, 0))  # 0-1
    p.append(_marker(P1, commit=False), markers=True)  # 2, below the HWM: forgotten
    p.append(_txn(P1, 2))  # 3-4
    p.txns.completing.clear()  # as if the marker were long committed
    loc = p.chunks[1]
    store.truncate_log(p.vlog.name, loc.segment, loc.position - FRAME_SIZE)
    try:
        assert p.txns.open == {P1: 0} and p.txns.aborted() == []
    finally:
        asyncio.run(store.close())


def test_producers_may_not_write_markers_or_misuse_transactional_ids(tmp_path):
    store = _store(tmp_path)
    p = store.partitions[1]
    try:
        with pytest.raises(AppendError) as e:
            p.append(_marker(P1, commit=True))
        assert e.value.error == "INVALID_RECORD"
        with pytest.raises(AppendError) as e:  # a transactional batch of an idempotent id
            p.append(_txn(7, 0))
        assert e.value.error == "INVALID_PRODUCER_ID_MAPPING"
        plain = build_batch([(None, b"v", T0)], producer_id=P1, producer_epoch=0, base_sequence=0)
        with pytest.raises(AppendError) as e:  # a transactional id's non-transactional batch
            p.append(plain)
        assert e.value.error == "INVALID_PRODUCER_ID_MAPPING"
        assert p.next_offset == 0
    finally:
        asyncio.run(store.close())


def test_a_marker_fences_the_older_epoch(tmp_path):
    store = _store(tmp_path)
    p = store.partitions[1]
    try:
        p.append(_txn(P1, 0, epoch=3))
        p.append(_marker(P1, commit=False, epoch=4), markers=True)  # a timed-out abort
        with pytest.raises(AppendError) as e:
            p.append(_txn(P1, 2, epoch=3))
        assert e.value.error == "INVALID_PRODUCER_EPOCH"
        p.append(_txn(P1, 0, epoch=5))
    finally:
        asyncio.run(store.close())


@pytest.mark.parametrize("where", ["sealed", "cold"])
def test_transactions_in_sealed_and_cold_history_are_rebuilt_at_start(tmp_path, where, monkeypatch):
    """Start-up indexes sealed segments by their sealed index's table and cold ones by their
    manifest, reading no chunk entries (storage/sealed_index.py): it still finds every chunk of a
    transactional producer there, reading only the runs and cold indexes that count some."""
    from stratalog.storage import sealed_index
    from stratalog.storage.chunk_index import RUN_CACHE
    from stratalog.storage.cold_tier import ColdStore
    from stratalog.storage.tiering import Migrator, TierSettings

    cold_dir = tmp_path / "cold"
    config = StorageConfig(
        tmp_path / "data",
        fsync=FsyncPolicy.parse("never"),
        virtual_logs=1,
        segment_bytes=600,
        cold_location=str(cold_dir) if where == "cold" else None,
    )

    async def fill() -> int:
        store = LogStore(config)
        store.open([("t", 0, 1), ("t", 1, 2)])
        p = store.partitions[1]
        _history(p)
        store.partitions[2].append(_txn(P1, 0, tag=b"other"))
        for k in range(40):  # plain history after it: segments with no transactional chunk
            p.append(_plain(b"filler-%03d" % k))
        _expect_history_through(p, 52)
        vlog = store.logs["v0"]
        deadline = asyncio.get_running_loop().time() + 20
        while any(not s.pix_path.exists() for s in vlog.segments.values() if s is not vlog.active):
            assert asyncio.get_running_loop().time() < deadline, "segments were not sealed"
            await asyncio.sleep(0.02)
        if where == "cold":
            migrator = Migrator(store, TierSettings(threads=1), lambda: {})
            try:
                for _ in range(3):
                    await migrator.migrate(vlog, vlog.oldest_sealed())
            finally:
                migrator.close()
            assert p.cold.first_offset == 0 and p.cold.next_offset > 12  # the history is cold
        sealed = [s for s in vlog.segments.values() if s is not vlog.active]
        await store.close()
        return len(sealed)

    sealed = asyncio.run(fill())
    assert sealed >= 3
    rows = [
        (pix, row)
        for pix in sorted((tmp_path / "data" / "logs" / "v0").glob("*.pix"))
        for row in sealed_index.load(pix).rows.values()
    ]
    with_txn = {(pix, row.at) for pix, row in rows if row.txn}
    cold_metas = [
        m
        for f in cold_dir.glob("p*/manifest-*.json")
        for m in json.loads(f.read_text())["segments"]
    ]
    cold_txn = {m["name"] for m in cold_metas if m["txn"]}
    if where == "sealed":
        assert with_txn and len(with_txn) < len(rows)  # some runs hold none
    else:
        assert cold_txn and len(cold_txn) < len(cold_metas)
    reads: list[tuple[Path, int]] = []
    cold_reads: list[str] = []
    real = sealed_index.read_run
    real_cold = ColdStore.read_index_bytes

    def counted(path, at, count, crc):
        reads.append((Path(path), at))
        return real(path, at, count, crc)

    def counted_cold(self, uid, meta):
        cold_reads.append(meta.name)
        return real_cold(self, uid, meta)

    monkeypatch.setattr(sealed_index, "read_run", counted)
    monkeypatch.setattr(ColdStore, "read_index_bytes", counted_cold)
    RUN_CACHE.clear()
    store = LogStore(config)
    store.open([("t", 0, 1), ("t", 1, 2)])
    try:
        assert set(reads) <= with_txn, "start-up read runs with no transactional chunk"
        assert set(cold_reads) <= cold_txn, "start-up read cold indexes with none"
        assert set(cold_reads) == cold_txn  # and every one that has some
        p = store.partitions[1]
        _expect_history_through(p, 52)
        assert store.partitions[2].txns.open == {P1: 0}
        if where == "cold":
            assert p.cold.first_offset == 0 and p.cold.next_offset > 12
    finally:
        asyncio.run(store.close())


def _expect_history_through(p: PartitionLog, end: int) -> None:
    """_history's transactions, then plain records up to ``end``: P1's second one still open."""
    assert p.next_offset == p.high_watermark == end
    assert p.last_stable_offset == 10
    assert p.txns.open == {P1: 10}
    assert p.txns.aborted() == [(P1, 1, 6)]
    assert p.txns.aborted_between(0, 10) == [(P1, 1)]
    assert [o for o, _ in _values(p, upto=p.last_stable_offset)] == [0, 1, 2, 3, 4, 5, 7, 8]
