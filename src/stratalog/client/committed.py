"""read_committed on the reading side: a Fetch answer's batches of aborted transactions dropped,
as Kafka's consumer drops them.

A read_committed Fetch ends at the last stable offset and lists the aborted transactions its
records overlap, as (producer id, first offset). Walking the batches in offset order, a
producer's transaction counts as aborted from that first offset until its ABORT marker; its
transactional batches in between are dropped. The markers themselves (control batches) are
left for the decoders, which skip them.
"""

from __future__ import annotations

import heapq

from stratalog.records import iter_records
from stratalog.storage.batch import HEADER_SIZE, parse_header

_ABORT = 0  # a control record's type (the second int16 of its key): 0 abort, 1 commit


def _is_abort_marker(batch: memoryview) -> bool:
    for r in iter_records(batch):
        return r.key is not None and len(r.key) >= 4 and r.key[2:4] == b"\x00\x00"
    return False


def committed_batches(
    raw: bytes | memoryview, aborted: list[tuple[int, int]] | None
) -> tuple[bytes | memoryview, int]:
    """(``raw`` without the batches of ``aborted`` transactions, the offset after its last
    complete batch; -1 if it has none). ``raw`` itself when nothing is aborted."""
    if not aborted:
        return raw, -1
    mv = memoryview(raw)
    pending = sorted((first, pid) for pid, first in aborted)
    heapq.heapify(pending)
    open_aborted: set[int] = set()
    kept: list[memoryview] = []
    end = -1
    pos = 0
    while pos + HEADER_SIZE <= len(mv):
        h = parse_header(mv, pos)
        if pos + h.size > len(mv):
            break  # a partial batch at the end of the answer
        batch = mv[pos : pos + h.size]
        pos += h.size
        end = h.last_offset + 1
        if h.producer_id >= 0:
            while pending and pending[0][0] <= h.last_offset:
                open_aborted.add(heapq.heappop(pending)[1])
            if h.is_control:
                if h.producer_id in open_aborted and _is_abort_marker(batch):
                    open_aborted.discard(h.producer_id)
            elif h.is_transactional and h.producer_id in open_aborted:
                continue
        kept.append(batch)
    return b"".join(kept), end
