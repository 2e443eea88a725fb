"""Segment appends through O_DIRECT (``storage.direct_io``).

Each direct append rewrites the file's last 4 KiB block from an aligned buffer and pads it with
zeros, so the file runs up to one block past the segment's size until the padding is cut at
seal or close. What is read back must be exactly what was appended, whatever the append sizes
(the buffer slides and grows), and recovery must tell padding from a torn write. Crash safety
of a broker with direct appends is in tests/test_crash.py (SIGKILL and simulated power cuts).
"""

from __future__ import annotations

import os
import random

from stratalog.storage.recovery import _direct_padding
from stratalog.storage.segment import _DIRECT_BUFFER, BLOCK, DIRECT_MIN_BYTES, Segment


def test_direct_appends_read_back_exactly(tmp_path):
    rng = random.Random(7)
    seg = Segment(tmp_path, 0, create=True)
    assert seg.enable_direct()
    written = bytearray()
    # Small appends take the page cache, large ones O_DIRECT; interleaved, and one larger than
    # the buffer.
    sizes = [
        rng.choice([rng.randint(1, 20_000), rng.randint(DIRECT_MIN_BYTES, 3 * DIRECT_MIN_BYTES)])
        for _ in range(200)
    ] + [_DIRECT_BUFFER + 12_345, 3, 4096, DIRECT_MIN_BYTES]
    assert sum(n >= DIRECT_MIN_BYTES for n in sizes) > 50
    for n in sizes:
        parts = [os.urandom(k) for k in (n // 3, n - n // 3) if k]
        pos = seg.write(parts)
        assert pos == len(written)
        written += b"".join(parts)
        on_disk = os.fstat(seg.fd).st_size
        assert seg.size <= on_disk < seg.size + BLOCK
        if n >= DIRECT_MIN_BYTES:
            assert on_disk % BLOCK == 0  # a direct write's last block, padded
        assert not any(seg.read(seg.size, on_disk - seg.size))  # padding is zeros
    assert seg.size == len(written)
    assert seg.read(0, seg.size) == written
    seg.finish_direct()
    assert os.fstat(seg.fd).st_size == len(written)  # the padding is cut
    seg.close()


def test_a_reopened_segment_continues_its_partial_block(tmp_path):
    seg = Segment(tmp_path, 0, create=True)
    seg.write([b"a" * 5000])
    seg.close()
    seg = Segment(tmp_path, 0)
    assert seg.enable_direct()
    seg.write([b"b" * 100])
    assert seg.read(0, seg.size) == b"a" * 5000 + b"b" * 100
    seg.close()


def test_recovery_tells_padding_from_a_tear(tmp_path):
    seg = Segment(tmp_path, 0, create=True)
    assert seg.enable_direct()
    seg.write([b"x" * 5000])  # through the page cache
    seg.write([b"y" * DIRECT_MIN_BYTES, b"z" * 50])  # direct, padded to the next block
    end = seg.size
    seg.size = os.fstat(seg.fd).st_size  # as a restart sees the file
    assert seg.size % BLOCK == 0 and seg.size > end
    assert _direct_padding(seg, end)  # zeros to the block boundary
    os.pwrite(seg.fd, b"\x01", end + 10)
    assert not _direct_padding(seg, end)  # anything else there is a tear
    assert not _direct_padding(seg, end - BLOCK)  # and so is more than a block
    seg.size = end
    seg.close()
