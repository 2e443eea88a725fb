"""Idempotent batches refused before they were written, so the batches behind them are refused
the same way rather than as a sequence gap.

A producer keeps up to five requests in flight per partition. When this broker refuses the
first of them before writing it (NOT_LEADER_OR_FOLLOWER while its primary is paused,
NOT_ENOUGH_REPLICAS while the in-sync set is short) and the state changes before the next one
arrives (the primary registered again at the same epoch, a backup back in sync), the next one
met the sequence check and was answered OUT_OF_ORDER_SEQUENCE_NUMBER. librdkafka takes that gap
for a lost request and bumps its producer epoch, renumbering every record it has not had
acknowledged, in every partition, including ones already written whose answer was lost (a
timeout, a dropped connection): written twice, as no broker can recognise a record under a new
epoch (the fault harness's duplicates). Kafka's leader answers the whole window the same way
because its state does not flip back so fast; here a batch whose gap begins at a refused batch
of the same producer and epoch gets that batch's refusal again. It was not written, so "not
persisted" stays true, and the producer retries the window from the refused batch.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from stratalog.storage.batch import HEADER_SIZE, NO_SEQUENCE, CorruptBatchError, parse_header

REMEMBERED_S = 30.0  # longer than a producer's retries of one window take
REMEMBERED_MAX = 100_000  # (topic, partition, producer) entries; the oldest go first


@dataclass(slots=True)
class _Refused:
    epoch: int
    base_sequence: int
    error: str
    at: float


def _first_header(records):
    if records is None or len(records) < HEADER_SIZE:
        return None
    try:
        h = parse_header(memoryview(records), 0)
    except CorruptBatchError:
        return None
    if h.producer_id < 0 or h.base_sequence == NO_SEQUENCE:
        return None
    return h


class Refusals:
    def __init__(self) -> None:
        self._refused: dict[tuple[str, int, int], _Refused] = {}
        self._purged = time.monotonic()

    def __bool__(self) -> bool:
        return bool(self._refused)

    def note(self, topic: str, index: int, records, error: str) -> None:
        """``records`` (a Produce request's data for one partition) was refused with the
        retriable ``error`` before anything of it was written."""
        h = _first_header(records)
        if h is None:
            return
        key = (topic, index, h.producer_id)
        old = self._refused.get(key)
        now = time.monotonic()
        if (
            old is not None
            and old.epoch == h.producer_epoch
            and old.base_sequence <= h.base_sequence
        ):
            old.at = now  # the window's first refusal stays the one to retry
            return
        if len(self._refused) >= REMEMBERED_MAX:
            self._refused.pop(next(iter(self._refused)))
        self._refused[key] = _Refused(h.producer_epoch, h.base_sequence, error, now)

    def instead_of_gap(self, topic: str, index: int, records, partition):
        """The refusal to give ``records`` (before its append) when it would leave a gap that
        begins at an earlier batch of its producer refused here: ``(error, message)``, or None.
        ``partition`` (its PartitionLog) tells what sequence it expects next; with no state
        for the producer's epoch (its first batch was the refused one) any sequence would be
        taken, and the refused batch's retry then failed as a sequence from the past."""
        self._purge()
        h = _first_header(records)
        if h is None:
            return None
        r = self._refused.get((topic, index, h.producer_id))
        if r is None or r.epoch != h.producer_epoch or not r.base_sequence < h.base_sequence:
            return None
        expected = partition.next_sequence(h.producer_id, h.producer_epoch)
        if expected is not None and expected != r.base_sequence:
            return None  # the refused batch was written since, or this gap is another one
        return r.error, (
            f"an earlier batch of producer {h.producer_id} (sequence {r.base_sequence}) was "
            f"refused here ({r.error}) and is not written: retry from it"
        )

    def _purge(self) -> None:
        now = time.monotonic()
        if now - self._purged < 1.0:
            return
        self._purged = now
        for key in [k for k, r in self._refused.items() if now - r.at > REMEMBERED_S]:
            del self._refused[key]
