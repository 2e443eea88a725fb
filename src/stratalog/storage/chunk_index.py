"""The chunk index of one partition: base offset -> (segment, position, size, max timestamp).

Like BookKeeper's entry-location index, it maps every chunk (batch) a partition owns to where it
lives; unlike Kafka's sparse offset index it is dense, because in a virtual log the chunks of one
partition are interleaved with other partitions' and cannot be found by scanning forward.
Columns are ``array('q')`` so a million entries cost tens of MB, not hundreds.

Segments only grow along a partition's index (chunks go to the active segment, and a migrated or
loaded cold segment follows the ones before it), so "the first chunks in segment s" is a bisect.
Work on many chunks at once (migration, retention) uses slices and bisects of the columns, never
a Python loop per chunk: it runs on the event loop, where a 26,000-chunk segment handled one
chunk at a time held up every produce request for over 100 ms.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Iterable
from dataclasses import dataclass
from itertools import accumulate


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
        self._check_follows(base, segment)
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

    def _check_follows(self, base: int, segment: int) -> None:
        if self._last and base <= self._last[-1]:
            raise ValueError(f"chunk at {base} does not follow {self._last[-1]}")
        if self._seg and segment < self._seg[-1]:
            raise ValueError(f"chunk in segment {segment} after one in {self._seg[-1]}")

    def _columns(self) -> tuple[array, ...]:
        return (
            self._base,
            self._last,
            self._seg,
            self._pos,
            self._size,
            self._maxts,
            self._prefmax,
        )

    # -- many chunks at once ---------------------------------------------------------------
    @classmethod
    def from_columns(
        cls,
        base: Iterable[int],
        last: Iterable[int],
        position: Iterable[int],
        size: Iterable[int],
        max_ts: Iterable[int],
    ) -> ChunkIndex:
        """A piece of index with no segment yet (see ``extend``); built off the event loop."""
        ix = cls()
        ix._base = array("q", base)
        ix._last = array("q", last)
        ix._pos = array("q", position)
        ix._size = array("q", size)
        ix._maxts = array("q", max_ts)
        ix._prefmax = array("q", accumulate(ix._maxts, max))
        n = len(ix._base)
        if not all(len(c) == n for c in (ix._last, ix._pos, ix._size, ix._maxts)):
            raise ValueError("columns of different lengths")
        if any(b >= a for a, b in zip(ix._base[1:], ix._last, strict=False)):
            raise ValueError("chunks overlap or are out of order")
        ix._seg = array("q", [0]) * n
        return ix

    def extend(self, piece: ChunkIndex, segment: int, start: int = 0) -> None:
        """Append ``piece``'s chunks from ``start`` on, all in ``segment``."""
        n = len(piece) - start
        if n <= 0:
            return
        self._check_follows(piece._base[start], segment)
        i = len(self._base)
        running = self._prefmax[-1] if self._prefmax else None
        self._base.extend(piece._base[start:])
        self._last.extend(piece._last[start:])
        self._seg.extend(array("q", [segment]) * n)
        self._pos.extend(piece._pos[start:])
        self._size.extend(piece._size[start:])
        self._maxts.extend(piece._maxts[start:])
        self._prefmax.extend(piece._prefmax[start:])
        self._fix_prefmax(i, running)

    def _fix_prefmax(self, i: int, running: int | None) -> None:
        """Recompute the running max from chunk ``i`` on, given the true one before it, until it
        agrees with the stored one: both are running maxes of the same timestamps from there."""
        maxts, pref = self._maxts, self._prefmax
        n = len(maxts)
        while i < n:
            t = maxts[i]
            running = t if running is None or t > running else running
            if pref[i] == running:
                return
            pref[i] = running
            i += 1

    def leading(self, segment: int) -> int:
        """How many of the first chunks lie in ``segment``."""
        if not self._seg or self._seg[0] != segment:
            return 0
        return bisect_right(self._seg, segment)

    def count_through(self, last_offset: int) -> int:
        """How many of the first chunks end at or before ``last_offset``."""
        return bisect_right(self._last, last_offset)

    def count_before(self, offset: int) -> int:
        """How many of the first chunks end before ``offset``."""
        return bisect_left(self._last, offset)

    def locations(self, n: int) -> tuple[array, array]:
        """(positions, sizes) of the first ``n`` chunks."""
        return self._pos[:n], self._size[:n]

    def bases(self, n: int) -> array:
        return self._base[:n]

    def max_timestamp_of_first(self, n: int) -> int:
        return self._prefmax[n - 1] if n > 0 else -1

    def bytes_of_first(self, n: int) -> int:
        return sum(self._size[:n])

    def count_by_segment_of_first(self, n: int) -> dict[int, int]:
        counts: dict[int, int] = {}
        seg = self._seg
        i = 0
        while i < n:
            j = min(n, bisect_right(seg, seg[i]))
            counts[seg[i]] = j - i
            i = j
        return counts

    def drop_front(self, n: int) -> None:
        """Forget the first ``n`` chunks (retention, migration)."""
        if n <= 0:
            return
        for col in self._columns():
            del col[:n]
        # The running max must forget what was dropped, or time lookups start too early; it
        # differs from the stored one only until the timestamps pass what was dropped.
        self._fix_prefmax(0, None)

    def drop_back(self, keep: int) -> None:
        """Keep only the first ``keep`` chunks (recovery truncation)."""
        for col in self._columns():
            del col[keep:]

    def count_before_location(self, segment: int, position: int) -> int:
        """How many of the first chunks lie before (segment, position) (a truncation point):
        chunks are in (segment, position) order."""
        lo = bisect_left(self._seg, segment)
        hi = bisect_right(self._seg, segment, lo)
        return bisect_left(self._pos, position, lo, hi)

    def bases_from(self, i: int) -> array:
        return self._base[i:]

    def bytes_from(self, i: int) -> int:
        return sum(self._size[i:])

    def count_by_segment_from(self, i: int) -> dict[int, int]:
        counts: dict[int, int] = {}
        for seq in self._seg[i:]:
            counts[seq] = counts.get(seq, 0) + 1
        return counts

    def segments(self) -> set[int]:
        return set(self._seg)

    def count_by_segment(self) -> dict[int, int]:
        return self.count_by_segment_of_first(len(self))
