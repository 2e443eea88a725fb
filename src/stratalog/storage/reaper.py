"""Deleting segment files off the event loop, a little at a time.

Deleting a 64 MiB segment costs more than it looks on a file system mounted with online discard
(``-o discard``, as this project's machine and many cloud VMs are): the freed extents are
discarded when the file system's journal commits, and every ``fdatasync`` that needs that commit
waits for it. Traced in the broker, a migrated segment's ``unlink`` held the event loop for
98-111 ms (every produce request arriving meanwhile waited), and unlinked on a thread instead it
held the journal's group-commit fsyncs for 30-60 ms. Beside a loop of 16 KiB appends with
``fdatasync`` (``docs/benchmarks.md``, "Deleting segments"), an ``unlink`` of a cached 64 MiB
file raised the fsync's maximum from 5 to 77-92 ms; cut down 4 MiB at a time, to 11-89 ms; 2 MiB
per 10 ms, to 6-7 ms, with the p99 at 2.3 ms against 1-1.8 ms.

So a segment nobody reads any more is handed to this one thread, which runs below the broker's
other threads (nice +10): it renames the file out of the way (``.deleting``: recovery never
takes a half-deleted segment for a torn one, and start-up removes such files, ``sweep``), drops
its pages from the page cache, cuts it down ``STEP_BYTES`` at a time with a pause between
steps (as RocksDB's delete scheduler does), and unlinks what is left. A crash before the rename
leaves a whole segment no live chunk refers to, which start-up deletes
(``LogStore._collect_garbage``).
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from pathlib import Path

log = logging.getLogger(__name__)

STEP_BYTES = 2 << 20  # cut per step
STEP_PAUSE_S = 0.01  # between steps: at most 200 MB/s of deletion
REAPER_NICE = 10
DELETING = ".deleting"

_lock = threading.Lock()
_queue: queue.Queue[tuple[tuple[Path, ...], bool]] = queue.Queue()
_thread: threading.Thread | None = None


def _shrink_away(path: Path) -> None:
    gone = path.with_name(path.name + DELETING)
    # No directory fsync: the file system's journal commits the rename no later than the first
    # cut that follows it, so a crash never leaves a cut file under its segment's name.
    os.rename(path, gone)
    fd = os.open(gone, os.O_WRONLY)
    try:
        size = os.fstat(fd).st_size
        # Cached pages go first (cheap, and no journal commit waits for them), then the
        # extents, a step at a time, each step's discard small enough to hide in one commit.
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        while size > STEP_BYTES:
            size -= STEP_BYTES
            os.ftruncate(fd, size)
            time.sleep(STEP_PAUSE_S)
    finally:
        os.close(fd)
    gone.unlink()


def _delete(paths: tuple[Path, ...], shrink: bool) -> None:
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


def unlink(*paths: Path, shrink: bool = True) -> None:
    """Delete ``paths`` soon, on the reaper's thread; ``shrink`` (a step at a time) only for
    files nobody has open: a descriptor still reading one would see it cut. The thread is a
    daemon: what is still queued at exit is left to the next start-up."""
    global _thread
    with _lock:
        if _thread is None or not _thread.is_alive():
            _thread = threading.Thread(target=_run, name="stratalog-reaper", daemon=True)
            _thread.start()
    _queue.put((paths, shrink))


def _run() -> None:
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), REAPER_NICE)
    except OSError:
        pass  # not allowed here: deletions run at the broker's priority
    while True:
        paths, shrink = _queue.get()
        try:
            _delete(paths, shrink)
        except Exception:
            log.exception("cannot delete %s", paths)
        finally:
            _queue.task_done()


def drain() -> None:
    """Wait until every file handed over so far is deleted (shutdown, tests)."""
    _queue.join()


def sweep(directory: Path) -> None:
    """At start-up: remove what a crash left half deleted in ``directory``."""
    for p in directory.glob("*" + DELETING):
        p.unlink(missing_ok=True)
