"""Backlog reads through the page cache, in small requests, one at a time (BookKeeper's isolation
of the journal from catch-up reads, on one disk).

A catch-up consumer's data is not in the page cache. Read through the kernel, it arrives as the
kernel's read-ahead: windows of up to ``read_ahead_kb`` (8 MiB on this project's machine), split
into requests of up to 4 MiB that sit in the device ahead of the journal's next fsync. In fio on
this machine, fdatasync's p99 beside a reader of one 8 MiB request at a time was 14 ms, of 4 MiB
8.2 ms, of 512 KiB 1.0 ms (0.3 ms alone), and the 512 KiB reader still read 1.7 GB/s.

So the read pool loads a fetch's span into the page cache itself, on a descriptor whose
read-ahead is off (``POSIX_FADV_RANDOM``), in requests of ``fetch.backlog.io_bytes`` with at most
``fetch.backlog.io_depth`` of them in the device over the whole broker. The fetch then sends the
loaded pages with ``sendfile``, as it sends the tail: the event loop copies nothing, and the read
threads copy only into a scratch buffer of their own with the GIL released.
"""

from __future__ import annotations

import os
import threading
from typing import TYPE_CHECKING

from prometheus_client import Counter

from stratalog.storage.noatime import open_noatime
from stratalog.storage.page_cache import PAGE, cached_pages
from stratalog.storage.segment import Segment

if TYPE_CHECKING:
    from stratalog.storage.cold_tier import ColdSegment

LOADED_BYTES = Counter(
    "stratalog_fetch_loaded_bytes",
    "Backlog bytes the read pool brought into the page cache for Fetch, in small requests",
)


class BacklogLoader:
    def __init__(self, io_bytes: int = 512 * 1024, io_depth: int = 1) -> None:
        self.io_bytes = max(PAGE, io_bytes - io_bytes % PAGE)
        # The device's share for backlog reads: requests in flight at once, broker-wide.
        self._device = threading.BoundedSemaphore(max(1, io_depth))
        self._scratch = threading.local()
        self.requests = 0  # disk reads issued, for tests

    def load(self, segment: Segment | ColdSegment, start: int, end: int) -> None:
        """Bring ``[start, end)`` of ``segment`` into the page cache (pages already there are
        not read again); a segment in an object store has no file and is left alone. Raises
        OSError if the storage fails."""
        path = segment.data_path
        start -= start % PAGE
        end = min(end, segment.size)
        if path is None or end <= start:
            return
        buf = getattr(self._scratch, "buf", None)
        if buf is None:
            buf = self._scratch.buf = memoryview(bytearray(self.io_bytes))
        fd = open_noatime(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)  # no read-ahead on this descriptor
            at = start
            while at < end:
                n = min(self.io_bytes, end - at)
                cached = cached_pages(fd, at, n)
                if cached is None or cached < -(-n // PAGE):
                    with self._device:
                        got = os.preadv(fd, [buf[:n]], at)
                        self.requests += 1
                    if got <= 0:
                        break  # the end of the file
                    LOADED_BYTES.inc(got)
                at += n
        finally:
            os.close(fd)
