"""A byte-rate limit shared by the coroutines of one event loop (migration, backlog reads), and
the controller that can steer the backlog's limit by the journal's fsync latency."""

from __future__ import annotations

import asyncio
import multiprocessing
import time

# How far ahead of a byte rate the small turns of a paced sender may run: a token bucket this
# many seconds of the rate deep. Shorter waits are not worth taking: event-loop and selector
# timers are whole milliseconds, and with no slack 128 KiB turns at 120 MB/s waited 2.2-2.7 ms
# each instead of 1.1 and went out at 44 MB/s (the loop's at 63). An answer also comes with gaps
# (the consumer's next Fetch, pages being loaded) that the turns after it may make up: with 4 ms
# of slack one consumer read at 81 MB/s of 120, with 20 ms at 100.
PACE_SLACK_S = 0.02
# A paced answer goes out in turns of this many bytes, each waiting for its time under the rate:
# 100 MB/s is about 760 small turns a second rather than one multi-megabyte burst every tenth of
# a second (the loop's connections and the backlog sender process alike).
PACED_TURN_BYTES = 128 * 1024


class ByteRate:
    """Spaces work out to ``rate`` bytes per second: each caller is scheduled after the bytes
    admitted before it and returns once its own bytes' time has passed. ``rate <= 0`` means
    unlimited."""

    def __init__(self, rate: int) -> None:
        self.rate = rate
        self._until = 0.0

    def waiting(self, now: float) -> bool:
        """Whether bytes admitted so far are still waiting for their time: the limit holds
        its callers back."""
        return self.rate > 0 and self._until > now

    def due_in(self, now: float) -> float:
        """Seconds until the bytes admitted so far have had their time (0: none are waiting)."""
        return max(0.0, self._until - now) if self.rate > 0 else 0.0

    def set_rate(self, rate: int, now: float | None = None) -> None:
        """A new rate; what is already scheduled is rescheduled at it, so a lower rate slows
        the queue at once and a higher one lets it go sooner (callers already asleep keep their
        wake-up, which only the queue behind them feels)."""
        if now is None:
            now = time.monotonic()
        if self.rate > 0 and rate > 0 and self._until > now:
            self._until = now + (self._until - now) * self.rate / rate
        self.rate = rate

    def reserve(self, nbytes: int, now: float | None = None) -> float:
        """Schedule ``nbytes`` after the bytes admitted before them; returns the seconds until
        their time has passed (0 when unlimited)."""
        if self.rate <= 0 or nbytes <= 0:
            return 0.0
        if now is None:
            now = time.monotonic()
        self._until = max(now, self._until) + nbytes / self.rate
        return self._until - now

    async def admit(self, nbytes: int) -> None:
        delay = self.reserve(nbytes)
        if delay > 0:
            await asyncio.sleep(delay)


class PacedResponse(list):
    """A response whose bytes go to the socket at ``rate`` (a backlog answer under a budget),
    a small piece at a time, instead of in one burst: a burst keeps the loop, the loopback and
    the reader's process busy for milliseconds at a time, and a produce arriving then waits."""

    __slots__ = ("rate", "size")

    def __init__(self, parts: list, rate: ByteRate, size: int) -> None:
        super().__init__(parts)
        self.rate = rate
        self.size = size  # bytes in all parts


class FsyncGuidedRate:
    """Steers a ByteRate between ``floor`` and ``ceiling`` by the journal's fsync latency:
    additive increase while the budget holds backlog reads back and the slowest fsync of the
    last interval met ``target`` seconds, multiplicative decrease when it did not (TCP's AIMD).

    Backlog reads delay producers through the disk: the journal's fsyncs queue behind them. A
    fixed byte rate has to be chosen for the slowest disk and the busiest hour; this one finds
    the rate the disk can serve beside the journal now, and gives it back when the journal
    slows down. It grows only while readers are waiting for the budget, so a trickle of reads
    cannot lift it far above what is read, and a halving takes effect at once.
    """

    DECREASE = 0.5
    MIN_STEP = 1_000_000  # bytes/s per interval, whatever the floor

    def __init__(
        self,
        rate: ByteRate,
        target: float,
        floor: int,
        ceiling: int,
        followers: tuple[ByteRate, ...] = (),
    ) -> None:
        self.rate = rate
        # Limits kept at the same rate (the sending of backlog answers): waiting for any of
        # them counts as being held back.
        self.followers = followers
        self.target = target
        self.floor = floor
        self.ceiling = max(ceiling, floor)
        self.step = max(floor, self.MIN_STEP)
        for r in (rate, *followers):
            r.rate = floor

    def tick(self, slowest_fsync: float | None, now: float | None = None) -> int:
        """One interval passed; ``slowest_fsync`` is its slowest group-commit fsync (None: no
        fsync happened, nothing to protect). Returns the new rate."""
        if now is None:
            now = time.monotonic()
        held_back = any(r.waiting(now) for r in (self.rate, *self.followers))
        r = self.rate.rate
        if slowest_fsync is not None and slowest_fsync > self.target:
            r = max(self.floor, int(r * self.DECREASE))
        elif held_back:
            r = min(self.ceiling, r + self.step)
        # The same clock for the reschedule as for the check above (a test passes its own).
        for limit in (self.rate, *self.followers):
            limit.set_rate(r, now)
        return r


class SharedRate:
    """A byte rate that one process steers and a worker process keeps (the cleaner's): the rate
    and the last time the worker waited for it, two numbers in shared memory. Made before the
    worker starts and handed to it then (a spawned process can be given it at its start only).
    It has ByteRate's face for FsyncGuidedRate: ``rate``, ``set_rate`` and ``waiting``."""

    # The worker waited for the rate this recently: it counts as held back (the steering's
    # intervals are 0.1 s; one wait per read span or written piece at any useful rate).
    HELD_S = 0.25

    def __init__(self, rate: float = 0.0) -> None:
        self._cells = multiprocessing.get_context("spawn").RawArray("d", 2)
        self._cells[0] = rate

    @property
    def rate(self) -> float:
        return self._cells[0]

    @rate.setter
    def rate(self, value: float) -> None:
        self._cells[0] = value

    def set_rate(self, rate: float, now: float | None = None) -> None:
        self._cells[0] = rate

    def waiting(self, now: float) -> bool:
        return self._cells[0] > 0 and now - self._cells[1] < self.HELD_S

    def note_held(self, now: float) -> None:
        self._cells[1] = now


class BlockingPace:
    """Holds a worker's reads and writes to a byte rate by sleeping (worker processes and
    threads, never the event loop): called with each piece's size before it goes, it returns
    once the piece's time under the rate has come. A token bucket ``PACE_SLACK_S`` deep, so a
    pause (a slow read, CPU work) is not made up for by a burst after it. ``rate``: bytes per
    second (<= 0: unlimited), or a SharedRate, read again at every call so a steered rate
    takes effect at the next piece."""

    STEP_S = 0.05  # a steered rate is looked at again this often while waiting

    def __init__(self, rate: float | SharedRate = 0.0) -> None:
        self._shared = rate if isinstance(rate, SharedRate) else None
        self._fixed = 0.0 if self._shared is not None else float(rate)  # type: ignore[arg-type]
        self._until = 0.0

    def __call__(self, nbytes: int) -> None:
        rate = self._shared.rate if self._shared is not None else self._fixed
        if rate <= 0 or nbytes <= 0:
            return
        now = time.monotonic()
        self._until = max(self._until, now - PACE_SLACK_S) + nbytes / rate
        if self._shared is None:
            if self._until > now:
                time.sleep(self._until - now)
            return
        # Steered: wait in short steps, and reschedule what is left at a new rate at once (a
        # piece admitted at the floor must not sleep for seconds after the rate went up).
        while self._until > now:
            self._shared.note_held(now)
            time.sleep(min(self._until - now, self.STEP_S))
            now = time.monotonic()
            new = self._shared.rate
            if new <= 0:
                self._until = now
            elif new != rate and self._until > now:
                self._until = now + (self._until - now) * rate / new
            rate = new
