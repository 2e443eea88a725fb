"""Kafka's group metadata records in ``__consumer_offsets``: a classic group's membership.

Kafka's group coordinator writes one whenever a classic group's generation is settled (the
leader's SyncGroup stored the assignment) or the group is emptied, and a tombstone when it is
deleted; a coordinator that loads the partition (a restart, a new coordinator in a cluster)
takes the group back with its members, so they go on heartbeating instead of rejoining.
Stratalog writes and reads the same records:

* key: ``GroupMetadataKey``, record type 2: int16 2, then the group (int16-length string);
* value: ``GroupMetadataValue`` version 3: protocol type, generation, protocol and leader
  (nullable), the state's timestamp, and per member its id, group instance id (nullable), client
  id and host, rebalance and session timeouts, subscription and assignment (int32-length bytes).

Version 3 is the newest non-flexible value; :func:`decode_group_value` reads 0-4.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import NamedTuple

from stratalog.broker.offset_records import OffsetRecordError, _Reader, _string

GROUP_KEY_VERSION = 2
GROUP_VALUE_VERSION = 3

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")


class GroupKey(NamedTuple):
    """The key of a group's metadata record (beside offset keys: (group, topic, partition))."""

    group: str


@dataclass(frozen=True, slots=True)
class MemberRecord:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    rebalance_timeout_ms: int
    session_timeout_ms: int
    subscription: bytes
    assignment: bytes


@dataclass(frozen=True, slots=True)
class GroupRecord:
    protocol_type: str
    generation: int
    protocol: str | None
    leader: str | None
    state_time_ms: int
    members: tuple[MemberRecord, ...]


def _nullable(s: str | None) -> bytes:
    return _I16.pack(-1) if s is None else _string(s)


def _bytes(b: bytes) -> bytes:
    return _I32.pack(len(b)) + b


def encode_group_key(group: str) -> bytes:
    return _I16.pack(GROUP_KEY_VERSION) + _string(group)


def encode_group_value(g: GroupRecord) -> bytes:
    out = bytearray(_I16.pack(GROUP_VALUE_VERSION))
    out += _string(g.protocol_type) + _I32.pack(g.generation)
    out += _nullable(g.protocol) + _nullable(g.leader) + _I64.pack(g.state_time_ms)
    out += _I32.pack(len(g.members))
    for m in g.members:
        out += _string(m.member_id) + _nullable(m.group_instance_id)
        out += _string(m.client_id) + _string(m.client_host)
        out += _I32.pack(m.rebalance_timeout_ms) + _I32.pack(m.session_timeout_ms)
        out += _bytes(m.subscription) + _bytes(m.assignment)
    return bytes(out)


def decode_group_key(key: bytes | None) -> str | None:
    """The group of a group metadata key; None for the topic's other record types."""
    if key is None or len(key) < 2:
        return None
    r = _Reader(bytes(key))
    if r.i16() != GROUP_KEY_VERSION:
        return None
    try:
        return r.string()
    except UnicodeDecodeError as e:
        raise OffsetRecordError(str(e)) from None


class _Fields:
    """Strings, nullable strings, bytes and arrays of one value version (4: flexible)."""

    def __init__(self, r: _Reader, flexible: bool) -> None:
        self.r = r
        self.flexible = flexible

    def _len(self, wide: bool = False) -> int:
        if self.flexible:
            return self.r.uvarint() - 1
        return self.r.i32() if wide else self.r.i16()

    def string(self) -> str:
        s = self.nullable()
        if s is None:
            raise OffsetRecordError("null string where a string is required")
        return s

    def nullable(self) -> str | None:
        n = self._len()
        return None if n < 0 else self.r._take(n).decode()

    def bytes(self) -> bytes:
        n = self._len(wide=True)
        return b"" if n < 0 else self.r._take(n)

    def count(self) -> int:
        return max(0, self._len(wide=True))

    def end_struct(self) -> None:
        if self.flexible:
            self.r.skip_tags()


def decode_group_value(value: bytes | None) -> GroupRecord | None:
    """A group metadata value of any version Kafka writes (0-4); None for a tombstone."""
    if value is None:
        return None
    r = _Reader(bytes(value))
    version = r.i16()
    if not 0 <= version <= 4:
        raise OffsetRecordError(f"unknown group metadata value version {version}")
    f = _Fields(r, version >= 4)
    try:
        protocol_type, generation = f.string(), r.i32()
        protocol, leader = f.nullable(), f.nullable()
        state_time = r.i64() if version >= 2 else -1
        members = []
        for _ in range(f.count()):
            member_id = f.string()
            instance = f.nullable() if version >= 3 else None
            client_id, client_host = f.string(), f.string()
            rebalance = r.i32() if version >= 1 else None
            session = r.i32()
            if rebalance is None:
                rebalance = session  # (version 0 had none: Kafka takes the session timeout)
            subscription, assignment = f.bytes(), f.bytes()
            f.end_struct()
            members.append(
                MemberRecord(
                    member_id,
                    instance,
                    client_id,
                    client_host,
                    rebalance,
                    session,
                    subscription,
                    assignment,
                )
            )
        f.end_struct()
    except UnicodeDecodeError as e:
        raise OffsetRecordError(str(e)) from None
    return GroupRecord(protocol_type, generation, protocol, leader, state_time, tuple(members))
