"""An idempotent retry batched differently from the records' first send.

After a failover librdkafka may regroup records that a not-yet-leader refused with
NOT_LEADER_OR_FOLLOWER, although the old leader had written and replicated them in other
batches (seen in tests/cluster/test_replication.py: a fatal OUT_OF_ORDER_SEQUENCE_NUMBER). A
(producer, epoch, sequence) names one record, so a batch whose every sequence is already
written, starting where a written batch starts, is a duplicate; anything else keeps Kafka's
rules.
"""

from __future__ import annotations

import pytest

from stratalog.records import build_batch
from stratalog.storage.batch import parse_header
from stratalog.storage.producer_state import ProducerStateTable, SequenceError

PID = 7


def _header(base_seq: int, count: int):
    raw = build_batch(
        [(None, b"v%d" % i, 1000) for i in range(count)],
        producer_id=PID,
        producer_epoch=0,
        base_sequence=base_seq,
    )
    return parse_header(raw)


def _table() -> ProducerStateTable:
    t = ProducerStateTable()
    # Written: seq 10 at offset 100, seqs 11-12 at offsets 101-102, seq 13 at offset 103.
    t.record(PID, 0, 10, 1, 100, 1000)
    t.record(PID, 0, 11, 2, 101, 1000)
    t.record(PID, 0, 13, 1, 103, 1000)
    return t


def test_a_regrouped_retry_of_written_records_is_their_duplicate():
    dup = _table().check(_header(10, 2))  # seqs 10-11: across two written batches
    assert dup is not None
    assert (dup.base_offset, dup.last_offset) == (100, 101)
    dup = _table().check(_header(11, 3))  # seqs 11-13
    assert dup is not None and (dup.base_offset, dup.last_offset) == (101, 103)


def test_an_exact_retry_is_still_the_duplicate_it_was():
    dup = _table().check(_header(11, 2))
    assert dup is not None and (dup.base_offset, dup.last_offset) == (101, 102)


def test_a_batch_reaching_past_what_was_written_is_out_of_order():
    with pytest.raises(SequenceError) as e:
        _table().check(_header(13, 2))  # seq 14 was never written
    assert e.value.error == "OUT_OF_ORDER_SEQUENCE_NUMBER"


def test_a_batch_starting_inside_a_written_batch_is_out_of_order():
    with pytest.raises(SequenceError):
        _table().check(_header(12, 2))  # seq 12 is the middle of 11-12


def test_the_next_sequence_is_appended():
    assert _table().check(_header(14, 3)) is None
