"""Reading a split partition family so that each key keeps its order (stratalog.splits).

After a split a producer sends a key to the parent until it learns of the split, then to the
child. Read side by side, the child's first records of that key could come out before the
parent's last ones. The broker answers each child batch with an order mark: the parent's next
offset when the batch was appended. A child batch is taken only once the parent was read up to
that mark, so every record a producer sent to the parent before the child comes first. Parent
batches need no wait (nothing of theirs depends on the child), which keeps the Arrow batches
large. Parents come before children in ``members`` and in each round's output.

A child batch without a mark (read from the cold tier, where partitions are kept apart) waits
until the parent's whole range was read: the order then still holds for every producer.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa

from stratalog.client.arrow_reader import ArrowDecoder
from stratalog.client.committed import committed_batches
from stratalog.client.wire import PartitionData, WireClient, WireError
from stratalog.storage.batch import HEADER_SIZE, parse_header


@dataclass(frozen=True)
class Member:
    """One partition of a family: read ``start <= offset < end``; ``parent`` as split."""

    partition: int
    start: int
    end: int
    parent: int | None = None


def _cut(data: PartitionData, parent_at: int) -> tuple[int, int | None] | None:
    """(base offset, mark) of the first batch of ``data`` that must wait for the parent (its
    mark is past ``parent_at``, or it has none: mark None); None if all may be taken."""
    marks = dict(data.order or ())
    mv = memoryview(data.records)
    pos = 0
    while pos + HEADER_SIZE <= len(mv):
        h = parse_header(mv, pos)
        w = marks.get(h.base_offset)
        if w is None or w > parent_at:
            return h.base_offset, w
        pos += h.size
    return None


def _waits(m: Member, blocked: dict, at: dict, end: dict) -> bool:
    """Whether child ``m`` still waits for its parent to reach the mark it was cut at."""
    if m.partition not in blocked or m.parent is None or m.parent not in at:
        return False
    if at[m.parent] >= end[m.parent]:
        return False  # the parent's range is read: nothing to wait for
    mark = blocked[m.partition]
    return mark is None or at[m.parent] < mark


def read_family(
    client: WireClient,
    topic: str,
    members: list[Member],
    *,
    include_headers: bool = False,
    include_producer: bool = False,
    fetch_bytes: int = 8 * 1024 * 1024,
    read_committed: bool = False,
) -> Iterator[pa.RecordBatch]:
    """Arrow batches of the members' records, every child batch after the parent records that
    were appended before it."""
    decoders = {
        m.partition: ArrowDecoder(topic, m.partition, include_headers, include_producer)
        for m in members
    }
    at = {m.partition: m.start for m in members}
    end = {m.partition: m.end for m in members}
    blocked: dict[int, int | None] = {}  # child -> the mark it waits for (None: the parent's end)
    while True:
        want = {
            m.partition: at[m.partition]
            for m in members
            if at[m.partition] < end[m.partition] and not _waits(m, blocked, at, end)
        }
        if not want:
            break
        got = client.fetch(
            topic,
            want,
            partition_max_bytes=fetch_bytes,
            max_bytes=fetch_bytes * len(want),  # each member its share
            max_wait_ms=0,
            isolation_level=int(read_committed),
            reuse_buffer=True,  # decoded before the next call
        )
        moved = False
        for m in members:
            p = m.partition
            data = got.get(p)
            if p not in want or data is None:
                continue
            if data.error_code:
                raise WireError(f"fetch {topic}/{p} at {at[p]}: error {data.error_code}",
                                data.error_code)  # fmt: skip
            if not data.records:
                readable = data.last_stable_offset if read_committed else data.high_watermark
                if readable <= at[p]:
                    end[p] = at[p]  # nothing more there (yet): asked past the end
                    moved = True
                continue  # (else the answer's byte budget went to the partitions before it)
            limit = end[p]
            parent = m.parent
            blocked.pop(p, None)
            if parent is not None and parent in at and at[parent] < end[parent]:
                cut = _cut(data, at[parent])
                if cut is not None:
                    limit = min(limit, cut[0])
                    # Not fetched again before the parent reached that mark: its bytes would
                    # be sent only to be dropped again.
                    blocked[p] = cut[1]
            if limit <= at[p]:
                continue  # waits for its parent
            records, after = committed_batches(data.records, data.aborted)
            nxt = decoders[p].add(records, at[p], limit)
            nxt = max(nxt, after) if limit == end[p] else min(max(nxt, after), limit)
            if nxt > at[p]:
                at[p] = nxt
                moved = True
        if not moved:
            raise WireError(f"reading the split family {sorted(at)} of {topic} made no progress")
        for m in members:  # parents first: their rows before their children's
            yield from decoders[m.partition].drain()


def child_end(
    client: WireClient, topic: str, child: int, start: int, end: int, parent_end: int
) -> int:
    """Where a read of ``child`` from ``start`` must end, at most ``end``, when its parent's
    read ends at ``parent_end``: before the first batch appended after the parent's records
    from ``parent_end`` on (its mark is past it), so that a range cut by a rate limit stays a
    consistent cut of the family's log. A batch without a mark (the cold tier) ends it too."""
    at = start
    while at < end:
        data = client.fetch(
            topic, {child: at}, max_bytes=1 << 20, partition_max_bytes=1 << 20, max_wait_ms=0
        )[child]
        if data.error_code:
            raise WireError(f"fetch {topic}/{child} at {at}: error {data.error_code}",
                            data.error_code)  # fmt: skip
        if not data.records:
            return at  # nothing more there: the end is where it is
        cut = _cut(data, parent_end)
        if cut is not None:
            return max(start, min(end, cut[0]))
        mv = memoryview(data.records)
        pos = nxt = 0
        while pos + HEADER_SIZE <= len(mv):
            h = parse_header(mv, pos)
            if pos + h.size > len(mv):
                break
            nxt = h.last_offset + 1
            pos += h.size
        if nxt <= at:
            raise WireError(f"fetch {topic}/{child} at {at} made no progress")
        at = nxt
    return end
