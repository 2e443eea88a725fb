"""The garbage collector's settings for a broker process (``stratalog serve``).

Measured with ``gc.callbacks`` in a broker taking about 10,000 small produce requests a second,
Python's defaults ran some 290 young, 26 middle and 2-3 full collections a second: about a
fifth of a core, with full passes of up to 70 ms that stall the event loop and every request
queued on it (docs/benchmarks.md, "the collector"). Most of what a full pass scans is what the
broker made at start-up and keeps for its lifetime: modules, classes, functions.

So a serving broker freezes what exists once it is up (``gc.freeze``: modules, classes,
configuration go to the permanent generation, which is never scanned), and may collect the
young generation less often (``gc.young_threshold``; each young collection then takes longer).
Not applied to an embedded ``Broker``: the collector is the host process's to set.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable


def apply(freeze: bool, young_threshold: int) -> None:
    """Freeze the objects that exist now, and set the young generation's threshold (0: keep
    Python's)."""
    if freeze:
        gc.collect()
        gc.freeze()
    if young_threshold > 0:
        _, middle, old = gc.get_threshold()
        gc.set_threshold(young_threshold, middle, old)


def observe_pauses(observe: Callable[[float], None]) -> None:
    """Report every collection's duration (each one stops the event loop) to ``observe``."""
    started = 0.0

    def on_collection(phase: str, _info: dict) -> None:
        nonlocal started
        if phase == "start":
            started = time.perf_counter()
        else:
            observe(time.perf_counter() - started)

    gc.callbacks.append(on_collection)
