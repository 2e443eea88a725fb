"""read_committed on the reading side (client/committed.py): which batches of a Fetch answer
are dropped, given its aborted-transaction list, as Kafka's consumer drops them.

Two producers interleave transactions; one of each aborts, at different offsets; a marker
ends each. The oracle is the history written here, not the broker's index."""

from __future__ import annotations

import struct

from stratalog.client.committed import committed_batches
from stratalog.records import build_batch, iter_records

T0 = 1_700_000_000_000
A, B = 1 << 61 | 1, 1 << 61 | 2


def _txn(pid: int, offset: int, tag: bytes, n: int = 2) -> bytes:
    return build_batch(
        [(None, tag + b"%d" % j, T0) for j in range(n)],
        base_offset=offset,
        producer_id=pid,
        producer_epoch=0,
        base_sequence=0,
        transactional=True,
    )


def _marker(pid: int, offset: int, commit: bool) -> bytes:
    key = struct.pack(">hh", 0, 1 if commit else 0)
    return build_batch(
        [(key, struct.pack(">hi", 0, 0), T0)],
        base_offset=offset,
        producer_id=pid,
        producer_epoch=0,
        transactional=True,
        control=True,
    )


def _history() -> bytes:
    return b"".join(
        [
            build_batch([(None, b"plain0", T0)], base_offset=0),  # 0
            _txn(A, 1, b"a-aborted"),  # 1-2
            _txn(B, 3, b"b-committed"),  # 3-4
            _marker(A, 5, commit=False),  # 5
            _txn(A, 6, b"a-committed"),  # 6-7
            _txn(B, 8, b"b-aborted"),  # 8-9
            _marker(A, 10, commit=True),  # 10
            _marker(B, 11, commit=True),  # 11: B's transaction 3-4, 8-9 ends
        ]
    )


def _values(raw: bytes | memoryview) -> list[bytes]:
    out, pos, mv = [], 0, memoryview(raw)
    while pos < len(mv):
        size = int.from_bytes(mv[pos + 8 : pos + 12], "big") + 12
        batch = mv[pos : pos + size]
        if not batch[22] & 0x20:
            out += [r.value for r in iter_records(batch)]
        pos += size
    return out


def test_batches_of_aborted_transactions_are_dropped_and_the_rest_kept():
    # B committed 3-4 (its marker comes at 11, after its second batch 8-9 which is part of the
    # same transaction): B is not aborted. A aborted 1-2 (marker 5), then committed 6-7.
    raw = _history()
    kept, after = committed_batches(raw, [(A, 1)])
    assert after == 12
    assert _values(kept) == [b"plain0", b"b-committed0", b"b-committed1", b"a-committed0",
                             b"a-committed1", b"b-aborted0", b"b-aborted1"]  # fmt: skip


def test_an_aborted_transaction_of_another_producer_overlapping_is_dropped_until_its_marker():
    # As if B's transaction 3-9 had aborted (the list names it from its first offset 3): its
    # batches go, A's do not.
    raw = _history()
    kept, _ = committed_batches(raw, [(A, 1), (B, 3)])
    assert _values(kept) == [b"plain0", b"a-committed0", b"a-committed1"]


def test_no_aborted_list_keeps_the_answer_as_it_is():
    raw = _history()
    kept, after = committed_batches(raw, None)
    assert kept is raw and after == -1
    assert committed_batches(raw, [])[0] is raw


def test_a_partial_batch_at_the_end_is_left_out_and_not_counted():
    raw = _history()
    cut = raw[: len(raw) - 5]
    kept, after = committed_batches(cut, [(A, 1)])
    assert after == 11  # the last complete batch is A's commit marker at 10
    assert _values(kept)[-1] == b"b-aborted1"
