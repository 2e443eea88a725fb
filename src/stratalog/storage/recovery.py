"""Recovery of one log at start: trust the index up to the checkpoint, scan the rest.

The segment index files are written lazily, so after a crash they may lag the data. The log's
checkpoint names a (segment, position) below which index entries are known complete and durable.
From there the scan walks frames, checking the frame CRC (partition uid and the batch fields the
batch CRC does not cover), the batch CRC, that the batch fits in the file, and that each
partition's offsets continue densely. The first frame that fails ends the log: the segment is
truncated there and any later segment is deleted, since nothing past a tear was acknowledged.
"""

from __future__ import annotations

import logging
import os
import struct
from collections.abc import MutableMapping
from dataclasses import dataclass, field
from pathlib import Path

from stratalog.storage.batch import CorruptBatchError, validate_batch
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


def read_checkpoint(directory: Path) -> tuple[int, int] | None:
    try:
        text = (directory / CHECKPOINT).read_text().split()
        return int(text[0]), int(text[1])
    except (FileNotFoundError, IndexError, ValueError):
        return None


def write_checkpoint(directory: Path, seq: int, position: int) -> None:
    tmp = directory / (CHECKPOINT + ".tmp")
    with open(tmp, "w") as f:
        f.write(f"{seq} {position}\n")
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
    buf: bytes | memoryview, at: int, position: int, expected: MutableMapping[int, int]
) -> IndexEntry | None:
    """The index entry of the whole frame at ``buf[at:]``, which lies at ``position`` of its
    segment, if its batch is valid and continues its partition's offsets in ``expected``
    (partition uid -> next offset, updated); else None. Call after ``frame_size`` accepted it."""
    (uid,) = _UID.unpack_from(buf, at)
    batch_at = at + FRAME_SIZE
    batch_len = int.from_bytes(buf[batch_at + 8 : batch_at + 12], "big", signed=True)
    try:
        h = validate_batch(memoryview(buf)[batch_at : batch_at + batch_len + 12])
    except CorruptBatchError:
        return None
    want = expected.get(uid)
    if want is not None and h.base_offset != want:
        return None
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


def scan(segment: Segment, start: int, expected: dict[int, int]) -> tuple[list[IndexEntry], int]:
    """Walk frames from ``start``; return the valid entries and where validity ends.

    ``expected`` maps partition uid -> next offset and is updated as frames are accepted.
    """
    entries: list[IndexEntry] = []
    pos = start
    size = segment.size
    buf = b""
    buf_at = pos
    while pos < size:
        # Make sure the buffer holds the frame header and batch header, then the whole batch.
        if pos + FRAME_HEAD > size:
            break
        if pos + FRAME_HEAD > buf_at + len(buf):
            buf = segment.read(pos, max(_SCAN_CHUNK, FRAME_HEAD))
            buf_at = pos
        rel = pos - buf_at
        total = frame_size(buf, rel)
        if total < 0 or pos + total > size:
            break
        if rel + total > len(buf):
            buf = segment.read(pos, max(_SCAN_CHUNK, total))
            buf_at = pos
            rel = 0
        e = frame_entry(buf, rel, pos, expected)
        if e is None:
            break
        entries.append(e)
        pos += total
    return entries, pos


def _chain(entries: list[IndexEntry], size: int, expected: dict[int, int]) -> list[IndexEntry]:
    """The longest prefix of ``entries`` that describes contiguous frames from position 0.

    An index file written lazily can end in garbage after a crash (zeros, a torn entry); only
    entries that tile the segment from its start, fit in the file and continue each partition's
    offsets are believed. ``expected`` is updated for the entries returned.
    """
    out: list[IndexEntry] = []
    at = 0
    seen = dict(expected)
    for e in entries:
        if e.position != at + FRAME_SIZE or e.size < 61 or e.last_offset_delta < 0:
            break
        end = e.position + e.size
        if end > size:
            break
        want = seen.get(e.uid)
        if want is not None and e.base_offset != want:
            break
        seen[e.uid] = e.last_offset + 1
        out.append(e)
        at = end
    for e in out:
        expected[e.uid] = e.last_offset + 1
    return out


def _direct_padding(seg: Segment, end: int) -> bool:
    """Whether the bytes past ``end`` are the zero padding of an O_DIRECT append: less than a
    block of zeros that ends the file at a block boundary (storage.direct_io)."""
    if seg.size % BLOCK or seg.size - end >= BLOCK:
        return False
    return not any(seg.read(end, seg.size - end))


def recover_log(
    directory: Path, seqs: list[int], elsewhere: dict[int, Path] | None = None
) -> tuple[list[Segment], dict[int, list[IndexEntry]], RecoveryReport]:
    """Open the segments of one log, repairing a torn tail; return segments and their entries.

    ``elsewhere`` maps segments that live outside ``directory`` (spilled to the cold tier's
    directory while the hot tier was full) to their directory.
    """
    elsewhere = elsewhere or {}
    report = RecoveryReport()
    marker = directory / CLEAN_SHUTDOWN
    ckpt = read_checkpoint(directory)
    ck_seq, ck_pos = ckpt if ckpt else (-1, 0)
    opened = [Segment(elsewhere.get(s, directory), s) for s in seqs]
    indexes = {seg.seq: seg.read_index() for seg in opened}

    if marker.exists():
        # Trust the index, but only if it accounts for every byte of every segment.
        expected: dict[int, int] = {}
        entries_by_seq = {}
        ok = True
        for seg in opened:
            chain = _chain(indexes[seg.seq], seg.size, expected)
            end = _frame_end(chain[-1]) if chain else 0
            ok &= len(chain) == len(indexes[seg.seq]) and end == seg.size
            entries_by_seq[seg.seq] = chain
        marker.unlink()
        fsync_dir(directory)
        if ok:
            report.clean = True
            return opened, entries_by_seq, report
        log.warning("%s: clean-shutdown marker but the index disagrees; scanning", directory)

    segments: list[Segment] = []
    entries_by_seq = {}
    expected = {}
    torn = False
    for seg in opened:
        s = seg.seq
        if torn:
            report.deleted_segments.append(s)
            seg.delete(background=False)  # its name may be taken again by the next roll
            continue
        segments.append(seg)
        indexed = indexes[s]
        # Entries below the checkpoint are known complete; past it, the scan redoes them.
        limit = seg.size if s < ck_seq else (ck_pos if s == ck_seq else 0)
        trusted = _chain(indexed, min(limit, seg.size), expected)
        start = _frame_end(trusted[-1]) if trusted else 0
        if start == seg.size and len(trusted) == len(indexed):
            entries_by_seq[s] = trusted
            continue
        scanned, end = scan(seg, start, expected)
        report.scanned_bytes += end - start
        report.scanned_frames += len(scanned)
        if end < seg.size and _direct_padding(seg, end):
            seg.truncate(end)  # the zeros of an O_DIRECT write's last block, not a tear
        if end < seg.size:
            log.warning(
                "%s: segment %d torn at %d of %d bytes: truncating", directory, s, end, seg.size
            )
            report.truncated_bytes += seg.size - end
            seg.truncate(end)
            torn = True
        all_entries = trusted + scanned
        if all_entries != indexed:
            seg.rewrite_index(all_entries)
        entries_by_seq[s] = all_entries
    return segments, entries_by_seq, report
