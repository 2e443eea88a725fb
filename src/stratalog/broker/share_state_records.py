"""Kafka's record formats for share-group state in ``__share_group_state`` (KIP-932's share
coordinator), so Kafka's readers of the topic decode what Stratalog writes:

* key: ``ShareSnapshotKey``, record type 0: int16 0, then group (int16-length string), topic id
  (16 bytes) and partition (int32);
* value: ``ShareSnapshotValue`` version 0 (flexible): int16 0, snapshot epoch (uint16), state
  epoch (int32), leader epoch (int32), start offset (int64), then the state batches as a compact
  array of (first offset int64, last offset int64, delivery state int8, delivery count int16),
  each and the value ending in an empty tagged-field section.

Stratalog writes every change of a share-partition as a whole snapshot (no ``ShareUpdate``
deltas, record type 1): the last record of a key is its state, as in the other internal topics.
The delivery states are Kafka's: 0 available, 2 acknowledged, 4 archived; a record acquired
when the state was written is written as available with its delivery count, so that after a
crash it is delivered again and counted.

A key's partition is Kafka's: ``abs(hash("group:topicId:partition")) % partitions``, with the
topic id in Kafka's spelling (URL-safe base64 without padding).
"""

from __future__ import annotations

import base64
import struct
import uuid
from dataclasses import dataclass

from stratalog.broker.offset_records import OffsetRecordError, _Reader, _string
from stratalog.broker.offset_records import partition_for as _hash_partition
from stratalog.protocol.wire import uvarint

SHARE_STATE_TOPIC = "__share_group_state"
SNAPSHOT_KEY = 0  # ShareSnapshotKey's record type
UPDATE_KEY = 1  # ShareUpdateKey's (read for its key only: Stratalog writes snapshots)
VALUE_VERSION = 0

_I8 = struct.Struct(">b")
_U16 = struct.Struct(">H")
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
_BATCH = struct.Struct(">qqbh")

ShareKey = tuple[str, uuid.UUID, int]  # group, topic id, partition

ShareStateError = OffsetRecordError


@dataclass(frozen=True, slots=True)
class StateBatch:
    first_offset: int
    last_offset: int
    delivery_state: int  # 0 available, 2 acknowledged, 4 archived
    delivery_count: int


@dataclass(frozen=True, slots=True)
class ShareState:
    """A share-partition's durable state: its start offset and the in-flight records after it."""

    start_offset: int
    batches: tuple[StateBatch, ...] = ()
    state_epoch: int = 0
    leader_epoch: int = 0
    snapshot_epoch: int = 0


def kafka_uuid(u: uuid.UUID) -> str:
    """A topic id as Kafka's ``Uuid.toString()`` spells it."""
    return base64.urlsafe_b64encode(u.bytes).rstrip(b"=").decode()


def partition_for(key: ShareKey, partitions: int) -> int:
    group, topic_id, partition = key
    return _hash_partition(f"{group}:{kafka_uuid(topic_id)}:{partition}", partitions)


def encode_key(key: ShareKey) -> bytes:
    group, topic_id, partition = key
    return _I16.pack(SNAPSHOT_KEY) + _string(group) + topic_id.bytes + _I32.pack(partition)


def encode_value(s: ShareState) -> bytes:
    parts = [
        _I16.pack(VALUE_VERSION),
        _U16.pack(s.snapshot_epoch & 0xFFFF),
        _I32.pack(s.state_epoch),
        _I32.pack(s.leader_epoch),
        _I64.pack(s.start_offset),
        uvarint(len(s.batches) + 1),
    ]
    for b in s.batches:
        parts.append(_BATCH.pack(b.first_offset, b.last_offset, b.delivery_state,
                                 min(b.delivery_count, 0x7FFF)) + b"\x00")  # fmt: skip
    parts.append(b"\x00")
    return b"".join(parts)


def decode_key(key: bytes | None) -> ShareKey | None:
    """(group, topic id, partition) of a snapshot key; None for another record type (an update,
    which Stratalog never writes, is skipped too: its value is a delta, not a state)."""
    if key is None or len(key) < 2:
        return None
    r = _Reader(bytes(key))
    if r.i16() != SNAPSHOT_KEY:
        return None
    try:
        return r.string(), uuid.UUID(bytes=r._take(16)), r.i32()
    except UnicodeDecodeError as e:
        raise ShareStateError(str(e)) from None


def decode_value(value: bytes | None) -> ShareState | None:
    """A ShareSnapshotValue of version 0; None for a tombstone (the state was deleted)."""
    if value is None:
        return None
    r = _Reader(bytes(value))
    version = r.i16()
    if version != VALUE_VERSION:
        raise ShareStateError(f"unknown share snapshot value version {version}")
    snapshot_epoch = _U16.unpack(r._take(2))[0]
    state_epoch, leader_epoch, start = r.i32(), r.i32(), r.i64()
    n = r.uvarint() - 1
    batches = []
    for _ in range(max(n, 0)):
        first, last, state, count = _BATCH.unpack(r._take(_BATCH.size))
        if last < first or state not in (0, 2, 4):
            raise ShareStateError(f"bad state batch {first}-{last} state {state}")
        batches.append(StateBatch(first, last, state, count))
        r.skip_tags()
    r.skip_tags()
    return ShareState(start, tuple(batches), state_epoch, leader_epoch, snapshot_epoch)
