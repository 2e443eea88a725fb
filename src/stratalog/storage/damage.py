"""Damaged ranges of a log: bytes recovery stepped over, kept so that they stay fenced.

When recovery meets a frame that fails its checks and a valid frame follows it, the bytes in
between are damage (a flipped bit, a lost sector), not a torn tail: recovery steps over them and
records the range here, with the offsets each partition lost there where they are known (from
the offsets of the partition's next frame, or from an index entry that points into the range).
The record is ``damaged.json`` in the log's directory, rewritten atomically and synced before
the log takes a write, and carries a CRC of its own. Reads of a lost offset range answer
CORRUPT_MESSAGE (PartitionLog.lost); the damaged bytes stay in the segment until it is deleted.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

from crc32c import crc32c

from stratalog.storage.segment import fsync_dir

log = logging.getLogger(__name__)

DAMAGE_FILE = "damaged.json"


class DamageRecordError(ValueError):
    """``damaged.json`` itself cannot be read or fails its CRC."""


@dataclass
class DamagedRange:
    """Bytes [start, end) of segment ``seq`` that hold no valid frame, and what was lost there:
    partition uid -> [first, last] offsets (a partition whose lost offsets are unknown is
    absent)."""

    seq: int
    start: int
    end: int
    lost: dict[int, tuple[int, int]] = field(default_factory=dict)

    def to_json(self) -> dict:
        return {
            "seq": self.seq,
            "start": self.start,
            "end": self.end,
            "lost": {str(u): list(r) for u, r in sorted(self.lost.items())},
        }

    @classmethod
    def from_json(cls, d: dict) -> DamagedRange:
        lost = {int(u): (int(r[0]), int(r[1])) for u, r in d.get("lost", {}).items()}
        return cls(int(d["seq"]), int(d["start"]), int(d["end"]), lost)

    def describe(self) -> str:
        parts = ", ".join(f"partition uid {u} offsets {a}..{b}" for u, (a, b) in self.lost.items())
        return f"segment {self.seq} bytes {self.start}..{self.end} ({self.end - self.start} B)" + (
            f": lost {parts}" if parts else ": lost offsets unknown"
        )


def _body(ranges: list[DamagedRange]) -> str:
    return json.dumps([r.to_json() for r in ranges], sort_keys=True)


def load(directory: Path) -> list[DamagedRange]:
    """The ranges recorded for the log in ``directory`` (none if there is no record); raises
    DamageRecordError if the record is unreadable."""
    path = directory / DAMAGE_FILE
    try:
        doc = json.loads(path.read_text())
        body = _body([DamagedRange.from_json(d) for d in doc["ranges"]])
        if crc32c(body.encode()) != int(doc["crc32c"]):
            raise DamageRecordError(f"{path}: CRC mismatch")
        return [DamagedRange.from_json(d) for d in doc["ranges"]]
    except FileNotFoundError:
        return []
    except (ValueError, KeyError, TypeError, IndexError, UnicodeDecodeError) as e:
        if isinstance(e, DamageRecordError):
            raise
        raise DamageRecordError(f"{path}: unreadable ({e})") from None


def save(directory: Path, ranges: list[DamagedRange]) -> None:
    """Write the record durably (write, fsync, rename, fsync the directory)."""
    body = _body(ranges)
    doc = json.dumps({"ranges": json.loads(body), "crc32c": crc32c(body.encode())})
    tmp = directory / (DAMAGE_FILE + ".tmp")
    with open(tmp, "w") as f:
        f.write(doc)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, directory / DAMAGE_FILE)
    fsync_dir(directory)


def merge(known: list[DamagedRange], found: list[DamagedRange]) -> tuple[list[DamagedRange], bool]:
    """``known`` with ``found`` added (a range found again, at a rescan, adds what it lost);
    whether anything changed."""
    by_key = {(r.seq, r.start): r for r in known}
    changed = False
    for r in found:
        old = by_key.get((r.seq, r.start))
        if old is None:
            by_key[(r.seq, r.start)] = r
            changed = True
            continue
        for uid, (a, b) in r.lost.items():
            was = old.lost.get(uid)
            new = (a, b) if was is None else (min(a, was[0]), max(b, was[1]))
            if new != was:
                old.lost[uid] = new
                changed = True
        if r.end > old.end:
            old.end = r.end
            changed = True
    return sorted(by_key.values(), key=lambda r: (r.seq, r.start)), changed


def holes_by_segment(ranges: list[DamagedRange]) -> dict[int, dict[int, int]]:
    """seq -> start -> end of the recorded ranges (what recovery's index check may jump)."""
    out: dict[int, dict[int, int]] = {}
    for r in ranges:
        out.setdefault(r.seq, {})[r.start] = r.end
    return out
