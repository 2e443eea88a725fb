"""Cold segments are written in small O_DIRECT requests (storage/gentle_write.py): whatever the
size, the file holds exactly the bytes given, on disk and through the page cache."""

from __future__ import annotations

import os
import random
import time

import pytest

from stratalog.storage import gentle_write
from stratalog.storage.throttle import BlockingPace

SIZES = [0, 1, 4095, 4096, 4097, 512 * 1024 - 1, 512 * 1024, 512 * 1024 + 1, 3 * 1024 * 1024 + 17]


@pytest.mark.parametrize("size", SIZES)
def test_the_file_holds_exactly_the_data(tmp_path, size):
    data = os.urandom(size)
    path = tmp_path / "seg.log"
    path.write_bytes(b"x" * (size + 10_000))  # replaced, not overwritten in place
    gentle_write.write_file(str(path), data)
    assert os.path.getsize(path) == size
    assert path.read_bytes() == data


def test_small_pieces_and_the_page_cache_fallback(tmp_path):
    data = os.urandom(100_000)
    direct = tmp_path / "direct.log"
    gentle_write.write_file(str(direct), data, piece=8192)
    assert direct.read_bytes() == data
    # The path where O_DIRECT is refused (tmpfs) writes synced pieces through the page cache.
    fd = os.open(tmp_path / "buffered.log", os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        gentle_write._write_synced_pieces(fd, [data], 8192)
    finally:
        os.close(fd)
    assert (tmp_path / "buffered.log").read_bytes() == data


def test_a_piece_must_be_whole_blocks(tmp_path):
    with pytest.raises(ValueError, match="multiple of 4096"):
        gentle_write.write_file(str(tmp_path / "f"), b"abc", piece=1000)
    assert not (tmp_path / "f").exists()


@pytest.mark.parametrize("direct", [True, False])
def test_parts_are_written_back_to_back_across_pieces(tmp_path, direct):
    """A cold segment's batches go in as parts (never joined first): parts of any size, empty
    ones included, straddling piece boundaries, land in order and nothing else."""
    rnd = random.Random(7)
    parts = [os.urandom(rnd.choice([0, 1, 70, 2500, 8191, 8192, 8193, 30_000])) for _ in range(60)]
    parts.append(memoryview(os.urandom(5000))[100:4000])
    want = b"".join(bytes(p) for p in parts)
    path = tmp_path / "parts.log"
    if direct:
        gentle_write.write_file(str(path), parts, piece=8192)
    else:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            gentle_write._write_synced_pieces(fd, parts, 8192)
        finally:
            os.close(fd)
    assert os.path.getsize(path) == len(want)
    assert path.read_bytes() == want


@pytest.mark.parametrize("direct", [True, False])
def test_a_paced_write_spreads_its_pieces_out(tmp_path, direct):
    """Migration's copies can be paced (tiers.migrate.pace): each piece waits until the bytes
    before it have had their time at the rate, so 10 pieces at 1 piece per 20 ms take at least
    the 9 gaps between them; the file is the same."""
    data = os.urandom(10 * 8192)
    path = tmp_path / "paced.log"
    t0 = time.monotonic()
    if direct:
        gentle_write.write_file(str(path), data, piece=8192, rate=8192 / 0.02)
    else:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            gentle_write._write_synced_pieces(fd, [data], 8192, BlockingPace(8192 / 0.02))
        finally:
            os.close(fd)
    assert time.monotonic() - t0 >= 9 * 0.02
    assert path.read_bytes() == data
