"""fdatasync through io_uring, its completions arriving on the event loop (storage.fsync_via).

The group commit used to hand its fsyncs to a thread: the thread wakes, takes the GIL, calls
``fdatasync``, takes the GIL again and wakes the loop. While the loop is busy (a tail of
produces, history answers) each of those GIL hand-offs waits up to the interpreter's switch
interval (5 ms), and a produce waiting for durability pays them all: measured, the group commit
as the loop saw it took twice its fsyncs (docs/benchmarks.md, e-slow-cold run6). Here the loop
writes the fsync requests into the kernel's submission ring and goes on; the kernel's own worker
runs them, and their completion makes the ring's eventfd readable, which the loop's selector
watches. No thread of ours and no GIL take part.

The ring is driven with the raw system calls through ctypes. The ``liburing`` wheel from PyPI
(2026.3.30) dies with SIGILL on import on this machine's CPU and its older releases are source
only, and Debian's liburing 2.3 keeps the ring helpers inline in its header. The ring's shared
memory is written and read with plain stores and loads, which is correct only under x86-64's
store and load ordering; on other machines ``open_ring`` answers None and the thread stays.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import mmap
import os
import platform
import select
import struct
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

log = logging.getLogger(__name__)

_SYS_SETUP, _SYS_ENTER, _SYS_REGISTER = 425, 426, 427  # x86-64 system call numbers
_OFF_SQ_RING, _OFF_CQ_RING, _OFF_SQES = 0, 0x8000000, 0x10000000
_OP_FSYNC = 3
_FSYNC_DATASYNC = 1
_REGISTER_EVENTFD = 4
_PARAMS_SIZE = 120  # struct io_uring_params
_SQE = struct.Struct("=BBHiQQIIQ24x")  # opcode flags ioprio fd off addr len fsync_flags user_data
_CQE = struct.Struct("=Qi")  # user_data res (then flags, unused)
_CQE_SIZE = 16
_U32 = struct.Struct("=I")
WATCH_S = 0.1  # how often the watch looks at fsyncs still out
# An fsync out this long is named in the log and finished on a thread, and the ring retired:
# twice a broker's ring took fsyncs and never completed them (a soak's, and a MirrorMaker
# bench's target: completions stopped for minutes while the loop ran on).
LATE_S = float(os.environ.get("STRATALOG_FSYNC_LATE_S", "10"))

_libc = ctypes.CDLL(None, use_errno=True)
_syscall = _libc.syscall
_syscall.restype = ctypes.c_long


def _check(ret: int) -> int:
    if ret < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return ret


@dataclass
class _Group:
    """fsyncs submitted together; ``done`` gets 0 or the first failure's errno."""

    remaining: int
    done: Callable[[int], None]
    fds: tuple[tuple[int, int], ...] = ()  # (fd, fsync flags): what a thread would sync
    error: int = 0
    since: float = 0.0  # monotonic time of its submission
    reported: bool = False  # the watch has said it is late


class FsyncRing:
    """One io_uring for a broker's fsyncs. ``sync(fds, done)`` queues them; ``done(errno)`` runs
    on the loop once every one of them returned (0: all durable)."""

    def __init__(self, entries: int = 128) -> None:
        params = ctypes.create_string_buffer(_PARAMS_SIZE)
        self.fd = _check(_syscall(_SYS_SETUP, ctypes.c_uint(entries), params))
        self._maps: list[mmap.mmap] = []
        try:
            sq_entries, cq_entries = struct.unpack_from("=II", params, 0)
            sq_head, sq_tail, sq_mask, _, _, _, sq_array = struct.unpack_from("=7I", params, 40)
            cq_head, cq_tail, cq_mask, _, _, cqes = struct.unpack_from("=6I", params, 80)
            self.sq_ring = self._map(sq_array + sq_entries * 4, _OFF_SQ_RING)
            self.cq_ring = self._map(cqes + cq_entries * _CQE_SIZE, _OFF_CQ_RING)
            self.sqes = self._map(sq_entries * _SQE.size, _OFF_SQES)
            self._sq_head, self._sq_tail, self._sq_array = sq_head, sq_tail, sq_array
            self._sq_mask = _U32.unpack_from(self.sq_ring, sq_mask)[0]
            self._cq_head, self._cq_tail, self._cqes = cq_head, cq_tail, cqes
            self._cq_mask = _U32.unpack_from(self.cq_ring, cq_mask)[0]
            # In flight at most as many as the completion ring holds, so none can overflow.
            self.capacity = min(sq_entries, cq_entries)
            self.eventfd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
            efd = ctypes.c_int(self.eventfd)
            _check(_syscall(_SYS_REGISTER, self.fd, _REGISTER_EVENTFD, ctypes.byref(efd), 1))
        except BaseException:
            self._unmap()
            os.close(self.fd)
            raise
        self._groups: dict[int, _Group] = {}
        self._next_id = 1
        self._queued: deque[tuple[int, int, int]] = deque()  # (fd, flags, group) waiting for room
        self._in_flight = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._watch_handle: asyncio.TimerHandle | None = None
        self.unnoticed = 0  # completions the watch found that no eventfd wake-up announced
        self._seen_head = -1  # the completion head at the last watch that saw some waiting
        self.closed = False
        # Once an fsync was out for LATE_S, every sync runs on a thread of its own instead.
        self.retired = False
        self._thread: ThreadPoolExecutor | None = None
        # Tests: the group of this number is not handed to the kernel although it counts as
        # taken (what a kernel that never completes it looks like).
        self._lose_group = int(os.environ.get("STRATALOG_FSYNC_RING_LOSE_GROUP", "0"))

    def _map(self, size: int, offset: int) -> mmap.mmap:
        m = mmap.mmap(
            self.fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE, offset=offset
        )
        self._maps.append(m)
        return m

    def _unmap(self) -> None:
        for m in self._maps:
            with contextlib.suppress(BufferError):
                m.close()
        self._maps.clear()

    # -- submission ----------------------------------------------------------------------------
    def sync(self, fds: list[int], done: Callable[[int], None], full: Sequence[int] = ()) -> None:
        """``fdatasync`` each of ``fds`` and ``fsync`` each of ``full`` (directories: a new
        file's entry); ``done(errno)`` runs on the running loop once all returned."""
        if self.closed:
            raise RuntimeError("the fsync ring is closed")
        self._attach()
        if not fds and not full:
            asyncio.get_running_loop().call_soon(done, 0)
            return
        work = tuple((fd, _FSYNC_DATASYNC) for fd in fds) + tuple((fd, 0) for fd in full)
        if self.retired:
            self._on_thread(work, done)
            return
        gid = self._next_id
        self._next_id += 1
        self._groups[gid] = _Group(len(work), done, work, since=time.monotonic())
        self._queued.extend((fd, flags, gid) for fd, flags in work)
        self._submit()

    def _on_thread(self, work: tuple[tuple[int, int], ...], done: Callable[[int], None]) -> None:
        """The syncs on a thread of the ring's, ``done`` on the loop after them."""
        loop = self._loop
        assert loop is not None
        if self._thread is None:
            self._thread = ThreadPoolExecutor(1, thread_name_prefix="stratalog-fsync")

        def run() -> None:
            err = 0
            for fd, flags in work:
                try:
                    (os.fdatasync if flags & _FSYNC_DATASYNC else os.fsync)(fd)
                except OSError as e:
                    err = err or (e.errno or 5)
            loop.call_soon_threadsafe(done, err)

        self._thread.submit(run)

    def _attach(self) -> None:
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            if self._loop is not None and not self._loop.is_closed():
                self._loop.remove_reader(self.eventfd)
            self._loop = loop
            loop.add_reader(self.eventfd, self._complete)
            if self._watch_handle is not None:
                self._watch_handle.cancel()
            self._watch_handle = loop.call_later(WATCH_S, self._watch)

    def _submit(self) -> None:
        tail = _U32.unpack_from(self.sq_ring, self._sq_tail)[0]
        n = 0
        while self._queued and self._in_flight < self.capacity:
            fd, flags, gid = self._queued.popleft()
            if gid == self._lose_group:
                self._in_flight += 1  # taken, and never to complete
                continue
            idx = (tail + n) & self._sq_mask
            _SQE.pack_into(self.sqes, idx * _SQE.size, _OP_FSYNC, 0, 0, fd, 0, 0, 0, flags, gid)
            _U32.pack_into(self.sq_ring, self._sq_array + idx * 4, idx)
            n += 1
            self._in_flight += 1
        if n == 0:
            return
        # The entries are written before the tail that hands them over (x86-64 keeps stores in
        # order), and the kernel takes them all in this call.
        _U32.pack_into(self.sq_ring, self._sq_tail, (tail + n) & 0xFFFFFFFF)
        self._enter()

    def _enter(self) -> None:
        while True:
            tail = _U32.unpack_from(self.sq_ring, self._sq_tail)[0]
            head = _U32.unpack_from(self.sq_ring, self._sq_head)[0]
            pending = (tail - head) & 0xFFFFFFFF
            if pending == 0:
                return
            ret = _syscall(_SYS_ENTER, self.fd, pending, 0, 0, None, 0)
            if ret >= 0:
                continue
            err = ctypes.get_errno()
            if err == 4:  # EINTR
                continue
            # EAGAIN/EBUSY: the kernel is short of memory or of completion room; the entries
            # stay in the ring and go with the next completion or a retry.
            log.warning("io_uring_enter: %s; retrying", os.strerror(err))
            assert self._loop is not None
            self._loop.call_later(0.001, self._enter)
            return

    # -- completion ----------------------------------------------------------------------------
    def _complete(self) -> None:
        with contextlib.suppress(BlockingIOError):
            os.eventfd_read(self.eventfd)
        head = _U32.unpack_from(self.cq_ring, self._cq_head)[0]
        tail = _U32.unpack_from(self.cq_ring, self._cq_tail)[0]
        finished: list[_Group] = []
        while head != tail:
            at = self._cqes + (head & self._cq_mask) * _CQE_SIZE
            gid, res = _CQE.unpack_from(self.cq_ring, at)
            head = (head + 1) & 0xFFFFFFFF
            self._in_flight -= 1
            group = self._groups.get(gid)
            if group is None:
                continue
            if res < 0 and not group.error:
                group.error = -res
            group.remaining -= 1
            if group.remaining == 0:
                del self._groups[gid]
                finished.append(group)
        _U32.pack_into(self.cq_ring, self._cq_head, head)
        if self._queued:
            self._submit()
        for group in finished:
            try:
                group.done(group.error)
            except Exception:  # one waiter's failure must not strand the others
                log.exception("io_uring: a group commit's completion failed")

    def _watch(self) -> None:
        """Every WATCH_S while fsyncs are out: completions sitting in the ring that the loop
        will not take by itself (the eventfd not readable, or readable but not serviced since
        the last look) are taken (a soak run saw a broker's every fsync stop completing while
        its loop ran on, for over a minute; with a 1 s watch a later soak logged one such
        completion in 20 runs), and an fsync still out after LATE_S is named once, with the
        ring's state."""
        if self.closed or self._loop is None:
            return
        now = time.monotonic()
        if self._groups:
            waiting = self.completions_waiting
            head = _U32.unpack_from(self.cq_ring, self._cq_head)[0]
            # Not announced (the eventfd is not readable), or announced and not taken since the
            # last look (the loop is not watching the eventfd): either way, take them now.
            stuck = waiting and (head == self._seen_head or not _readable(self.eventfd))
            self._seen_head = head if waiting else -1
            if stuck:
                self.unnoticed += waiting
                log.warning("io_uring: %d completions waited unannounced; taking them", waiting)
                self._complete()
            late = [g for g in self._groups.values() if now - g.since >= LATE_S and not g.reported]
            if late:
                sq = [_U32.unpack_from(self.sq_ring, o)[0] for o in (self._sq_head, self._sq_tail)]
                cq = [_U32.unpack_from(self.cq_ring, o)[0] for o in (self._cq_head, self._cq_tail)]
                log.warning(
                    "io_uring: %d fsync group(s) out for %.0f s or more (%d in flight, %d queued, "
                    "submission head/tail %d/%d, completion head/tail %d/%d)",
                    len(late),
                    LATE_S,
                    self._in_flight,
                    len(self._queued),
                    sq[0],
                    sq[1],
                    cq[0],
                    cq[1],
                )
                for g in late:
                    g.reported = True
                self._retire(late)
        self._watch_handle = self._loop.call_later(WATCH_S, self._watch)

    def _retire(self, late: list[_Group]) -> None:
        """Finish the late groups' syncs on a thread (fdatasync waits for what was written
        before it, so their durability is the same), and make every later one there: a ring
        that lost completions is not trusted again. A completion that still comes for them is
        dropped."""
        if not self.retired:
            self.retired = True
            log.error(
                "io_uring: fsyncs out for %.0f s: finishing them on a thread, and every later "
                "one; the ring is not used again",
                LATE_S,
            )
        ids = [gid for gid, g in self._groups.items() if g in late]
        for gid in ids:
            group = self._groups.pop(gid)
            self._on_thread(group.fds, group.done)

    @property
    def completions_waiting(self) -> int:
        """Completions the kernel posted that the loop has not taken yet."""
        head = _U32.unpack_from(self.cq_ring, self._cq_head)[0]
        tail = _U32.unpack_from(self.cq_ring, self._cq_tail)[0]
        return (tail - head) & 0xFFFFFFFF

    @property
    def busy(self) -> bool:
        return bool(self._groups)

    def close(self) -> None:
        """Stop watching the ring and release it; fsyncs still in flight finish in the kernel
        (the group commit drains before its store closes)."""
        if self.closed:
            return
        self.closed = True
        if self._thread is not None:
            self._thread.shutdown(wait=True)
        if self._watch_handle is not None:
            self._watch_handle.cancel()
        if self._loop is not None and not self._loop.is_closed():
            self._loop.remove_reader(self.eventfd)
        self._unmap()
        os.close(self.eventfd)
        os.close(self.fd)


def _readable(fd: int) -> bool:
    """Whether the loop's selector would wake for ``fd`` now (poll: any descriptor number)."""
    p = select.poll()
    p.register(fd, select.POLLIN)
    return bool(p.poll(0))


def open_ring(mode: str) -> FsyncRing | None:
    """The ring for ``storage.fsync_via``: "thread" never, "io_uring" always (an error if the
    kernel refuses), "auto" when this machine and kernel allow it."""
    if mode == "thread":
        return None
    reason = ""
    if platform.machine() not in ("x86_64", "AMD64"):
        reason = f"not on {platform.machine()} (the ring's memory ordering is x86-64's)"
    else:
        try:
            return FsyncRing()
        except OSError as e:  # ENOSYS, EPERM (seccomp, kernel.io_uring_disabled), ENOMEM
            reason = f"io_uring_setup failed: {e.strerror}"
    if mode == "io_uring":
        raise OSError(f"storage.fsync_via=io_uring: {reason}")
    log.info("fsyncs run on the I/O threads: %s", reason)
    return None


def available() -> bool:
    """Whether "auto" finds a ring on this machine."""
    ring = open_ring("auto")
    if ring is not None:
        ring.close()
    return ring is not None
