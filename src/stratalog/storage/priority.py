"""CPU and I/O priority of the calling thread (Linux), for the backlog read pool.

BookKeeper keeps catch-up reads off the journal's path with separate disks and threads; on one
machine the nearest thing is to let the kernel schedule backlog reads after the write path:
a higher nice value for the CPU scheduler and the idle I/O class for the block layer. On one
disk, in fio, a sequential reader raised fdatasync's p99 from 0.4 ms to 20-28 ms, because its
reads queued in front of the journal's writes; in the idle class (which mq-deadline and BFQ
serve after every best-effort request, mq-deadline with aging against starvation) it was 5-9 ms
at the same read throughput. A best-effort level alone changed nothing: mq-deadline orders by
class. In the broker's catch-up benchmark the gain has not been measurable yet, so it is an
option. Both are hints: where the platform refuses them, reads still run as before.
"""

from __future__ import annotations

import ctypes
import logging
import os
import platform
import signal
import threading

log = logging.getLogger(__name__)

_SYS_IOPRIO_SET = {"x86_64": 251, "aarch64": 30}.get(platform.machine())
_SYS_IOPRIO_GET = {"x86_64": 252, "aarch64": 31}.get(platform.machine())
_IOPRIO_WHO_PROCESS = 1  # with a thread id: that thread only
_IOPRIO_CLASS_IDLE = 3
_IOPRIO_CLASS_SHIFT = 13
_PR_SET_PDEATHSIG = 1  # prctl(2)
LOW_NICE = 10
LOW_IOPRIO = _IOPRIO_CLASS_IDLE << _IOPRIO_CLASS_SHIFT  # ioprio_get's value for the idle class


def lower_this_thread(sched_idle: bool = False) -> None:
    """Run the calling thread at nice LOW_NICE (or, with ``sched_idle``, in the SCHED_IDLE CPU
    class) and in the idle I/O class."""
    tid = threading.get_native_id()
    try:
        if sched_idle:
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
        else:
            os.setpriority(os.PRIO_PROCESS, tid, LOW_NICE)
    except OSError as e:
        log.debug("cannot lower the CPU priority of thread %d: %s", tid, e)
    if _SYS_IOPRIO_SET is None:
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.syscall(_SYS_IOPRIO_SET, _IOPRIO_WHO_PROCESS, tid, LOW_IOPRIO) != 0:
            log.debug("ioprio_set refused: errno %d", ctypes.get_errno())
    except (OSError, AttributeError) as e:
        log.debug("ioprio_set unavailable: %s", e)


def die_with_parent(parent: int) -> bool:
    """Have Linux kill this (helper) process when the process ``parent`` ends, even by kill -9;
    False if ``parent`` is already gone, when the caller should exit."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass
    return os.getppid() == parent


def thread_priority(tid: int) -> tuple[int, int | None]:
    """(nice, I/O priority value or None) of a thread of this process, for tests and status."""
    nice = os.getpriority(os.PRIO_PROCESS, tid)
    if _SYS_IOPRIO_GET is None:
        return nice, None
    libc = ctypes.CDLL(None, use_errno=True)
    value = libc.syscall(_SYS_IOPRIO_GET, _IOPRIO_WHO_PROCESS, tid)
    return nice, value if value >= 0 else None
