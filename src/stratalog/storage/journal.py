"""Group commit for one log (BookKeeper's journal): fsync before ack, one fsync per group.

Appends are written to the page cache on the event loop and counted in a log sequence number
(LSN: bytes appended to the log so far). Under ``fsync=always`` one ``fdatasync`` per dirty
segment makes a group durable, submitted to an io_uring from the event loop (storage.fsync_via)
or run on a worker thread, while the next group gathers. By default (``group_commit_ms`` 0)
the group commit is adaptive, as a database's WAL flusher: a sync starts at the end of the loop
turn that appended something, unless one is in flight; the appends that arrive meanwhile are
the next group, which starts the moment it returns. A lone request pays one fsync, and a busy
log shares each fsync among everything one fsync's time brought (the group is bounded by that
time). With ``group_commit_ms`` > 0 a group instead waits that long for company, or until it
holds ``group_commit_bytes``. When it returns, every append up
to the group's LSN is durable and ``on_durable`` is called with that LSN. Under ``interval:<ms>``
and ``never`` appends count as durable at once (the page cache is the promise) and syncs run on a
timer or only at shutdown.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass

from prometheus_client import Counter, Gauge, Histogram

from stratalog.storage.fsync_ring import FsyncRing
from stratalog.storage.segment import Segment

log = logging.getLogger(__name__)

# BookKeeper's journal sync latency: one observation per group commit (all its segments).
# Buckets grow by 1.25x from 0.1 ms to ~26 s, as the request histogram's.
SYNC_SECONDS = Histogram(
    "stratalog_fsync_seconds",
    "Time of one group commit's fsyncs",
    buckets=[round(0.0001 * 1.25**i, 7) for i in range(57)],
)


# The same group commit as the event loop sees it: from handing the fsyncs to the I/O thread to
# their completion running on the loop. Beyond SYNC_SECONDS it holds the hand-offs (the thread's
# wake-up, the GIL both ways, the loop's turn), which a produce waiting for durability pays too.
COMMIT_SECONDS = Histogram(
    "stratalog_group_commit_seconds",
    "Time of one group commit from the event loop: its fsyncs and the hand-offs to and from "
    "the thread that runs them",
    buckets=[round(0.0001 * 1.25**i, 7) for i in range(57)],
)


# Which way each group commit's fsyncs went (storage.fsync_via): "io_uring" or "thread".
FAILED_LOGS = Gauge(
    "stratalog_logs_failed",
    "Virtual logs stopped by a failed fsync (they acknowledge nothing until a restart)",
)
COMMITS = Counter(
    "stratalog_group_commits",
    "Group commits completed, by the way their fsyncs ran",
    ["via"],
)


class SlowestSync:
    """The slowest group-commit fsync (one that acks=all waits for) since it was last read,
    over all journals of the process: what the backlog read budget is steered by
    (throttle.FsyncGuidedRate). Written by the I/O threads."""

    def __init__(self) -> None:
        self._slowest: float | None = None
        self._lock = threading.Lock()  # the sample a race would lose is the slow one

    def note(self, seconds: float) -> None:
        with self._lock:
            if self._slowest is None or seconds > self._slowest:
                self._slowest = seconds

    def take(self) -> float | None:
        with self._lock:
            s, self._slowest = self._slowest, None
        return s


SLOWEST_SYNC = SlowestSync()


@dataclass(frozen=True, slots=True)
class FsyncPolicy:
    mode: str  # "always" | "interval" | "never"
    interval_ms: int = 0

    @classmethod
    def parse(cls, text: str) -> FsyncPolicy:
        t = str(text).strip().lower()
        if t in ("always", "never"):
            return cls(t)
        if t.startswith("interval:"):
            try:
                ms = int(t.split(":", 1)[1])
            except ValueError:
                ms = -1
            if ms > 0:
                return cls("interval", ms)
        raise ValueError(
            f"fsync must be 'always', 'never' or 'interval:<ms>' (ms > 0), not {text!r}"
        )

    def __str__(self) -> str:
        return f"interval:{self.interval_ms}" if self.mode == "interval" else self.mode


class StorageFailure(RuntimeError):
    """An fsync failed: what is in the page cache can no longer be promised durable."""


class GroupCommit:
    def __init__(
        self,
        policy: FsyncPolicy,
        executor: Executor,
        on_durable: Callable[[int], None],
        *,
        group_ms: float = 0.0,
        group_bytes: int = 512 * 1024,
        ring: FsyncRing | None = None,
        name: str = "",
    ) -> None:
        self.policy = policy
        self.name = name  # the virtual log's, for errors
        self._executor = executor
        # When set, the group's fdatasyncs (and a new segment's directory fsync) go through
        # io_uring and complete on the loop, with no thread hand-off (fsync_ring.py).
        self._ring = ring
        self._on_durable = on_durable
        self._group_s = group_ms / 1000.0
        self._group_bytes = group_bytes
        self.appended = 0
        self.durable = 0
        self.failed: BaseException | None = None
        self._dirty: dict[int, Segment] = {}
        self._group_size = 0
        self._group_start: float | None = None
        self._flushing = False
        self._timer: asyncio.Handle | None = None
        self._closed = False
        self.syncs = 0  # fsync groups completed, for metrics and tests
        self._loop: asyncio.AbstractEventLoop | None = None
        self._idle: asyncio.Event | None = None

    def _ensure_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
            if self.policy.mode == "interval":
                self._timer = self._loop.call_later(self.policy.interval_ms / 1000, self._tick)
        return self._loop

    def note_append(self, segment: Segment, lsn: int, nbytes: int) -> None:
        """Record that bytes up to ``lsn`` are in ``segment``'s page cache."""
        self.appended = lsn
        self._dirty[segment.seq] = segment
        if self.policy.mode != "always":
            self.durable = lsn
            self._on_durable(lsn)
            if self.policy.mode == "interval":
                self._ensure_loop()
            return
        loop = self._ensure_loop()
        self._group_size += nbytes
        if self._group_start is None:
            self._group_start = loop.time()
        if self._flushing:
            return
        if self._group_s <= 0:
            # Adaptive: the rest of this loop turn's appends (the other requests one read
            # brought, other connections' requests) join this sync at no cost in latency.
            if self._timer is None:
                self._timer = loop.call_soon(self._start_flush)
        elif self._group_size >= self._group_bytes:
            self._start_flush()
        elif self._timer is None:
            self._timer = loop.call_at(self._group_start + self._group_s, self._start_flush)

    def forget(self, segment: Segment) -> None:
        """A segment that is going away (truncated off): its unsynced bytes need no fsync."""
        if self._dirty.get(segment.seq) is segment:
            del self._dirty[segment.seq]

    def _start_flush(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._flushing or self.durable >= self.appended or self.failed:
            return
        target = self.appended
        segments = list(self._dirty.values())
        for s in segments:
            s.acquire()
        self._dirty.clear()
        self._group_size = 0
        self._group_start = None
        self._flushing = True
        loop = self._ensure_loop()
        started = loop.time()
        ring = self._ring
        if ring is not None and not ring.closed and self._ring_flush(segments, target, started):
            return
        fut = loop.run_in_executor(self._executor, _sync_all, segments)
        fut.add_done_callback(lambda f: self._thread_flushed(f, target, segments, started))

    def _ring_flush(self, segments: list[Segment], target: int, started: float) -> bool:
        """Hand the group's syncs to the ring (a new segment's directory too); False if a
        directory cannot be opened here, and the thread's path reports why."""
        assert self._ring is not None
        sizes = [s.size for s in segments]
        new = [s for s in segments if not s.dir_synced]
        dirs: list[int] = []
        try:
            for directory in {s.directory for s in new}:
                dirs.append(os.open(directory, os.O_RDONLY | os.O_DIRECTORY))
        except OSError:
            for fd in dirs:
                os.close(fd)
            return False

        def done(err: int) -> None:
            for fd in dirs:
                os.close(fd)
            took = self._ensure_loop().time() - started
            # The kernel's time and the loop's are one here: no hand-off to tell apart.
            SYNC_SECONDS.observe(took)
            SLOWEST_SYNC.note(took)
            if not err:
                for seg in new:
                    seg.dir_synced = True
                for seg, size in zip(segments, sizes, strict=True):
                    seg.synced(size)
            COMMITS.labels("io_uring").inc()
            failure = OSError(err, os.strerror(err)) if err else None
            self._flushed(failure, target, segments, started)

        self._ring.sync([s.fd for s in segments], done, full=dirs)
        return True

    def _thread_flushed(
        self, fut: asyncio.Future[None], target: int, segments: list[Segment], started: float
    ) -> None:
        COMMITS.labels("thread").inc()
        self._flushed(fut.exception(), target, segments, started)

    def _flushed(
        self, exc: BaseException | None, target: int, segments: list[Segment], started: float
    ) -> None:
        self._flushing = False
        COMMIT_SECONDS.observe(self._ensure_loop().time() - started)
        for s in segments:
            s.release()
        if exc is not None:
            # After a failed fsync the kernel may have dropped the dirty pages: never retry and
            # pretend (PostgreSQL's fsyncgate). The log stops acknowledging.
            self.fail(StorageFailure(f"virtual log {self.name}: fsync failed: {exc}"))
            if self._idle is not None:
                self._idle.set()
            return
        self.syncs += 1
        self.durable = target
        self._on_durable(target)
        if self._idle is not None and self.durable >= self.appended:
            self._idle.set()
        if self.appended > self.durable and not self._closed:
            loop = self._ensure_loop()
            start = self._group_start if self._group_start is not None else loop.time()
            if self._group_size >= self._group_bytes or loop.time() - start >= self._group_s:
                self._start_flush()
            elif self._timer is None:
                self._timer = loop.call_at(start + self._group_s, self._start_flush)

    def fail(self, failure: StorageFailure) -> None:
        """A write or fsync failed: stop acknowledging, and fail everything waiting for
        durability."""
        if self.failed is None:
            self.failed = failure
            log.error(
                "%s; virtual log %s acknowledges nothing more (its partitions answer "
                "KAFKA_STORAGE_ERROR) until the broker restarts and recovers it",
                failure,
                self.name,
            )
            FAILED_LOGS.inc()
        self._on_durable(-1)

    def _tick(self) -> None:
        self._timer = None
        if self._closed:
            return
        if self._dirty and not self._flushing:
            segments = list(self._dirty.values())
            self._dirty.clear()
            for s in segments:
                s.acquire()
            self._flushing = True
            loop = self._ensure_loop()
            fut = loop.run_in_executor(self._executor, _sync_all, segments)
            fut.add_done_callback(lambda f: self._interval_done(f, segments))
        loop = self._ensure_loop()
        self._timer = loop.call_later(self.policy.interval_ms / 1000, self._tick)

    def _interval_done(self, fut: asyncio.Future[None], segments: list[Segment]) -> None:
        self._flushing = False
        for s in segments:
            s.release()
        if fut.exception() is not None:
            log.error("periodic fsync failed: %s", fut.exception())
        else:
            self.syncs += 1

    async def drain(self) -> None:
        """Wait until every append so far is durable (used before a clean shutdown)."""
        if self.policy.mode == "always":
            while self.durable < self.appended and not self.failed:
                self._idle = asyncio.Event()
                self._start_flush()
                await self._idle.wait()
        while self._flushing:
            await asyncio.sleep(0.001)
        self.sync_now()

    def sync_now(self) -> None:
        """Synchronously sync every dirty segment (shutdown, segment seal in tests)."""
        for s in list(self._dirty.values()):
            s.sync()
        self._dirty.clear()
        if not self.failed:
            self.durable = self.appended

    def close(self) -> None:
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


def _sync_all(segments: list[Segment]) -> None:
    t0 = time.monotonic()
    for s in segments:
        s.sync()
    took = time.monotonic() - t0
    SYNC_SECONDS.observe(took)
    SLOWEST_SYNC.note(took)
