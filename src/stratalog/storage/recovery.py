"""Recovery of one log at start: trust the index up to the checkpoint, scan the rest.

The segment index files are written lazily, so after a crash they may lag the data. The log's
checkpoint names a (segment, position) below which index entries are known complete and durable.
From there the scan walks frames, checking the frame CRC (partition uid and the batch fields the
batch CRC does not cover), the batch CRC, that the batch fits in the file, and that each
partition's offsets continue densely.

A frame that fails is either a torn tail (a write a crash interrupted: nothing valid follows it
in the log) or damage (a flipped bit, a lost sector: a valid frame follows). A torn tail is cut
as always: the segment is truncated there and later segments are deleted, since nothing past it
was acknowledged. Damage is stepped over: the scan looks for the next position where a frame's
header and both CRCs hold, records the bytes in between as a damaged range (damage.py) with the
offsets each partition lost there when they can be told, and goes on; every later chunk of every
partition is kept. Past damage a partition's offsets may jump (the jump is what it lost), but
never go back.
"""

from __future__ import annotations

import logging
import os
import struct
from collections.abc import MutableMapping
from dataclasses import dataclass, field
from pathlib import Path

from crc32c import crc32c

from stratalog.storage import sealed_index
from stratalog.storage.batch import CorruptBatchError, validate_batch
from stratalog.storage.damage import DamagedRange
from stratalog.storage.sealed_index import SealedIndex, SealedIndexError
from stratalog.storage.segment import (
    BLOCK,
    FRAME,
    FRAME_SIZE,
    IndexEntry,
    Segment,
    frame_crc,
    fsync_dir,
)

log = logging.getLogger(__name__)

CHECKPOINT = "checkpoint"
CLEAN_SHUTDOWN = ".clean-shutdown"
_SCAN_CHUNK = 8 * 1024 * 1024
_UID = struct.Struct("<I")


@dataclass
class RecoveryReport:
    scanned_bytes: int = 0
    scanned_frames: int = 0
    truncated_bytes: int = 0
    deleted_segments: list[int] = field(default_factory=list)
    clean: bool = False
    # Ranges met at this start that hold no valid frame but are followed by valid ones: new
    # ones, and recorded ones met again by a rescan (with what they lost).
    damaged: list[DamagedRange] = field(default_factory=list)
    verified: bool = False  # every frame's CRCs were checked (storage.verify_on_open)


def _checkpoint_crc(seq: int, position: int) -> int:
    return crc32c(f"{seq} {position}".encode())


def parse_checkpoint(raw: bytes) -> tuple[int, int]:
    """(seq, position) of a checkpoint file's bytes; ValueError if they do not hold one. Old
    files have no CRC and are taken as they are."""
    if not raw.endswith(b"\n"):
        raise ValueError("cut short")  # every checkpoint ever written ends its line
    fields = raw.decode("ascii").split()
    if len(fields) not in (2, 3):
        raise ValueError(f"{len(fields)} fields")
    seq, position = int(fields[0]), int(fields[1])
    if len(fields) == 3 and fields[2] != f"{_checkpoint_crc(seq, position):08x}":
        raise ValueError("CRC mismatch")
    if seq < 0 or position < 0:
        raise ValueError("negative position")
    return seq, position


def read_checkpoint(directory: Path) -> tuple[int, int] | None:
    """The checkpoint, or None if there is none or it is damaged (the scan then starts at the
    first segment: slower, nothing lost)."""
    try:
        return parse_checkpoint((directory / CHECKPOINT).read_bytes())
    except FileNotFoundError:
        return None
    except (ValueError, UnicodeDecodeError) as e:
        log.warning("%s: checkpoint unreadable (%s): scanning every segment", directory, e)
        return None


def write_checkpoint(directory: Path, seq: int, position: int) -> None:
    tmp = directory / (CHECKPOINT + ".tmp")
    with open(tmp, "w") as f:
        f.write(f"{seq} {position} {_checkpoint_crc(seq, position):08x}\n")
        f.flush()
        os.fdatasync(f.fileno())
    os.replace(tmp, directory / CHECKPOINT)


def _frame_end(e: IndexEntry) -> int:
    return e.position + e.size


# The frame header plus the batch header: what must be read before a frame's size is known.
FRAME_HEAD = FRAME_SIZE + 61


def frame_size(buf: bytes | memoryview, at: int) -> int:
    """Size (frame header and batch) of the frame at ``buf[at:]`` if its frame CRC holds and its
    batch length is plausible, else -1. ``buf`` must hold ``FRAME_SIZE + 21`` bytes from ``at``."""
    uid, crc = FRAME.unpack_from(buf, at)
    batch_at = at + FRAME_SIZE
    if frame_crc(uid, buf[batch_at : batch_at + 21]) != crc:
        return -1
    batch_len = int.from_bytes(buf[batch_at + 8 : batch_at + 12], "big", signed=True)
    if batch_len < 49:
        return -1
    return FRAME_SIZE + batch_len + 12


def frame_entry(
    buf: bytes | memoryview,
    at: int,
    position: int,
    expected: MutableMapping[int, int],
    gaps: dict[int, tuple[int, int]] | None = None,
) -> IndexEntry | None:
    """The index entry of the whole frame at ``buf[at:]``, which lies at ``position`` of its
    segment, if its batch is valid and continues its partition's offsets in ``expected``
    (partition uid -> next offset, updated); else None. Call after ``frame_size`` accepted it.
    With ``gaps`` (past damage) a partition's offsets may jump forward: the offsets skipped
    are added to it (uid -> (first, last))."""
    (uid,) = _UID.unpack_from(buf, at)
    batch_at = at + FRAME_SIZE
    batch_len = int.from_bytes(buf[batch_at + 8 : batch_at + 12], "big", signed=True)
    try:
        h = validate_batch(memoryview(buf)[batch_at : batch_at + batch_len + 12])
    except CorruptBatchError:
        return None
    want = expected.get(uid)
    if want is not None and h.base_offset != want:
        if gaps is None or h.base_offset < want:
            return None
        gaps[uid] = (want, h.base_offset - 1)
    expected[uid] = h.last_offset + 1
    return IndexEntry(
        uid,
        h.base_offset,
        h.last_offset_delta,
        position + FRAME_SIZE,
        h.size,
        h.max_timestamp,
        h.producer_id,
        h.producer_epoch,
        h.base_sequence,
    )


def parse_frames(
    data: bytes | memoryview, position: int, expected: MutableMapping[int, int]
) -> tuple[list[IndexEntry], int]:
    """Walk the frames of ``data``, which starts at ``position`` of a segment, as ``scan`` walks
    a file: return the valid entries and how many bytes of ``data`` they cover (the first bad or
    incomplete frame ends them). ``expected`` as for ``scan``."""
    entries: list[IndexEntry] = []
    at = 0
    n = len(data)
    while at + FRAME_HEAD <= n:
        total = frame_size(data, at)
        if total < 0 or at + total > n:
            break
        e = frame_entry(data, at, position + at, expected)
        if e is None:
            break
        entries.append(e)
        at += total
    return entries, at


class _Damage:
    """What a log's scan has met of damage so far: the ranges, and the offsets partitions
    skipped past them (attributed to the range met last before the frame that showed the
    skip)."""

    def __init__(self, holes: dict[int, dict[int, int]]) -> None:
        self.holes = holes  # recorded ranges: seq -> start -> end
        self.ranges: list[DamagedRange] = []
        # Offsets partitions skipped, not attributed yet. A valid frame whose offsets jump
        # forward is kept: the frames in between are what is missing, not this one.
        self.gaps: dict[int, tuple[int, int]] = {}
        # Each range's partitions' next offsets when it was met (to check index hints).
        self.expected_at: list[dict[int, int]] = []

    def met(self, r: DamagedRange, expected: dict[int, int]) -> None:
        self.ranges.append(r)
        self.expected_at.append(dict(expected))

    def settle(self) -> None:
        if self.gaps:
            if self.ranges:  # else the gap lies across a range recorded before: known
                self.ranges[-1].lost.update(self.gaps)
            self.gaps.clear()

    def hint(self, indexed: dict[int, list[IndexEntry]]) -> None:
        """Partitions whose lost frames were their last (no later frame shows a jump): an
        index entry that points into the range names them, if it continues the partition's
        offsets as they stood when the range was met."""
        for r, exp in zip(self.ranges, self.expected_at, strict=True):
            for e in indexed.get(r.seq, []):
                at = e.position - FRAME_SIZE
                if not r.start <= at < r.end or e.last_offset_delta < 0:
                    continue
                got = r.lost.get(e.uid)
                if got is None and exp.get(e.uid, e.base_offset) == e.base_offset:
                    r.lost[e.uid] = (e.base_offset, e.last_offset)
                elif got is not None and got[1] + 1 == e.base_offset:
                    r.lost[e.uid] = (got[0], e.last_offset)


def _valid_frame_at(
    segment: Segment, pos: int, size: int, expected: dict[int, int]
) -> tuple[IndexEntry, int] | None:
    """The entry and size of a valid frame at ``pos`` (offsets may jump, never go back)."""
    if pos + FRAME_HEAD > size:
        return None
    head = segment.read(pos, FRAME_HEAD)
    if len(head) < FRAME_HEAD:
        return None
    total = frame_size(head, 0)
    if total < 0 or pos + total > size:
        return None
    buf = segment.read(pos, total)
    if len(buf) < total:
        return None
    trial = dict(expected)
    return (e, total) if (e := frame_entry(buf, 0, pos, trial, {})) is not None else None


def next_valid(segment: Segment, pos: int, expected: dict[int, int]) -> int | None:
    """The first position at or after ``pos`` where a valid frame starts (its frame header and
    both CRCs hold, its offsets do not go back), or None. Candidates are the positions whose
    batch magic byte is 2, so the search reads the segment once and checks few of them."""
    size = segment.size
    magic_at = FRAME_SIZE + 16  # a frame's batch magic, from the frame's start
    window = _SCAN_CHUNK
    at = pos
    while at + FRAME_HEAD <= size:
        buf = segment.read(at, min(window, size - at))
        if len(buf) < FRAME_HEAD:
            return None
        q = buf.find(b"\x02", magic_at)
        last = len(buf) - FRAME_HEAD + magic_at  # candidates whose head is in this buffer
        while 0 <= q <= last:
            cand = at + q - magic_at
            if _valid_frame_at(segment, cand, size, expected) is not None:
                return cand
            q = buf.find(b"\x02", q + 1)
        at += len(buf) - FRAME_HEAD + 1
    return None


def scan(
    segment: Segment,
    start: int,
    expected: dict[int, int],
    damage: _Damage | None = None,
) -> tuple[list[IndexEntry], int]:
    """Walk frames from ``start``; return the valid entries and where validity ends.

    ``expected`` maps partition uid -> next offset and is updated as frames are accepted.
    With ``damage``, a frame that fails but is followed by a valid frame in this segment is
    stepped over (recorded there); without it, the first frame that fails ends the scan.
    """
    entries: list[IndexEntry] = []
    pos = start
    size = segment.size
    buf = b""
    buf_at = pos
    holes = damage.holes.get(segment.seq, {}) if damage is not None else {}
    while pos < size:
        e = None
        total = -1
        # Make sure the buffer holds the frame header and batch header, then the whole batch.
        if pos + FRAME_HEAD <= size:
            if pos + FRAME_HEAD > buf_at + len(buf):
                buf = segment.read(pos, max(_SCAN_CHUNK, FRAME_HEAD))
                buf_at = pos
            rel = pos - buf_at
            total = frame_size(buf, rel)
            if total >= 0 and pos + total <= size:
                if rel + total > len(buf):
                    buf = segment.read(pos, max(_SCAN_CHUNK, total))
                    buf_at = pos
                    rel = 0
                e = frame_entry(buf, rel, pos, expected, damage.gaps if damage else None)
        if e is not None:
            entries.append(e)
            if damage is not None and damage.gaps:
                if not damage.ranges:
                    # Offsets jump with no damage met in this scan: frames went missing before
                    # this one (a segment cut short at a frame boundary, say).
                    damage.met(DamagedRange(segment.seq, pos, pos), expected)
                damage.settle()
            pos += total
            continue
        if damage is None:
            break
        end = holes.get(pos)
        if end is not None and end > pos:
            # Damage recorded at an earlier start, met again: step over it as recorded.
            damage.met(DamagedRange(segment.seq, pos, min(end, size)), expected)
            pos = min(end, size)
            continue
        nxt = next_valid(segment, pos + 1, expected)
        if nxt is None:
            break  # nothing valid follows in this segment: the caller decides (tear or not)
        r = DamagedRange(segment.seq, pos, nxt)
        log.error(
            "%s: damaged bytes at %d..%d of segment %d: stepping over them to the next valid frame",
            segment.directory,
            pos,
            nxt,
            segment.seq,
        )
        damage.met(r, expected)
        pos = nxt
    if damage is not None and pos >= size and holes.get(pos, -1) > pos:
        # A range recorded past the file's end (it was cut short): offsets jump past it.
        damage.met(DamagedRange(segment.seq, pos, holes[pos]), expected)
    return entries, pos


def _chain(
    entries: list[IndexEntry],
    size: int,
    expected: dict[int, int],
    holes: dict[int, int] | None = None,
    relaxed: bool = False,
) -> tuple[list[IndexEntry], int]:
    """The longest prefix of ``entries`` that describes contiguous frames from position 0, and
    where the bytes it accounts for end.

    An index file written lazily can end in garbage after a crash (zeros, a torn entry); only
    entries that tile the segment from its start (jumping only over recorded damaged ranges,
    ``holes``: start -> end), fit in the file and continue each partition's offsets are
    believed (past a hole, or with ``relaxed``: past one in an earlier segment, they may jump
    forward). ``expected`` is updated for the entries returned.
    """
    holes = holes or {}
    out: list[IndexEntry] = []
    at = 0
    seen = dict(expected)
    for e in entries:
        if holes.get(at) == e.position - FRAME_SIZE:
            at = e.position - FRAME_SIZE  # over a recorded range (or to a recorded jump)
            relaxed = True
        if e.position != at + FRAME_SIZE or e.size < 61 or e.last_offset_delta < 0:
            break
        end = e.position + e.size
        if end > size:
            break
        want = seen.get(e.uid)
        if want is not None and e.base_offset != want and not (relaxed and e.base_offset > want):
            break
        seen[e.uid] = e.last_offset + 1
        out.append(e)
        at = end
    if holes.get(at, -1) >= size:
        at = size  # a recorded range runs to the end of the segment
    for e in out:
        expected[e.uid] = e.last_offset + 1
    return out, at


def indexed_end(entries: list[IndexEntry], end: int, size: int) -> int:
    """Where a segment's index says its frames go on to past ``size`` (its length on disk),
    given that its valid frames end at ``end``: the chain of entries from the one starting at
    ``end``, each starting where the previous one ends; ``size`` if it does not pass it. A
    segment whose index goes on was cut short (a sealed segment's index is synced after its
    data); a damaged entry points elsewhere and starts no such chain."""
    ends = {e.position - FRAME_SIZE: _frame_end(e) for e in entries if e.size >= 61}
    at = end
    while at in ends:
        at = ends[at]
    return max(at, size)


def _direct_padding(seg: Segment, end: int) -> bool:
    """Whether the bytes past ``end`` are the zero padding of an O_DIRECT append: less than a
    block of zeros that ends the file at a block boundary (storage.direct_io)."""
    if seg.size % BLOCK or seg.size - end >= BLOCK:
        return False
    return not any(seg.read(end, seg.size - end))


def _table_follows(si: SealedIndex, expected: dict[int, int], relaxed: bool) -> bool:
    """Whether each partition's chunks in a sealed index continue its offsets in ``expected``
    (past damage, with ``relaxed``, they may jump forward); if so ``expected`` moves on."""
    for uid, row in si.rows.items():
        want = expected.get(uid)
        if want is not None and row.first != want and not (relaxed and row.first > want):
            return False
    for uid, row in si.rows.items():
        expected[uid] = row.last + 1
    return True


def _load_sealed(seg: Segment) -> SealedIndex | None:
    """A sealed segment's sealed index if it holds together and describes it; else None (it is
    rebuilt from the segment's entries)."""
    try:
        si = sealed_index.load(seg.pix_path)
        if si is not None:
            si.check_segment(seg.fd, seg.size)
        return si
    except (SealedIndexError, OSError) as e:
        log.warning("%s: rebuilding it", e)
        return None


def pack_entries(entries: list[IndexEntry]) -> bytes:
    return b"".join(e.pack() for e in entries)


def write_sealed(seg: Segment, entries: list[IndexEntry]) -> SealedIndex | None:
    """Write a sealed segment's sealed index from its entries; None if it cannot be written
    (the segment's chunks then stay in memory; the next start tries again)."""
    try:
        return sealed_index.write_from_entries(
            seg.fd, seg.size, pack_entries(entries), seg.pix_path
        )
    except OSError as e:
        log.warning("%s: cannot write its sealed index: %s", seg, e)
        return None


def recover_log(
    directory: Path,
    seqs: list[int],
    elsewhere: dict[int, Path] | None = None,
    *,
    holes: dict[int, dict[int, int]] | None = None,
    verify: bool = False,
    sealed: bool = False,
) -> tuple[list[Segment], dict[int, list[IndexEntry] | SealedIndex], RecoveryReport]:
    """Open the segments of one log, repairing a torn tail and stepping over damage; return
    segments and their entries (the report lists the damaged ranges met).

    ``elsewhere`` maps segments that live outside ``directory`` (spilled to the cold tier's
    directory while the hot tier was full) to their directory. ``holes`` are the damaged
    ranges recorded at earlier starts (seq -> start -> end). ``verify`` checks every frame's
    CRCs, trusting neither the checkpoint nor a clean-shutdown marker (and rebuilds index
    entries that disagree with their frames).

    With ``sealed``, a sealed segment (every one but the last) is given as its sealed index
    (sealed_index.py) instead of its entries: where one holds together and describes the
    segment, and the segment is trusted (below the checkpoint, or all after a clean stop), its
    ``.idx`` is not read at all; where one is missing or wrong it is written from the
    entries. The last segment (the active one) never keeps one.
    """
    elsewhere = elsewhere or {}
    holes = holes or {}
    report = RecoveryReport(verified=verify)
    marker = directory / CLEAN_SHUTDOWN
    ckpt = None if verify else read_checkpoint(directory)
    ck_seq, ck_pos = ckpt if ckpt else (-1, 0)
    opened = [Segment(elsewhere.get(s, directory), s) for s in seqs]
    indexes: dict[int, list[IndexEntry]] = {}

    def index_of(seg: Segment) -> list[IndexEntry]:
        got = indexes.get(seg.seq)
        if got is None:
            got = indexes[seg.seq] = seg.read_index()
        return got

    pix: dict[int, SealedIndex] = {}
    if sealed and not verify:
        for seg in opened[:-1]:
            si = _load_sealed(seg)
            if si is not None:
                pix[seg.seq] = si

    def finish(
        segments: list[Segment], entries_by_seq: dict
    ) -> tuple[list[Segment], dict, RecoveryReport]:
        if segments:
            last = segments[-1]
            last.pix_path.unlink(missing_ok=True)  # active: written at its seal
            if isinstance(entries_by_seq.get(last.seq), SealedIndex):
                # (Never loaded for the last segment; the active one's entries stay in memory.)
                entries_by_seq[last.seq] = index_of(last)
        if sealed:
            for seg in segments[:-1]:
                got = entries_by_seq.get(seg.seq)
                if isinstance(got, list):
                    si = write_sealed(seg, got)
                    if si is not None:
                        entries_by_seq[seg.seq] = si
        return segments, entries_by_seq, report

    if marker.exists():
        ok = not verify
        entries_by_seq: dict[int, list[IndexEntry] | SealedIndex] = {}
        if ok:
            # Trust the index, but only if it accounts for every byte of every segment.
            expected: dict[int, int] = {}
            for seg in opened:
                past = any(h <= seg.seq for h in holes)
                si = pix.get(seg.seq)
                if si is not None:
                    ok &= _table_follows(si, expected, past)
                    entries_by_seq[seg.seq] = si
                    continue
                indexed = index_of(seg)
                chain, end = _chain(indexed, seg.size, expected, holes.get(seg.seq), past)
                ok &= len(chain) == len(indexed) and end == seg.size
                entries_by_seq[seg.seq] = chain
        marker.unlink()
        fsync_dir(directory)
        if ok:
            report.clean = True
            return finish(opened, entries_by_seq)
        if not verify:
            log.warning("%s: clean-shutdown marker but the index disagrees; scanning", directory)

    segments: list[Segment] = []
    entries_by_seq = {}
    expected = {}
    damage = _Damage(holes)
    torn = False
    present = {seg.seq for seg in opened}
    gone = sorted(h for h in holes if h not in present)
    for k, seg in enumerate(opened):
        s = seg.seq
        while gone and gone[0] < s and not torn:
            # Ranges of a segment deleted since (nothing in it lived on): offsets jump past it.
            g = gone.pop(0)
            for a, b in sorted(holes[g].items()):
                damage.met(DamagedRange(g, a, b), expected)
        if torn:
            report.deleted_segments.append(s)
            seg.delete(background=False)  # its name may be taken again by the next roll
            continue
        segments.append(seg)
        past = any(h < s for h in holes)  # offsets may jump past a range recorded earlier
        si = pix.get(s)
        if si is not None and s < ck_seq and _table_follows(si, expected, past or s in holes):
            # Below the checkpoint its entries are trusted, and its sealed index holds them.
            # (Past it the scan redoes them as for any segment: it is also where damage is
            # found after a crash, tests/test_recovery.py.)
            for a, b in sorted(holes.get(s, {}).items()):
                damage.met(DamagedRange(s, a, b), expected)  # in the trusted part: passed
            entries_by_seq[s] = si
            continue
        indexed = index_of(seg)
        # Entries below the checkpoint are known complete; past it, the scan redoes them.
        limit = seg.size if s < ck_seq else (ck_pos if s == ck_seq else 0)
        trusted, start = _chain(indexed, min(limit, seg.size), expected, holes.get(s), past)
        for a, b in sorted(holes.get(s, {}).items()):
            if b <= start or (a < start and b >= seg.size):
                damage.met(DamagedRange(s, a, b), expected)  # in the trusted part: passed
        if start == seg.size and len(trusted) == len(indexed):
            entries_by_seq[s] = trusted
            continue
        scanned, end = scan(seg, start, expected, damage)
        report.scanned_bytes += end - start
        report.scanned_frames += len(scanned)
        if end < seg.size and _direct_padding(seg, end):
            seg.truncate(end)  # the zeros of an O_DIRECT write's last block, not a tear
        # A sealed segment's index was synced with it: entries past its end mean it lost them.
        cut_short = indexed_end(indexed, end, seg.size) > seg.size
        if (end < seg.size or cut_short) and any(
            next_valid(later, 0, expected) is not None for later in opened[k + 1 :]
        ):
            # Valid frames follow in a later segment: damage to the end of this one, not a
            # tear (a crash leaves the log's end torn, never its middle).
            stop = indexed_end(indexed, end, seg.size)
            log.error(
                "%s: damaged bytes at %d..%d of segment %d (its end, %d B on disk): stepping "
                "over them",
                directory,
                end,
                stop,
                s,
                seg.size,
            )
            damage.met(DamagedRange(s, end, stop), expected)
        elif end < seg.size:
            log.warning(
                "%s: segment %d torn at %d of %d bytes: truncating", directory, s, end, seg.size
            )
            report.truncated_bytes += seg.size - end
            seg.truncate(end)
            torn = True
        all_entries = trusted + scanned
        if all_entries != indexed:
            seg.rewrite_index(all_entries)
            pix.pop(s, None)
            seg.pix_path.unlink(missing_ok=True)
        entries_by_seq[s] = all_entries
    damage.settle()
    kept = {seg.seq: seg for seg in segments}
    damage.hint(
        {
            r.seq: indexes[r.seq] if r.seq in indexes else index_of(kept[r.seq])
            for r in damage.ranges
            if r.seq in kept or r.seq in indexes
        }
    )
    report.damaged = damage.ranges
    for r in damage.ranges:
        log.error("%s: damaged range: %s", directory, r.describe())
    return finish(segments, entries_by_seq)
