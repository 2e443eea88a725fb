"""Splits under load (dynamic partitioning, stratalog.splits): a topic with
``partition.autoscale.enable=true`` is split when one of its partitions took more than
``partition.autoscale.bytes.per.sec`` on average over ``partition.autoscale.window.ms``.

Rates come from each partition's count of appended bytes, sampled once per tick; after a split
the topic's samples start again, so the next split needs a whole window of its own.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque

from stratalog import splits
from stratalog.cluster.metadata import MetadataError

log = logging.getLogger(__name__)

TICK_S = 0.25


class Autoscaler:
    def __init__(self, core) -> None:
        self.core = core
        self._samples: dict[str, deque[tuple[float, list[int]]]] = {}

    async def run(self) -> None:
        while True:
            await asyncio.sleep(TICK_S)
            try:
                for name in self.step(time.monotonic()):
                    try:
                        await self.core.split(name)
                    except MetadataError as e:
                        log.warning("cannot split %s: %s", name, e)
            except Exception:
                log.exception("partition autoscaling failed")

    def step(self, now: float) -> list[str]:
        """Sample every autoscaled topic; return those to split. (In a cluster each broker
        sees the partitions it leads; a split asked for by two at once is made once: the
        second finds the count doubled already and is refused.)"""
        core = self.core
        done = []
        for name, t in list(core.metadata.topics.items()):
            # (Its default is false: an override only; the view below for those that split.)
            if t.configs.get(splits.AUTOSCALE_ENABLE) != "true":
                self._samples.pop(name, None)
                continue
            view = core.topic_config(t)
            parts = [core.store.partitions.get(uid) for uid in t.partitions]
            counts = [p.appended_bytes if p is not None else 0 for p in parts]
            window = view.get_int(splits.AUTOSCALE_WINDOW) / 1000
            samples = self._samples.setdefault(name, deque())
            if samples and len(samples[0][1]) != len(counts):
                samples.clear()  # split on request since the last tick
            samples.append((now, counts))
            while len(samples) > 2 and now - samples[1][0] >= window:
                samples.popleft()
            t0, first = samples[0]
            if now - t0 < window:
                continue
            limit = view.get_int(splits.AUTOSCALE_BYTES)
            rates = [(b - a) / (now - t0) for a, b in zip(first, counts, strict=True)]
            total = 2 * len(counts)
            if max(rates) <= limit or total > view.get_int(splits.AUTOSCALE_MAX):
                continue
            hot = rates.index(max(rates))
            log.info("%s-%d took %.0f B/s over %.1f s (limit %d): splitting the topic",
                     name, hot, rates[hot], now - t0, limit)  # fmt: skip
            samples.clear()
            done.append(name)
        return done
