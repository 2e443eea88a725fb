"""Deleted segments' files go on the reaper's thread (storage/reaper.py), after the last reader
lets go, renamed out of the way and cut down a step at a time; recovery's deletions happen at
once, since the next segment may take the same name; start-up removes what a crash left half
deleted."""

from __future__ import annotations

import os

import pytest

from stratalog.bench import deletion_probe
from stratalog.storage import reaper
from stratalog.storage.segment import Segment


def _segment(tmp_path, seq: int) -> Segment:
    seg = Segment(tmp_path, seq, create=True)
    seg.write([b"x" * 100_000])
    return seg


def test_a_deleted_segment_goes_once_no_reader_holds_it(tmp_path):
    seg = _segment(tmp_path, 1)
    seg.acquire()  # a reader's slice
    seg.delete()
    reaper.drain()
    assert seg.data_path.exists() and seg.index_path.exists(), "deleted under a reader"
    assert seg.read(0, 10) == b"x" * 10
    seg.release()
    reaper.drain()
    assert not seg.data_path.exists() and not seg.index_path.exists()


def test_recovery_deletes_at_once_and_the_name_can_be_reused(tmp_path):
    seg = _segment(tmp_path, 2)
    seg.delete(background=False)
    assert not seg.data_path.exists()
    again = _segment(tmp_path, 2)  # the next roll takes the name
    reaper.drain()
    assert again.data_path.exists() and again.read(0, 5) == b"xxxxx"
    again.close()


def test_files_already_gone_are_not_an_error(tmp_path):
    seg = _segment(tmp_path, 3)
    seg.data_path.unlink()
    seg.delete()
    reaper.drain()
    assert not seg.index_path.exists()


def test_a_large_file_is_cut_down_under_another_name(tmp_path):
    seg = Segment(tmp_path, 4, create=True)
    chunk = b"y" * (1 << 20)
    for _ in range(3 * reaper.STEP_BYTES // len(chunk) + 1):
        seg.write([chunk])
    seg.delete()
    reaper.drain()
    assert list(tmp_path.iterdir()) == []


def test_start_up_sweeps_what_a_crash_left_half_deleted(tmp_path):
    (tmp_path / "00000000000000000007.log.deleting").write_bytes(b"z" * 5000)
    keep = _segment(tmp_path, 8)
    reaper.sweep(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [keep.data_path.name, keep.index_path.name]
    )
    keep.close()


def test_an_evicted_copy_someone_reads_is_unlinked_whole(tmp_path):
    path = tmp_path / "promoted.log"
    path.write_bytes(b"p" * (3 * reaper.STEP_BYTES))
    fd = os.open(path, os.O_RDONLY)  # a reader's descriptor, as a promoted cold segment keeps
    try:
        reaper.unlink(path, shrink=False)
        reaper.drain()
        assert not path.exists()
        assert os.pread(fd, 4, 2 * reaper.STEP_BYTES) == b"pppp"  # not cut under the reader
    finally:
        os.close(fd)


def test_the_deletion_probe_times_fsyncs_beside_each_kind_of_deletion(tmp_path):
    """The probe behind docs/benchmarks.md's "Deleting segments" (stratalog.bench.deletion_probe)
    runs the reaper's own deletion; here tiny, only to show it measures and cleans up."""
    for mode in deletion_probe.MODES:
        r = deletion_probe.measure(tmp_path, mode, seconds=0.3, files=2, file_bytes=3 << 20)
        assert r["fsyncs"] > 0 and 0 < r["p50_ms"] <= r["p99_ms"] <= r["max_ms"]
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(ValueError, match="mode must be one of"):
        deletion_probe.measure(tmp_path, "shred")
