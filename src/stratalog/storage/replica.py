"""What a replicated virtual log needs beyond appending: its errors and its epoch history.

In cluster mode the unit of replication is the virtual log (KerA): its primary ships every run
of frames it writes, byte for byte, to its backups, which append them at the same (segment seq,
byte position), so a position names the same bytes on every replica. The network side lives in
``cluster/``; storage only checks what it is handed (continuity, frame CRCs, epochs) and says
why it refuses, with the exceptions below.

The epoch history (Kafka's leader-epoch cache, KIP-101) is kept per log in ``epochs.json``: the
highest epoch the log promised (BookKeeper's fence: a backup that promised epoch e refuses
anything older, and the promise survives a crash, BP-46) and, for each epoch that wrote, the
position its first byte went to. ``VirtualLog.epoch_end(e)`` answers where epoch ``e`` ended,
which is where a backup whose last epoch is ``e`` must cut its log.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from crc32c import crc32c

from stratalog.storage.journal import StorageFailure
from stratalog.storage.segment import fsync_dir

EPOCHS_FILE = "epochs.json"


class ReplicaError(Exception):
    """A replicated write or read that this log refuses; nothing of it was written."""


class ReplicaGap(ReplicaError):
    """The bytes do not continue this log: it ends at (``expected_seq``,
    ``expected_position``), where the next bytes must go."""

    def __init__(self, expected_seq: int, expected_position: int, message: str = "") -> None:
        super().__init__(
            message or f"gap: this log continues at ({expected_seq}, {expected_position})"
        )
        self.expected_seq = expected_seq
        self.expected_position = expected_position


class CorruptReplica(ReplicaError):
    """The bytes are not whole valid frames (a frame or batch CRC fails, a frame is cut short,
    or a partition's offsets do not continue): nothing was written."""


class NotPrimary(StorageFailure):
    """A local append to a replicated log this broker is not the primary of: its bytes would be
    in no other replica's history (a backup's copy must only ever hold the primary's bytes)."""


class StaleEpoch(ReplicaError):
    """An epoch below the one this log promised (a deposed primary's write)."""

    def __init__(self, epoch: int, promised: int) -> None:
        super().__init__(f"epoch {epoch} is older than the promised epoch {promised}")
        self.epoch = epoch
        self.promised = promised


class PositionUnavailable(ReplicaError):
    """A read from a position whose segment is gone (retention, migration): the log holds
    nothing before (``first_seq``, ``first_position``)."""

    def __init__(self, first_seq: int, first_position: int) -> None:
        super().__init__(f"this log starts at ({first_seq}, {first_position})")
        self.first_seq = first_seq
        self.first_position = first_position


def parse_epochs(raw: bytes) -> tuple[int, list[tuple[int, int, int]]]:
    """(promised, starts) of an epochs file's bytes; ValueError (or KeyError, TypeError) if
    they are damaged. Files from before the CRC are taken as they are."""
    doc = json.loads(raw)
    if set(doc) not in ({"promised", "starts"}, {"promised", "starts", "crc32c"}):
        raise ValueError(f"unexpected keys {sorted(doc)}")
    promised = int(doc["promised"])
    starts = [(int(e), int(s), int(p)) for e, s, p in doc["starts"]]
    if "crc32c" in doc:
        body = json.dumps({"promised": doc["promised"], "starts": doc["starts"]})
        if crc32c(body.encode()) != doc["crc32c"]:
            raise ValueError("CRC mismatch")
    return promised, starts


@dataclass
class EpochHistory:
    """The promised epoch and (epoch, start seq, start position) of each epoch that wrote, in
    order; kept in ``<log>/epochs.json``, replaced atomically and fsynced on every change (a
    change is a failover, never an append)."""

    directory: Path
    promised: int = -1
    starts: list[tuple[int, int, int]] = field(default_factory=list)

    @classmethod
    def load(cls, directory: Path) -> EpochHistory:
        h = cls(directory)
        path = directory / EPOCHS_FILE
        try:
            h.promised, h.starts = parse_epochs(path.read_bytes())
        except FileNotFoundError:
            return h
        except (ValueError, KeyError, TypeError, UnicodeDecodeError) as e:
            # A promise that cannot be read cannot be kept (BP-46): refuse to open the log.
            raise ValueError(f"{path} is damaged: {e}") from None
        return h

    def save(self) -> None:
        tmp = self.directory / (EPOCHS_FILE + ".tmp")
        with open(tmp, "w") as f:
            body = json.dumps({"promised": self.promised, "starts": self.starts})
            f.write(json.dumps({**json.loads(body), "crc32c": crc32c(body.encode())}))
            f.flush()
            os.fdatasync(f.fileno())
        os.replace(tmp, self.directory / EPOCHS_FILE)
        fsync_dir(self.directory)

    @property
    def last(self) -> int:
        """The newest epoch that wrote (-1: none)."""
        return self.starts[-1][0] if self.starts else -1

    def covering(self, seq: int, position: int) -> tuple[int, tuple[int, int] | None]:
        """The epoch the byte at (seq, position) was written under (-1: before any epoch) and
        where the next epoch starts (None: it runs to the end)."""
        epoch = -1
        for e, s, p in self.starts:
            if (s, p) > (seq, position):
                return epoch, (s, p)
            epoch = e
        return epoch, None

    def last_before(self, end: tuple[int, int]) -> int:
        """The newest epoch with a byte before ``end`` (the log's end; -1: none)."""
        for e, s, p in reversed(self.starts):
            if (s, p) < end:
                return e
        return -1

    def forget_empty(self, end: tuple[int, int]) -> bool:
        """Forget epochs that start at ``end`` (the log's end) and so hold no byte (a primary
        records its epoch when it starts leading, and may be deposed before it writes);
        whether any went. Bytes that follow are then checked against the epoch that wrote
        the last byte, not an empty one after it."""
        return self.cut(*end)

    def cut(self, seq: int, position: int) -> bool:
        """Forget epochs whose first byte is at or past (seq, position); whether any went."""
        keep = [e for e in self.starts if (e[1], e[2]) < (seq, position)]
        changed = len(keep) != len(self.starts)
        self.starts = keep
        return changed


def parting_point(
    ours: list[tuple[int, int, int]] | tuple[tuple[int, int, int], ...],
    our_end: tuple[int, int],
    theirs: list[tuple[int, int, int]] | tuple[tuple[int, int, int], ...],
    their_end: tuple[int, int],
) -> tuple[int, int]:
    """Where two replicas' logs part, from their epoch histories and ends: the newest epoch
    both wrote, up to where it ends on either side (KIP-101 with KIP-279's fix, in one step
    since the whole history is at hand). Bytes of one epoch at one position are the same
    everywhere (one primary wrote them, after its log agreed with their predecessors), so
    everything before that point agrees and what follows on the other side must go.

    A history without epochs (bytes from before cluster mode) agrees up to the shorter end;
    two histories with no epoch in common agree before the other side's first epoch."""
    if not theirs:
        return min(our_end, their_end)
    mine = {e for e, _, _ in ours}
    common = [e for e, _, _ in theirs if e in mine]
    if not common:
        return min((theirs[0][1], theirs[0][2]), our_end)
    epoch = max(common)
    return min(_epoch_end(ours, our_end, epoch), _epoch_end(theirs, their_end, epoch))


def _epoch_end(history, end: tuple[int, int], epoch: int) -> tuple[int, int]:
    for e, s, p in history:
        if e > epoch:
            return min((s, p), end)
    return end
