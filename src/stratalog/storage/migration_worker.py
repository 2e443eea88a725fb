"""Migration's copy work, in worker processes of their own.

Copying a hot segment's chunks into a cold segment is tens of thousands of small reads, header
parses and index entries per 64 MiB segment: Python work. Run on a thread of the broker, it
shares the broker's GIL with the event loop, and on a busy machine the loop waited for it in
runs of 5 ms timeouts (the interpreter's switch interval; seen with ``perf trace`` on the loop's
``futex`` calls) while every produce request waited for the loop: the produce p99 tripled while
migration ran (docs/benchmarks.md, e). In a process of its own the copy shares only the CPU and
the disk, and runs at a lower scheduling priority than the broker (``WORKER_NICE``), as
BookKeeper keeps compaction off the journal's path.

The worker reads the hot segment's file by name (the broker holds a reference to the segment,
so it is not deleted meanwhile), writes the cold segment and its index through its own
``ColdStore`` (synced before it returns), and hands back the cold segment's description and its
piece of chunk index. The broker commits the manifest and switches its index as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
import sys
import types
from array import array
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool

from stratalog.storage.chunk_index import ChunkIndex
from stratalog.storage.cold_tier import ColdSegmentMeta, ColdStore, ColdTierError, entries_index
from stratalog.storage.noatime import open_noatime
from stratalog.storage.priority import die_with_parent

WORKER_NICE = 10  # below the broker's threads: migration only has to keep up on average
READ_GAP = 4096  # bytes between two chunks read in one request
READ_SPAN = 1 << 20  # bytes read in one request at most

_stores: dict[tuple[str, str], ColdStore] = {}  # in a worker: one ColdStore per cold tier


def _start_worker(broker_pid: int, cpus: frozenset[int] = frozenset()) -> None:
    # A worker must not outlive a broker that was killed (kill -9): the pool's queues stay open
    # in every worker, so it would wait for work forever. Linux stops it with its parent.
    if not die_with_parent(broker_pid):
        os._exit(0)  # the broker died before that took effect
    if cpus:
        os.sched_setaffinity(0, cpus)
    try:
        os.nice(WORKER_NICE)
    except OSError:
        pass  # not allowed here: run at the broker's priority


def copy_down(
    location: str,
    options: dict | None,
    uid: int,
    hot_path: str,
    positions: bytes,
    sizes: bytes,
    rate: float = 0.0,
) -> tuple[ColdSegmentMeta, ChunkIndex]:
    """In a worker: copy the chunks at ``positions``/``sizes`` of the hot segment file into a
    new cold segment of partition ``uid``, synced, written at ``rate`` bytes per second if
    given; return its description and index piece."""
    key = (location, repr(sorted((options or {}).items())))
    cold = _stores.get(key)
    if cold is None:
        cold = _stores[key] = ColdStore(location, options)
    pos, size = array("q"), array("q")
    pos.frombytes(positions)
    size.frombytes(sizes)
    fd = open_noatime(hot_path, os.O_RDONLY)
    try:
        batches = read_ranges(fd, pos, size, hot_path)
    finally:
        os.close(fd)
    meta, entries = cold.write_segment(uid, batches, rate)
    return meta, entries_index(entries)


def read_ranges(fd: int, pos: array, size: array, name: str) -> list[memoryview]:
    """The byte ranges (``pos[i]``, ``size[i]``) of the file ``fd``, ascending (``spans``)."""
    return list(spans(lambda at, n: os.pread(fd, n, at), pos, size, name))


def spans(
    read: Callable[[int, int], bytes],
    pos: array,
    size: array,
    name: str,
    paced: Callable[[int], None] | None = None,
) -> Iterator[memoryview]:
    """The byte ranges (``pos[i]``, ``size[i]``), ascending, each as its own view, read with
    ``read(position, size)`` in as few requests as possible: ranges at most ``READ_GAP`` apart
    share one read of up to ``READ_SPAN`` bytes (a partition's chunks in a virtual log are back
    to back but for frame headers when it has the log to itself; thousands of small reads
    become a few large ones). ``paced`` is told the bytes of each read."""
    i, n = 0, len(pos)
    while i < n:
        start, end, j = pos[i], pos[i] + size[i], i + 1
        while j < n and pos[j] - end <= READ_GAP and pos[j] + size[j] - start <= READ_SPAN:
            end = pos[j] + size[j]
            j += 1
        span = memoryview(read(start, end - start))
        if len(span) != end - start:
            raise OSError(f"{name}: short read at {start}: {len(span)} of {end - start} B")
        if paced is not None:
            paced(len(span))
        for k in range(i, j):
            yield span[pos[k] - start : pos[k] - start + size[k]]
        i = j


@contextlib.contextmanager
def _plain_main():
    """While a worker starts, hide the host's ``__main__``: spawn would otherwise re-run the
    top of the script that embeds the broker in the new process (unguarded code included)."""
    saved = sys.modules.get("__main__")
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        if saved is not None:
            sys.modules["__main__"] = saved


class CopyWorkers:
    """A pool of ``workers`` copy processes, started at the first copy."""

    def __init__(self, cold: ColdStore, workers: int, cpus: frozenset[int] = frozenset()) -> None:
        self._location = cold.location
        self._cpus = cpus
        self._options = cold.options
        self._workers = max(1, workers)
        self._pool: ProcessPoolExecutor | None = None

    def _executor(self) -> ProcessPoolExecutor:
        if self._pool is None:
            # spawn: a fork of a threaded broker could copy a lock held by another thread.
            self._pool = ProcessPoolExecutor(
                self._workers,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=_start_worker,
                initargs=(os.getpid(), self._cpus),
            )
        return self._pool

    async def start(self) -> None:
        """Start the workers now (spawning one imports the package: better at start-up than
        in the middle of the first migration)."""
        loop = asyncio.get_running_loop()
        pool = self._executor()
        with _plain_main():  # a pool starts its processes as work is submitted
            started = [loop.run_in_executor(pool, os.getpid) for _ in range(self._workers)]
        await asyncio.gather(*started)

    async def copy_down(
        self, uid: int, hot_path: str, locations: tuple[array, array], rate: float = 0.0
    ) -> tuple[ColdSegmentMeta, ChunkIndex]:
        pos, size = locations
        loop = asyncio.get_running_loop()
        try:
            with _plain_main():
                done = loop.run_in_executor(
                    self._executor(),
                    copy_down,
                    self._location,
                    self._options,
                    uid,
                    hot_path,
                    pos.tobytes(),
                    size.tobytes(),
                    rate,
                )
            return await done
        except BrokenProcessPool as e:
            # A worker died (killed, out of memory): start afresh next time; nothing was
            # committed, so the step is simply retried.
            self.close()
            raise ColdTierError(f"a migration worker died: {e}") from e

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
