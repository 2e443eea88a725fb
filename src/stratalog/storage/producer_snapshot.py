"""Producer-state snapshots of a log (``<seq>.snapshot``), so start-up replays only the tail.

The idempotent-producer state of a partition (producer_state.py) used to be rebuilt at every
start from every index entry the broker kept, hot and cold: start-up time grew with history.
As Kafka writes a ``.snapshot`` at each segment roll, a log's partitions' state is written when
a segment is sealed (as of its end) and at a clean stop (as of the log's end); start-up loads the
newest snapshot that holds together and replays only the entries written after it.

```
header  magic "SLPS", version, segment seq and position the state is as of, partitions,
        CRC-32C of the body
body    per partition: uid, producers; per producer: id, epoch, kept batches, then for a
        deterministic producer (ids from 2^62) its whole batch history; each batch: first and
        last sequence, base and last offset, timestamp
```

Written to a temporary name, synced, renamed, its directory synced, and only then are older
snapshots beyond the newest two removed. A snapshot is believed only if its CRC holds and its
position is not past the log's recovered end (a power cut may take back the bytes a snapshot
covered: it is removed before the log takes a write); a truncation removes the snapshots past
its cut first. No snapshot (a data directory from before them): the state is rebuilt from every
entry, once, and a snapshot written.
"""

from __future__ import annotations

import logging
import os
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from crc32c import crc32c

from stratalog.storage.producer_state import (
    BatchMeta,
    ProducerEntry,
    ProducerStateTable,
)
from stratalog.storage.segment import write_whole

log = logging.getLogger(__name__)

SUFFIX = ".snapshot"
MAGIC = b"SLPS"
VERSION = 1
KEEP = 2  # snapshots kept per log
# magic, version, flags, seq, position, partitions, CRC-32C of what comes before it and after
_HEADER = struct.Struct("<4sHHqqII")
_PART = struct.Struct("<II")  # uid, producers
_PRODUCER = struct.Struct("<qhHI")  # id, epoch, kept batches, history batches (or 0xFFFFFFFF)
_BATCH = struct.Struct("<iiqqq")
_NO_HISTORY = 0xFFFFFFFF


class SnapshotError(ValueError):
    """A snapshot that does not hold together."""


@dataclass
class Snapshot:
    seq: int
    position: int
    tables: dict[int, ProducerStateTable]
    path: Path

    @property
    def at(self) -> tuple[int, int]:
        return self.seq, self.position


def name(seq: int) -> str:
    return f"{seq:020d}{SUFFIX}"


def encode(seq: int, position: int, tables: Iterable[tuple[int, ProducerStateTable]]) -> bytes:
    body = bytearray()
    n = 0
    for uid, table in tables:
        if not table.producers:
            continue
        n += 1
        body += _PART.pack(uid, len(table.producers))
        for pid, e in table.producers.items():
            hist = e.history
            body += _PRODUCER.pack(
                pid, e.epoch, len(e.batches), _NO_HISTORY if hist is None else len(hist)
            )
            for b in (*e.batches, *(hist or ())):
                body += _BATCH.pack(
                    b.first_seq, b.last_seq, b.base_offset, b.last_offset, b.timestamp
                )
    head = _HEADER.pack(MAGIC, VERSION, 0, seq, position, n, 0)[:-4]
    return head + struct.pack("<I", crc32c(body, crc32c(head))) + bytes(body)


def decode(data: bytes, path: Path, touched_ms: int) -> Snapshot:
    """The snapshot in ``data``; its producers count as touched at ``touched_ms`` (as a rebuild
    at start does: expiry counts from the start, not from before the stop)."""
    if len(data) < _HEADER.size:
        raise SnapshotError(f"{path}: cut short")
    magic, version, _flags, seq, position, nparts, crc = _HEADER.unpack_from(data)
    if magic != MAGIC or version != VERSION:
        raise SnapshotError(f"{path}: not a producer snapshot")
    body = memoryview(data)[_HEADER.size :]
    if crc32c(body, crc32c(data[: _HEADER.size - 4])) != crc:
        raise SnapshotError(f"{path}: fails its CRC")
    tables: dict[int, ProducerStateTable] = {}
    at = 0
    try:
        for _ in range(nparts):
            uid, nprod = _PART.unpack_from(body, at)
            at += _PART.size
            table = ProducerStateTable()
            for _ in range(nprod):
                pid, epoch, nb, nh = _PRODUCER.unpack_from(body, at)
                at += _PRODUCER.size
                entry = ProducerEntry(epoch)
                entry.touched_ms = touched_ms
                for _ in range(nb):
                    entry.batches.append(BatchMeta(*_BATCH.unpack_from(body, at)))
                    at += _BATCH.size
                if nh != _NO_HISTORY:
                    entry.history = []
                    for _ in range(nh):
                        entry.history.append(BatchMeta(*_BATCH.unpack_from(body, at)))
                        at += _BATCH.size
                table.producers[pid] = entry
            tables[uid] = table
    except struct.error as e:
        raise SnapshotError(f"{path}: {e}") from None
    if at != len(body):
        raise SnapshotError(f"{path}: {len(body) - at} bytes past its end")
    return Snapshot(seq, position, tables, path)


def listed(directory: Path) -> list[Path]:
    """The snapshot files of a log directory, newest segment first."""
    return sorted(directory.glob("*" + SUFFIX), reverse=True)


def write(directory: Path, data: bytes, seq: int) -> Path:
    """Write a snapshot durably, then remove all but the newest ``KEEP``."""
    path = directory / name(seq)
    write_whole(path, data)
    dfd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
    for old in listed(directory)[KEEP:]:
        old.unlink(missing_ok=True)
    return path


def load_newest(directory: Path, end: tuple[int, int], touched_ms: int) -> Snapshot | None:
    """The newest snapshot of the log in ``directory`` that holds together and is not past
    ``end`` (the log's recovered end). Ones past it are removed (the bytes they covered are
    gone), and so are damaged ones (logged; an older one or the entries stand in)."""
    found = None
    for path in listed(directory):
        try:
            snap = decode(path.read_bytes(), path, touched_ms)
        except SnapshotError as e:
            log.error("producer snapshot %s is damaged (%s): removed", path, e)
            path.unlink(missing_ok=True)
            continue
        except OSError as e:
            log.error("producer snapshot %s unreadable (%s): an older one, or the entries", path, e)
            continue
        if snap.at > end:
            log.warning("producer snapshot %s is past the log's end %s: removed", path, end)
            path.unlink(missing_ok=True)
            continue
        found = found or snap
    return found


def remove_past(directory: Path, seq: int, position: int) -> None:
    """Remove the snapshots of state past (seq, position) (a truncation there)."""
    for path in listed(directory):
        try:
            head = path.read_bytes()[: _HEADER.size]
            _m, _v, _f, s, p, _n, _c = _HEADER.unpack(head)
        except (OSError, struct.error):
            path.unlink(missing_ok=True)
            continue
        if (s, p) > (seq, position):
            path.unlink(missing_ok=True)
