"""Partition splits (dynamic partitioning, KerA's idea in Kafka's terms): the split tree.

A split doubles a topic's partitions, N to 2N: partition ``p`` gains the child ``p + N``. With
doubling, Kafka's own partitioner is the split tree (``murmur2(k) % 2N`` is ``p`` or ``p + N``
for every key of ``p``), so a plain Kafka producer, once it learns the new count, sends each key
where it was or to its one child. The children live in their parent's virtual log, so the log
holds the family's records in the order they were appended; Fetch answers a child's batches with
*order marks* (below) that let a Stratalog reader keep each key's order across the split even
for records a producer sent to the parent before it learned of the split.

The history is a topic config the broker keeps (``partition.split.history``): the partition
counts in order, e.g. ``"2,4,8"`` for a topic created with 2 and split twice. Shared by the
broker and the readers; no I/O here.
"""

from __future__ import annotations

import itertools
import struct

SPLIT_HISTORY = "partition.split.history"
AUTOSCALE_ENABLE = "partition.autoscale.enable"
AUTOSCALE_BYTES = "partition.autoscale.bytes.per.sec"
AUTOSCALE_WINDOW = "partition.autoscale.window.ms"
AUTOSCALE_MAX = "partition.autoscale.max.partitions"

# A tagged field of Fetch's partition answers (v12+) that only Stratalog writes: Kafka clients
# skip tags they do not know (KIP-482). Far above Kafka's own tags (0 to 2 there).
ORDER_TAG = 0x5354
_MARK = struct.Struct(">qq")


class SplitError(ValueError):
    """A history that is not a doubling sequence, or a count that is not the next split."""


def parse_history(value: str | None) -> list[int]:
    """The partition counts of a split history; [] for none."""
    if not value:
        return []
    try:
        counts = [int(x) for x in value.split(",")]
    except ValueError:
        raise SplitError(f"{SPLIT_HISTORY} {value!r} is not a list of partition counts") from None
    if counts[0] < 1 or any(b != 2 * a for a, b in itertools.pairwise(counts)):
        raise SplitError(f"{SPLIT_HISTORY} {value!r}: each count must double the one before")
    return counts


def format_history(counts: list[int]) -> str:
    return ",".join(str(c) for c in counts)


def next_history(value: str | None, current: int, requested: int) -> str:
    """The history after splitting a topic of ``current`` partitions to ``requested``."""
    if requested != 2 * current:
        raise SplitError(
            f"a topic with {AUTOSCALE_ENABLE}=true grows by splits, which double its "
            f"partitions: {current} to {2 * current}, not {requested}"
        )
    counts = parse_history(value) or [current]
    if counts[-1] != current:
        raise SplitError(f"{SPLIT_HISTORY} ends at {counts[-1]}, the topic has {current}")
    return format_history([*counts, requested])


def parent_of(partition: int, counts: list[int]) -> int | None:
    """The partition ``partition`` was split from; None for one the topic was created with."""
    for n in reversed(counts[:-1]):
        if n <= partition < 2 * n:
            return partition - n
    return None


def families(counts: list[int], total: int) -> list[list[int]]:
    """Each original partition with its descendants, parents before their children."""
    first = counts[0] if counts else total
    out = [[r] for r in range(first)]
    for c in range(first, total):
        p = c
        while (q := parent_of(p, counts)) is not None:
            p = q
        out[p].append(c)
    return out


def encode_marks(marks: list[tuple[int, int]]) -> bytes:
    """Order marks as the tagged field's payload: a count, then (batch base offset, parent
    offset) pairs: each batch of the child was appended when its parent's next offset was the
    second number (every parent record below it came first in the log)."""
    return struct.pack(">i", len(marks)) + b"".join(_MARK.pack(b, w) for b, w in marks)


def decode_marks(data: bytes | memoryview) -> list[tuple[int, int]]:
    (n,) = struct.unpack_from(">i", data, 0)
    if n < 0 or 4 + n * _MARK.size != len(data):
        raise ValueError(f"order marks of {len(data)} bytes cannot hold {n} entries")
    return [_MARK.unpack_from(data, 4 + i * _MARK.size) for i in range(n)]
