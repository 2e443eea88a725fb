"""Cores of its own for the backlog sender (fetch.backlog.sender_cpus).

A lower priority does not keep history's work off the tail's path on a kernel that preempts no
system call (``PREEMPT_NONE``, as this project's machine runs): the scheduler counts a core that
runs only ``SCHED_IDLE`` work as idle and wakes the event loop there, and the loop then waits
until the sender's ``sendfile`` (with the loopback TCP work inside it) returns, whatever its
class (``docs/benchmarks.md``, e, "Why idle priority does not protect the tail"). Redpanda and
Seastar pin each shard to a core; this does the same for the two halves of a broker: the
sender process runs on the CPUs named, and the broker's own threads on the others, so a wake-up
of the loop never queues behind a history send.

The broker pins the thread that builds it (its event loop's); every thread and process it
starts afterwards (the I/O threads, the ring's kernel workers) inherits that; the sender process
moves itself to its own CPUs when it starts, and migration's copy workers (nice +10) back to
all of them. Threads the embedding program started before are left alone.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

log = logging.getLogger(__name__)


class CpuListError(ValueError):
    """A CPU list that cannot be read, or names CPUs this process may not use."""


def parse_cpus(text: str) -> frozenset[int]:
    """A Linux CPU list ("1", "0,2", "2-3,6"); empty text is the empty set."""
    cpus: set[int] = set()
    for part in text.replace(" ", "").split(","):
        if not part:
            continue
        low, dash, high = part.partition("-")
        try:
            first, last = int(low), int(high) if dash else int(low)
        except ValueError:
            raise CpuListError(f"{part!r} is not a CPU number or a range like 2-3") from None
        if first < 0 or last < first:
            raise CpuListError(f"{part!r} is not a CPU number or a range like 2-3")
        cpus.update(range(first, last + 1))
    if text.strip() and not cpus:
        raise CpuListError(f"{text!r} names no CPU")
    return frozenset(cpus)


def broker_cpus(sender: frozenset[int]) -> frozenset[int]:
    """The CPUs left to the broker when the sender has ``sender``, out of those this process
    may run on."""
    allowed = frozenset(os.sched_getaffinity(0))
    missing = sorted(sender - allowed)
    if missing:
        raise CpuListError(
            f"CPU {', '.join(map(str, missing))} is not one this process may run on "
            f"({format_cpus(allowed)})"
        )
    broker = allowed - sender
    if not broker:
        raise CpuListError(
            f"it names every CPU this process may run on ({format_cpus(allowed)}): "
            "the broker needs at least one of its own"
        )
    return broker


def format_cpus(cpus: frozenset[int]) -> str:
    return ",".join(map(str, sorted(cpus)))


def pin_this_thread(cpus: frozenset[int], who: str) -> None:
    """Run the calling thread (and what it starts from now on) on ``cpus`` only."""
    os.sched_setaffinity(0, cpus)
    log.info("%s runs on CPU %s", who, format_cpus(cpus))


def journal_threads(paths: list[Path]) -> dict[int, str]:
    """The ext4 journal threads (``jbd2/<device>-8``) of the file systems holding ``paths``:
    pid -> name. A file system without a journal, or not ext4, has none."""
    names = set()
    for path in paths:
        try:
            st = os.stat(path)
            device = os.path.basename(
                os.readlink(f"/sys/dev/block/{os.major(st.st_dev)}:{os.minor(st.st_dev)}")
            )
        except OSError:
            continue  # not a block device's file system (tmpfs, overlay)
        names.add(f"jbd2/{device}-")
    found = {}
    if not names:
        return found
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/comm") as f:
                comm = f.read().strip()
        except OSError:
            continue
        if any(comm.startswith(n) for n in names):
            found[int(entry)] = comm
    return found


class JournalThreads:
    """The journal threads of the broker's write path, moved to the broker's CPUs while it runs.

    A group commit's fsync asks the file system's journal thread for a commit and waits for it;
    that kernel thread wakes like any task, and on this project's kernel it waited 20-56 ms at
    a time to run behind the history sender's system calls (``jbd2_run_stats``'s request delay,
    docs/benchmarks.md, e-slow-cold, session 20): every produce waited with it. Moving a kernel
    thread needs CAP_SYS_NICE and changes it for every user of that file system, so this is
    done only with fetch.backlog.sender_cpus, logged, and undone when the broker stops."""

    def __init__(self) -> None:
        self._before: dict[int, set[int]] = {}

    def pin(self, paths: list[Path], cpus: frozenset[int]) -> None:
        for pid, name in journal_threads(paths).items():
            try:
                before = os.sched_getaffinity(pid)
                os.sched_setaffinity(pid, cpus)
            except PermissionError:
                log.warning(
                    "cannot move %s (pid %d) to the broker's CPUs %s: not permitted (needs "
                    "CAP_SYS_NICE); group commits may wait for it behind history's work "
                    "(taskset -p does it by hand)",
                    name,
                    pid,
                    format_cpus(cpus),
                )
                continue
            except ProcessLookupError:
                continue
            self._before[pid] = before
            log.info(
                "%s (pid %d) runs on CPU %s while the broker runs", name, pid, format_cpus(cpus)
            )

    def restore(self) -> None:
        for pid, cpus in self._before.items():
            try:
                os.sched_setaffinity(pid, cpus)
            except OSError:
                pass  # gone (the file system was unmounted) or no longer ours to move
        self._before.clear()
