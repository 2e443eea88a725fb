"""Segment reads leave the file's access time alone (storage/noatime.py): an atime update is a
metadata change that waits for the file system's journal, and the event loop reads segments."""

from __future__ import annotations

import os

import pytest

from stratalog.storage.segment import Segment


def _age_atime(path) -> float:
    """Set the access time a day before the modification time, so a relatime mount would
    update it on the next read."""
    st = os.stat(path)
    os.utime(path, (st.st_mtime - 86400, st.st_mtime))
    return os.stat(path).st_atime


def test_segment_reads_do_not_update_the_access_time(tmp_path):
    probe = tmp_path / "probe"
    probe.write_bytes(b"x" * 4096)
    before = _age_atime(probe)
    with open(probe, "rb") as f:
        f.read()
    if os.stat(probe).st_atime == before:
        pytest.skip("this file system does not update access times (noatime mount)")

    seg = Segment(tmp_path, 0, create=True)
    seg.write([b"y" * 8192])
    os.fsync(seg.fd)
    before = _age_atime(seg.data_path)
    assert seg.read(0, 8192) == b"y" * 8192
    os.posix_fadvise(seg.fd, 0, 0, os.POSIX_FADV_DONTNEED)
    assert seg.read(100, 100) == b"y" * 100
    assert os.stat(seg.data_path).st_atime == before
    seg.release()
