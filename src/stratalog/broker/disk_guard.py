"""The free-space reserve: produce is refused before the disk is full, and resumes by itself.

Every ``interval`` the guard reads the free space of the file system under the logs (statvfs,
no I/O to the device). Under ``storage.min_free_bytes`` (as Redpanda's minimum free bytes) the
broker refuses produce requests with KAFKA_STORAGE_ERROR (retriable: clients keep their records
and retry) and a message naming the path and the figures, logs the change once, and exports it
(``stratalog_disk_free_bytes``, ``stratalog_disk_low``, ``stratalog status``). As soon as space
returns (retention, migration to the cold tier, an operator) produce resumes: no restart.
"""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path

from prometheus_client import Gauge

log = logging.getLogger(__name__)

FREE_BYTES = Gauge("stratalog_disk_free_bytes", "Free bytes of the logs' file system")
LOW = Gauge("stratalog_disk_low", "1 while free space is under storage.min_free_bytes")


class DiskGuard:
    def __init__(self, path: Path, reserve: int, interval: float = 0.5) -> None:
        self.path = path
        self.reserve = reserve
        self.interval = interval
        self.free = -1
        self.low = False

    def check(self) -> bool:
        """Read the free space now; True while it is under the reserve."""
        try:
            st = os.statvfs(self.path)
        except OSError as e:
            log.warning("cannot read the free space of %s: %s", self.path, e)
            return self.low
        self.free = st.f_bavail * st.f_frsize
        FREE_BYTES.set(self.free)
        low = self.reserve > 0 and self.free < self.reserve
        if low != self.low:
            self.low = low
            LOW.set(int(low))
            if low:
                log.error("%s; produce refused until space returns", self.reason())
            else:
                log.warning(
                    "free space on %s is back to %d B: produce resumes", self.path, self.free
                )
        return low

    def reason(self) -> str:
        return (
            f"free space on {self.path} is {self.free} B, under storage.min_free_bytes "
            f"({self.reserve} B)"
        )

    async def run(self) -> None:
        while True:
            self.check()
            await asyncio.sleep(self.interval)
