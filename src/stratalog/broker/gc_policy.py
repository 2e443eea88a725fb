"""The garbage collector's settings for a broker process (``stratalog serve``).

Python's defaults collect the young generation every 700 net container allocations. A broker
at 10,000 requests/s allocates that many in well under a millisecond, and most of what survives
a young collection is promoted and scanned again by older ones, so with the defaults the
collector took about 20% of a core and paused the event loop for up to 70 ms at a time
(docs/benchmarks.md, "the collector"). Almost everything a request allocates is freed by
reference counting anyway; the cycles the collector exists for are rare here.

So a serving broker (1) freezes what exists once it is up (modules, classes, configuration: the
permanent generation is never scanned) and (2) collects the young generation only every
``gc.young_threshold`` net allocations. Not applied to an embedded ``Broker``: the collector is
the host process's to set.
"""

from __future__ import annotations

import gc


def apply(young_threshold: int) -> None:
    """Freeze the objects that exist now and raise the young generation's threshold; 0 leaves
    Python's defaults alone."""
    if young_threshold <= 0:
        return
    gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(young_threshold, middle, old)
