"""Deleting segment files off the event loop, a few MiB at a time.

Unlinking a 64 MiB segment file whose pages are in the page cache took 14-17 ms on this
project's machine: the kernel frees every cached page before ``unlink`` returns. Migration and
retention delete a hot segment every few seconds under load, and on the event loop each one held
every produce request for that long (the catch-up benchmark's produce p99 doubled while
migration ran, with the loop's lag p99 unmoved because such stalls are rare). A file that is no
longer referenced goes to this one thread instead; a crash before it is unlinked leaves a
segment no live chunk refers to, which start-up deletes (``LogStore._collect_garbage``).

Unlinked at once even there, the file's extents and pages were freed in one go, and the
journal's group-commit fsyncs issued meanwhile waited for the file system to commit that (their
p99 rose from 1.7 to 2.9-4.2 ms in the catch-up benchmark). So a segment is first renamed out of
the way (``.deleting``: recovery never takes it for a torn segment, and start-up removes it,
``sweep``), then cut down ``SHRINK_BYTES`` at a time with a pause between steps (as RocksDB's
delete scheduler truncates large files in chunks), and only then unlinked.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from pathlib import Path

log = logging.getLogger(__name__)

SHRINK_BYTES = 8 << 20  # cut per step
SHRINK_PAUSE_S = 0.02  # between steps: about 400 MB/s of deletion at most
DELETING = ".deleting"

_lock = threading.Lock()
_queue: queue.Queue[tuple[tuple[Path, ...], bool]] = queue.Queue()
_thread: threading.Thread | None = None


def _shrink_away(path: Path) -> None:
    gone = path.with_name(path.name + DELETING)
    os.rename(path, gone)
    fd = os.open(gone, os.O_WRONLY)
    try:
        size = os.fstat(fd).st_size
        while size > SHRINK_BYTES:
            size -= SHRINK_BYTES
            os.ftruncate(fd, size)
            time.sleep(SHRINK_PAUSE_S)
    finally:
        os.close(fd)
    gone.unlink()


def _unlink(paths: tuple[Path, ...], shrink: bool) -> None:
    for p in paths:
        try:
            if shrink:
                _shrink_away(p)
            else:
                p.unlink()
        except FileNotFoundError:
            pass
        except OSError as e:
            log.error("cannot delete %s: %s", p, e)


def unlink(*paths: Path, shrink: bool = False) -> None:
    """Delete ``paths`` soon, on the reaper's thread; ``shrink``: a few MiB at a time (only for
    files nobody has open: a descriptor still reading one would see it cut). The thread is a
    daemon: what is still queued at exit is left to the next start-up."""
    global _thread
    with _lock:
        if _thread is None:
            _thread = threading.Thread(target=_run, name="stratalog-reaper", daemon=True)
            _thread.start()
    _queue.put((paths, shrink))


def _run() -> None:
    while True:
        paths, shrink = _queue.get()
        try:
            _unlink(paths, shrink)
        except Exception:
            log.exception("cannot delete %s", paths)
        finally:
            _queue.task_done()


def drain() -> None:
    """Wait until every file handed over so far is deleted (tests)."""
    _queue.join()


def sweep(directory: Path) -> None:
    """At start-up: remove what a crash left half deleted in ``directory``."""
    for p in directory.glob("*" + DELETING):
        p.unlink(missing_ok=True)
