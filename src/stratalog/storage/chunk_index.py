"""The chunk index of one partition: base offset -> (segment, position, size, max timestamp).

Like BookKeeper's entry-location index, it maps every chunk (batch) a partition owns to where it
lives; unlike Kafka's sparse offset index it is dense, because in a virtual log the chunks of one
partition are interleaved with other partitions' and cannot be found by scanning forward.

It has two levels, so that history costs disk, not memory:

* **runs**: the chunks of sealed segments (a hot segment's sealed index, ``sealed_index.py``; a
  cold segment's index file) stay on disk. Memory holds a summary per run (segment, chunks,
  first and last offset, max and min timestamp, bytes, running max timestamp) in ``array('q')``
  columns; a run's entries are read when a lookup lands in it (one read, through the broker-wide
  ``RUN_CACHE``, least recently used first out) and bisected there.
* **dense**: the chunks of the segments still being written, in memory, as ``array('q')``
  columns of base offset, last offset, segment, position, size, max timestamp and a running max
  timestamp (a million entries cost tens of MB, not hundreds). When a segment's sealed index is
  written, ``seal`` turns its chunks into a run.

Callers see one sequence of chunks, numbered from 0 (the oldest kept), with the same methods
either way. Segments only grow along a partition's index (chunks go to the active segment, and a
migrated or loaded cold segment follows the ones before it), so "the first chunks in segment s"
is a bisect. Work on many chunks at once (migration, retention) uses slices and bisects of the
columns, never a Python loop per chunk: it runs on the event loop, where a 26,000-chunk segment
handled one chunk at a time held up every produce request for over 100 ms.
"""

from __future__ import annotations

import threading
import weakref
from array import array
from bisect import bisect_left, bisect_right
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from itertools import accumulate
from typing import Protocol

# A run's smallest timestamp before it was ever read (a cold segment's: its manifest has none).
UNKNOWN_TIMESTAMP = -(1 << 63)


@dataclass(frozen=True, slots=True)
class ChunkLocation:
    base_offset: int
    last_offset: int
    segment: int
    position: int  # of the batch itself (after the frame header), in the segment file
    size: int
    max_timestamp: int


class Columns:
    """The entries of one run, whole (a piece of index may skip its first ones)."""

    __slots__ = ("__weakref__", "_prefmax", "base", "last", "maxts", "pos", "size")

    def __init__(self, base: array, last: array, pos: array, size: array, maxts: array) -> None:
        n = len(base)
        if not all(len(c) == n for c in (last, pos, size, maxts)):
            raise ValueError("columns of different lengths")
        self.base = base
        self.last = last
        self.pos = pos
        self.size = size
        self.maxts = maxts
        self._prefmax: array | None = None

    def __len__(self) -> int:
        return len(self.base)

    @property
    def prefmax(self) -> array:
        """Running max of the max timestamps from the run's first entry."""
        if self._prefmax is None:
            self._prefmax = array("q", accumulate(self.maxts, max))
        return self._prefmax

    def nbytes(self) -> int:
        return 5 * 8 * len(self.base) + (8 * len(self.base) if self._prefmax is not None else 0)


class RunSource(Protocol):
    """Where a run's entries are: ``load`` reads them (OSError if it cannot)."""

    def load(self) -> Columns: ...


class MemoryRun:
    """A run kept in memory (tests, and a piece whose file is not written yet)."""

    __slots__ = ("cols",)

    def __init__(self, cols: Columns) -> None:
        self.cols = cols

    def load(self) -> Columns:
        return self.cols


class RunCache:
    """The runs read lately, for the whole broker: a catch-up reader walks one run chunk by
    chunk, and each step must not read it again. Least recently used goes first once the
    columns held pass ``capacity`` bytes."""

    def __init__(self, capacity: int = 64 * 1024 * 1024) -> None:
        self.capacity = capacity
        self._runs: OrderedDict[RunSource, Columns] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.loads = 0  # runs read from their source (a lookup that went to disk)

    def get(self, source: RunSource) -> Columns:
        with self._lock:
            cols = self._runs.get(source)
            if cols is not None:
                self._runs.move_to_end(source)
                return cols
        cols = source.load()
        self.loads += 1
        self.put(source, cols)
        return cols

    def put(self, source: RunSource, cols: Columns) -> None:
        if isinstance(source, MemoryRun):
            return  # already in memory
        with self._lock:
            old = self._runs.pop(source, None)
            if old is not None:
                self._bytes -= old.nbytes()
            self._runs[source] = cols
            self._bytes += cols.nbytes()
            while self._bytes > self.capacity and len(self._runs) > 1:
                _, gone = self._runs.popitem(last=False)
                self._bytes -= gone.nbytes()

    def drop(self, source: RunSource) -> None:
        with self._lock:
            old = self._runs.pop(source, None)
            if old is not None:
                self._bytes -= old.nbytes()

    def clear(self) -> None:
        with self._lock:
            self._runs.clear()
            self._bytes = 0

    @property
    def bytes(self) -> int:
        return self._bytes


RUN_CACHE = RunCache()


class ChunkIndex:
    __slots__ = (
        "_base",
        "_last",
        "_maxts",
        "_memo",
        "_pbase",
        "_pbytes",
        "_pend",
        "_plast",
        "_pmax",
        "_pmin",
        "_pn",
        "_pos",
        "_ppref",
        "_prefmax",
        "_pseg",
        "_pskip",
        "_psrc",
        "_seg",
        "_size",
    )

    def __init__(self) -> None:
        # Dense: chunks of segments not sealed yet.
        self._base = array("q")
        self._last = array("q")
        self._seg = array("q")
        self._pos = array("q")
        self._size = array("q")
        self._maxts = array("q")
        # Running maximum of max timestamps (over runs and dense chunks): monotone, so time
        # lookups can bisect it even though producers may send timestamps out of order.
        self._prefmax = array("q")
        # Runs, oldest first: segment, live chunks, skipped leading entries of the run, first
        # base and last offset, max and min timestamp and bytes of the live chunks, running max
        # timestamp at the run's end, where its chunks end in the numbering, and its source.
        self._pseg = array("q")
        self._pn = array("q")
        self._pskip = array("q")
        self._pbase = array("q")
        self._plast = array("q")
        self._pmax = array("q")
        self._pmin = array("q")
        self._pbytes = array("q")
        self._ppref = array("q")
        self._pend = array("q")
        self._psrc: list[RunSource] = []
        # The run looked up last: (its first chunk, the chunk after it, first chunk - skip,
        # a weak reference to its columns), so a walk through a run does not go back to the
        # cache for every chunk. Cleared when runs move (drop_front, drop_back, unseal_from).
        self._memo: tuple[int, int, int, weakref.ref[Columns]] | None = None

    # -- runs ------------------------------------------------------------------------------
    @property
    def _nlazy(self) -> int:
        return self._pend[-1] if self._pend else 0

    def _run_start(self, k: int) -> int:
        return self._pend[k - 1] if k else 0

    def _cols(self, k: int) -> Columns:
        return RUN_CACHE.get(self._psrc[k])

    def _where(self, i: int) -> tuple[Columns, int] | None:
        """(columns, entry) of chunk ``i`` if it lies in a run; None if it is dense."""
        m = self._memo
        if m is not None and m[0] <= i < m[1]:
            c = m[3]()
            if c is not None:
                return c, i - m[2]
        if i < 0:
            i += len(self)
            if i < 0:
                raise IndexError("chunk index out of range")
        if not self._pend or i >= self._pend[-1]:
            return None
        k = bisect_right(self._pend, i)
        c = self._cols(k)
        start = self._run_start(k)
        self._memo = (start, self._pend[k], start - self._pskip[k], weakref.ref(c))
        return c, i - start + self._pskip[k]

    @property
    def in_memory(self) -> int:
        """How many chunks are in memory (of segments not sealed yet)."""
        return len(self._base)

    @property
    def dense_first_segment(self) -> int | None:
        """The segment of the first chunk in memory (the next one ``seal`` takes)."""
        return self._seg[0] if self._seg else None

    def advance_while_bytes(self, k: int, below: int, excess: int) -> tuple[int, int]:
        """From chunk ``k`` on, past the chunks that end below offset ``below`` while their
        sizes fit in ``excess`` bytes (retention.bytes): (the first chunk not passed, what is
        left of ``excess``). Whole runs are passed by their summaries."""
        n = len(self)
        while k < n:
            if self._pend and k < self._pend[-1]:
                r = bisect_right(self._pend, k)
                if k == self._run_start(r) and self._plast[r] < below and self._pbytes[r] <= excess:
                    excess -= self._pbytes[r]
                    k = self._pend[r]
                    continue
            s = self.size_of(k)
            if self.last_of(k) >= below or s > excess:
                break
            excess -= s
            k += 1
        return k, excess

    @property
    def runs(self) -> int:
        """How many chunks' runs stay on disk (sealed segments)."""
        return len(self._psrc)

    @property
    def lazy_chunks(self) -> int:
        return self._nlazy

    def _reindex_runs(self) -> None:
        self._memo = None
        self._pend = array("q", accumulate(self._pn))
        self._ppref = array("q", accumulate(self._pmax, max))

    def add_run(
        self,
        segment: int,
        source: RunSource,
        count: int,
        first: int,
        last: int,
        max_ts: int,
        min_ts: int,
        nbytes: int,
        skip: int = 0,
    ) -> None:
        """Append a run of ``count`` chunks (from the run's entry ``skip`` on) of ``segment``,
        kept by ``source``, described by its summary. Only before any dense chunk."""
        if count <= 0:
            return
        if self._base:
            raise ValueError("a run cannot follow chunks in memory")
        nxt = self.next_offset
        if nxt is not None and first < nxt:
            raise ValueError(f"chunk at {first} does not follow {nxt - 1}")
        if self._pseg and segment < self._pseg[-1]:
            raise ValueError(f"chunk in segment {segment} after one in {self._pseg[-1]}")
        self._pseg.append(segment)
        self._pn.append(count)
        self._pskip.append(skip)
        self._pbase.append(first)
        self._plast.append(last)
        self._pmax.append(max_ts)
        self._pmin.append(min_ts)
        self._pbytes.append(nbytes)
        self._ppref.append(max(max_ts, self._ppref[-1]) if self._ppref else max_ts)
        self._pend.append(self._nlazy + count)
        self._psrc.append(source)

    def seal(self, segment: int, source: RunSource, run_count: int, run_last: int) -> bool:
        """The chunks in memory of ``segment`` (the first ones in memory) are now kept by
        ``source``, a run of ``run_count`` entries ending at offset ``run_last`` (the segment's
        sealed index): keep only their summary. False, changing nothing, if they are not the
        first in memory or the run does not end where they do."""
        n = self._dense_leading(segment)
        if n == 0 or n > run_count or self._last[n - 1] != run_last:
            return False
        size, maxts = self._size[:n], self._maxts[:n]
        self._pseg.append(segment)
        self._pn.append(n)
        self._pskip.append(run_count - n)
        self._pbase.append(self._base[0])
        self._plast.append(run_last)
        self._pmax.append(max(maxts))
        self._pmin.append(min(maxts))
        self._pbytes.append(sum(size))
        self._ppref.append(self._prefmax[n - 1])
        self._pend.append(self._nlazy + n)
        self._psrc.append(source)
        for col in self._dense_columns():
            del col[:n]
        return True

    def unseal_from(self, segment: int) -> None:
        """Bring the runs of ``segment`` and later ones back into memory (before their files
        go: a truncation into them)."""
        k = bisect_left(self._pseg, segment)
        if k >= len(self._psrc):
            return
        rows = self._rows_from_runs(k)
        del_runs = slice(k, None)
        for col in self._run_columns():
            del col[del_runs]
        del self._psrc[del_runs]
        # The runs' chunks go before the dense ones.
        for col, add in zip(self._dense_columns()[:6], rows, strict=True):
            col[0:0] = add
        self._reindex_runs()
        self._rebuild_prefmax()

    def _rows_from_runs(self, k: int) -> tuple[array, ...]:
        """Columns (base, last, seg, pos, size, maxts) of runs ``k`` on, in memory."""
        base, last, seg, pos, size, maxts = (array("q") for _ in range(6))
        for r in range(k, len(self._psrc)):
            c = self._cols(r)
            a, b = self._pskip[r], self._pskip[r] + self._pn[r]
            base.extend(c.base[a:b])
            last.extend(c.last[a:b])
            seg.extend(array("q", [self._pseg[r]]) * (b - a))
            pos.extend(c.pos[a:b])
            size.extend(c.size[a:b])
            maxts.extend(c.maxts[a:b])
        return base, last, seg, pos, size, maxts

    def _run_columns(self) -> tuple[array, ...]:
        return (
            self._pseg,
            self._pn,
            self._pskip,
            self._pbase,
            self._plast,
            self._pmax,
            self._pmin,
            self._pbytes,
            self._ppref,
            self._pend,
        )

    def _dense_columns(self) -> tuple[array, ...]:
        return (
            self._base,
            self._last,
            self._seg,
            self._pos,
            self._size,
            self._maxts,
            self._prefmax,
        )

    def _dense_leading(self, segment: int) -> int:
        if not self._seg or self._seg[0] != segment:
            return 0
        return bisect_right(self._seg, segment)

    # -- one chunk -------------------------------------------------------------------------
    def __len__(self) -> int:
        return self._nlazy + len(self._base)

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
        prev = self._prefmax[-1] if self._prefmax else (self._ppref[-1] if self._ppref else None)
        self._prefmax.append(max_ts if prev is None or max_ts > prev else prev)

    def __getitem__(self, i: int) -> ChunkLocation:
        if i < 0:
            i += len(self)
        w = self._where(i)
        if w is None:
            j = i - self._nlazy
            return ChunkLocation(
                self._base[j], self._last[j], self._seg[j], self._pos[j], self._size[j],
                self._maxts[j],
            )  # fmt: skip
        c, j = w
        seg = self._pseg[bisect_right(self._pend, i)]
        return ChunkLocation(c.base[j], c.last[j], seg, c.pos[j], c.size[j], c.maxts[j])

    def end_below(self, offset: int) -> tuple[int, int]:
        """(segment, end position) of the last chunk whose last offset is below ``offset``,
        (-1, -1) if none: where the partition's readable bytes end (read slots). Fast when that
        chunk is dense, as the high watermark's is."""
        last = self._last
        j = len(last) - 1
        while j >= 0 and last[j] >= offset:
            j -= 1
        if j >= 0:
            return self._seg[j], self._pos[j] + self._size[j]
        i = self._nlazy - 1
        while i >= 0 and self.last_of(i) >= offset:
            i -= 1
        if i < 0:
            return -1, -1
        loc = self[i]
        return loc.segment, loc.position + loc.size

    @property
    def first_offset(self) -> int | None:
        if self._pbase:
            return self._pbase[0]
        return self._base[0] if self._base else None

    @property
    def next_offset(self) -> int | None:
        if self._last:
            return self._last[-1] + 1
        return self._plast[-1] + 1 if self._plast else None

    def size_of(self, i: int) -> int:
        w = self._where(i)
        return self._size[i - self._nlazy] if w is None else w[0].size[w[1]]

    def segment_of(self, i: int) -> int:
        if self._pend and i < self._pend[-1]:
            return self._pseg[bisect_right(self._pend, i)]
        return self._seg[i - self._nlazy]

    def max_timestamp_of(self, i: int) -> int:
        w = self._where(i)
        return self._maxts[i - self._nlazy] if w is None else w[0].maxts[w[1]]

    def base_of(self, i: int) -> int:
        w = self._where(i)
        return self._base[i - self._nlazy] if w is None else w[0].base[w[1]]

    def last_of(self, i: int) -> int:
        w = self._where(i)
        return self._last[i - self._nlazy] if w is None else w[0].last[w[1]]

    # -- lookups ---------------------------------------------------------------------------
    def locate(self, offset: int) -> int:
        """Index of the chunk holding ``offset``, or of the first chunk after it; len() if none."""
        if self._plast and offset <= self._plast[-1]:
            # In a run: bisect the summaries, then the run's entries (one read).
            k = bisect_right(self._pbase, offset) - 1
            if k < 0:
                return 0
            if self._plast[k] < offset:
                return self._pend[k]  # between two runs: the next run's first chunk
            c = self._cols(k)
            a = self._pskip[k]
            b = a + self._pn[k]
            j = bisect_right(c.base, offset, a, b) - 1
            if c.last[j] < offset:
                j += 1
            return self._run_start(k) + j - a
        i = bisect_right(self._base, offset) - 1
        if i >= 0 and self._last[i] >= offset:
            return self._nlazy + i
        return self._nlazy + i + 1

    def locate_time(self, timestamp: int) -> int:
        """Index of the first chunk whose running max timestamp reaches ``timestamp``."""
        if self._ppref and self._ppref[-1] >= timestamp:
            k = bisect_left(self._ppref, timestamp)
            # Every chunk before run k is older: the first of its own that reaches it.
            if timestamp <= self._pmin[k]:
                return self._run_start(k)  # its first chunk already reaches it: nothing read
            c = self._cols(k)
            a = self._pskip[k]
            b = a + self._pn[k]
            if self._pmin[k] == UNKNOWN_TIMESTAMP:
                self._pmin[k] = min(c.maxts[a:b])
            pm = c.prefmax
            if a == 0 or pm[a - 1] < timestamp:
                j = bisect_left(pm, timestamp, a, b)
            else:
                j = next(x for x in range(a, b) if c.maxts[x] >= timestamp)
            return self._run_start(k) + j - a
        return self._nlazy + bisect_left(self._prefmax, timestamp)

    def total_bytes(self) -> int:
        return sum(self._pbytes) + sum(self._size)

    def timestamp_range(self) -> tuple[int, int] | None:
        """(smallest, largest) of the chunks' max timestamps; None if there is no chunk. Reads
        only runs whose smallest was never seen (a cold segment of an older manifest)."""
        if not len(self):
            return None
        lows = []
        for k in range(len(self._psrc)):
            if self._pmin[k] == UNKNOWN_TIMESTAMP:
                c = self._cols(k)
                a = self._pskip[k]
                self._pmin[k] = min(c.maxts[a : a + self._pn[k]])
            lows.append(self._pmin[k])
        if self._maxts:
            lows.append(min(self._maxts))
        high = self._prefmax[-1] if self._prefmax else self._ppref[-1]
        return min(lows), high

    def argmax_timestamp(self, below: int) -> int:
        """Index of the first chunk with the largest max timestamp among those whose last
        offset is below ``below``; -1 if none is."""
        n = self.count_before(below)
        if n <= 0:
            return -1
        best_t, best_i = None, -1
        full = bisect_right(self._pend, n)  # runs wholly among the first n chunks
        for k in range(full):
            if best_t is None or self._pmax[k] > best_t:
                best_t, best_i = self._pmax[k], k
        if best_i >= 0:
            c = self._cols(best_i)
            a = self._pskip[best_i]
            b = a + self._pn[best_i]
            j = next(x for x in range(a, b) if c.maxts[x] == best_t)
            best_i = self._run_start(best_i) + j - a
        for i in range(self._run_start(full), n):  # a partial run, then dense chunks
            t = self.max_timestamp_of(i)
            if best_t is None or t > best_t:
                best_t, best_i = t, i
        return best_i

    def _check_follows(self, base: int, segment: int) -> None:
        nxt = self.next_offset
        if nxt is not None and base < nxt:
            raise ValueError(f"chunk at {base} does not follow {nxt - 1}")
        last_seg = self._seg[-1] if self._seg else (self._pseg[-1] if self._pseg else None)
        if last_seg is not None and segment < last_seg:
            raise ValueError(f"chunk in segment {segment} after one in {last_seg}")

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

    def columns(self) -> Columns:
        """A piece's chunks in memory as one run's columns (see ``from_columns``)."""
        if self._psrc:
            raise ValueError("a piece with runs")
        return Columns(self._base, self._last, self._pos, self._size, self._maxts)

    def extend(self, piece: ChunkIndex, segment: int, start: int = 0) -> None:
        """Append ``piece``'s chunks from ``start`` on, all in ``segment``."""
        n = len(piece) - start
        if n <= 0:
            return
        self._check_follows(piece.base_of(start), segment)
        i = len(self._base)
        running = self._prefmax[-1] if self._prefmax else (self._ppref[-1] if self._ppref else None)
        self._base.extend(piece._base[start:])
        self._last.extend(piece._last[start:])
        self._seg.extend(array("q", [segment]) * n)
        self._pos.extend(piece._pos[start:])
        self._size.extend(piece._size[start:])
        self._maxts.extend(piece._maxts[start:])
        self._prefmax.extend(piece._prefmax[start:])
        self._fix_prefmax(i, running)

    def _fix_prefmax(self, i: int, running: int | None) -> None:
        """Recompute the dense running max from chunk ``i`` on, given the true one before it,
        until it agrees with the stored one: both are running maxes of the same timestamps
        from there."""
        maxts, pref = self._maxts, self._prefmax
        n = len(maxts)
        while i < n:
            t = maxts[i]
            running = t if running is None or t > running else running
            if pref[i] == running:
                return
            pref[i] = running
            i += 1

    def _rebuild_prefmax(self) -> None:
        """The dense running max from scratch, continuing the runs'."""
        if self._ppref:
            self._prefmax = array("q", accumulate(self._maxts, max, initial=self._ppref[-1]))
            del self._prefmax[0]
        else:
            self._prefmax = array("q", accumulate(self._maxts, max))

    def leading(self, segment: int) -> int:
        """How many of the first chunks lie in ``segment``."""
        n = 0
        k = 0
        while k < len(self._psrc) and self._pseg[k] == segment:
            n += self._pn[k]
            k += 1
        if k < len(self._psrc):
            return n
        return n + self._dense_leading(segment)

    def count_through(self, last_offset: int) -> int:
        """How many of the first chunks end at or before ``last_offset``."""
        k = bisect_right(self._plast, last_offset)
        if k < len(self._psrc):
            if self._pbase[k] > last_offset:
                return self._run_start(k)
            c = self._cols(k)
            a = self._pskip[k]
            return self._run_start(k) + bisect_right(c.last, last_offset, a, a + self._pn[k]) - a
        return self._nlazy + bisect_right(self._last, last_offset)

    def count_before(self, offset: int) -> int:
        """How many of the first chunks end before ``offset``."""
        k = bisect_left(self._plast, offset)
        if k < len(self._psrc):
            if self._pbase[k] >= offset:
                return self._run_start(k)
            c = self._cols(k)
            a = self._pskip[k]
            return self._run_start(k) + bisect_left(c.last, offset, a, a + self._pn[k]) - a
        return self._nlazy + bisect_left(self._last, offset)

    def _slices(self, i: int, n: int):
        """(segment, columns or None for dense, start, stop) covering chunks i..n-1."""
        out = []
        if self._pend and i < self._pend[-1]:
            k = bisect_right(self._pend, i)
            while k < len(self._psrc) and self._run_start(k) < n:
                start = self._run_start(k)
                a = self._pskip[k] + max(0, i - start)
                b = self._pskip[k] + min(self._pn[k], n - start)
                if b > a:
                    out.append((self._pseg[k], self._cols(k), a, b))
                k += 1
        lazy = self._nlazy
        a, b = max(0, i - lazy), n - lazy
        if b > a:
            out.append((None, None, a, b))
        return out

    def _gather(self, name: str, i: int, n: int) -> array:
        out = array("q")
        dense = {"pos": self._pos, "size": self._size, "base": self._base}[name]
        for _seg, c, a, b in self._slices(i, n):
            out.extend((dense if c is None else getattr(c, name))[a:b])
        return out

    def locations(self, n: int) -> tuple[array, array]:
        """(positions, sizes) of the first ``n`` chunks."""
        return self._gather("pos", 0, n), self._gather("size", 0, n)

    def bases(self, n: int) -> array:
        return self._gather("base", 0, n)

    def max_timestamp_of_first(self, n: int) -> int:
        if n <= 0:
            return -1
        i = n - 1
        lazy = self._nlazy
        if i >= lazy:
            return self._prefmax[i - lazy]
        k = bisect_right(self._pend, i)
        if i == self._pend[k] - 1:
            return self._ppref[k]
        c = self._cols(k)
        a = self._pskip[k]
        j = i - self._run_start(k) + a
        local = max(c.maxts[a : j + 1])
        return max(local, self._ppref[k - 1]) if k else local

    def bytes_of_first(self, n: int) -> int:
        return self._bytes_between(0, n)

    def _bytes_between(self, i: int, n: int) -> int:
        total = 0
        for _seg, c, a, b in self._slices(i, n):
            if c is None:
                total += sum(self._size[a:b])
            else:
                total += sum(c.size[a:b])
        return total

    def count_by_segment_of_first(self, n: int) -> dict[int, int]:
        return self._counts_between(0, n)

    def _counts_between(self, i: int, n: int) -> dict[int, int]:
        counts: dict[int, int] = {}
        for seg_of_run, c, a, b in self._slices(i, n):
            if c is not None:
                counts[seg_of_run] = counts.get(seg_of_run, 0) + b - a
                continue
            seg = self._seg
            j = a
            while j < b:
                e = min(b, bisect_right(seg, seg[j]))
                counts[seg[j]] = counts.get(seg[j], 0) + e - j
                j = e
        return counts

    def drop_front(self, n: int) -> None:
        """Forget the first ``n`` chunks (retention, migration)."""
        if n <= 0:
            return
        n = min(n, len(self))
        whole = bisect_right(self._pend, n)  # runs wholly among them
        rest = n - self._run_start(whole)
        if whole:
            for col in self._run_columns():
                del col[:whole]
            del self._psrc[:whole]
        if self._psrc and rest > 0:
            # Into the first run: it starts further in (one read for its new summary).
            c = RUN_CACHE.get(self._psrc[0])
            a = self._pskip[0] + rest
            b = self._pskip[0] + self._pn[0]
            self._pskip[0] = a
            self._pn[0] = b - a
            self._pbase[0] = c.base[a]
            self._pmax[0] = max(c.maxts[a:b])
            self._pmin[0] = min(c.maxts[a:b])
            self._pbytes[0] = sum(c.size[a:b])
            rest = 0
        self._reindex_runs()
        if not self._psrc and rest > 0:
            for col in self._dense_columns():
                del col[:rest]
        # The running max must forget what was dropped, or time lookups start too early; it
        # differs from the stored one only until the timestamps pass what was dropped.
        self._fix_prefmax(0, self._ppref[-1] if self._ppref else None)

    def drop_back(self, keep: int) -> None:
        """Keep only the first ``keep`` chunks (recovery truncation)."""
        lazy = self._nlazy
        if keep >= lazy:
            for col in self._dense_columns():
                del col[keep - lazy :]
            return
        k = bisect_right(self._pend, keep)
        j = keep - self._run_start(k)
        if j:
            # Into run k: its first j chunks come back into memory, the rest goes.
            c = self._cols(k)
            a = self._pskip[k]
            seg = self._pseg[k]
            for col in self._dense_columns():
                del col[:]
            self._base.extend(c.base[a : a + j])
            self._last.extend(c.last[a : a + j])
            self._seg.extend(array("q", [seg]) * j)
            self._pos.extend(c.pos[a : a + j])
            self._size.extend(c.size[a : a + j])
            self._maxts.extend(c.maxts[a : a + j])
        else:
            for col in self._dense_columns():
                del col[:]
        for col in self._run_columns():
            del col[k:]
        del self._psrc[k:]
        self._memo = None
        self._rebuild_prefmax()

    def count_before_location(self, segment: int, position: int) -> int:
        """How many of the first chunks lie before (segment, position) (a truncation point):
        chunks are in (segment, position) order."""
        lo = bisect_left(self._pseg, segment)
        if lo < len(self._psrc):
            if self._pseg[lo] > segment:
                return self._run_start(lo)
            c = self._cols(lo)
            a = self._pskip[lo]
            return self._run_start(lo) + bisect_left(c.pos, position, a, a + self._pn[lo]) - a
        lo = bisect_left(self._seg, segment)
        hi = bisect_right(self._seg, segment, lo)
        return self._nlazy + bisect_left(self._pos, position, lo, hi)

    def bases_from(self, i: int) -> array:
        return self._gather("base", i, len(self))

    def bytes_from(self, i: int) -> int:
        return self._bytes_between(i, len(self))

    def count_by_segment_from(self, i: int) -> dict[int, int]:
        return self._counts_between(i, len(self))

    def segments(self) -> set[int]:
        return set(self._pseg) | set(self._seg)

    def count_by_segment(self) -> dict[int, int]:
        return self.count_by_segment_of_first(len(self))
