"""Writing a whole file without a burst in the disk the journal syncs on (migration's cold
segments).

A cold segment written the plain way (one write of several MiB into the page cache, then
``fsync``) hands the device the whole file at once when it is synced, and every group commit's
``fdatasync`` issued meanwhile waits behind it: with migration running, the journal's fsync p99
went from 1.4 ms to 11 ms on this machine's disk (docs/benchmarks.md, e). Here the file goes out
in O_DIRECT requests of ``PIECE`` bytes, one at a time, so at most one small write of migration
is ever in the device ahead of a journal's fsync (as the backlog loader does for reads), and the
final ``fsync`` has only the file's size and extents left to commit. Where the file system
refuses O_DIRECT (tmpfs), the pieces go through the page cache, each synced before the next.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Iterable, Iterator, Sequence

from stratalog.storage.throttle import BlockingPace

PIECE = 512 * 1024
BLOCK = 4096  # O_DIRECT: whole blocks at block offsets, from aligned memory


Data = bytes | bytearray | memoryview


def write_file(
    path: str,
    data: Data | Sequence[Data],
    piece: int = PIECE,
    rate: float | BlockingPace = 0.0,
) -> None:
    """Create (or replace) ``path`` holding ``data`` (one buffer, or parts written back to back),
    durable when this returns; with ``rate`` (bytes per second, > 0) the pieces are spread out
    to that pace (a BlockingPace: the pace of a larger job this write is part of).

    Parts are copied into each piece as it goes out, never joined into one buffer first: on a
    pool thread, one ``b"".join`` of a 64 MiB segment is a single C call that holds the GIL for
    tens of milliseconds, and the event loop's thread waited for it (5 ms futex timeouts back
    to back in ``perf trace``) while every produce request waited for the loop.
    """
    if piece <= 0 or piece % BLOCK:
        raise ValueError(f"piece must be a positive multiple of {BLOCK}, not {piece}")
    parts = [data] if isinstance(data, bytes | bytearray | memoryview) else data
    pace = rate if isinstance(rate, BlockingPace) else BlockingPace(rate)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        try:
            dfd = os.open(path, os.O_WRONLY | os.O_DIRECT)
        except OSError:
            dfd = -1
        if dfd >= 0:
            try:
                size = _write_direct(dfd, parts, piece, pace)
            finally:
                os.close(dfd)
            os.ftruncate(fd, size)  # the last block was padded
        else:
            _write_synced_pieces(fd, parts, piece, pace)
        os.fsync(fd)
    finally:
        os.close(fd)


def _pieces(parts: Iterable[Data], piece: int, out: memoryview) -> Iterator[int]:
    """Fill ``out`` from ``parts`` in order; yield how many bytes it holds each time it is full,
    and once more for the rest (if any). The caller writes ``out[:n]`` before resuming."""
    filled = 0
    for part in parts:
        with memoryview(part) as src:
            i, n = 0, len(src)
            while i < n:
                k = min(piece - filled, n - i)
                out[filled : filled + k] = src[i : i + k]
                filled += k
                i += k
                if filled == piece:
                    yield filled
                    filled = 0
    if filled:
        yield filled


def _write_direct(
    dfd: int, parts: Iterable[Data], piece: int, pace: BlockingPace | None = None
) -> int:
    """Write ``parts`` in O_DIRECT pieces, the last one padded; return the data's size."""
    pace = pace or BlockingPace()
    buf = mmap.mmap(-1, piece)  # page-aligned
    pos = 0
    try:
        with memoryview(buf) as out:
            for k in _pieces(parts, piece, out):
                pace(k)
                padded = -(-k // BLOCK) * BLOCK
                out[k:padded] = bytes(padded - k)
                written = os.pwrite(dfd, out[:padded], pos)
                if written != padded:
                    raise OSError(f"short O_DIRECT write to a cold segment: {written} of {padded}")
                pos += k
    finally:
        buf.close()
    return pos


def _write_synced_pieces(
    fd: int, parts: Iterable[Data], piece: int, pace: BlockingPace | None = None
) -> None:
    pace = pace or BlockingPace()
    buf = bytearray(piece)
    with memoryview(buf) as out:
        for k in _pieces(parts, piece, out):
            pace(k)
            view = out[:k]
            while view:
                view = view[os.write(fd, view) :]
            os.fdatasync(fd)
