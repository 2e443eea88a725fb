"""The on-disk formats a co-located reader shares with storage: segment frames, index entries,
and the read slots (docs/architecture.md, "Co-located reads").

A reader on the broker's host reads segment files itself instead of asking Fetch. It needs three
things, all fixed-size and little-endian, so that neither side imports the other:

* a segment file's *frame*: an 8-byte header (partition uid, frame CRC) before each batch;
* a segment's ``.idx`` *entry*: one per frame, appended lazily (at the index checkpoint);
* a partition's *read slot*: a small file the broker rewrites in place (a shared mapping)
  whenever what a reader may read changes. Its fields are guarded by a sequence counter, odd
  while the broker writes (a seqlock): a reader copies the slot between two equal, even reads
  of the counter.

The slot's ``end_seq``/``end_pos`` is where the partition's last chunk below the high
watermark ends in its log. Every frame of the log before that point is whole (the log is
written in order and the high watermark follows durability, or a cluster's commit point), so a
reader may walk frames up to it without meeting a torn one.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

# Segment frames and index entries (storage/segment.py writes them).
FRAME = struct.Struct("<II")  # partition uid, CRC-32C of the uid and the batch's first 21 bytes
FRAME_SIZE = FRAME.size
# uid, base offset, last offset delta, batch position, batch size, max timestamp,
# producer id, producer epoch, base sequence
ENTRY = struct.Struct("<Iqiqiqqhi")
ENTRY_SIZE = ENTRY.size

# Read slots: <hot tier>/slots/<topic>/<partition>.slot, and <hot tier>/slots/identity.json
# (the broker's cluster id and node id: a reader checks it is reading its leader's files).
SLOTS_DIR = "slots"
IDENTITY_FILE = "identity.json"
SLOT_MAGIC = b"SLOT"
SLOT_VERSION = 1
_COUNTER = struct.Struct("<Q")
COUNTER_AT = 8
# magic, version, flags, counter, uid, partition, incarnation, high watermark, log start,
# hot start (first offset in the hot tier's segments), end_seq, end_pos, log name (32 bytes)
SLOT = struct.Struct("<4sHHQIiQqqqqq32s")
SLOT_SIZE = 128
# Where the range fields start (high watermark, log start, hot start, end_seq, end_pos: what
# each new high watermark rewrites) and their layout.
RANGE_AT = struct.calcsize("<4sHHQIiQ")
RANGE = struct.Struct("<qqqqq")
# Flags: what a reader must respect before reading anything.
READABLE = 1  # this broker leads the partition and the slot is current
DAMAGED = 2  # the partition has lost ranges (storage/damage.py): read them through Fetch


def segment_name(seq: int) -> str:
    """A segment's files are <name>.log and <name>.idx."""
    return f"{seq:020d}"


def slot_name(partition: int) -> str:
    return f"{partition}.slot"


@dataclass(frozen=True, slots=True)
class SlotState:
    flags: int
    uid: int
    partition: int
    incarnation: int  # the broker's storage open: a new one means cached positions are stale
    high_watermark: int
    log_start: int
    hot_start: int
    end_seq: int  # -1: no chunk below the high watermark in the hot tier
    end_pos: int
    log: str  # the partition's log directory, under the hot tier

    @property
    def readable(self) -> bool:
        return bool(self.flags & READABLE) and not self.flags & DAMAGED


def pack_slot(counter: int, s: SlotState) -> bytes:
    return SLOT.pack(
        SLOT_MAGIC,
        SLOT_VERSION,
        s.flags,
        counter,
        s.uid,
        s.partition,
        s.incarnation,
        s.high_watermark,
        s.log_start,
        s.hot_start,
        s.end_seq,
        s.end_pos,
        s.log.encode(),
    )


def counter_of(buf) -> int:
    return _COUNTER.unpack_from(buf, COUNTER_AT)[0]


def pack_counter(buf, counter: int) -> None:
    _COUNTER.pack_into(buf, COUNTER_AT, counter)


def unpack_slot(raw: bytes) -> SlotState:
    (magic, version, flags, _counter, uid, partition, inc, hwm, start, hot, seq, pos, name) = (
        SLOT.unpack_from(raw)
    )
    if magic != SLOT_MAGIC or version != SLOT_VERSION:
        raise ValueError(f"not a version {SLOT_VERSION} read slot (magic {magic!r}, {version})")
    return SlotState(
        flags, uid, partition, inc, hwm, start, hot, seq, pos, name.rstrip(b"\0").decode()
    )
