"""Kafka's record formats for committed offsets in ``__consumer_offsets``.

Stratalog writes what Kafka's group coordinator writes, so Kafka's own readers (and tools that
tail the topic) decode Stratalog's records:

* key: ``OffsetCommitKey`` with record type 1: int16 1, then group, topic (int16-length UTF-8
  strings) and partition (int32);
* value: ``OffsetCommitValue`` version 3: int16 3, offset (int64), leader epoch (int32),
  metadata (string; a null metadata is stored as ""), commit timestamp (int64); a null value
  (tombstone) deletes the key.

Version 3 is the newest non-flexible value, decoded by Kafka's readers since 2.1 and by tools
that tail the topic; Kafka 4.4 itself writes version 4 (flexible, with the topic id in a tagged
field, which readers from before KIP-915 cannot decode). :func:`decode_value` reads 0-4.

The partition of a group is Kafka's: ``abs(groupId.hashCode()) % n``, Java's String.hashCode over
UTF-16 code units.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

OFFSETS_TOPIC = "__consumer_offsets"
KEY_VERSION = 1  # the record type of OffsetCommitKey (0 is the legacy spelling of the same)
VALUE_VERSION = 3

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")


@dataclass(frozen=True, slots=True)
class CommittedOffset:
    offset: int
    leader_epoch: int
    metadata: str | None
    commit_time: int


Key = tuple[str, str, int]  # group, topic, partition


class OffsetRecordError(ValueError):
    """A key or value that is not a well-formed offset commit record."""


def java_string_hashcode(s: str) -> int:
    """Java's ``String.hashCode()``: over UTF-16 code units, as a signed 32-bit int."""
    h = 0
    units = s.encode("utf-16-be", "surrogatepass")
    for i in range(0, len(units), 2):
        h = (31 * h + (units[i] << 8 | units[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


def partition_for(group: str, partitions: int) -> int:
    """The offsets topic's partition of ``group``: Kafka's ``Utils.abs(hash) % partitions``
    (whose abs maps Integer.MIN_VALUE to 0, not to itself)."""
    h = java_string_hashcode(group)
    return (0 if h == -(1 << 31) else abs(h)) % partitions


def _string(s: str) -> bytes:
    raw = s.encode()
    if len(raw) > 0x7FFF:
        raise OffsetRecordError(f"string of {len(raw)} bytes does not fit an int16 length")
    return _I16.pack(len(raw)) + raw


def encode_key(group: str, topic: str, partition: int) -> bytes:
    return _I16.pack(KEY_VERSION) + _string(group) + _string(topic) + _I32.pack(partition)


def encode_value(c: CommittedOffset) -> bytes:
    return (
        _I16.pack(VALUE_VERSION)
        + _I64.pack(c.offset)
        + _I32.pack(c.leader_epoch)
        + _string(c.metadata or "")
        + _I64.pack(c.commit_time)
    )


class _Reader:
    __slots__ = ("buf", "pos")

    def __init__(self, buf: bytes) -> None:
        self.buf = buf
        self.pos = 0

    def _take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > len(self.buf):
            raise OffsetRecordError("record ends early")
        out = self.buf[self.pos : self.pos + n]
        self.pos += n
        return out

    def i16(self) -> int:
        return _I16.unpack(self._take(2))[0]

    def i32(self) -> int:
        return _I32.unpack(self._take(4))[0]

    def i64(self) -> int:
        return _I64.unpack(self._take(8))[0]

    def uvarint(self) -> int:
        shift = value = 0
        while True:
            b = self._take(1)[0]
            value |= (b & 0x7F) << shift
            if not b & 0x80:
                return value
            shift += 7
            if shift > 28:
                raise OffsetRecordError("varint too long")

    def string(self) -> str:
        return self._take(self.i16()).decode()

    def compact_string(self) -> str:
        n = self.uvarint() - 1
        if n < 0:
            raise OffsetRecordError("null string where a string is required")
        return self._take(n).decode()

    def skip_tags(self) -> None:
        for _ in range(self.uvarint()):
            self.uvarint()  # tag
            self._take(self.uvarint())


def decode_key(key: bytes | None) -> Key | None:
    """(group, topic, partition) of an offset commit key; None for the topic's other record
    types (group metadata, consumer-group and share-group records)."""
    if key is None or len(key) < 2:
        return None
    r = _Reader(bytes(key))
    if r.i16() not in (0, 1):
        return None
    try:
        return r.string(), r.string(), r.i32()
    except UnicodeDecodeError as e:
        raise OffsetRecordError(str(e)) from None


def decode_value(value: bytes | None) -> CommittedOffset | None:
    """An offset commit value of any version Kafka writes (0-4); None for a tombstone."""
    if value is None:
        return None
    r = _Reader(bytes(value))
    version = r.i16()
    try:
        if version in (0, 1, 2):
            offset, metadata, stamp = r.i64(), r.string(), r.i64()
            return CommittedOffset(offset, -1, metadata, stamp)
        if version == 3:
            return CommittedOffset(r.i64(), r.i32(), r.string(), r.i64())
        if version == 4:
            c = CommittedOffset(r.i64(), r.i32(), r.compact_string(), r.i64())
            r.skip_tags()
            return c
    except UnicodeDecodeError as e:
        raise OffsetRecordError(str(e)) from None
    raise OffsetRecordError(f"unknown offset commit value version {version}")
