"""Transactions as one partition sees them: open transactions, the last stable offset, and the
aborted-transaction index (Kafka's producer state and ``.txnindex``, KIP-98).

A transactional producer's batches carry the transactional bit; the transaction coordinator ends
each transaction with a control batch (a *marker*: COMMIT or ABORT) in every partition it wrote
to. Per partition this index keeps

* the open transactions: producer id -> the offset of its first batch after its last marker;
* the completing ones: a marker was appended, but the high watermark has not passed it yet, so
  consumers cannot see the marker and the transaction still holds the stable offset back;
* the aborted transactions, (producer id, first offset, marker offset), in marker order, with
  the first unstable offset that remained once each was aborted (what lets a lookup stop early,
  as Kafka's ``TransactionIndex.collectAbortedTxns`` does).

The *last stable offset* (LSO) is the smaller of the high watermark and the first offset of any
transaction not yet completed below it: a ``read_committed`` consumer reads up to it and drops
the records of the aborted transactions the Fetch response lists.

Nothing here is written to a file of its own. The index is derived from the log: at start it is
rebuilt from the chunk index entries (which carry each batch's producer id and base sequence)
and the markers' control records (one small read per candidate chunk), so it follows whatever
the log holds after recovery, migration to the cold tier or a replica's truncation. That needs
transactional producers to be told apart from idempotent ones without reading every batch:
the transaction coordinator gives them producer ids from :data:`TRANSACTIONAL_PRODUCER_IDS` up
(below the Spark sinks' deterministic ids), and the produce path holds the rule both ways (a
transactional batch has such an id, a non-transactional batch never has). A batch of such a
producer with no sequence is either a marker or the coordinator's own transactional offset
commit; reading its header tells which.
"""

from __future__ import annotations

import struct
from array import array
from bisect import bisect_left
from collections.abc import Callable, Iterable

from stratalog.records import _bytes_field, _varint, build_batch, iter_records
from stratalog.storage.batch import HEADER_SIZE, CorruptBatchError, parse_header

# Producer ids handed to transactional producers: [2^61, 2^62). Below: idempotent producers
# (from 0); from 2^62: writers that derive their own ids (producer_state.py).
TRANSACTIONAL_PRODUCER_IDS = 1 << 61
TRANSACTIONAL_END = 1 << 62

# Control record types (ControlRecordType): the key is int16 version (0), int16 type.
ABORT = 0
COMMIT = 1

_I16 = struct.Struct(">h")
_MARKER_KEY = struct.Struct(">hh")
_MARKER_VALUE = struct.Struct(">hi")


def is_transactional_producer(producer_id: int) -> bool:
    return TRANSACTIONAL_PRODUCER_IDS <= producer_id < TRANSACTIONAL_END


def marker_key(commit: bool) -> bytes:
    return _MARKER_KEY.pack(0, COMMIT if commit else ABORT)


def marker_value(coordinator_epoch: int) -> bytes:
    """EndTransactionMarker version 0: int16 version, int32 coordinator epoch."""
    return _MARKER_VALUE.pack(0, coordinator_epoch)


def marker_batch(
    producer_id: int, epoch: int, commit: bool, coordinator_epoch: int, timestamp_ms: int
) -> bytes:
    """A transaction marker: a control batch of one control record, as Kafka writes it (no
    sequence; key: version 0 and COMMIT or ABORT; value: EndTransactionMarker version 0)."""
    return build_batch(
        [(marker_key(commit), marker_value(coordinator_epoch), timestamp_ms)],
        producer_id=producer_id,
        producer_epoch=epoch,
        transactional=True,
        control=True,
    )


def control_record(batch: bytes | memoryview) -> tuple[int, int] | None:
    """(control record type, coordinator epoch) of a control batch (the type ABORT, COMMIT or
    another of Kafka's; the epoch -1 when the value holds none), None if the batch is not a
    control batch or its record cannot be read."""
    if len(batch) < HEADER_SIZE:
        return None
    h = parse_header(batch)
    if not h.is_control or h.record_count < 1:
        return None
    try:
        if h.compression == 0:
            # The first record read in place (Kafka never compresses control batches):
            # length, attributes, timestamp and offset deltas, key, value.
            _length, pos = _varint(batch, HEADER_SIZE)
            _ts, pos = _varint(batch, pos + 1)
            _delta, pos = _varint(batch, pos)
            key, pos = _bytes_field(batch, pos)
            value, pos = _bytes_field(batch, pos)
        else:
            rec = next(iter_records(batch, h))
            key, value = rec.key, rec.value
    except (CorruptBatchError, ValueError, IndexError, StopIteration):
        return None
    if key is None or len(key) < 4:
        return None
    epoch = -1
    if value is not None and len(value) >= _MARKER_VALUE.size:
        epoch = _MARKER_VALUE.unpack_from(value)[1]
    return _MARKER_KEY.unpack_from(key)[1], epoch


def control_type(batch: bytes | memoryview) -> int | None:
    """The control record type of a control batch, None if it is none (control_record)."""
    found = control_record(batch)
    return None if found is None else found[0]


class TxnIndex:
    """One partition's transactions (see the module docstring)."""

    __slots__ = ("_ab_first", "_ab_last", "_ab_pid", "_ab_stable", "completing", "open")

    def __init__(self) -> None:
        self.open: dict[int, int] = {}  # producer id -> first offset of its open transaction
        # (marker offset, producer id, first offset, aborted), marker order; above the HWM.
        self.completing: list[tuple[int, int, int, bool]] = []
        # The aborted transactions, as columns (memory stays small however many there were).
        self._ab_pid = array("q")
        self._ab_first = array("q")
        self._ab_last = array("q")
        self._ab_stable = array("q")

    # -- the write path ------------------------------------------------------------------------
    def on_data(self, producer_id: int, base_offset: int) -> None:
        """A transactional batch of ``producer_id`` was appended at ``base_offset``."""
        if producer_id not in self.open:
            self.open[producer_id] = base_offset

    def on_marker(self, producer_id: int, offset: int, aborted: bool) -> None:
        """The marker ending ``producer_id``'s transaction was appended at ``offset``."""
        first = self.open.pop(producer_id, offset)
        self.completing.append((offset, producer_id, first, aborted))
        if aborted and first < offset:
            # What stays unstable once this one is done: a later lookup that reaches an entry
            # whose value is past its upper bound can stop (every later abort starts after it).
            stable = min(self.open.values(), default=offset + 1)
            for c in self.completing[:-1]:
                stable = min(stable, c[2])
            self._ab_pid.append(producer_id)
            self._ab_first.append(first)
            self._ab_last.append(offset)
            self._ab_stable.append(stable)

    def on_high_watermark(self, hwm: int) -> None:
        """Completions whose marker is now below the high watermark stop holding the LSO."""
        c = self.completing
        if c and c[0][0] < hwm:
            k = 0
            while k < len(c) and c[k][0] < hwm:
                k += 1
            del c[:k]

    # -- the read path -------------------------------------------------------------------------
    def first_unstable(self) -> int | None:
        """The first offset of a transaction not yet complete below the high watermark."""
        if not self.open and not self.completing:
            return None
        return min([*self.open.values(), *(c[2] for c in self.completing)])

    def last_stable_offset(self, hwm: int) -> int:
        first = self.first_unstable()
        return hwm if first is None or first > hwm else first

    def aborted_between(self, start: int, end: int) -> list[tuple[int, int]]:
        """(producer id, first offset) of the aborted transactions a read of offsets
        ``start``..``end - 1`` overlaps: marker at or after ``start``, first offset before
        ``end``."""
        out: list[tuple[int, int]] = []
        lasts = self._ab_last
        n = len(lasts)
        i = bisect_left(lasts, start)
        firsts, stables, pids = self._ab_first, self._ab_stable, self._ab_pid
        while i < n:
            if firsts[i] < end:
                out.append((pids[i], firsts[i]))
            if stables[i] >= end:
                break
            i += 1
        return out

    @property
    def aborted_count(self) -> int:
        return len(self._ab_last)

    def aborted(self) -> list[tuple[int, int, int]]:
        """Every aborted transaction: (producer id, first offset, marker offset)."""
        return list(zip(self._ab_pid, self._ab_first, self._ab_last, strict=True))

    # -- retention, truncation, rebuild --------------------------------------------------------
    def drop_before(self, log_start: int) -> None:
        """Retention moved the log start: aborted transactions wholly before it are forgotten;
        open ones that started before it now start there."""
        k = bisect_left(self._ab_last, log_start)
        if k:
            for col in (self._ab_pid, self._ab_first, self._ab_last, self._ab_stable):
                del col[:k]
        for pid, first in list(self.open.items()):
            if first < log_start:
                self.open[pid] = log_start

    def truncate(self, offset: int) -> bool:
        """Forget what lies at or past ``offset`` (a replica's log was cut there). Returns False
        if the index cannot tell what the cut reopens (a marker it no longer remembers was cut:
        the caller rebuilds it from the log)."""
        for pid, first in list(self.open.items()):
            if first >= offset:
                del self.open[pid]
        kept = []
        reopened: dict[int, int] = {}
        for c in self.completing:
            if c[0] >= offset:
                if c[2] < offset and c[1] not in reopened:
                    reopened[c[1]] = c[2]
            else:
                kept.append(c)
        k = bisect_left(self._ab_last, offset)
        if k < len(self._ab_last):
            remembered = {c[0] for c in self.completing}
            if any(last not in remembered for last in self._ab_last[k:]):
                return False
            for col in (self._ab_pid, self._ab_first, self._ab_last, self._ab_stable):
                del col[k:]
        self.completing = kept
        for pid, first in reopened.items():
            self.open[pid] = min(first, self.open.get(pid, first))
        return True

    def clear(self) -> None:
        self.open.clear()
        self.completing.clear()
        for col in (self._ab_pid, self._ab_first, self._ab_last, self._ab_stable):
            del col[:]

    def rebuild(
        self,
        chunks: Iterable[tuple[int, int, int]],
        control_of: Callable[[int], tuple[int, int] | None],
        hwm: int,
    ) -> list[tuple[int, int, int]]:
        """Rebuild from a partition's transactional chunks in offset order: (base offset,
        producer id, base sequence) of each chunk of a transactional producer. A chunk without
        a sequence is looked at (``control_of(base)``: control_record's answer, None for data).
        Returns (producer id, marker offset, coordinator epoch) of the markers found (the
        caller fences older epochs)."""
        self.clear()
        markers: list[tuple[int, int, int]] = []
        for base, pid, seq in chunks:
            control = control_of(base) if seq < 0 else None
            if control is None:
                self.on_data(pid, base)
            elif control[0] in (ABORT, COMMIT):
                self.on_marker(pid, base, control[0] == ABORT)
                self.on_high_watermark(hwm)  # (keeps the completing list short as it goes)
                markers.append((pid, base, control[1]))
        self.on_high_watermark(hwm)
        return markers
