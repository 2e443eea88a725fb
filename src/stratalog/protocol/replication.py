"""Replication messages between a virtual log's primary and its backups, sans-IO (after h11).

The unit of replication is the virtual log (KerA): the primary pushes every run of frames it
writes (``Append``), byte for byte, at its (segment seq, byte position); a backup appends them,
makes them durable and answers ``Ack``, or ``Refused`` (a stale epoch, a gap, a corrupt
frame). A new primary first sends ``Fence``: promise this epoch and cut the log to this
position (KIP-101, one cut for every partition of the log); the backup answers ``FenceAck``
with where its log then ends. Every message carries the epoch: the fencing token each side
checks, never a lease (docs: replication-facts.md §4).

Framing: a 4-byte big-endian length, then the frame: version (1 byte), message type (1 byte),
the fields (strings as a length and UTF-8, integers as signed 64-bit big-endian) and, for an
Append, the frames' bytes to the end. ``encode`` returns a list of parts so that an Append's
bytes are sent as they are, never copied into the frame; ``ReplicationConnection`` turns
received bytes back into messages, checking the length against ``max_frame_bytes`` before
anything is allocated; a large frame is received into a buffer of its own size, so an Append's
bytes are a memoryview of what the kernel wrote. No I/O happens here: the caller owns the
socket.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from stratalog.protocol.connection import ProtocolError

__all__ = [
    "CLOSED",
    "NEED_DATA",
    "RECEIVE_CHUNK",
    "REFUSED_CORRUPT",
    "REFUSED_GAP",
    "REFUSED_STALE_EPOCH",
    "REFUSED_STORAGE",
    "Ack",
    "Append",
    "Commit",
    "Fence",
    "FenceAck",
    "Message",
    "Migrated",
    "ProtocolError",
    "Refused",
    "ReplicationConnection",
    "encode",
]

VERSION = 3  # 2: Append.data_epoch, FenceAck.history, Commit; 3: Migrated
DEFAULT_MAX_FRAME_BYTES = 64 * 1024 * 1024
RECEIVE_CHUNK = 64 * 1024  # a receive buffer; frames this big or more get one of their own

# Refused.error: why a backup refused (the storage exception behind it), named as Kafka names
# its errors.
REFUSED_STALE_EPOCH = "STALE_EPOCH"  # StaleEpoch: a newer epoch was promised
REFUSED_GAP = "GAP"  # ReplicaGap: expected_seq/expected_position say where the log ends
REFUSED_CORRUPT = "CORRUPT"  # CorruptReplica
REFUSED_STORAGE = "KAFKA_STORAGE_ERROR"  # the backup's log failed (or is full)

_APPEND, _ACK, _FENCE, _FENCE_ACK, _REFUSED, _COMMIT, _MIGRATED = 1, 2, 3, 4, 5, 6, 7
_SIZE = struct.Struct(">I")
_HEAD = struct.Struct(">IBB")  # length, version, type
_U8 = struct.Struct(">B")
_U16 = struct.Struct(">H")
_INTS = {n: struct.Struct(">" + "q" * n) for n in (1, 2, 3, 4)}
_MAX_NAME = 255
MAX_HISTORY = 0xFFFF  # epochs in a FenceAck's history (one per failover)
_MAX_ERROR = 0xFFFF


class _Sentinel:
    def __init__(self, name: str) -> None:
        self._name = name

    def __repr__(self) -> str:
        return self._name


NEED_DATA: Any = _Sentinel("NEED_DATA")
CLOSED: Any = _Sentinel("CLOSED")  # the peer closed the connection between frames

Parts = Sequence[bytes | memoryview]


@dataclass(frozen=True, slots=True)
class Append:
    """Primary -> backup: ``data`` (whole frames, or a list of parts as ``on_write`` gives
    them) goes at (seq, position); ``lsn_end`` is the primary's LSN at its end, which the
    backup's Ack returns. ``epoch`` is the fencing token; ``data_epoch`` the epoch the bytes
    were written under (-1: ``epoch``), never newer than it."""

    vlog: str
    epoch: int
    seq: int
    position: int
    lsn_end: int
    data: bytes | memoryview | Parts
    data_epoch: int = -1

    @property
    def written_in(self) -> int:
        """The epoch the bytes were written under."""
        return self.epoch if self.data_epoch < 0 else self.data_epoch

    @property
    def parts(self) -> list[bytes | memoryview]:
        d = self.data
        return [d] if isinstance(d, bytes | bytearray | memoryview) else list(d)

    @property
    def nbytes(self) -> int:
        return sum(len(p) for p in self.parts)


@dataclass(frozen=True, slots=True)
class Ack:
    """Backup -> primary: everything up to the primary's ``lsn`` (an Append's ``lsn_end``) is
    durable here; the log ends at (end_seq, end_position)."""

    vlog: str
    epoch: int
    lsn: int
    end_seq: int
    end_position: int


@dataclass(frozen=True, slots=True)
class Fence:
    """A new primary's order: promise ``epoch`` (refuse older ones from now on) and cut the
    log at (truncate_seq, truncate_position); (-1, -1) cuts nothing."""

    vlog: str
    epoch: int
    truncate_seq: int
    truncate_position: int


@dataclass(frozen=True, slots=True)
class FenceAck:
    """Backup -> new primary: the epoch is promised, durably, and the log ends here;
    ``history`` is its epoch history, (epoch, seq, position) of each epoch's first byte, in
    order, so the primary can find where their logs part (KIP-101 with KIP-279's fix:
    the newest epoch both have, up to where it ends on the shorter side)."""

    vlog: str
    epoch: int
    end_seq: int
    end_position: int
    history: tuple[tuple[int, int, int], ...] = ()


@dataclass(frozen=True, slots=True)
class Refused:
    """Backup -> primary: a message was not applied (``error``: one of the REFUSED_* names).
    ``epoch`` is the backup's promised epoch (-1: none yet), newer than the message's when it
    was stale; for a gap, (expected_seq, expected_position) is where its log ends (else -1)."""

    vlog: str
    epoch: int
    error: str
    expected_seq: int = -1
    expected_position: int = -1


@dataclass(frozen=True, slots=True)
class Commit:
    """Primary -> backup: every byte of the log before (seq, position) is committed (in every
    in-sync replica), so a backup's partitions may show records up to there (their high
    watermark), and no more: a backup promoted later must not serve what was never committed
    (Kafka's followers learn the leader's high watermark the same way, from its fetches)."""

    vlog: str
    epoch: int
    seq: int
    position: int


@dataclass(frozen=True, slots=True)
class Migrated:
    """Primary -> backup: the primary's hot tier holds nothing of the log before segment
    ``first_hot_seq`` any more (migrated to the cold tier, or gone by retention), so the
    backup moves its copies of those segments to the cold tier too (cluster/tiers.py): from
    the shared cold tier if every broker has the same one, else by copying them itself."""

    vlog: str
    epoch: int
    first_hot_seq: int


Message = Append | Ack | Fence | FenceAck | Refused | Commit | Migrated


# -- encoding ------------------------------------------------------------------------------------
def _name(s: str, limit: int, size: struct.Struct) -> bytes:
    b = s.encode()
    if len(b) > limit:
        raise ValueError(f"{s[:40]!r}... is longer than {limit} bytes")
    return size.pack(len(b)) + b


def _ints(*values: int, low: int = 0) -> bytes:
    for v in values:
        if not low <= v < 1 << 63:
            raise ValueError(f"{v} is out of range")
    return _INTS[len(values)].pack(*values)


def _frame(kind: int, body: bytes, extra: int = 0) -> bytes:
    size = 2 + len(body) + extra
    if size > 0xFFFFFFFF:
        raise ValueError(f"a frame of {size} bytes does not fit the length prefix")
    return _HEAD.pack(size, VERSION, kind) + body


def encode(msg: Message) -> list[bytes | memoryview]:
    """The bytes of ``msg`` as parts to write in order (``writelines``, ``sendmsg``); an
    Append's data parts follow the header as they are, not copied."""
    vlog = _name(msg.vlog, _MAX_NAME, _U8)
    if isinstance(msg, Append):
        parts = msg.parts
        n = sum(len(p) for p in parts)
        if msg.data_epoch > msg.epoch:
            raise ValueError(f"bytes of epoch {msg.data_epoch} sent at the older epoch {msg.epoch}")
        body = vlog + _ints(msg.epoch, msg.seq, msg.position, msg.lsn_end)
        body += _ints(msg.data_epoch, low=-1)
        return [_frame(_APPEND, body, n), *parts]
    if isinstance(msg, Ack):
        body = vlog + _ints(msg.epoch, msg.lsn, msg.end_seq, msg.end_position)
        return [_frame(_ACK, body)]
    if isinstance(msg, Fence):
        # (-1, -1): no cut, only the promise and the answer where the log ends.
        body = vlog + _ints(msg.epoch) + _ints(msg.truncate_seq, msg.truncate_position, low=-1)
        return [_frame(_FENCE, body)]
    if isinstance(msg, FenceAck):
        if len(msg.history) > MAX_HISTORY:
            raise ValueError(f"an epoch history of {len(msg.history)} epochs")
        body = vlog + _ints(msg.epoch, msg.end_seq, msg.end_position)
        body += _U16.pack(len(msg.history))
        body += b"".join(_ints(*entry) for entry in msg.history)
        return [_frame(_FENCE_ACK, body)]
    if isinstance(msg, Commit):
        return [_frame(_COMMIT, vlog + _ints(msg.epoch, msg.seq, msg.position))]
    if isinstance(msg, Migrated):
        return [_frame(_MIGRATED, vlog + _ints(msg.epoch, msg.first_hot_seq))]
    if isinstance(msg, Refused):
        body = (
            vlog
            + _ints(msg.epoch, low=-1)
            + _name(msg.error, _MAX_ERROR, _U16)
            + _ints(msg.expected_seq, msg.expected_position, low=-1)
        )
        return [_frame(_REFUSED, body)]
    raise TypeError(f"not a replication message: {msg!r}")


# -- decoding ------------------------------------------------------------------------------------
class _Reader:
    __slots__ = ("buf", "pos")

    def __init__(self, buf: memoryview, pos: int) -> None:
        self.buf = buf
        self.pos = pos

    def _take(self, n: int) -> int:
        at = self.pos
        if at + n > len(self.buf):
            raise ProtocolError("replication message cut short")
        self.pos = at + n
        return at

    def text(self, size: struct.Struct) -> str:
        (n,) = size.unpack_from(self.buf, self._take(size.size))
        at = self._take(n)
        try:
            return str(self.buf[at : at + n], "utf-8")
        except UnicodeDecodeError:
            raise ProtocolError("replication message with a string that is not UTF-8") from None

    def count(self) -> int:
        (n,) = _U16.unpack_from(self.buf, self._take(_U16.size))
        return n

    def ints(self, n: int, low: int = 0) -> tuple[int, ...]:
        values = _INTS[n].unpack_from(self.buf, self._take(8 * n))
        if any(v < low for v in values):
            raise ProtocolError(f"replication message with a field below {low}: {values}")
        return values

    def end(self) -> None:
        if self.pos != len(self.buf):
            raise ProtocolError(f"{len(self.buf) - self.pos} stray bytes after a message")


def _decode(frame: memoryview) -> Message:
    if len(frame) < 2:
        raise ProtocolError("replication frame shorter than its header")
    version, kind = frame[0], frame[1]
    if version != VERSION:
        raise ProtocolError(f"replication protocol version {version}, not {VERSION}")
    r = _Reader(frame, 2)
    vlog = r.text(_U8)
    msg: Message
    if kind == _APPEND:
        epoch, seq, position, lsn_end = r.ints(4)
        (data_epoch,) = r.ints(1, low=-1)
        if data_epoch > epoch:
            raise ProtocolError(f"bytes of epoch {data_epoch} sent at the older epoch {epoch}")
        return Append(vlog, epoch, seq, position, lsn_end, frame[r.pos :], data_epoch)
    if kind == _ACK:
        msg = Ack(vlog, *r.ints(4))
    elif kind == _FENCE:
        msg = Fence(vlog, *r.ints(1), *r.ints(2, low=-1))
    elif kind == _FENCE_ACK:
        epoch, end_seq, end_position = r.ints(3)
        history = tuple(r.ints(3) for _ in range(r.count()))
        msg = FenceAck(vlog, epoch, end_seq, end_position, history)
    elif kind == _COMMIT:
        msg = Commit(vlog, *r.ints(3))
    elif kind == _MIGRATED:
        msg = Migrated(vlog, *r.ints(2))
    elif kind == _REFUSED:
        (epoch,) = r.ints(1, low=-1)
        error = r.text(_U16)
        msg = Refused(vlog, epoch, error, *r.ints(2, low=-1))
    else:
        raise ProtocolError(f"unknown replication message type {kind}")
    r.end()
    return msg


class ReplicationConnection:
    """One side of a replication connection: hand it what the socket delivered, then
    ``next_event`` until NEED_DATA; ``send`` encodes. Bytes come in either by
    ``receive_data`` (a copy of them; ``b""`` at end of file) or, without a copy, by receiving
    straight into ``get_buffer()`` and calling ``buffer_updated(n)`` (a BufferedProtocol's
    calls, or ``recv_into``). A ProtocolError means the peer must be disconnected; the
    connection stays failed."""

    def __init__(self, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> None:
        self.max_frame_bytes = max_frame_bytes
        # Received chunks are never written again once filled, so a message decoded from a
        # view of one (an Append's data) stays valid however long it is kept.
        self._buf: bytes | memoryview = b""
        self._pos = 0
        self._more: list[bytes | memoryview] = []
        self._more_len = 0
        # A frame too big for a receive buffer gets one of its own, received into directly:
        # the kernel's copy is the only one of an Append's bytes (KafkaDirect).
        self._frame: bytearray | None = None
        self._frame_fill = 0
        self._chunk: bytearray | None = None
        self._into_frame = False  # the last get_buffer() was the frame's rest
        self._eof = False
        self._failed = False

    @property
    def buffered(self) -> int:
        return len(self._buf) - self._pos + self._more_len + self._frame_fill

    def get_buffer(self, sizehint: int = -1) -> memoryview:
        """Where the next received bytes go: the rest of a large frame being received, else
        a fresh buffer of at least RECEIVE_CHUNK bytes."""
        if self._frame is not None and self._frame_fill < len(self._frame):
            self._into_frame, self._chunk = True, None
            return memoryview(self._frame)[self._frame_fill :]
        # (A frame that is whole waits for next_event; what follows it goes to a chunk.)
        self._into_frame = False
        self._chunk = bytearray(max(sizehint, RECEIVE_CHUNK))
        return memoryview(self._chunk)

    def buffer_updated(self, nbytes: int) -> None:
        """``nbytes`` were received into the last ``get_buffer()``."""
        if self._failed:
            raise ProtocolError("replication connection already failed")
        if self._eof:
            raise ProtocolError("data after the end of the stream")
        if nbytes <= 0:
            return
        if self._into_frame:
            self._into_frame = False
            self._frame_fill += nbytes
            return
        chunk, self._chunk = self._chunk, None
        if chunk is None:
            raise ProtocolError("buffer_updated without get_buffer")
        self._take(memoryview(chunk)[:nbytes].toreadonly())

    def receive_data(self, data: bytes | bytearray | memoryview) -> None:
        if self._failed:
            raise ProtocolError("replication connection already failed")
        if not data:
            self._eof = True
            return
        if self._eof:
            raise ProtocolError("data after the end of the stream")
        if self._frame is None and isinstance(data, bytes):
            self._take(data)  # immutable: kept as it is, no copy
            return
        view = memoryview(data).cast("B")
        while view:
            into = self.get_buffer(len(view))
            n = min(len(into), len(view))
            into[:n] = view[:n]
            self.buffer_updated(n)
            view = view[n:]

    def _take(self, chunk: bytes | memoryview) -> None:
        if self._pos >= len(self._buf) and not self._more:
            self._buf, self._pos = chunk, 0
        else:
            self._more.append(chunk)
            self._more_len += len(chunk)

    def _coalesce(self) -> None:
        self._buf = b"".join([memoryview(self._buf)[self._pos :], *self._more])
        self._pos = 0
        self._more.clear()
        self._more_len = 0

    def next_event(self) -> Message | Any:
        """The next complete message, NEED_DATA, or CLOSED once the peer ended the stream
        between frames."""
        if self._failed:
            raise ProtocolError("replication connection already failed")
        if self._frame is not None:
            if self._frame_fill < len(self._frame):
                return self._short(self._frame_fill)
            frame, self._frame, self._frame_fill = self._frame, None, 0
            return self._decoded(memoryview(frame)[4:].toreadonly())
        avail = self.buffered
        if avail < 4:
            return self._short(avail)
        if len(self._buf) - self._pos < 4:
            self._coalesce()
        (size,) = _SIZE.unpack_from(self._buf, self._pos)
        if size < 2 or size > self.max_frame_bytes:
            self._failed = True
            raise ProtocolError(
                f"replication frame of {size} bytes is outside 2..{self.max_frame_bytes}"
            )
        if avail < 4 + size:
            if size >= RECEIVE_CHUNK and not self._eof:
                self._assemble(4 + size)
            return self._short(self.buffered)
        if len(self._buf) - self._pos < 4 + size:
            self._coalesce()
        start = self._pos + 4
        frame = memoryview(self._buf)[start : start + size]
        self._pos = start + size
        return self._decoded(frame)

    def _assemble(self, total: int) -> None:
        """Move the start of a large frame (everything buffered: it is all of that frame) into
        a buffer of the frame's size, which the rest is then received into."""
        frame = bytearray(total)
        at = 0
        for part in (memoryview(self._buf)[self._pos :], *self._more):
            frame[at : at + len(part)] = part
            at += len(part)
        self._buf, self._pos = b"", 0
        self._more.clear()
        self._more_len = 0
        self._frame, self._frame_fill = frame, at

    def _decoded(self, frame: memoryview) -> Message:
        try:
            return _decode(frame)
        except ProtocolError:
            self._failed = True
            raise

    def _short(self, avail: int) -> Any:
        if not self._eof:
            return NEED_DATA
        if avail:
            self._failed = True
            raise ProtocolError(f"stream ended inside a frame ({avail} bytes left)")
        return CLOSED

    @staticmethod
    def send(msg: Message) -> list[bytes | memoryview]:
        return encode(msg)
