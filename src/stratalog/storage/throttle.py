"""A byte-rate limit shared by the coroutines of one event loop (migration, backlog reads), and
the controller that can steer the backlog's limit by the journal's fsync latency."""

from __future__ import annotations

import asyncio
import time


class ByteRate:
    """Spaces work out to ``rate`` bytes per second: each caller is scheduled after the bytes
    admitted before it and returns once its own bytes' time has passed. ``rate <= 0`` means
    unlimited."""

    def __init__(self, rate: int) -> None:
        self.rate = rate
        self._until = 0.0
        self.admitted = 0  # bytes asked for so far, limited or not

    async def admit(self, nbytes: int) -> None:
        if nbytes > 0:
            self.admitted += nbytes
        if self.rate <= 0 or nbytes <= 0:
            return
        now = time.monotonic()
        self._until = max(now, self._until) + nbytes / self.rate
        await asyncio.sleep(self._until - now)


class FsyncGuidedRate:
    """Steers a ByteRate between ``floor`` and ``ceiling`` by the journal's fsync latency:
    additive increase while backlog reads want more and the slowest fsync of the last interval
    met ``target`` seconds, multiplicative decrease when it did not (TCP's AIMD).

    Backlog reads delay producers through the disk: the journal's fsyncs queue behind them. A
    fixed byte rate has to be chosen for the slowest disk and the busiest hour; this one finds
    the rate the disk can serve beside the journal now, and gives it back when the journal
    slows down.
    """

    DECREASE = 0.5

    def __init__(self, rate: ByteRate, target: float, floor: int, ceiling: int) -> None:
        self.rate = rate
        self.target = target
        self.floor = floor
        self.ceiling = max(ceiling, floor)
        self.step = floor  # per interval: from the floor to 100 MB/s in a few seconds
        self._seen = rate.admitted
        rate.rate = floor

    def tick(self, slowest_fsync: float | None) -> int:
        """One interval passed; ``slowest_fsync`` is its slowest group-commit fsync (None: no
        fsync happened). Returns the new rate."""
        wanted = self.rate.admitted > self._seen
        self._seen = self.rate.admitted
        r = self.rate.rate
        if slowest_fsync is not None and slowest_fsync > self.target:
            r = max(self.floor, int(r * self.DECREASE))
        elif wanted:
            r = min(self.ceiling, r + self.step)
        self.rate.rate = r
        return r
