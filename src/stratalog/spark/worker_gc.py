"""The collector in PySpark's Python workers, where this package's readers run.

A reused PySpark worker runs a full ``gc.collect()`` after every task (``pyspark/daemon.py``).
Each pass walks every tracked object of the worker: PySpark, pyarrow and this package, some
110,000 objects, all alive for the worker's lifetime. Reading a 1 GiB topic with
``format("stratalog")``, perf put 19% of a worker's CPU in the collector and none of it inside
the read itself (``gc.get_stats`` around it counted no collection). So the first read in a
worker freezes what exists then (``gc.freeze``: the permanent generation is never walked), and
the per-task passes only walk what tasks made since. Once per process: freezing at every task
would also pin each task's leftovers.
"""

from __future__ import annotations

import gc

_frozen = False


def freeze_once() -> None:
    """Move the objects alive now to the permanent generation, the first time only."""
    global _frozen
    if _frozen:
        return
    _frozen = True
    gc.collect()
    gc.freeze()
