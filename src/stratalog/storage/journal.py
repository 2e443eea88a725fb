"""Group commit for one log (BookKeeper's journal): fsync before ack, one fsync per group.

Appends are counted in a log sequence number (LSN: bytes appended to the log so far). Under
``fsync=always`` a group gathers appends until it holds ``group_commit_bytes`` or is
``group_commit_ms`` old, then one ``fdatasync`` per dirty segment runs in a worker thread while
the next group gathers. When it returns, every append up to the group's LSN is durable and
``on_durable`` is called with that LSN.

With write-behind (``storage.write_behind``, under ``fsync=always``) the event loop does not
write either: it reserves the bytes' place in the segment and stages references to them, and the
same worker writes a group's staged appends, in order and coalesced, before its fsync
(BookKeeper's journal thread). The loop's share of an append is then bookkeeping; the copy into
the kernel runs beside it. ``on_written`` reports the LSN up to which appends are in the file
(what ``acks=1`` waits for: a broker process killed after that loses nothing).

Under ``interval:<ms>`` and ``never`` appends are written on the loop and count as durable at
once (the page cache is the promise); syncs run on a timer or only at shutdown.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass

from prometheus_client import Histogram

from stratalog.storage.segment import Segment

log = logging.getLogger(__name__)

# BookKeeper's journal sync latency: one observation per group commit (all its segments).
# Buckets grow by 1.5x from 0.1 ms to ~4 s.
SYNC_SECONDS = Histogram(
    "stratalog_fsync_seconds",
    "Time of one group commit's fsyncs",
    buckets=[round(0.0001 * 1.5**i, 7) for i in range(27)],
)


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


# A staged write: (segment, position, parts, bytes); a staged seal: (segment, None, None, 0).
# Each holds one reference on its segment until the group that carries it is done.
Staged = tuple[Segment, int | None, list | None, int]


class GroupCommit:
    def __init__(
        self,
        policy: FsyncPolicy,
        executor: Executor,
        on_durable: Callable[[int], None],
        *,
        group_ms: float = 2.0,
        group_bytes: int = 512 * 1024,
        write_behind: bool = False,
        on_written: Callable[[int], None] | None = None,
    ) -> None:
        self.policy = policy
        self._executor = executor
        self._on_durable = on_durable
        self._on_written = on_written
        self._group_s = group_ms / 1000.0
        self._group_bytes = group_bytes
        self.write_behind = write_behind and policy.mode == "always"
        self.appended = 0
        self.written = 0
        self.durable = 0
        # Write-behind: what the next group writes (and seals), in log order.
        self._staged: list[Staged] = []
        # (segment, end) of the last write the journal made durable: where a checkpoint may
        # point without vouching for bytes still only staged.
        self.durable_end: tuple[Segment, int] | None = None
        self.failed: BaseException | None = None
        self._dirty: dict[int, Segment] = {}
        self._group_size = 0
        self._group_start: float | None = None
        self._flushing = False
        self._timer: asyncio.TimerHandle | None = None
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

    def stage(self, segment: Segment, position: int, parts: list, nbytes: int, lsn: int) -> None:
        """Write-behind: have the next group write ``parts`` at ``position`` (already reserved
        in the segment's size); bytes up to ``lsn`` are then appended."""
        segment.acquire()
        segment.unwritten += nbytes
        self._staged.append((segment, position, parts, nbytes))
        self._note(segment, lsn, nbytes)

    def stage_seal(self, segment: Segment, seal: Callable[[Segment], None]) -> None:
        """Write-behind: seal ``segment`` (``seal`` runs in the worker) once its staged writes
        are written; the caller's reference on it passes to the journal."""
        if self.failed is not None:
            segment.release()  # its staged writes were dropped: nothing to seal
            return
        self._staged.append((segment, None, seal, 0))  # type: ignore[arg-type]
        if not self._flushing:
            self._ensure_loop().call_soon(self._start_flush)

    def note_append(self, segment: Segment, lsn: int, nbytes: int) -> None:
        """Record that bytes up to ``lsn`` are in ``segment``'s page cache."""
        self.written = lsn
        self._note(segment, lsn, nbytes)

    def _note(self, segment: Segment, lsn: int, nbytes: int) -> None:
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
        if self._group_size >= self._group_bytes or self._group_s <= 0:
            self._start_flush()
        elif self._timer is None:
            self._timer = loop.call_at(self._group_start + self._group_s, self._start_flush)

    def _start_flush(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._flushing or self.failed:
            return
        if self.durable >= self.appended and not self._staged:
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
        staged, self._staged = self._staged, []
        if staged:
            wrote = None
            if self._on_written is not None:
                wrote = lambda: loop.call_soon_threadsafe(self._wrote, target)  # noqa: E731
            fut = loop.run_in_executor(self._executor, _write_and_sync, staged, segments, wrote)
        else:
            fut = loop.run_in_executor(self._executor, _sync_all, segments)
        fut.add_done_callback(lambda f: self._flushed(f, target, segments, staged))

    def _wrote(self, target: int) -> None:
        if self.failed is None and target > self.written:
            self.written = target
            if self._on_written is not None:
                self._on_written(target)

    def _flushed(
        self,
        fut: asyncio.Future[None],
        target: int,
        segments: list[Segment],
        staged: list[Staged] | None = None,
    ) -> None:
        self._flushing = False
        for s in segments:
            s.release()
        if staged:
            _release_staged(staged)
        exc = fut.exception()
        if exc is not None:
            # After a failed fsync the kernel may have dropped the dirty pages: never retry and
            # pretend (PostgreSQL's fsyncgate). The log stops acknowledging.
            self.fail(StorageFailure(f"fsync failed: {exc}"))
            if self._idle is not None:
                self._idle.set()
            return
        self.syncs += 1
        if staged:
            last = next((w for w in reversed(staged) if w[1] is not None), None)
            if last is not None:
                self.durable_end = (last[0], last[1] + last[3])
            self._wrote(target)
        self.durable = target
        self._on_durable(target)
        if self._idle is not None and self.durable >= self.appended and not self._staged:
            self._idle.set()
        if (self.appended > self.durable or self._staged) and not self._closed:
            loop = self._ensure_loop()
            start = self._group_start if self._group_start is not None else loop.time()
            due = self._group_size >= self._group_bytes or loop.time() - start >= self._group_s
            if due or (self._staged and self.appended <= self.durable):  # a seal is waiting
                self._start_flush()
            elif self._timer is None:
                self._timer = loop.call_at(start + self._group_s, self._start_flush)

    def fail(self, failure: StorageFailure) -> None:
        """A write or fsync failed: stop acknowledging, and fail everything waiting for
        durability."""
        if self.failed is None:
            self.failed = failure
            log.error("%s; the log is read-only from now on", failure)
        # Staged but never to be written: drop them (and their segment references).
        staged, self._staged = self._staged, []
        _release_staged(staged)
        if self._on_written is not None:
            self._on_written(-1)
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
            while (self.durable < self.appended or self._staged) and not self.failed:
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

    def discard(self) -> None:
        """Drop what is staged, unwritten (a simulated crash: the process just stops)."""
        staged, self._staged = self._staged, []
        _release_staged(staged)


def _sync_all(segments: list[Segment]) -> None:
    t0 = time.monotonic()
    for s in segments:
        s.sync()
    SYNC_SECONDS.observe(time.monotonic() - t0)


_IOV_MAX = 1000


def _write_and_sync(
    staged: list[Staged], segments: list[Segment], wrote: Callable[[], None] | None
) -> None:
    """The journal thread's group: write the staged appends in order, each run of contiguous
    ones in as few ``pwritev`` calls as the iovec limit allows; seal segments as their turn
    comes; report the group written; then fsync every segment it touched."""
    run_seg: Segment | None = None
    run_parts: list = []
    run_start = run_end = 0

    def write_run() -> None:
        at = run_start
        for i in range(0, len(run_parts), _IOV_MAX):
            chunk = run_parts[i : i + _IOV_MAX]
            n = sum(len(p) for p in chunk) if len(run_parts) > _IOV_MAX else run_end - run_start
            assert run_seg is not None
            run_seg.write_at(chunk, at, n)
            at += n

    for seg, position, parts, nbytes in staged:
        if position is None:  # a seal: everything staged before it is written first
            if run_seg is not None:
                write_run()
                run_seg = None
            parts(seg)  # type: ignore[misc]
            continue
        if run_seg is seg and position == run_end:
            run_parts += parts
            run_end += nbytes
            continue
        if run_seg is not None:
            write_run()
        run_seg, run_parts, run_start, run_end = seg, list(parts), position, position + nbytes
    if run_seg is not None:
        write_run()
    if wrote is not None:
        wrote()
    _sync_all(segments)


def _release_staged(staged: list[Staged]) -> None:
    for seg, position, _parts, nbytes in staged:
        if position is not None:
            seg.unwritten -= nbytes
        seg.release()
