"""Idempotent-producer state of one partition: sequence checks and duplicate detection.

Follows Kafka's rules: per producer id the broker remembers the epoch and the last five batches.
A batch that matches one of those five by (first, last) sequence is a retry and is answered with
its original offsets instead of being appended twice; a batch whose sequence does not continue
the last one is rejected with OUT_OF_ORDER_SEQUENCE_NUMBER; an older epoch is fenced. The state
is rebuilt at start from the chunk index (every entry carries the batch's producer fields).
"""

from __future__ import annotations

import time
from bisect import bisect_right
from collections import deque
from dataclasses import dataclass, field

from stratalog.storage.batch import NO_SEQUENCE, BatchHeader

RETAINED_BATCHES = 5
_INT32_MAX = 0x7FFFFFFF
# Producer ids from here up are chosen by writers themselves, derived from what they write
# (Stratalog's exactly-once Spark sink: query, batch and task). For them any batch whose
# sequence range is already behind the last one is a retry, not only one of the last five, so
# a task re-run from its first record appends only what is missing. Their batches are all kept
# (until the producer expires) so that a repeat can be compared with the records it repeats
# (PartitionLog._check_repeat). The broker hands out ids
# from 0 and never gets near this range.
DETERMINISTIC_PRODUCER_IDS = 1 << 62


class SequenceError(Exception):
    def __init__(self, error: str, message: str) -> None:
        super().__init__(message)
        self.error = error


@dataclass(slots=True)
class BatchMeta:
    first_seq: int
    last_seq: int
    base_offset: int
    last_offset: int
    timestamp: int


@dataclass(slots=True)
class ProducerEntry:
    epoch: int
    batches: deque[BatchMeta] = field(default_factory=lambda: deque(maxlen=RETAINED_BATCHES))
    # Wall-clock ms of the last append (or of the rebuild at start): what expiry counts from.
    # Not the batch's timestamp, which a writer may set years back (a copy of old events).
    touched_ms: int = 0
    # Deterministic producers only: every batch in sequence order, so a re-run's batch can be
    # checked against the records it claims to repeat (see originals()).
    history: list[BatchMeta] | None = None
    # The coordinator epoch of its last transaction marker here (-1: none; DescribeProducers).
    coordinator_epoch: int = -1

    @property
    def last_seq(self) -> int:
        return self.batches[-1].last_seq if self.batches else NO_SEQUENCE


def _in_sequence(last_seq: int, next_seq: int) -> bool:
    return next_seq == last_seq + 1 or (next_seq == 0 and last_seq == _INT32_MAX)


class ProducerStateTable:
    def __init__(self) -> None:
        self.producers: dict[int, ProducerEntry] = {}

    def next_sequence(self, producer_id: int, epoch: int) -> int | None:
        """The sequence expected next from ``producer_id`` at ``epoch`` (None: no state)."""
        entry = self.producers.get(producer_id)
        if entry is None or entry.epoch != epoch or not entry.batches:
            return None
        return (entry.last_seq + 1) & _INT32_MAX

    def check(self, h: BatchHeader) -> BatchMeta | None:
        """Validate a batch before it is appended.

        Returns the earlier append's metadata when the batch is a duplicate, None when it should
        be appended; raises SequenceError when it must be rejected.
        """
        if h.producer_id < 0 or h.base_sequence == NO_SEQUENCE:
            return None
        entry = self.producers.get(h.producer_id)
        if entry is None:
            # No state (new producer, or its batches were all removed by retention): accept.
            return None
        if h.producer_epoch < entry.epoch:
            raise SequenceError(
                "INVALID_PRODUCER_EPOCH",
                f"producer {h.producer_id} epoch {h.producer_epoch} is older than {entry.epoch}",
            )
        if h.producer_epoch > entry.epoch:
            if h.base_sequence != 0:
                raise SequenceError(
                    "OUT_OF_ORDER_SEQUENCE_NUMBER",
                    f"new epoch {h.producer_epoch} must start at sequence 0, not {h.base_sequence}",
                )
            return None
        for b in entry.batches:
            if b.first_seq == h.base_sequence and b.last_seq == h.last_sequence:
                return b
        regrouped = _regrouped(entry, h)
        if regrouped is not None:
            return regrouped
        if (
            h.producer_id >= DETERMINISTIC_PRODUCER_IDS
            and entry.batches
            and h.base_sequence <= h.last_sequence <= entry.last_seq
        ):
            return BatchMeta(h.base_sequence, h.last_sequence, -1, -1, h.max_timestamp)
        if not _in_sequence(entry.last_seq, h.base_sequence):
            raise SequenceError(
                "OUT_OF_ORDER_SEQUENCE_NUMBER",
                f"producer {h.producer_id}: expected sequence {entry.last_seq + 1}, "
                f"got {h.base_sequence}",
            )
        return None

    def record(
        self,
        producer_id: int,
        epoch: int,
        base_sequence: int,
        count: int,
        base_offset: int,
        timestamp: int,
    ) -> None:
        """Remember an appended batch (also used to rebuild state from the index)."""
        if producer_id < 0 or base_sequence == NO_SEQUENCE:
            return
        entry = self.producers.get(producer_id)
        if entry is None or epoch > entry.epoch:
            entry = ProducerEntry(epoch)
            self.producers[producer_id] = entry
        elif epoch < entry.epoch:
            return
        last_seq = (base_sequence + count - 1) & _INT32_MAX
        entry.touched_ms = int(time.time() * 1000)
        meta = BatchMeta(base_sequence, last_seq, base_offset, base_offset + count - 1, timestamp)
        entry.batches.append(meta)
        if producer_id >= DETERMINISTIC_PRODUCER_IDS:
            if entry.history is None:
                entry.history = []
            entry.history.append(meta)

    def fence(self, producer_id: int, epoch: int, coordinator_epoch: int = -1) -> None:
        """A transaction marker of ``producer_id`` at ``epoch`` was appended: batches of an older
        epoch are refused from now on (a coordinator that aborted a timed-out transaction bumped
        the epoch to fence the zombie producer). A producer with no state here stays unknown."""
        entry = self.producers.get(producer_id)
        if entry is not None and epoch > entry.epoch:
            entry = ProducerEntry(epoch)
            entry.touched_ms = int(time.time() * 1000)
            self.producers[producer_id] = entry
        if entry is not None and coordinator_epoch >= 0:
            entry.coordinator_epoch = coordinator_epoch

    def truncate(self, offset: int) -> None:
        """Forget batches at or past ``offset`` (a replica's log was cut there, KIP-101). A
        producer whose retained batches all went is forgotten, as if expired: with at most
        five batches in flight, whatever it may retry was cut, so no duplicate gets through;
        only its next sequence is no longer checked."""
        gone = []
        for pid, entry in self.producers.items():
            batches = entry.batches
            while batches and batches[-1].base_offset >= offset:
                batches.pop()
            if entry.history is not None:
                while entry.history and entry.history[-1].base_offset >= offset:
                    entry.history.pop()
            if not batches:
                gone.append(pid)
        for pid in gone:
            del self.producers[pid]

    def originals(self, producer_id: int, first_seq: int, last_seq: int) -> list[BatchMeta]:
        """The batches a deterministic producer appended that hold sequences first..last: what a
        re-run's batch under those sequences repeats. A Spark task numbers its records from 0
        and never wraps, so the history is sorted by sequence."""
        entry = self.producers.get(producer_id)
        history = entry.history if entry is not None else None
        if not history:
            return []
        i = max(bisect_right(history, first_seq, key=lambda b: b.first_seq) - 1, 0)
        out = []
        while i < len(history) and history[i].first_seq <= last_seq:
            if history[i].last_seq >= first_seq:
                out.append(history[i])
            i += 1
        return out

    def expire(self, now_ms: int, after_ms: int) -> int:
        """Forget producers that appended nothing for ``after_ms`` (Kafka's
        producer.id.expiration.ms); returns how many. A retry from one of them is then appended
        again, as in Kafka. Without this the table grows by one entry per Spark write task and
        target partition, for ever."""
        old = [pid for pid, e in self.producers.items() if now_ms - e.touched_ms >= after_ms]
        for pid in old:
            del self.producers[pid]
        return len(old)


def _regrouped(entry: ProducerEntry, h: BatchHeader) -> BatchMeta | None:
    """A retry of records already written, batched differently than the first time.

    librdkafka may regroup records it was told were not persisted (NOT_LEADER_OR_FOLLOWER from
    a broker that was not yet the leader after a failover) although an earlier send of them was
    written by the old leader and replicated: the new leader then holds them as other batches.
    A (producer, epoch, sequence) names one record, so when every sequence of the batch is
    among the retained batches and it starts where one of them starts, it is a duplicate;
    its offsets are those the retained batches give its first sequence on."""
    batches = list(entry.batches)
    for i, b in enumerate(batches):
        if b.first_seq != h.base_sequence:
            continue
        covered = b.last_seq
        for nxt in batches[i + 1 :]:
            if covered >= h.last_sequence or nxt.first_seq != covered + 1:
                break
            covered = nxt.last_seq
        if covered >= h.last_sequence:
            return BatchMeta(
                h.base_sequence,
                h.last_sequence,
                b.base_offset,
                b.base_offset + h.last_sequence - h.base_sequence,
                b.timestamp,
            )
    return None
