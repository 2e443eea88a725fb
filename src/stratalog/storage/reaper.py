"""Deleting segment files off the event loop.

Unlinking a 64 MiB segment file whose pages are in the page cache took 14-17 ms on this
project's machine: the kernel frees every cached page before ``unlink`` returns. Migration and
retention delete a hot segment every few seconds under load, and on the event loop each one held
every produce request for that long (the catch-up benchmark's produce p99 doubled while
migration ran, with the loop's lag p99 unmoved because such stalls are rare). A file that is no
longer referenced goes to this one thread instead; a crash before it is unlinked leaves a
segment no live chunk refers to, which start-up deletes (``LogStore._collect_garbage``).
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import Future, ThreadPoolExecutor, wait
from pathlib import Path

log = logging.getLogger(__name__)

_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None
_pending: set[Future] = set()


def _unlink(paths: tuple[Path, ...]) -> None:
    for p in paths:
        try:
            p.unlink()
        except FileNotFoundError:
            pass
        except OSError as e:
            log.error("cannot delete %s: %s", p, e)


def unlink(*paths: Path) -> None:
    """Delete ``paths`` soon, on the reaper's thread."""
    global _pool
    with _lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(1, thread_name_prefix="stratalog-reaper")
        fut = _pool.submit(_unlink, paths)
        _pending.add(fut)
    fut.add_done_callback(_forget)


def _forget(fut: Future) -> None:
    with _lock:
        _pending.discard(fut)


def drain(timeout: float | None = 30.0) -> None:
    """Wait until every file handed over so far is deleted (shutdown, tests)."""
    with _lock:
        todo = set(_pending)
    wait(todo, timeout)
