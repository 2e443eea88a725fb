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
