"""A stop that always ends: each step of a clean shutdown gets a bound.

A step that overruns it (an fsync the kernel never completes, a read thread stuck in a dying
disk, an unreachable etcd) is logged by name and left behind; the rest of the stop goes on. What
was not flushed is what recovery is for: the log keeps no clean-shutdown marker, so the next
start scans its tail.
"""

from __future__ import annotations

import asyncio
import logging
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

    async def blocking(self, what: str, call: Callable[[], object]) -> None:
        """A blocking call (joining a thread pool) on a thread of its own, bounded."""
        await self.step(what, asyncio.to_thread(call))
