"""Kafka's record formats for transaction state in ``__transaction_state``.

Stratalog writes what Kafka's transaction coordinator writes, so Kafka's readers (its
``TransactionLogMessageFormatter``) decode Stratalog's records:

* key: ``TransactionLogKey`` version 0: int16 0, then the transactional id (int16-length UTF-8);
* value: ``TransactionLogValue`` version 0: int16 0, producer id (int64), producer epoch (int16),
  transaction timeout ms (int32), state (int8), the partitions (int32 count, then per topic a
  string and an int32 array of partition ids), last update and start timestamps (int64); a null
  value (tombstone) deletes the transactional id.

Version 1 (flexible) adds tagged fields for KIP-890's epoch bump on every transaction, which
Stratalog does not do; :func:`decode_value` reads both. The partition of a transactional id is
Kafka's: ``abs(transactionalId.hashCode()) % partitions``.
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass, field

from stratalog.broker.offset_records import OffsetRecordError, _Reader, _string, partition_for

__all__ = ["TRANSACTION_STATE_TOPIC", "TxnRecordError", "TxnState", "TxnValue", "partition_for"]

TRANSACTION_STATE_TOPIC = "__transaction_state"
KEY_VERSION = 0
VALUE_VERSION = 0

_I8 = struct.Struct(">b")
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")

TxnRecordError = OffsetRecordError


class TxnState(enum.IntEnum):
    """Kafka's TransactionState, by the byte it is stored as."""

    EMPTY = 0
    ONGOING = 1
    PREPARE_COMMIT = 2
    PREPARE_ABORT = 3
    COMPLETE_COMMIT = 4
    COMPLETE_ABORT = 5
    DEAD = 6
    PREPARE_EPOCH_FENCE = 7

    @property
    def kafka_name(self) -> str:
        """The name DescribeTransactions and ListTransactions report (Kafka's state names)."""
        return "".join(w.capitalize() for w in self.name.split("_"))


@dataclass(slots=True)
class TxnValue:
    producer_id: int
    producer_epoch: int
    timeout_ms: int
    state: TxnState
    partitions: set[tuple[str, int]] = field(default_factory=set)
    last_update_ms: int = -1
    start_ms: int = -1


def encode_key(transactional_id: str) -> bytes:
    return _I16.pack(KEY_VERSION) + _string(transactional_id)


def encode_value(v: TxnValue) -> bytes:
    by_topic: dict[str, list[int]] = {}
    for topic, index in sorted(v.partitions):
        by_topic.setdefault(topic, []).append(index)
    parts = [_I32.pack(len(by_topic))]
    for topic, indexes in by_topic.items():
        parts.append(_string(topic) + _I32.pack(len(indexes)))
        parts.extend(_I32.pack(i) for i in indexes)
    return (
        _I16.pack(VALUE_VERSION)
        + _I64.pack(v.producer_id)
        + _I16.pack(v.producer_epoch)
        + _I32.pack(v.timeout_ms)
        + _I8.pack(int(v.state))
        + b"".join(parts)
        + _I64.pack(v.last_update_ms)
        + _I64.pack(v.start_ms)
    )


def decode_key(key: bytes | None) -> str | None:
    """The transactional id of a transaction log key (None: not a key of this log)."""
    if key is None or len(key) < 2:
        return None
    r = _Reader(bytes(key))
    if r.i16() != KEY_VERSION:
        return None
    try:
        return r.string()
    except UnicodeDecodeError as e:
        raise TxnRecordError(str(e)) from None


def decode_value(value: bytes | None) -> TxnValue | None:
    """A transaction log value of version 0 or 1; None for a tombstone."""
    if value is None:
        return None
    r = _Reader(bytes(value))
    version = r.i16()
    if version not in (0, 1):
        raise TxnRecordError(f"unknown transaction log value version {version}")
    flexible = version >= 1
    try:
        pid = r.i64()
        epoch = r.i16()
        timeout = r.i32()
        state = TxnState(_I8.unpack(r._take(1))[0])
        n = (r.uvarint() - 1) if flexible else r.i32()
        partitions: set[tuple[str, int]] = set()
        for _ in range(max(n, 0)):
            topic = r.compact_string() if flexible else r.string()
            k = (r.uvarint() - 1) if flexible else r.i32()
            for _ in range(max(k, 0)):
                partitions.add((topic, r.i32()))
            if flexible:
                r.skip_tags()
        last_update = r.i64()
        start = r.i64()
        if flexible:
            r.skip_tags()
    except (UnicodeDecodeError, ValueError) as e:
        raise TxnRecordError(str(e)) from None
    return TxnValue(pid, epoch, timeout, state, partitions, last_update, start)
