"""A stop that always ends: each step of a clean shutdown gets a bound.

A step that overruns it (an fsync the kernel never completes, a read thread stuck in a dying
disk, an unreachable etcd) is logged by name and left behind; the rest of the stop goes on. What
was not flushed is what recovery is for: the log keeps no clean-shutdown marker, so the next
start scans its tail.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
import traceback
from collections.abc import Awaitable, Callable

log = logging.getLogger(__name__)


class BoundedStop:
    """Runs the steps of one stop; ``complete`` is False once any step was given up."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.complete = True

    async def step(self, what: str, step: Awaitable[object]) -> None:
        try:
            await asyncio.wait_for(step, self.seconds)
        except TimeoutError:
            self.complete = False
            log.error("stop: gave up waiting for %s after %.0f s", what, self.seconds)
            log.error("stop: where every thread is:\n%s", thread_stacks())

    async def blocking(self, what: str, call: Callable[[], object]) -> None:
        """A blocking call (joining a thread pool) on a thread of its own, bounded."""
        await self.step(what, asyncio.to_thread(call))


def thread_stacks() -> str:
    """Every thread's stack, named: what a step that never ended was waiting behind (a stuck
    fsync, a lock) is only ever visible here."""
    names = {t.ident: t.name for t in threading.enumerate()}
    out = []
    for ident, frame in sys._current_frames().items():
        out.append(f"thread {names.get(ident, ident)}:")
        out.extend(line.rstrip() for line in traceback.format_stack(frame))
    return "\n".join(out)
