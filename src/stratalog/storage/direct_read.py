"""Backlog reads that bypass the page cache (``fetch.backlog.direct_reads``).

A catch-up consumer's buffered reads reach the disk as the kernel's read-ahead, in bursts the
journal's fsyncs queue behind. fio on this project's machine shows what reads that bypass the
page cache at a low I/O priority do instead: an fdatasync beside an O_DIRECT reader in the idle
I/O class waited 4-7 ms at p50, against 60-110 ms beside one in the default class
(docs/benchmarks.md, e). So backlog slices can be read here with O_DIRECT, on the read pool's
threads (whose I/O class ``storage.read_priority=low`` sets), in aligned windows of
``fetch.read_ahead.bytes``. A window is kept for the next reads: in a virtual log the other
partitions' catch-up consumers read the same region, and one large sequential read serves them
all where chunk-by-chunk reads would be many small random ones.

A window is not read in one request. The device serves requests in the order they reach it, and
a journal fsync that arrives behind a backlog read waits for all of it: in fio on this project's
machine, fdatasync's p99 beside a reader of 8 MiB requests (one at a time) was 14 ms, beside one
of 4 MiB 8.2 ms, beside one of 512 KiB 1.0 ms (0.3 ms alone), while the 512 KiB reader still
read 1.7 GB/s. So a window is read in requests of ``io_bytes`` (``fetch.backlog.io_bytes``), and
at most ``io_depth`` of them (``fetch.backlog.io_depth``, 1) are in the device at once over the
whole broker: an fsync waits behind one small read, never behind a whole fetch.

Bytes below a segment's size never change (segments are append-only), so a window stays valid
for as long as the segment exists; a window read at the end of a growing segment is short and
is read again when a later slice needs more of it.
"""

from __future__ import annotations

import mmap
import os
import threading
from collections import OrderedDict

from stratalog.storage.segment import Segment

BLOCK = 4096


class DirectReader:
    def __init__(
        self, window_bytes: int, windows: int = 32, io_bytes: int = 512 * 1024, io_depth: int = 1
    ) -> None:
        self.window = max(BLOCK, -(-window_bytes // BLOCK) * BLOCK)
        self.windows = windows
        self.io_bytes = max(BLOCK, io_bytes - io_bytes % BLOCK)
        # The device's share for backlog reads: requests of this reader in flight at once.
        self._device = threading.BoundedSemaphore(max(1, io_depth))
        self.requests = 0  # disk reads issued, for tests and metrics
        self._lock = threading.Lock()
        # (segment path, window start) -> (the window's bytes, how many are valid)
        self._cache: OrderedDict[tuple[str, int], tuple[mmap.mmap, int]] = OrderedDict()

    def read(self, segment: Segment, position: int, size: int) -> bytes:
        """``size`` bytes of ``segment`` from ``position``; raises OSError on a short read."""
        pieces = []
        at, end = position, position + size
        while at < end:
            start = at - at % self.window
            data, valid = self._window(segment, start, min(end, start + self.window) - start)
            take = min(end, start + valid) - at
            if take <= 0:
                raise OSError(f"{segment}: short read at {at}: {valid} B in the window at {start}")
            pieces.append(memoryview(data)[at - start : at - start + take])
            at += take
        return b"".join(pieces)

    def _window(self, segment: Segment, start: int, need: int) -> tuple[mmap.mmap, int]:
        key = (str(segment.data_path), start)
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None and hit[1] >= need:
                self._cache.move_to_end(key)
                return hit
        data = mmap.mmap(-1, self.window)  # page-aligned, as O_DIRECT needs
        fd = os.open(segment.data_path, os.O_RDONLY | os.O_DIRECT)
        view = memoryview(data)
        try:
            valid = 0
            while valid < self.window:
                with self._device:
                    n = os.preadv(fd, [view[valid : valid + self.io_bytes]], start + valid)
                    self.requests += 1
                if n <= 0:
                    break
                valid += n
                if valid % BLOCK:
                    break  # the end of the file
        finally:
            view.release()
            os.close(fd)
        with self._lock:
            self._cache[key] = (data, valid)
            self._cache.move_to_end(key)
            while len(self._cache) > self.windows:
                self._cache.popitem(last=False)
        return data, valid
