"""Migration's copy worker (storage/migration_worker.py): the chunks it reads from a hot segment
file are exactly the ranges asked for, however they are spaced, and a file that ends early is
an error, not a short copy."""

from __future__ import annotations

import os
import random
from array import array

import pytest

from stratalog.storage.migration_worker import READ_GAP, READ_SPAN, read_ranges


def _layout(rnd: random.Random, count: int) -> tuple[array, array]:
    pos, size, at = array("q"), array("q"), 0
    for _ in range(count):
        at += rnd.choice([0, 12, 61, READ_GAP, READ_GAP + 1, 100_000])  # gaps around the limit
        n = rnd.choice([1, 70, 2500, 70_000, READ_SPAN - 1, READ_SPAN + 5])
        pos.append(at)
        size.append(n)
        at += n
    return pos, size


@pytest.mark.parametrize("seed", range(5))
def test_ranges_read_back_exactly(tmp_path, seed):
    rnd = random.Random(seed)
    pos, size = _layout(rnd, 80)
    data = os.urandom(pos[-1] + size[-1] + 100)
    path = tmp_path / "hot.log"
    path.write_bytes(data)
    fd = os.open(path, os.O_RDONLY)
    try:
        got = read_ranges(fd, pos, size, str(path))
    finally:
        os.close(fd)
    assert [bytes(g) for g in got] == [data[p : p + n] for p, n in zip(pos, size, strict=True)]


def test_a_file_that_ends_early_is_an_error(tmp_path):
    path = tmp_path / "short.log"
    path.write_bytes(b"x" * 1000)
    fd = os.open(path, os.O_RDONLY)
    try:
        with pytest.raises(OSError, match=r"short\.log: short read at 0"):
            read_ranges(fd, array("q", [0, 900]), array("q", [100, 200]), str(path))
    finally:
        os.close(fd)
