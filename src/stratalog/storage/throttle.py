"""A byte-rate limit shared by the coroutines of one event loop (migration, backlog reads)."""

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

    async def admit(self, nbytes: int) -> None:
        if self.rate <= 0 or nbytes <= 0:
            return
        now = time.monotonic()
        self._until = max(now, self._until) + nbytes / self.rate
        await asyncio.sleep(self._until - now)
