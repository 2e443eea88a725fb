"""The garbage collector's settings for a broker process (``stratalog serve``).

Python's defaults collect the young generation every 700 net container allocations. A broker
at 10,000 requests/s allocates that many in well under a millisecond, and most of what survives
a young collection is promoted and scanned again by older ones, so with the defaults the
collector took about 20% of a core and paused the event loop for up to 70 ms at a time
(docs/benchmarks.md, "the collector"). Almost everything a request allocates is freed by
reference counting anyway; the cycles the collector exists for are rare here.

So a serving broker freezes what exists once it is up (``gc.freeze``: modules, classes,
configuration go to the permanent generation, which is never scanned), and may collect the
young generation less often (``gc.young_threshold``; each young collection then takes longer).
Not applied to an embedded ``Broker``: the collector is the host process's to set.
"""

from __future__ import annotations

import gc


def apply(freeze: bool, young_threshold: int) -> None:
    """Freeze the objects that exist now, and set the young generation's threshold (0: keep
    Python's)."""
    if freeze:
        gc.collect()
        gc.freeze()
    if young_threshold > 0:
        _, middle, old = gc.get_threshold()
        gc.set_threshold(young_threshold, middle, old)
