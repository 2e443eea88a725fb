"""One share-partition of a share group (KIP-932): which records are in flight, with whom, and
how often each was delivered.

Sans-IO: every call takes the time (``now``, milliseconds); nothing waits. The fetch handler asks
:meth:`SharePartition.fetch_from` where to read, reads the log, then :meth:`acquire`\\s the
offsets the read covered; acknowledgements and lock expiry move records on.

A record below the *share-partition start offset* (SPSO, ``start``) is done. From ``start`` to
``end`` (the next offset never acquired) each offset has a state:

* AVAILABLE: released, or its lock expired, and under the delivery limit: acquirable again;
* ACQUIRED: locked by one member until ``deadline`` (``lock_ms`` after acquisition);
* ACKNOWLEDGED (ACCEPT) or ARCHIVED (REJECT, a GAP, or delivered ``delivery_limit`` times):
  done; ``start`` moves over a prefix of done records.

At most ``max_locks`` offsets are in flight (``end - start``): new records are not acquired past
that until ``start`` moves, as Kafka's ``group.share.partition.max.record.locks``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

# Record states (Kafka's RecordState).
AVAILABLE = 0
ACQUIRED = 1
ACKNOWLEDGED = 2
ARCHIVED = 4

# Acknowledge types on the wire (ShareFetch/ShareAcknowledge AcknowledgeTypes).
GAP = 0
ACCEPT = 1
RELEASE = 2
REJECT = 3
RENEW = 4


class ShareError(Exception):
    """A request refused for a partition: ``error`` is Kafka's error name."""

    def __init__(self, error: str, message: str = "") -> None:
        super().__init__(message or error)
        self.error = error
        self.message = message or None


@dataclass(slots=True)
class InFlight:
    state: int
    delivery_count: int = 0
    member: str | None = None
    deadline: int = 0


@dataclass(frozen=True, slots=True)
class Acquired:
    """A run of consecutive offsets handed to a member, all delivered ``delivery_count`` times."""

    first_offset: int
    last_offset: int
    delivery_count: int


class SharePartition:
    def __init__(
        self,
        start_offset: int,
        *,
        lock_ms: int = 30000,
        delivery_limit: int = 5,
        max_locks: int = 2000,
        leader_epoch: int = 0,
    ) -> None:
        self.start = start_offset
        self.end = start_offset
        self.records: dict[int, InFlight] = {}
        # Whether any record reached a state after acquisition (Kafka writes a share-partition's
        # state at its first acknowledgement, release or lock expiry, and describes it as
        # unknown, start offset -1, until then).
        self.written = False
        self.lock_ms = lock_ms
        self.delivery_limit = delivery_limit
        self.max_locks = max_locks
        # The epoch of the partition's leadership this state was taken at (a new leadership
        # reads the durable state again), and a count of the changes the durable state must
        # follow (acquisitions, acknowledgements) against the count it holds.
        self.leader_epoch = leader_epoch
        self.version = 0
        self.durable_version = 0
        # Lock deadlines in the order given out (so, rising: the lock time is one setting), and
        # how many records each still locks: the next deadline without a look at every record.
        self._deadlines: deque[int] = deque()
        self._locked: dict[int, int] = {}

    # -- durable state (share_state.py writes it to __share_group_state) --------------------------
    def state_batches(self) -> list[tuple[int, int, int, int]]:
        """Runs (first, last, state, delivery count) covering [start, end): what is written
        durably. An acquired record is written as available with its delivery count: after a
        crash its lock is gone and it is delivered again, its earlier deliveries counted."""
        out: list[tuple[int, int, int, int]] = []
        records = self.records
        for off in range(self.start, self.end):
            r = records[off]
            state = AVAILABLE if r.state == ACQUIRED else r.state
            if out and out[-1][2] == state and out[-1][3] == r.delivery_count:
                out[-1] = (out[-1][0], off, state, r.delivery_count)
            else:
                out.append((off, off, state, r.delivery_count))
        return out

    def restore(self, start: int, batches: list[tuple[int, int, int, int]]) -> None:
        """Take the state written by :meth:`state_batches` (read back after a restart, or by a
        new leader). A record written as available that was delivered as often as the limit
        allows was acquired for its last delivery: it is archived, as a release would."""
        self.start = self.end = start
        self.records = {}
        self._deadlines.clear()
        self._locked.clear()
        for first, last, state, count in sorted(batches):
            for off in range(max(first, start), last + 1):
                if off >= self.end:
                    for gap in range(self.end, off):  # (never written so: nothing to deliver)
                        self.records[gap] = InFlight(ARCHIVED)
                    self.end = off + 1
                r = self.records[off] = InFlight(state, count)
                if state == AVAILABLE and count >= self.delivery_limit:
                    r.state = ARCHIVED
        self.written = True
        self._advance()

    # -- acquisition -----------------------------------------------------------------------------
    def fetch_from(self) -> int | None:
        """The first offset a fetch could acquire (an available one, else ``end``), or None when
        the in-flight window is full of records others hold."""
        for off in range(self.start, self.end):
            if self.records[off].state == AVAILABLE:
                return off
        return self.end if self.end - self.start < self.max_locks else None

    def acquirable_until(self, lo: int, max_records: int) -> int:
        """The offset before which [lo, it) holds ``max_records`` acquirable offsets (or all the
        window allows): a read of the log needs to go no further."""
        n = 0
        off = max(lo, self.start)
        while off < self.end and n < max_records:
            if self.records[off].state == AVAILABLE:
                n += 1
            off += 1
        if n < max_records:
            off = max(off, self.end) + min(max_records - n, self.start + self.max_locks - self.end)
        return off

    def acquire(self, member: str, lo: int, hi: int, max_records: int, now: int) -> list[Acquired]:
        """Lock up to ``max_records`` acquirable offsets in [lo, hi) (the range a read of the
        log covered) for ``member``; the runs handed out, in offset order."""
        # One pass, per record only what must be per record (this runs for every record a
        # share group delivers).
        records = self.records
        deadline = now + self.lock_ms
        limit = self.start + self.max_locks
        end = self.end
        runs: list[list[int]] = []  # [first, last, delivery count]
        taken = 0
        off = max(lo, self.start)
        while off < hi and taken < max_records:
            if off >= end:
                if end >= limit:
                    break
                # Offsets the log does not have (compacted away, or before the read's first
                # batch): nothing to deliver, done at once.
                for gap in range(end, off):
                    records[gap] = InFlight(ARCHIVED)
                end = off + 1
                r = records[off] = InFlight(ACQUIRED, 1, member, deadline)
            else:
                r = records[off]
                if r.state != AVAILABLE:
                    off += 1
                    continue
                r.state = ACQUIRED
                r.member = member
                r.delivery_count += 1
                r.deadline = deadline
            taken += 1
            count = r.delivery_count
            last = runs[-1] if runs else None
            if last is not None and last[1] == off - 1 and last[2] == count:
                last[1] = off
            else:
                runs.append([off, off, count])
            off += 1
        self.end = end
        if taken:
            self.version += 1
            self._lock(deadline, taken)
        self._advance()
        return [Acquired(a, b, c) for a, b, c in runs]

    def unacquire(self, member: str, acquired: list[Acquired]) -> None:
        """Undo an acquisition whose durable write failed: the records were never handed out."""
        for a in acquired:
            for off in range(a.first_offset, a.last_offset + 1):
                r = self.records.get(off)
                if r is not None and r.state == ACQUIRED and r.member == member:
                    self._finish(r, AVAILABLE)
                    r.delivery_count -= 1
        self.version += 1

    # -- acknowledgement ---------------------------------------------------------------------------
    def acknowledge(
        self, member: str, first: int, last: int, types: tuple[int, ...], now: int
    ) -> None:
        """Apply one acknowledgement batch: one type for all of [first, last] or one per offset.
        Every offset from the start offset on must be acquired by ``member``, else nothing
        changes (INVALID_RECORD_STATE); offsets below the start are done and left alone."""
        if last < first or not types or (len(types) != 1 and len(types) != last - first + 1):
            raise ShareError("INVALID_REQUEST", "Invalid acknowledgement batch.")
        if any(t not in (GAP, ACCEPT, RELEASE, REJECT, RENEW) for t in types):
            raise ShareError("INVALID_REQUEST", "Invalid acknowledge type.")
        records = self.records
        lo = max(first, self.start)
        for off in range(lo, last + 1):
            r = records.get(off)
            if r is None or r.state != ACQUIRED or r.member != member:
                raise ShareError(
                    "INVALID_RECORD_STATE",
                    f"The record at offset {off} is not acquired by member {member}.",
                )
        # Offsets below the start are done already (Kafka ignores acknowledgements of them).
        if len(types) == 1 and types[0] in (ACCEPT, REJECT, GAP):
            done = ACKNOWLEDGED if types[0] == ACCEPT else ARCHIVED
            locked = self._locked
            for off in range(lo, last + 1):
                r = records[off]
                r.state = done
                r.member = None
                locked[r.deadline] -= 1
        else:
            for off in range(lo, last + 1):
                t = types[0] if len(types) == 1 else types[off - first]
                r = records[off]
                if t == ACCEPT:
                    self._finish(r, ACKNOWLEDGED)
                elif t in (REJECT, GAP):
                    self._finish(r, ARCHIVED)
                elif t == RELEASE:
                    self._release(r)
                else:  # RENEW: the member needs longer; the lock starts over
                    self._locked[r.deadline] -= 1
                    r.deadline = now + self.lock_ms
                    self._lock(r.deadline, 1)
        self.written = True
        self.version += 1
        self._advance()

    def _lock(self, deadline: int, records: int) -> None:
        if deadline not in self._locked:
            self._deadlines.append(deadline)
            self._locked[deadline] = 0
        self._locked[deadline] += records

    def _finish(self, r: InFlight, state: int) -> None:
        """An acquired record leaves its lock."""
        self._locked[r.deadline] -= 1
        r.state = state
        r.member = None

    def _release(self, r: InFlight) -> None:
        # A record delivered as often as the limit allows is archived rather than offered again.
        self._finish(r, ARCHIVED if r.delivery_count >= self.delivery_limit else AVAILABLE)

    def _advance(self) -> None:
        records = self.records
        while self.start < self.end and records[self.start].state in (ACKNOWLEDGED, ARCHIVED):
            del records[self.start]
            self.start += 1

    # -- locks and members -----------------------------------------------------------------------
    def expire(self, now: int) -> int:
        """Release every record whose lock has run out; how many came back."""
        return self._release_where(lambda r: r.deadline <= now)

    def release_member(self, member: str) -> int:
        """Release every record ``member`` holds (its share session closed); how many."""
        return self._release_where(lambda r: r.member == member)

    def _release_where(self, held: Callable[[InFlight], bool]) -> int:
        n = 0
        for r in self.records.values():
            if r.state == ACQUIRED and held(r):
                self._release(r)
                n += 1
        if n:
            self.written = True
            self._advance()
        return n

    def next_deadline(self) -> int | None:
        """The earliest deadline of a record still acquired."""
        deadlines, locked = self._deadlines, self._locked
        while deadlines and locked[deadlines[0]] <= 0:
            del locked[deadlines.popleft()]
        return deadlines[0] if deadlines else None

    def move_start(self, log_start: int) -> None:
        """The log lost its records before ``log_start`` (retention, DeleteRecords): they can
        never be delivered, so the share-partition starts there at least."""
        if log_start <= self.start:
            return
        for off in range(self.start, min(log_start, self.end)):
            r = self.records.pop(off)
            if r.state == ACQUIRED:
                self._locked[r.deadline] -= 1
        self.start = log_start
        self.end = max(self.end, log_start)
        self._advance()

    def done_in_flight(self) -> int:
        """Records past ``start`` already acknowledged or archived (not lag any more)."""
        return sum(1 for r in self.records.values() if r.state in (ACKNOWLEDGED, ARCHIVED))

    def in_flight(self) -> int:
        return self.end - self.start
