"""storage/page_cache.py: asking whether a range is cached must not read it in."""

from __future__ import annotations

import os

import pytest

from stratalog.storage import page_cache


def test_asking_about_an_evicted_file_reads_nothing(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(os.urandom(4 << 20))
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fdatasync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        if page_cache.cached_pages(fd, 0, 4 << 20) is None:
            pytest.skip("this kernel has no cachestat (Linux 6.5+)")
        assert page_cache.cached_pages(fd, 0, 4 << 20) == 0
        # A catch-up consumer's fetches ask about one range after the next.
        for at in range(0, 4 << 20, 64 << 10):
            assert not page_cache.resident(fd, at, 64 << 10)
        assert page_cache.cached_pages(fd, 0, 4 << 20) == 0  # nothing was read in

        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)  # no read-ahead past what is read
        os.pread(fd, 8192, 0)  # now two pages are cached
        assert page_cache.resident(fd, 0, 8192)
        assert page_cache.resident(fd, 100, 5000)
        assert not page_cache.resident(fd, 0, 8193)
    finally:
        os.close(fd)
