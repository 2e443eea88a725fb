"""DirectReader: O_DIRECT reads of a segment in aligned windows, kept for the next reads."""

from __future__ import annotations

import os

import pytest

from stratalog.storage.direct_read import DirectReader
from stratalog.storage.segment import Segment


def test_reads_across_windows_and_the_end_of_a_growing_file(tmp_path):
    seg = Segment(tmp_path, 0, create=True)
    data = os.urandom(50_000)  # not a multiple of the block size
    seg.write([data])
    reader = DirectReader(8192)
    for pos, size in [(0, 10), (8000, 500), (8191, 2), (100, 30_000), (49_990, 10), (0, 50_000)]:
        assert reader.read(seg, pos, size) == data[pos : pos + size], (pos, size)
    # The window holding the old end was read short; after the file grows it is read again.
    more = os.urandom(20_000)
    seg.write([more])
    whole = data + more
    assert reader.read(seg, 49_000, 10_000) == whole[49_000:59_000]
    assert reader.read(seg, 0, len(whole)) == whole
    with pytest.raises(OSError, match="short read"):
        reader.read(seg, len(whole) - 5, 10)  # past the end: an error, never short bytes
    seg.close()


def test_a_window_is_read_in_requests_of_io_bytes(tmp_path):
    """A window reaches the device as several small reads, so a journal fsync never waits
    behind a whole window (fetch.backlog.io_bytes)."""
    seg = Segment(tmp_path, 0, create=True)
    data = os.urandom(300_000)
    seg.write([data])
    reader = DirectReader(262_144, io_bytes=40_000, io_depth=1)
    assert reader.io_bytes == 36_864  # rounded down to whole blocks
    assert reader.read(seg, 1000, 250_000) == data[1000:251_000]
    # 256 KiB window in 36 KiB requests: 8 requests (the last one short).
    assert reader.requests == 8
    # The second window holds the file's end: read short, in ceil(37,856 / 36,864) requests.
    assert reader.read(seg, 262_000, 38_000) == data[262_000:300_000]
    assert reader.requests == 8 + 2
    seg.close()
