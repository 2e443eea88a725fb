"""The sealed index of a segment (``<seq>.pix``): its chunks sorted by partition, on disk.

A virtual log's ``.idx`` holds one entry per frame in log order, every partition interleaved,
so finding one partition's chunks in it means reading all of it; at start-up the broker used to
read every segment's ``.idx`` into memory. When a segment is sealed (or at recovery, for a sealed
segment without one) its entries are written once more, grouped by partition and sorted by
offset, as Kafka keeps an offset index per segment:

```
header   magic "SLPX", version, the segment's size it describes, the data's first and last
         frame headers (8 bytes each, and where the last one starts), row count, CRC-32C of
         the header and the table
table    one row per partition: uid, chunks, first base offset, last offset, max and min
         timestamp, bytes, where its run starts, CRC-32C of the run, chunks of transactional
         producers (start-up reads only the runs that hold some: storage/txn_index.py)
runs     per partition, its entries in offset order (base offset, last delta, position, size,
         max timestamp, producer id, epoch, base sequence: the cold tier's entry format)
```

Start-up reads the header and table only (one small read per segment: the per-partition
summary the two-level chunk index keeps in memory); a lookup in history reads one partition's
run (one read) and bisects it. Every claim is checked: the table by its CRC, the file's match
with its segment by the size and the first and last frame headers (read from the segment), each
run by its CRC when it is read. A file that fails is rebuilt from the segment's frames; a
missing one is written again from the segment's index at the next start. It is written to a
temporary name, synced and renamed, so a crash never leaves a torn one under its name (and a
stale one from an earlier segment of the same sequence number fails the frame check).
"""

from __future__ import annotations

import logging
import os
import struct
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from crc32c import crc32c

from stratalog.storage.chunk_index import Columns
from stratalog.storage.noatime import open_noatime
from stratalog.storage.segment import write_whole
from stratalog.storage.txn_index import (
    TRANSACTIONAL_END,
    TRANSACTIONAL_PRODUCER_IDS,
    is_transactional_producer,
)

log = logging.getLogger(__name__)

MAGIC = b"SLPX"
VERSION = 2  # 2: rows count transactional chunks (1's are rebuilt)
# magic, version, flags, data size, first frame (8), last frame's position, last frame (8),
# rows, CRC-32C of the header before it and of the table
HEADER = struct.Struct("<4sHHq8sq8sII")
# uid, chunks, first base, last offset, max timestamp, min (chunk max) timestamp, bytes, run
# position, run CRC, chunks of transactional producers
ROW = struct.Struct("<IIqqqqqqII")
# base offset, last offset delta, position, size, max timestamp, producer id, epoch, base
# sequence (= cold_tier.COLD_ENTRY)
RUN_ENTRY = struct.Struct("<qiqiqqhi")
# segment.ENTRY: the same with the partition uid first
_IDX_ENTRY_SIZE = 50
_FIRST_READ = 4096  # the header and a table of 60 partitions: one page


class SealedIndexError(ValueError):
    """A sealed index that does not hold what it claims (damaged, stale, cut short)."""


@dataclass(frozen=True, slots=True)
class Row:
    uid: int
    count: int
    first: int  # base offset of its first chunk
    last: int  # last offset of its last chunk
    max_ts: int
    min_ts: int  # the smallest of its chunks' max timestamps
    nbytes: int
    at: int  # where its run starts in the file
    crc: int
    txn: int  # chunks of transactional producers


def _np():
    import numpy

    return numpy


# RUN_ENTRY's fields as numpy sees them; an .idx entry is the same after its partition uid.
_RUN_FIELDS = [
    ("base", "<i8"),
    ("delta", "<i4"),
    ("pos", "<i8"),
    ("size", "<i4"),
    ("maxts", "<i8"),
    ("pid", "<i8"),
    ("epoch", "<i2"),
    ("seq", "<i4"),
]


def _idx_dtype():
    return _np().dtype([("uid", "<u4"), *_RUN_FIELDS])


def run_dtype():
    return _np().dtype(_RUN_FIELDS)


def build(idx_bytes: bytes | memoryview, data_size: int, first: bytes, last_at: int, last: bytes):
    """The file's bytes for a segment of ``data_size`` bytes whose ``.idx`` entries (segment
    ENTRY structs, in log order) are ``idx_bytes``; ``first``/``last``: the 8-byte frame
    headers at position 0 and ``last_at`` of the segment."""
    np = _np()
    n = len(idx_bytes) // _IDX_ENTRY_SIZE
    a = np.frombuffer(idx_bytes, dtype=_idx_dtype(), count=n)
    order = np.argsort(a["uid"], kind="stable")  # log order within a partition: offset order
    s = a[order]
    runs = np.empty(n, dtype=run_dtype())
    for f in runs.dtype.names:
        runs[f] = s[f]
    uids, starts, counts = np.unique(s["uid"], return_index=True, return_counts=True)
    rows = []
    body = runs.tobytes()
    table_size = ROW.size * len(uids)
    at0 = HEADER.size + table_size
    if n:
        ends = starts + counts - 1
        maxts = np.maximum.reduceat(s["maxts"], starts)
        mints = np.minimum.reduceat(s["maxts"], starts)
        nbytes = np.add.reduceat(s["size"].astype(np.int64), starts)
        firsts = s["base"][starts]
        pid = s["pid"]
        txns = np.add.reduceat(
            ((pid >= TRANSACTIONAL_PRODUCER_IDS) & (pid < TRANSACTIONAL_END)).astype(np.int64),
            starts,
        )
        lasts = s["base"][ends] + s["delta"][ends]
        for k in range(len(uids)):
            start, count = int(starts[k]), int(counts[k])
            run = body[start * RUN_ENTRY.size : (start + count) * RUN_ENTRY.size]
            rows.append(
                ROW.pack(
                    int(uids[k]),
                    count,
                    int(firsts[k]),
                    int(lasts[k]),
                    int(maxts[k]),
                    int(mints[k]),
                    int(nbytes[k]),
                    at0 + start * RUN_ENTRY.size,
                    crc32c(run),
                    int(txns[k]),
                )
            )
    table = b"".join(rows)
    head = HEADER.pack(MAGIC, VERSION, 0, data_size, first, last_at, last, len(uids), 0)
    crc = crc32c(table, crc32c(head[: HEADER.size - 4]))
    head = head[: HEADER.size - 4] + struct.pack("<I", crc)
    return head + table + body


def write(path: Path, data: bytes) -> None:
    """Write the file whole: a temporary name, synced, renamed over (no directory sync: a
    missing file is rebuilt, a present one is whole)."""
    write_whole(path, data)


def frame_heads(data_fd: int, data_size: int, last_at: int) -> tuple[bytes, bytes]:
    """The 8-byte frame headers at 0 and at ``last_at`` of a segment (empty past its end)."""
    if data_size <= 0:
        return b"\0" * 8, b"\0" * 8
    first = os.pread(data_fd, 8, 0)
    last = os.pread(data_fd, 8, last_at) if last_at + 8 <= data_size else b""
    return first.ljust(8, b"\0"), last.ljust(8, b"\0")


def write_for_segment(data_fd: int, data_size: int, index_fd: int, path: Path) -> SealedIndex:
    """Build and write the sealed index of a segment from its ``.idx`` (whole: a sealed
    segment's, open at ``index_fd``), and return it loaded."""
    raw = _read_all(index_fd)
    whole = raw[: len(raw) - len(raw) % _IDX_ENTRY_SIZE]
    return write_from_entries(data_fd, data_size, whole, path)


def write_from_entries(
    data_fd: int, data_size: int, idx_bytes: bytes | memoryview, path: Path
) -> SealedIndex:
    """As ``write_for_segment``, from the segment's entries packed as ``.idx`` entries."""
    last_at = _last_frame_at(idx_bytes)
    first, last = frame_heads(data_fd, data_size, last_at)
    data = build(idx_bytes, data_size, first, last_at, last)
    write(path, data)
    return parse(data, path)


def _last_frame_at(idx_bytes: bytes | memoryview) -> int:
    n = len(idx_bytes) // _IDX_ENTRY_SIZE
    if not n:
        return 0
    # The last entry's batch position (uid at 0, base 4, delta 12, position 16).
    (pos,) = struct.unpack_from("<q", idx_bytes, (n - 1) * _IDX_ENTRY_SIZE + 16)
    return pos - 8


def _read_all(fd: int) -> bytes:
    size = os.fstat(fd).st_size
    parts = []
    at = 0
    while at < size:
        b = os.pread(fd, size - at, at)
        if not b:
            break
        parts.append(b)
        at += len(b)
    return b"".join(parts)


class SealedIndex:
    """The header and table of a ``.pix`` file: the per-partition summary of one segment."""

    __slots__ = ("data_size", "first", "last", "last_at", "path", "rows")

    def __init__(
        self,
        path: Path,
        data_size: int,
        first: bytes,
        last_at: int,
        last: bytes,
        rows: dict[int, Row],
    ) -> None:
        self.path = path
        self.data_size = data_size
        self.first = first
        self.last_at = last_at
        self.last = last
        self.rows = rows

    def check_segment(self, data_fd: int, data_size: int) -> None:
        """SealedIndexError unless this describes the segment open at ``data_fd`` (of
        ``data_size`` bytes): the same size and the same first and last frame headers."""
        if data_size != self.data_size:
            raise SealedIndexError(
                f"{self.path}: describes {self.data_size} bytes, the segment has {data_size}"
            )
        if (self.first, self.last) != frame_heads(data_fd, data_size, self.last_at):
            raise SealedIndexError(f"{self.path}: describes another segment's frames")

    def read_run(self, uid: int):
        """The partition's entries (a numpy record array, RUN_ENTRY fields), CRC-checked."""
        row = self.rows.get(uid)
        if row is None:
            return _np().empty(0, dtype=run_dtype())
        return read_run(self.path, row.at, row.count, row.crc)

    def entries_bytes(self) -> int:
        return sum(r.count for r in self.rows.values()) * RUN_ENTRY.size


def read_run(path: Path, at: int, count: int, crc: int):
    """``count`` entries at ``at`` of a ``.pix`` file, checked against ``crc``; a numpy record
    array. SealedIndexError if they do not match (OSError if the file cannot be read)."""
    want = count * RUN_ENTRY.size
    fd = open_noatime(path, os.O_RDONLY)
    try:
        raw = os.pread(fd, want, at)
    finally:
        os.close(fd)
    if len(raw) != want or crc32c(raw) != crc:
        raise SealedIndexError(f"{path}: the run at {at} ({count} entries) fails its CRC")
    return _np().frombuffer(raw, dtype=run_dtype())


def parse(data: bytes | memoryview, path: Path) -> SealedIndex:
    """The header and table of a ``.pix`` file's first bytes (at least header and table)."""
    if len(data) < HEADER.size:
        raise SealedIndexError(f"{path}: cut short ({len(data)} bytes)")
    magic, version, _flags, size, first, last_at, last, nrows, crc = HEADER.unpack_from(data)
    if magic != MAGIC or version != VERSION:
        raise SealedIndexError(f"{path}: not a sealed index (magic {magic!r}, version {version})")
    end = HEADER.size + nrows * ROW.size
    if len(data) < end:
        raise SealedIndexError(f"{path}: table cut short")
    table = bytes(data[HEADER.size : end])
    if crc32c(table, crc32c(bytes(data[: HEADER.size - 4]))) != crc:
        raise SealedIndexError(f"{path}: header or table fails its CRC")
    rows = {}
    for fields in ROW.iter_unpack(table):
        r = Row(*fields)
        rows[r.uid] = r
    return SealedIndex(path, size, first, last_at, last, rows)


def load(path: Path) -> SealedIndex | None:
    """The header and table of ``path`` (one read, two if the table is large); None if there
    is no such file; SealedIndexError if it does not hold together."""
    try:
        fd = open_noatime(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        head = os.pread(fd, _FIRST_READ, 0)
        if len(head) >= HEADER.size:
            nrows = HEADER.unpack_from(head)[7]
            end = HEADER.size + nrows * ROW.size
            if end > len(head) and end < 1 << 31:
                head = os.pread(fd, end, 0)
    finally:
        os.close(fd)
    return parse(head, path)


def verify(path: Path, idx_entries: Sequence) -> list[str]:
    """What is wrong with the sealed index at ``path`` against the segment's entries (segment
    IndexEntry objects, as a scan of its frames gives them): every run's CRC and every entry
    (scrub). Empty if it holds."""
    try:
        si = load(path)
    except (SealedIndexError, OSError) as e:
        return [str(e)]
    if si is None:
        return []
    problems = []
    by_uid: dict[int, list] = {}
    for e in idx_entries:
        by_uid.setdefault(e.uid, []).append(e)
    if set(by_uid) != set(si.rows):
        problems.append(
            f"{path}: partitions {sorted(si.rows)} but the frames hold {sorted(by_uid)}"
        )
    for uid in si.rows:
        try:
            run = si.read_run(uid)
        except (SealedIndexError, OSError) as e:
            problems.append(str(e))
            continue
        want = by_uid.get(uid, [])
        got = [
            (int(r["base"]), int(r["delta"]), int(r["pos"]), int(r["size"]), int(r["maxts"]))
            for r in run
        ]
        exp = [
            (e.base_offset, e.last_offset_delta, e.position, e.size, e.max_timestamp) for e in want
        ]
        if got != exp:
            problems.append(f"{path}: partition {uid}'s entries differ from its frames")
        txn = sum(is_transactional_producer(e.producer_id) for e in want)
        if si.rows[uid].txn != txn:
            problems.append(
                f"{path}: partition {uid} has {txn} transactional chunk(s), its row says "
                f"{si.rows[uid].txn}"
            )
    return problems


def columns_of(run) -> Columns:
    """A run's entries (a numpy record array) as chunk-index columns."""
    np = _np()

    def col(values) -> array:
        a = array("q")
        a.frombytes(np.ascontiguousarray(values, dtype="<i8").tobytes())
        return a

    base = run["base"].astype(np.int64)
    return Columns(
        col(base),
        col(base + run["delta"]),
        col(run["pos"]),
        col(run["size"]),
        col(run["maxts"]),
    )


class PixRun:
    """One partition's run in a segment's sealed index, as the chunk index's source: read on
    demand (one read, CRC-checked). A run that fails its check, or a file that is gone, is
    rebuilt from the segment (``rebuild``: the segment's frames, as recovery reads them) and
    read again; if the segment's frames then disagree with what the summary in memory says,
    the read fails (OSError: the partition's reads answer a storage error)."""

    __slots__ = ("at", "count", "crc", "rebuild", "segment", "uid")

    def __init__(
        self, segment, uid: int, row: Row, rebuild: Callable[[object], SealedIndex] | None
    ) -> None:
        self.segment = segment
        self.uid = uid
        self.at = row.at
        self.count = row.count
        self.crc = row.crc
        self.rebuild = rebuild

    def entries(self):
        """The run's entries, all fields (a numpy record array)."""
        try:
            return read_run(self.segment.pix_path, self.at, self.count, self.crc)
        except (SealedIndexError, OSError) as e:
            if self.rebuild is None:
                raise OSError(f"sealed index of {self.segment}: {e}") from e
            log.error("%s: rebuilding it from its segment's frames", e)
            si = self.rebuild(self.segment)
        row = si.rows.get(self.uid)
        if row is None or row.count != self.count:
            raise OSError(
                f"{self.segment}: its frames hold {row.count if row else 0} chunks of partition "
                f"{self.uid}, its index said {self.count}"
            )
        self.at, self.crc = row.at, row.crc
        return read_run(self.segment.pix_path, self.at, self.count, self.crc)

    def load(self) -> Columns:
        return columns_of(self.entries())
