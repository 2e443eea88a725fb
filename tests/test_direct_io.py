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
from stratalog.storage.segment import _DIRECT_BUFFER, BLOCK, Segment


def test_direct_appends_read_back_exactly(tmp_path):
    rng = random.Random(7)
    seg = Segment(tmp_path, 0, create=True)
    assert seg.enable_direct()
    written = bytearray()
    sizes = [rng.randint(1, 20_000) for _ in range(600)] + [_DIRECT_BUFFER + 12_345, 3, 4096]
    for n in sizes:
        parts = [os.urandom(k) for k in (n // 3, n - n // 3) if k]
        pos = seg.write(parts)
        assert pos == len(written)
        written += b"".join(parts)
        on_disk = os.fstat(seg.fd).st_size
        assert on_disk % BLOCK == 0 and seg.size <= on_disk < seg.size + BLOCK
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
    seg.write([b"x" * 5000])
    end = seg.size
    seg.size = os.fstat(seg.fd).st_size  # as a restart sees the file: 8192 bytes
    assert _direct_padding(seg, end)  # zeros to the block boundary
    os.pwrite(seg.fd, b"\x01", end + 10)
    assert not _direct_padding(seg, end)  # anything else there is a tear
    assert not _direct_padding(seg, end - BLOCK)  # and so is more than a block
    seg.size = end
    seg.close()
