"""The chunk index of one partition: base offset -> (segment, position, size, max timestamp).

Like BookKeeper's entry-location index, it maps every chunk (batch) a partition owns to where it
lives; unlike Kafka's sparse offset index it is dense, because in a virtual log the chunks of one
partition are interleaved with other partitions' and cannot be found by scanning forward.
Columns are ``array('q')`` so a million entries cost tens of MB, not hundreds.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left, bisect_right
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ChunkLocation:
    base_offset: int
    last_offset: int
    segment: int
    position: int  # of the batch itself (after the frame header), in the segment file
    size: int
    max_timestamp: int


class ChunkIndex:
    __slots__ = ("_base", "_last", "_maxts", "_pos", "_prefmax", "_seg", "_size")

    def __init__(self) -> None:
        self._base = array("q")
        self._last = array("q")
        self._seg = array("q")
        self._pos = array("q")
        self._size = array("q")
        self._maxts = array("q")
        # Running maximum of max timestamps: monotone, so time lookups can bisect it even though
        # producers may send timestamps out of order.
        self._prefmax = array("q")

    def __len__(self) -> int:
        return len(self._base)

    def append(
        self, base: int, last: int, segment: int, position: int, size: int, max_ts: int
    ) -> None:
        if self._last and base <= self._last[-1]:
            raise ValueError(f"chunk at {base} does not follow {self._last[-1]}")
        self._base.append(base)
        self._last.append(last)
        self._seg.append(segment)
        self._pos.append(position)
        self._size.append(size)
        self._maxts.append(max_ts)
        self._prefmax.append(max(max_ts, self._prefmax[-1]) if self._prefmax else max_ts)

    def __getitem__(self, i: int) -> ChunkLocation:
        return ChunkLocation(
            self._base[i], self._last[i], self._seg[i], self._pos[i], self._size[i], self._maxts[i]
        )

    @property
    def first_offset(self) -> int | None:
        return self._base[0] if self._base else None

    @property
    def next_offset(self) -> int | None:
        return self._last[-1] + 1 if self._last else None

    def size_of(self, i: int) -> int:
        return self._size[i]

    def segment_of(self, i: int) -> int:
        return self._seg[i]

    def max_timestamp_of(self, i: int) -> int:
        return self._maxts[i]

    def base_of(self, i: int) -> int:
        return self._base[i]

    def last_of(self, i: int) -> int:
        return self._last[i]

    def locate(self, offset: int) -> int:
        """Index of the chunk holding ``offset``, or of the first chunk after it; len() if none."""
        i = bisect_right(self._base, offset) - 1
        if i >= 0 and self._last[i] >= offset:
            return i
        return i + 1

    def locate_time(self, timestamp: int) -> int:
        """Index of the first chunk whose running max timestamp reaches ``timestamp``."""
        return bisect_left(self._prefmax, timestamp)

    def total_bytes(self) -> int:
        return sum(self._size)

    def drop_front(self, n: int) -> None:
        """Forget the first ``n`` chunks (retention, migration)."""
        if n <= 0:
            return
        for col in (self._base, self._last, self._seg, self._pos, self._size, self._maxts):
            del col[:n]
        # The running max must forget what was dropped, or time lookups start too early.
        self._prefmax = array("q")
        running = None
        for t in self._maxts:
            running = t if running is None else max(running, t)
            self._prefmax.append(running)

    def drop_back(self, keep: int) -> None:
        """Keep only the first ``keep`` chunks (recovery truncation)."""
        for col in (self._base, self._last, self._seg, self._pos, self._size, self._maxts):
            del col[keep:]
        del self._prefmax[keep:]

    def segments(self) -> set[int]:
        return set(self._seg)

    def count_by_segment(self) -> dict[int, int]:
        counts: dict[int, int] = {}
        for s in self._seg:
            counts[s] = counts.get(s, 0) + 1
        return counts
