"""Read slots: where a co-located reader learns what it may read of a partition
(colocated_format.py has the layout; docs/architecture.md, "Co-located reads").

One small file per partition, ``<hot tier>/slots/<topic>/<partition>.slot``, mapped shared and
rewritten in place whenever the partition's high watermark, log start or hot-tier start moves:
one ``pack_into`` of 104 bytes between two counter stores, on the event loop, no system call.
The reader maps it read-only and needs nothing else from the broker. A slot is only a hint of
what is safe to read: a stale one (a deposed leader's, until the next refresh) still names only
committed records.

The directory is rebuilt at every start (slots of deleted topics must not outlive them) and
carries ``identity.json`` (cluster id and node id) so a reader can tell it found its leader's
files and not another broker's at the same path.
"""

from __future__ import annotations

import json
import logging
import mmap
import os
import random
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from stratalog.colocated_format import (
    DAMAGED,
    IDENTITY_FILE,
    RANGE,
    RANGE_AT,
    READABLE,
    SLOT,
    SLOT_SIZE,
    SLOTS_DIR,
    SlotState,
    pack_counter,
    pack_slot,
    slot_name,
)

if TYPE_CHECKING:
    from stratalog.storage.partition import PartitionLog

log = logging.getLogger(__name__)


class ReadSlot:
    """One partition's slot, mapped for writing."""

    __slots__ = ("_counter", "_fd", "_map", "incarnation", "path")

    def __init__(self, path: Path, incarnation: int, mode: int) -> None:
        self.path = path
        self.incarnation = incarnation
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, mode)
        os.ftruncate(self._fd, SLOT_SIZE)
        self._map = mmap.mmap(self._fd, SLOT_SIZE)  # shared, read and write
        self._counter = 0

    def publish(self, p: PartitionLog) -> None:
        """Write the partition's current state (seqlock: the counter is odd meanwhile)."""
        m = self._map
        if m.closed:
            return
        c = self._counter + 1
        pack_counter(m, c)
        m[: SLOT.size] = pack_slot(c, _state(p, self.incarnation))
        self._counter = c + 1
        pack_counter(m, c + 1)

    def publish_end(self, p: PartitionLog) -> None:
        """Write what a new high watermark changes (the range's end, and the starts beside it)
        and nothing else: the append path's share, about a microsecond."""
        m = self._map
        if m.closed:
            return
        c = self._counter + 1
        pack_counter(m, c)
        hwm = p.high_watermark
        chunks = p.chunks
        seq, end = chunks.end_below(hwm)
        hot = chunks.first_offset
        RANGE.pack_into(
            m, RANGE_AT, hwm, p.log_start_offset, p.next_offset if hot is None else hot, seq, end
        )
        self._counter = c + 1
        pack_counter(m, c + 1)

    def close(self, unlink: bool) -> None:
        """Stop publishing; readers still holding the mapping see the slot unreadable."""
        if not self._map.closed:
            pack_counter(self._map, self._counter + 1)
            self._map[6:8] = b"\0\0"  # no flags
            pack_counter(self._map, self._counter + 2)
            self._map.close()
            os.close(self._fd)
        if unlink:
            try:
                self.path.unlink()
            except FileNotFoundError:
                pass


def _state(p: PartitionLog, incarnation: int) -> SlotState:
    hwm = p.high_watermark
    chunks = p.chunks
    n = len(chunks)
    hot_start = chunks.first_offset if n else p.next_offset
    # The hot chunk holding the last offset below the high watermark: the last one, or a few
    # before it (those still being synced).
    end_seq, end_pos = chunks.end_below(hwm)
    flags = READABLE if p.vlog.leading and not p.deleted else 0
    if p.lost:
        flags |= DAMAGED
    return SlotState(
        flags,
        p.uid,
        p.index,
        incarnation,
        hwm,
        p.log_start_offset,
        hot_start if hot_start is not None else p.next_offset,
        end_seq,
        end_pos,
        p.vlog.name,
    )


def _dir_mode(mode: int) -> int:
    """A directory's mode for files of ``mode``: searchable by whom they are readable."""
    return mode | (mode & 0o444) >> 2


class ReadSlots:
    """Every partition's slot under ``<root>/slots``."""

    def __init__(self, root: Path, mode: int = 0o644) -> None:
        self.directory = root / SLOTS_DIR
        self.mode = mode
        # Cached positions of a reader are good for one opening of the logs only.
        self.incarnation = random.getrandbits(63)
        self._slots: dict[int, ReadSlot] = {}

    def open(self) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)
        self.directory.mkdir(parents=True)
        os.chmod(self.directory, _dir_mode(self.mode))

    def write_identity(self, identity: dict[str, object]) -> None:
        """Name the broker these files are of (a reader compares it with Metadata's answer)."""
        body = json.dumps({**identity, "incarnation": self.incarnation}).encode()
        path = self.directory / IDENTITY_FILE
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(body)
        os.chmod(tmp, self.mode)
        os.replace(tmp, path)

    def add(self, p: PartitionLog) -> None:
        if p.uid in self._slots:
            return
        topic_dir = self.directory / p.topic
        try:
            topic_dir.mkdir(exist_ok=True)
            os.chmod(topic_dir, _dir_mode(self.mode))
            slot = ReadSlot(topic_dir / slot_name(p.index), self.incarnation, self.mode)
        except OSError as e:
            # A reader then falls back to Fetch; the broker goes on without this slot.
            log.warning("no read slot for %s-%d: %s", p.topic, p.index, e)
            return
        self._slots[p.uid] = slot
        p.slot = slot
        slot.publish(p)

    def remove(self, p: PartitionLog) -> None:
        slot = self._slots.pop(p.uid, None)
        p.slot = None
        if slot is not None:
            slot.close(unlink=True)
            try:
                slot.path.parent.rmdir()  # the topic's last partition
            except OSError:
                pass

    def refresh(self, partitions) -> None:
        """Publish every slot again: what no event hook covers (leadership) within a tick."""
        for p in partitions:
            slot = self._slots.get(p.uid)
            if slot is not None:
                slot.publish(p)

    def close(self) -> None:
        for slot in self._slots.values():
            slot.close(unlink=False)
        self._slots.clear()
