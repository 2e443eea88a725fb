"""Durable committed offsets of consumer groups.

Commits are appended as JSON lines to ``meta/offsets.log`` and fsynced before OffsetCommit is
answered; at start the file is replayed and, when it has grown well past the live state, compacted
by rewriting the latest value of each key (written aside, fsynced, renamed).
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class CommittedOffset:
    offset: int
    leader_epoch: int
    metadata: str | None
    commit_time: int


Key = tuple[str, str, int]  # group, topic, partition


class OffsetStore:
    def __init__(self, data_dir: Path) -> None:
        self.path = Path(data_dir) / "meta" / "offsets.log"
        self.offsets: dict[Key, CommittedOffset] = {}
        self._fd = -1
        self._lines = 0
        self._lock = threading.Lock()

    def load(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.path.exists():
            with open(self.path, "rb") as f:
                for raw in f:
                    try:
                        rec = json.loads(raw)
                    except ValueError:
                        break  # a torn last line: it was never acknowledged
                    self._apply(rec)
                    self._lines += 1
        if self._lines > 2 * len(self.offsets) + 1000:
            self._compact()
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        # Drop a torn tail so the next append starts on a line boundary.
        self._truncate_torn_tail()

    def _truncate_torn_tail(self) -> None:
        size = os.fstat(self._fd).st_size
        if size == 0:
            return
        with open(self.path, "rb") as f:
            data = f.read()
        good = data.rfind(b"\n") + 1
        tail = data[good:]
        if tail:
            os.ftruncate(self._fd, good)
            os.fsync(self._fd)

    def _apply(self, rec: dict) -> None:
        key = (rec["g"], rec["t"], rec["p"])
        if rec.get("d"):
            self.offsets.pop(key, None)
        else:
            self.offsets[key] = CommittedOffset(rec["o"], rec["e"], rec["m"], rec["ts"])

    def _compact(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        with open(tmp, "wb") as f:
            for (g, t, p), c in self.offsets.items():
                f.write(self._line(g, t, p, c))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        self._lines = len(self.offsets)

    @staticmethod
    def _line(g: str, t: str, p: int, c: CommittedOffset | None) -> bytes:
        if c is None:
            rec = {"g": g, "t": t, "p": p, "d": 1}
        else:
            rec = {
                "g": g,
                "t": t,
                "p": p,
                "o": c.offset,
                "e": c.leader_epoch,
                "m": c.metadata,
                "ts": c.commit_time,
            }
        return json.dumps(rec, separators=(",", ":")).encode() + b"\n"

    def write(self, entries: list[tuple[Key, CommittedOffset | None]]) -> None:
        """Append and fsync (blocking: call it from a worker thread), then apply."""
        data = b"".join(self._line(g, t, p, c) for (g, t, p), c in entries)
        with self._lock:
            os.write(self._fd, data)
            os.fdatasync(self._fd)
            for key, c in entries:
                if c is None:
                    self.offsets.pop(key, None)
                else:
                    self.offsets[key] = c
            self._lines += len(entries)

    def get(self, group: str, topic: str, partition: int) -> CommittedOffset | None:
        return self.offsets.get((group, topic, partition))

    def group_offsets(self, group: str) -> dict[tuple[str, int], CommittedOffset]:
        return {(t, p): c for (g, t, p), c in self.offsets.items() if g == group}

    def groups(self) -> set[str]:
        return {g for g, _, _ in self.offsets}

    def keys_for_topic(self, topic: str) -> list[Key]:
        return [k for k in self.offsets if k[1] == topic]

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
