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


def split(sender: frozenset[int]) -> tuple[frozenset[int], frozenset[int]]:
    """(the broker's CPUs, the sender's) out of those this process may run on."""
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
    return broker, sender


def format_cpus(cpus: frozenset[int]) -> str:
    return ",".join(map(str, sorted(cpus)))


def pin_this_thread(cpus: frozenset[int], who: str) -> None:
    """Run the calling thread (and what it starts from now on) on ``cpus`` only."""
    os.sched_setaffinity(0, cpus)
    log.info("%s runs on CPU %s", who, format_cpus(cpus))
