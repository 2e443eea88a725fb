"""Co-located reads: a reader on the broker's host reads the partition's segment files itself
(KafkaDirect's and KerA's idea: the broker's CPU is not in the read path). docs/architecture.md,
"Co-located reads".

The leader says where its files are (DescribeLogDirs: its hot tier's directory); the reader
checks that directory's ``slots/identity.json`` names the same cluster and node, then maps the
partition's read slot (``slots/<topic>/<partition>.slot``, colocated_format.py) read-only. The
slot gives the high watermark, the log start, the first offset still in the hot tier, the
partition's log and where its last chunk below the high watermark ends in that log.

The reader finds the partition's batches in the log's segments from their ``.idx`` entries
(written lazily by the broker) and, past the last entry, by walking the frames up to that end:
every frame before it is whole. It keeps what it learned (base, last offset, position, size
per batch) and reads batches with ``preadv``, straight into one buffer, the 8-byte frame
header between two of its batches going into a scratch buffer, so the result is a run of
batches like a Fetch answer's records. Each batch read is checked against what the index said
(base offset, length): a segment deleted or cut meanwhile (retention, the reaper) shows as a
mismatch or a short read, and the caller falls back to Fetch.

What is not in the slot's range (the cold tier, offsets past a stale slot, a partition led
elsewhere, a damaged one) is not read here: ``read`` answers None and the caller fetches.
Segment files are read with ``pread`` rather than mapped: the reaper cuts a deleted segment
down in steps, and a mapped page past the new end would kill the reader with SIGBUS.
"""

from __future__ import annotations

import json
import mmap
import os
import struct
from array import array
from bisect import bisect_left
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from stratalog.client.wire import WireClient
from stratalog.colocated_format import (
    COUNTER_AT,
    ENTRY,
    ENTRY_SIZE,
    FRAME,
    FRAME_SIZE,
    IDENTITY_FILE,
    SLOT,
    SLOT_SIZE,
    SLOTS_DIR,
    SlotState,
    segment_name,
    slot_name,
    unpack_slot,
)

_BATCH_HEAD = struct.Struct(">qi")  # base offset, batch length (after these 12 bytes)
_LAST_DELTA = struct.Struct(">i")  # at byte 23 of a batch
_HEAD = FRAME_SIZE + 27  # a frame header and a batch's first 27 bytes: uid, base, size, last
_MIN_LENGTH = 49  # a batch's length field: its header after the first 12 bytes, at least
_SCAN_BLOCK = 1 << 20
_IOV_MAX = 1024
_COUNTER = struct.Struct("<Q")


@dataclass(frozen=True, slots=True)
class ColocatedRead:
    records: memoryview  # whole batches, as a Fetch answer's records; valid until the next read
    high_watermark: int
    log_start_offset: int
    next_offset: int


class _Segment:
    """What the reader knows of one segment: its batches of this partition, in offset order."""

    __slots__ = ("base", "fd", "idx_read", "last", "pos", "scanned", "size", "whole")

    def __init__(self) -> None:
        self.base = array("q")
        self.last = array("q")
        self.pos = array("q")
        self.size = array("q")
        self.idx_read = 0  # bytes of .idx taken
        self.scanned = 0  # the position up to which every frame is known
        self.whole = False  # a segment before the slot's end: known to its end
        self.fd = -1


class ColocatedPartition:
    """One partition of a broker on this host, read from its files."""

    def __init__(self, root: Path, topic: str, partition: int, read_ahead: bool = False) -> None:
        """``read_ahead``: after each read, read the next range on a thread of its own while
        the caller decodes this one (``preadv`` lets go of the GIL)."""
        self.root = root
        self.topic = topic
        self.partition = partition
        self._path = root / SLOTS_DIR / topic / slot_name(partition)
        self._slot, self._inode = _map_slot(self._path)  # PermissionError: not this user
        self._key: tuple[int, int, str] | None = None  # (incarnation, uid, log)
        self._segments: dict[int, _Segment] = {}
        self._starts = (-1, -1)  # (log start, hot start) when gone segments were last looked for
        # Two buffers: a read fills the one the caller is not holding (the read ahead's).
        self._buffers = [bytearray(), bytearray()]
        self._out = 0  # the buffer the last read handed out
        self._scratch = bytearray(FRAME_SIZE)
        self._ahead = ThreadPoolExecutor(1, "stratalog-colocated") if read_ahead else None
        self._pending: tuple[int, int, Future[ColocatedRead | None]] | None = None

    def close(self) -> None:
        self._take_pending()
        if self._ahead is not None:
            self._ahead.shutdown()
        self._forget()
        self._slot.close()

    def __enter__(self) -> ColocatedPartition:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the slot --------------------------------------------------------------------------
    def state(self) -> SlotState | None:
        """The slot's fields, copied between two equal, even counter readings; None if the
        broker stopped publishing it."""
        m = self._slot
        for _ in range(1000):
            before = _COUNTER.unpack_from(m, COUNTER_AT)[0]
            if before & 1:
                continue
            raw = m[: SLOT.size]
            if _COUNTER.unpack_from(m, COUNTER_AT)[0] == before:
                try:
                    return unpack_slot(raw)
                except ValueError:
                    return None
        return None  # a writer that never finishes: read through Fetch

    # -- reading ---------------------------------------------------------------------------
    def read(self, offset: int, max_bytes: int) -> ColocatedRead | None:
        """Whole batches from the one holding ``offset``, at least one, about ``max_bytes``,
        all below the high watermark; an empty read at or past it. None: not readable here
        (fall back to Fetch)."""
        ahead = self._take_pending()
        if ahead is not None and ahead[:2] == (offset, max_bytes):
            got = ahead[2]
        else:
            got = self._read_now(offset, max_bytes)
        if self._ahead is not None and got is not None and got.records:
            nxt = got.next_offset
            self._pending = (nxt, max_bytes, self._ahead.submit(self._read_now, nxt, max_bytes))
        return got

    def _take_pending(self) -> tuple[int, int, ColocatedRead | None] | None:
        """The read ahead's result, once it is done (nothing else touches the index
        meanwhile)."""
        if self._pending is None:
            return None
        offset, max_bytes, fut = self._pending
        self._pending = None
        return offset, max_bytes, fut.result()

    def _read_now(self, offset: int, max_bytes: int) -> ColocatedRead | None:
        got = self._read_slot(offset, max_bytes)
        if (got is None or not got.records) and self._replaced():
            got = self._read_slot(offset, max_bytes)  # the broker restarted: its new slot
        return got

    def _replaced(self) -> bool:
        """Whether the slot file is a new one (a restarted broker's), mapped if so."""
        try:
            if os.stat(self._path).st_ino == self._inode:
                return False
            slot, inode = _map_slot(self._path)
        except OSError:
            return False
        self._slot.close()
        self._slot, self._inode = slot, inode
        self._forget()
        return True

    def _read_slot(self, offset: int, max_bytes: int) -> ColocatedRead | None:
        s = self.state()
        if s is None or not s.readable or s.partition != self.partition:
            return None
        if offset < s.log_start or offset < s.hot_start:
            return None  # out of range, or in the cold tier: Fetch answers
        if offset >= s.high_watermark:
            return ColocatedRead(memoryview(b""), s.high_watermark, s.log_start, offset)
        key = (s.incarnation, s.uid, s.log)
        if key != self._key:
            self._forget()
            self._key = key
        try:
            self._learn(s)
            got = self._read(offset, max_bytes, s)
        except OSError:
            got = None
        if got is None:
            self._forget()  # something moved under the index: learn it again next time
            return None
        return got

    def _forget(self) -> None:
        for seg in self._segments.values():
            if seg.fd >= 0:
                os.close(seg.fd)
        self._segments.clear()
        self._key = None

    def _fd(self, seq: int, seg: _Segment, log_dir: Path) -> int:
        if seg.fd < 0:
            seg.fd = os.open(log_dir / f"{segment_name(seq)}.log", os.O_RDONLY)
        return seg.fd

    def _learn(self, s: SlotState) -> None:
        """Index the partition's batches up to (end_seq, end_pos)."""
        if s.end_seq < 0:
            return
        log_dir = self.root / s.log
        known = self._segments
        if s.end_seq not in known:
            for name in os.listdir(log_dir):
                if name.endswith(".log") and name[:-4].isdigit():
                    seq = int(name[:-4])
                    if seq <= s.end_seq and seq not in known:
                        known[seq] = _Segment()
        if s.end_seq not in known or (s.log_start, s.hot_start) != self._starts:
            # Segments gone (retention, migration) go out of the way of later lookups, and
            # their descriptors are closed: an open one would keep a deleted file's space.
            self._starts = (s.log_start, s.hot_start)
            for seq in [q for q in known if not (log_dir / f"{segment_name(q)}.log").exists()]:
                seg = known.pop(seq)
                if seg.fd >= 0:
                    os.close(seg.fd)
        for seq in sorted(q for q in known if q <= s.end_seq):
            seg = known[seq]
            if seg.whole:
                continue
            # Before the end's segment every frame is whole, to its end; in it, to end_pos.
            limit = s.end_pos if seq == s.end_seq else os.fstat(self._fd(seq, seg, log_dir)).st_size
            if seg.scanned < limit:
                self._from_index(seg, seq, log_dir, limit, s.uid)
                self._scan(seg, seq, log_dir, limit, s.uid, sealed=seq < s.end_seq)
            seg.whole = seq < s.end_seq
        # A whole segment holding nothing readable of this partition any more (retention,
        # migration: it may be deleted at any moment) keeps no descriptor: an open one would
        # keep a deleted file's space. It stays known, so it is not walked again.
        start = max(s.log_start, s.hot_start)
        for seg in known.values():
            if seg.whole and seg.fd >= 0 and (not seg.last or seg.last[-1] < start):
                os.close(seg.fd)
                seg.fd = -1

    def _from_index(self, seg: _Segment, seq: int, log_dir: Path, limit: int, uid: int) -> None:
        try:
            with open(log_dir / f"{segment_name(seq)}.idx", "rb") as f:
                f.seek(seg.idx_read)
                raw = f.read()
        except FileNotFoundError:
            return
        whole = len(raw) - len(raw) % ENTRY_SIZE
        taken = 0
        for e_uid, base, delta, pos, size, *_ in ENTRY.iter_unpack(memoryview(raw)[:whole]):
            end = pos + size
            if end > limit:
                break  # not below the slot's end yet: taken again next time
            if pos < seg.scanned:
                taken += ENTRY_SIZE
                continue  # known from a walk of the frames
            if pos - FRAME_SIZE != seg.scanned:
                break  # not where the known frames end: walk them instead
            taken += ENTRY_SIZE
            if e_uid == uid:
                seg.base.append(base)
                seg.last.append(base + delta)
                seg.pos.append(pos)
                seg.size.append(size)
            seg.scanned = end
        seg.idx_read += taken

    def _scan(
        self, seg: _Segment, seq: int, log_dir: Path, limit: int, uid: int, sealed: bool
    ) -> None:
        """Walk the frames from where the index ended up to ``limit``."""
        fd = self._fd(seq, seg, log_dir)
        at = seg.scanned
        while at < limit:
            if sealed and limit - at < _HEAD:
                seg.scanned = limit  # too short for a frame: the last block's O_DIRECT padding
                return
            block = os.pread(fd, min(_SCAN_BLOCK, limit - at), at)
            if len(block) < min(_HEAD, limit - at):
                raise OSError(f"segment {seq} is shorter than its slot says")
            i = 0
            n = len(block)
            while i + _HEAD <= n:
                f_uid, _crc = FRAME.unpack_from(block, i)
                base, length = _BATCH_HEAD.unpack_from(block, i + FRAME_SIZE)
                if length < _MIN_LENGTH:
                    if not sealed:
                        raise OSError(f"segment {seq}: no frame at {at + i}")
                    # An O_DIRECT segment's last block padding, before the broker cut it.
                    seg.scanned = limit
                    return
                size = length + 12
                if f_uid == uid:
                    seg.base.append(base)
                    seg.last.append(base + _LAST_DELTA.unpack_from(block, i + FRAME_SIZE + 23)[0])
                    seg.pos.append(at + i + FRAME_SIZE)
                    seg.size.append(size)
                i += FRAME_SIZE + size
                if at + i >= limit:
                    break
            if i == 0:
                raise OSError(f"segment {seq}: no whole frame at {at}")
            at += i
            seg.scanned = at

    def _read(self, offset: int, max_bytes: int, s: SlotState) -> ColocatedRead | None:
        log_dir = self.root / s.log
        hwm = s.high_watermark
        # The chunk holding offset: the first batch whose last offset is at or past it.
        plan: list[tuple[int, _Segment, int, int]] = []  # (seq, segment, first, count)
        total = 0
        expect = -1  # the next offset the batches planned so far lead to
        for seq in sorted(self._segments):
            seg = self._segments[seq]
            if not seg.last or seg.last[-1] < offset:
                continue
            i = bisect_left(seg.last, offset) if expect < 0 else 0
            if expect < 0 and seg.base[i] > offset:
                return None  # not a batch of the offset: Fetch says what is there
            j = i
            while j < len(seg.base) and seg.last[j] < hwm:
                size = seg.size[j]
                # Offsets run on without a gap (a segment this reader cannot see, a spilled
                # one, would leave one): a gap ends the read, and the next starts at Fetch.
                if (total and total + size > max_bytes) or (expect >= 0 and seg.base[j] != expect):
                    break
                total += size
                expect = seg.last[j] + 1
                j += 1
            if j > i:
                plan.append((seq, seg, i, j - i))
            if j < len(seg.base) or total >= max_bytes:
                break
        if not plan:
            return None  # the index does not reach it (a stale slot): Fetch knows better
        which = 1 - self._out
        if len(self._buffers[which]) < total:
            self._buffers[which] = bytearray(total)
        out = memoryview(self._buffers[which])
        at = 0
        nxt = offset
        for seq, seg, i, count in plan:
            fd = self._fd(seq, seg, log_dir)
            k = i
            while k < i + count:
                # A run of batches of this partition back to back in the file (one frame header
                # between each), up to IOV_MAX buffers.
                start = seg.pos[k]
                views = [out[at : at + seg.size[k]]]
                want = seg.size[k]
                run_end = start + seg.size[k]
                at += seg.size[k]
                k += 1
                while (
                    k < i + count
                    and seg.pos[k] == run_end + FRAME_SIZE
                    and len(views) < _IOV_MAX - 1
                ):
                    views.append(self._scratch)
                    views.append(out[at : at + seg.size[k]])
                    want += FRAME_SIZE + seg.size[k]
                    run_end = seg.pos[k] + seg.size[k]
                    at += seg.size[k]
                    k += 1
                if os.preadv(fd, views, start) != want:
                    return None  # cut meanwhile
            for k in range(i, i + count):
                nxt = seg.last[k] + 1
        records = out[:at]
        if not _check(records, plan):
            return None
        self._out = which
        return ColocatedRead(records, hwm, s.log_start, nxt)


def _map_slot(path: Path) -> tuple[mmap.mmap, int]:
    fd = os.open(path, os.O_RDONLY)
    try:
        return mmap.mmap(fd, SLOT_SIZE, mmap.MAP_SHARED, mmap.PROT_READ), os.fstat(fd).st_ino
    finally:
        os.close(fd)


def _check(records: memoryview, plan: list[tuple[int, _Segment, int, int]]) -> bool:
    """Every batch read is the one the index promised (base offset and length)."""
    at = 0
    for _seq, seg, i, count in plan:
        for k in range(i, i + count):
            base, length = _BATCH_HEAD.unpack_from(records, at)
            if base != seg.base[k] or length + 12 != seg.size[k]:
                return False
            at += seg.size[k]
    return True


class ColocatedReads:
    """The partitions of a client's topics whose leader runs on this host, found once each."""

    def __init__(self, client: WireClient) -> None:
        self.client = client
        self._found: dict[tuple[str, int], ColocatedPartition | None] = {}

    def partition(self, topic: str, partition: int) -> ColocatedPartition | None:
        key = (topic, partition)
        if key not in self._found:
            self._found[key] = find(self.client, topic, partition)
        return self._found[key]

    def close(self) -> None:
        for p in self._found.values():
            if p is not None:
                p.close()
        self._found.clear()


def find(
    client: WireClient, topic: str, partition: int, read_ahead: bool = False
) -> ColocatedPartition | None:
    """The partition read from its leader's files, if the leader runs on this host and this
    user may read them; None otherwise (read it through Fetch)."""
    try:
        where = client.leader_log_dir(topic, partition)
    except Exception:
        return None
    if where is None:
        return None
    cluster_id, node, log_dir = where
    root = Path(log_dir)
    try:
        identity = json.loads((root / SLOTS_DIR / IDENTITY_FILE).read_bytes())
        if identity.get("cluster_id") != cluster_id or identity.get("node_id") != node:
            return None  # a path of the same name, of another broker
        return ColocatedPartition(root, topic, partition, read_ahead)
    except (OSError, ValueError):
        return None  # not on this host, not readable by this user, or no slot
