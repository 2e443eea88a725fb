"""Latency recording with HdrHistogram (microseconds, 1 us .. 10 min, 3 significant digits).

Worker processes append raw latencies to an ``array('q')`` (a C-level append, far cheaper than
``HdrHistogram.record_value`` per record) and fold them into the histogram in bulk every 64 k
values, with numpy counting equal values first. Histograms cross process boundaries in
HdrHistogram's own compressed encoding and are merged with ``add``.
"""

from __future__ import annotations

from array import array

import numpy as np
from hdrh.histogram import HdrHistogram

LOWEST_US = 1
HIGHEST_US = 600_000_000
DIGITS = 3
_FOLD_AT = 65_536

PERCENTILES = (50.0, 99.0, 99.9)


def new_histogram() -> HdrHistogram:
    return HdrHistogram(LOWEST_US, HIGHEST_US, DIGITS)


class LatencyRecorder:
    """Collects latencies (us) cheaply; ``encode()`` gives the histogram to send to the parent."""

    def __init__(self) -> None:
        self.hist = new_histogram()
        self.pending = array("q")

    def add(self, us: int) -> None:
        self.pending.append(us)
        if len(self.pending) >= _FOLD_AT:
            self.fold()

    def extend(self, values: array) -> None:
        self.pending.extend(values)
        if len(self.pending) >= _FOLD_AT:
            self.fold()

    def fold(self) -> None:
        if not self.pending:
            return
        arr = np.frombuffer(self.pending, dtype=np.int64)
        arr = np.clip(arr, LOWEST_US, HIGHEST_US)
        values, counts = np.unique(arr, return_counts=True)
        for v, c in zip(values.tolist(), counts.tolist(), strict=True):
            self.hist.record_value(v, c)
        self.pending = array("q")

    def encode(self) -> bytes | None:
        self.fold()
        if self.hist.get_total_count() == 0:
            return None
        return self.hist.encode()


def merge(encoded: list[bytes | None]) -> HdrHistogram:
    total = new_histogram()
    for e in encoded:
        if e:
            total.add(HdrHistogram.decode(e))
    return total


def summary(h: HdrHistogram) -> dict[str, float] | None:
    """p50/p99/p99.9/max and mean in milliseconds, with the count; None when empty."""
    n = h.get_total_count()
    if n == 0:
        return None
    out: dict[str, float] = {"count": float(n)}
    for p in PERCENTILES:
        out[f"p{p:g}"] = h.get_value_at_percentile(p) / 1000.0
    out["max"] = h.get_max_value() / 1000.0
    out["mean"] = h.get_mean_value() / 1000.0
    return out


def bucket_quantile(
    before: dict[float, float], after: dict[float, float], q: float
) -> float | None:
    """The ``q`` quantile (seconds) of what a Prometheus histogram counted between two scrapes
    (cumulative counts by upper bound ``le``), interpolated within its bucket as Prometheus'
    ``histogram_quantile`` does; None if nothing was counted."""
    bounds = sorted(after)
    counts = [after[b] - before.get(b, 0.0) for b in bounds]
    if not counts or counts[-1] <= 0:
        return None
    rank = q * counts[-1]
    lower, below = 0.0, 0.0
    for bound, cum in zip(bounds, counts, strict=True):
        if cum >= rank:
            if bound == float("inf"):
                return lower  # past the last finite bucket: its bound is all we know
            inside = cum - below
            return lower + (bound - lower) * ((rank - below) / inside if inside else 1.0)
        lower, below = bound, cum
    return lower
