"""Whether a file's range is in the page cache, asked without starting a read.

A ``preadv(RWF_NOWAIT)`` probe, the portable way, is not free: on a page that is not cached it
starts a read of it, and probes that walk forward through a file (each fetch of a catch-up
consumer probes a little further on) look sequential to the kernel, whose read-ahead then reads
megabytes (``read_ahead_kb`` is 8 MiB on this project's machine). That I/O is issued by the
event loop's thread, in its I/O class, whatever class the read pool runs in; a probe loop over
an evicted file pulled the whole file back in. Linux 6.5's ``cachestat`` counts the cached pages
of a range and reads nothing, in about a microsecond. It also counts pages whose read is still
in flight (just asked for by ``posix_fadvise``), which a ``sendfile`` on the event loop would
wait for; so a range it finds complete is still probed, which starts nothing on pages that are
there. Without ``cachestat`` the probe alone decides.
"""

from __future__ import annotations

import ctypes
import errno
import os

PAGE = os.sysconf("SC_PAGE_SIZE")
_CACHESTAT = 451  # the same number on every architecture (the generic syscall table)


class _Range(ctypes.Structure):
    _fields_ = [("off", ctypes.c_uint64), ("len", ctypes.c_uint64)]


class _Stat(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_uint64)
        for name in ("cache", "dirty", "writeback", "evicted", "recently_evicted")
    ]


_libc = ctypes.CDLL(None, use_errno=True)
_syscall = _libc.syscall
_syscall.restype = ctypes.c_long
_available = True


def cached_pages(fd: int, offset: int, length: int) -> int | None:
    """Pages of ``[offset, offset + length)`` in the page cache, or None where the kernel cannot
    say (before Linux 6.5, or a file system without a page cache)."""
    global _available
    if not _available:
        return None
    r = _Range(offset, length)
    s = _Stat()
    if _syscall(_CACHESTAT, fd, ctypes.byref(r), ctypes.byref(s), 0) != 0:
        if ctypes.get_errno() in (errno.ENOSYS, errno.EPERM):
            _available = False  # not this kernel (or a seccomp filter): stop asking
        return None
    return s.cache


_RWF_NOWAIT = getattr(os, "RWF_NOWAIT", 0)


def resident(fd: int, offset: int, length: int) -> bool:
    """Whether the range can be read without waiting for the disk: every page of it is in the
    page cache (cachestat, when the kernel has it) and its first and last byte are readable
    without blocking (the probe)."""
    if length <= 0:
        return True
    pages = cached_pages(fd, offset, length)
    if pages is not None and pages < (offset + length - 1) // PAGE - offset // PAGE + 1:
        return False
    buf = bytearray(1)
    try:
        for at in (offset, offset + length - 1):
            if os.preadv(fd, [buf], at, _RWF_NOWAIT) != 1:
                return False
    except OSError:  # BlockingIOError: not cached
        return False
    return True
