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

PIECE = 512 * 1024
BLOCK = 4096  # O_DIRECT: whole blocks at block offsets, from aligned memory


def write_file(path: str, data: bytes, piece: int = PIECE) -> None:
    """Create (or replace) ``path`` holding ``data``, durable when this returns."""
    if piece <= 0 or piece % BLOCK:
        raise ValueError(f"piece must be a positive multiple of {BLOCK}, not {piece}")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        try:
            dfd = os.open(path, os.O_WRONLY | os.O_DIRECT)
        except OSError:
            dfd = -1
        if dfd >= 0:
            try:
                _write_direct(dfd, data, piece)
            finally:
                os.close(dfd)
            os.ftruncate(fd, len(data))  # the last block was padded
        else:
            _write_synced_pieces(fd, data, piece)
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_direct(dfd: int, data: bytes, piece: int) -> None:
    buf = mmap.mmap(-1, piece)  # page-aligned
    try:
        with memoryview(data) as src, memoryview(buf) as out:
            pos = 0
            n = len(src)
            while pos < n:
                k = min(piece, n - pos)
                out[:k] = src[pos : pos + k]
                padded = -(-k // BLOCK) * BLOCK
                out[k:padded] = bytes(padded - k)
                written = os.pwrite(dfd, out[:padded], pos)
                if written != padded:
                    raise OSError(f"short O_DIRECT write to a cold segment: {written} of {padded}")
                pos += k
    finally:
        buf.close()


def _write_synced_pieces(fd: int, data: bytes, piece: int) -> None:
    with memoryview(data) as src:
        pos = 0
        while pos < len(src):
            end = min(pos + piece, len(src))
            while pos < end:
                pos += os.write(fd, src[pos:end])
            os.fdatasync(fd)
