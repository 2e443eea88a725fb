"""Kafka's records of the modern groups in ``__consumer_offsets``: consumer-protocol groups
(KIP-848) and share groups (KIP-932).

Kafka's group coordinator keeps such a group as several records, each the latest of its key, so
that a coordinator that loads the partition (a restart, a new coordinator in a cluster) has the
group back with its members, their epochs and assignments: they go on heartbeating instead of
rejoining. Stratalog writes and reads the same records (keys are not flexible: int16 record type,
then int16-length strings; values are version 0, flexible: compact strings and arrays, an empty
tagged-field section after each struct):

* type 3, ``ConsumerGroupMetadata`` (group): the group epoch;
* type 5, ``ConsumerGroupMemberMetadata`` (group, member): instance and rack ids, client id and
  host, subscribed topic names and regular expression, rebalance timeout, server assignor;
* type 6, ``ConsumerGroupTargetAssignmentMetadata`` (group): the assignment epoch;
* type 7, ``ConsumerGroupTargetAssignmentMember`` (group, member): the member's target, as
  (topic id, partitions);
* type 8, ``ConsumerGroupCurrentMemberAssignment`` (group, member): member epoch, previous
  epoch, state (Kafka's MemberState byte: 0 stable, 1 unrevoked, 2 unreleased partitions), the
  assigned partitions and those pending revocation.

A share group's records are the same in kind: type 11, ``ShareGroupMetadata`` (the group epoch
and a hash of the subscribed topics' metadata, written 0: Kafka computes it again), type 10,
``ShareGroupMemberMetadata`` (rack id, client id and host, subscribed topic names), type 12, the
assignment epoch (its timestamp, a tagged field, not written), type 13, a member's target, type
14, a member's epochs, state and assigned partitions. Type 15 (which share-partitions Kafka's
share coordinator initialized) is not written: Stratalog's share-partition state is its own
(``share_state.py``).

Type 4 (``ConsumerGroupPartitionMetadata``, the subscribed topics' sizes) is neither written nor
needed: they are the broker's topics, read again at load. A null value (tombstone) deletes a key:
a member that left, a deleted group.
"""

from __future__ import annotations

import struct
import uuid
from dataclasses import dataclass
from typing import Any, NamedTuple

from stratalog.broker.assignors import Assignment
from stratalog.broker.offset_records import OffsetRecordError, _Reader, _string
from stratalog.broker.reconciliation import M_STABLE, M_UNRELEASED, M_UNREVOKED
from stratalog.protocol.wire import uvarint

METADATA = 3
MEMBER = 5
TARGET_METADATA = 6
TARGET_MEMBER = 7
CURRENT = 8
SHARE_MEMBER = 10
SHARE_METADATA = 11
SHARE_TARGET_METADATA = 12
SHARE_TARGET_MEMBER = 13
SHARE_CURRENT = 14
_PER_MEMBER = (MEMBER, TARGET_MEMBER, CURRENT, SHARE_MEMBER, SHARE_TARGET_MEMBER, SHARE_CURRENT)
# 4 and 15: read for their keys, their values skipped
TYPES = (METADATA, 4, MEMBER, TARGET_METADATA, TARGET_MEMBER, CURRENT, *range(10, 16))
_EPOCHS = (METADATA, TARGET_METADATA, SHARE_TARGET_METADATA)
CONSUMER_KINDS = frozenset({METADATA, 4, MEMBER, TARGET_METADATA, TARGET_MEMBER, CURRENT})
SHARE_KINDS = frozenset(range(10, 16))
_UNWRITTEN = object()  # no record's value: such a key is written again (or deleted) next time

_STATES = {M_STABLE: 0, M_UNREVOKED: 1, M_UNRELEASED: 2}
_STATE_NAMES = {v: k for k, v in _STATES.items()}

_I8 = struct.Struct(">b")
_I64 = struct.Struct(">q")
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")


class ModernGroupKey(NamedTuple):
    """A record's key: the group first (it picks the offsets partition), the record type, and
    the member for the per-member types ("" for the group's)."""

    group: str
    kind: int
    member: str = ""


@dataclass(frozen=True, slots=True)
class MemberMetadata:
    instance_id: str | None
    rack_id: str | None
    client_id: str
    client_host: str
    subscribed_topic_names: tuple[str, ...]
    subscribed_topic_regex: str | None
    rebalance_timeout_ms: int
    server_assignor: str | None


@dataclass(frozen=True, slots=True)
class CurrentAssignment:
    epoch: int
    previous_epoch: int
    state: str  # reconciliation's member state names
    assigned: tuple[tuple[uuid.UUID, tuple[int, ...]], ...]
    pending_revocation: tuple[tuple[uuid.UUID, tuple[int, ...]], ...]


@dataclass(frozen=True, slots=True)
class ShareMemberMetadata:
    rack_id: str | None
    client_id: str
    client_host: str
    subscribed_topic_names: tuple[str, ...]


# The value of each type: an epoch (3, 6, 11, 12), MemberMetadata (5), ShareMemberMetadata (10),
# an assignment (7, 13), or CurrentAssignment (8, 14: no revocation in share groups); None
# deletes the key.
Value = int | MemberMetadata | ShareMemberMetadata | tuple | CurrentAssignment | None


def frozen(a: Assignment) -> tuple[tuple[uuid.UUID, tuple[int, ...]], ...]:
    """An assignment as a value (sorted: equal assignments give equal records)."""
    return tuple((t, tuple(sorted(ps))) for t, ps in sorted(a.items(), key=lambda x: str(x[0])))


def thawed(a: tuple[tuple[uuid.UUID, tuple[int, ...]], ...]) -> Assignment:
    return {t: frozenset(ps) for t, ps in a}


class Written:
    """The records of each group as last handed out to be written (what the offsets topic
    holds), to tell what a change of the group changed."""

    def __init__(self) -> None:
        self._by_group: dict[str, dict[ModernGroupKey, Any]] = {}

    def changes(
        self, group_id: str, now: dict[ModernGroupKey, Value]
    ) -> list[tuple[ModernGroupKey, Value]]:
        """The records of ``now`` that differ from the last ones, and tombstones (None) for
        those gone; from then on ``now`` counts as written."""
        before = self._by_group.get(group_id, {})
        out = [(k, v) for k, v in now.items() if before.get(k) != v]
        out += [(k, None) for k in before if k not in now]
        self.settle(group_id, now)
        return out

    def unwritten(self, group_id: str, changes: list[tuple[ModernGroupKey, Value]]) -> None:
        """The write of ``changes`` failed: each of their keys is written again, or deleted, at
        the next change, whatever the log holds of it now."""
        held = self._by_group.setdefault(group_id, {})
        for k, _v in changes:
            held[k] = _UNWRITTEN

    def drop(self, group_id: str) -> None:
        """Forget the group (another coordinator wrote it since: loaded again when needed)."""
        self._by_group.pop(group_id, None)

    def settle(self, group_id: str, now: dict[ModernGroupKey, Any]) -> None:
        """``now`` is what the offsets topic holds of the group (as loaded)."""
        if now:
            self._by_group[group_id] = now
        else:
            self._by_group.pop(group_id, None)


def by_group(
    records: dict[ModernGroupKey, Value], kinds: frozenset[int]
) -> dict[str, dict[ModernGroupKey, Value]]:
    """The records of ``kinds`` (one type of group), by group."""
    out: dict[str, dict[ModernGroupKey, Value]] = {}
    for k, v in records.items():
        if k.kind in kinds:
            out.setdefault(k.group, {})[k] = v
    return out


# -- encoding ----------------------------------------------------------------------------------
def encode_key(k: ModernGroupKey) -> bytes:
    member = _string(k.member) if k.kind in _PER_MEMBER else b""
    return _I16.pack(k.kind) + _string(k.group) + member


def _cstr(s: str | None) -> bytes:
    if s is None:
        return b"\x00"
    raw = s.encode()
    return uvarint(len(raw) + 1) + raw


def _topic_partitions(a: tuple[tuple[uuid.UUID, tuple[int, ...]], ...]) -> bytes:
    out = [uvarint(len(a) + 1)]
    for t, ps in a:
        out += [t.bytes, uvarint(len(ps) + 1), *(_I32.pack(p) for p in ps), b"\x00"]
    return b"".join(out)


def encode_value(k: ModernGroupKey, v: Value) -> bytes:
    head = _I16.pack(0)
    if k.kind in _EPOCHS:
        assert isinstance(v, int)
        return head + _I32.pack(v) + b"\x00"
    if k.kind == SHARE_METADATA:
        assert isinstance(v, int)
        return head + _I32.pack(v) + _I64.pack(0) + b"\x00"
    if k.kind == SHARE_MEMBER:
        assert isinstance(v, ShareMemberMetadata)
        names = [uvarint(len(v.subscribed_topic_names) + 1)]
        names += [_cstr(n) for n in v.subscribed_topic_names]
        return b"".join([head, _cstr(v.rack_id), _cstr(v.client_id), _cstr(v.client_host),
                         *names, b"\x00"])  # fmt: skip
    if k.kind == SHARE_CURRENT:
        assert isinstance(v, CurrentAssignment)
        return b"".join([
            head, _I32.pack(v.epoch), _I32.pack(v.previous_epoch), _I8.pack(_STATES[v.state]),
            _topic_partitions(v.assigned), b"\x00",
        ])  # fmt: skip
    if k.kind == MEMBER:
        assert isinstance(v, MemberMetadata)
        names = [uvarint(len(v.subscribed_topic_names) + 1)]
        names += [_cstr(n) for n in v.subscribed_topic_names]
        return b"".join([
            head, _cstr(v.instance_id), _cstr(v.rack_id), _cstr(v.client_id),
            _cstr(v.client_host), *names, _cstr(v.subscribed_topic_regex),
            _I32.pack(v.rebalance_timeout_ms), _cstr(v.server_assignor), b"\x00",
        ])  # fmt: skip
    if k.kind in (TARGET_MEMBER, SHARE_TARGET_MEMBER):
        assert isinstance(v, tuple)
        return head + _topic_partitions(v) + b"\x00"
    if k.kind == CURRENT:
        assert isinstance(v, CurrentAssignment)
        return b"".join([
            head, _I32.pack(v.epoch), _I32.pack(v.previous_epoch), _I8.pack(_STATES[v.state]),
            _topic_partitions(v.assigned), _topic_partitions(v.pending_revocation), b"\x00",
        ])  # fmt: skip
    raise OffsetRecordError(f"no value of record type {k.kind} is written")


# -- decoding ----------------------------------------------------------------------------------
def decode_key(raw: bytes | None) -> ModernGroupKey | None:
    """The key of a consumer-protocol group's record; None for another record type."""
    if raw is None or len(raw) < 2:
        return None
    r = _Reader(bytes(raw))
    kind = r.i16()
    if kind not in TYPES:
        return None
    try:
        group = r.string()
        member = r.string() if kind in _PER_MEMBER else ""
    except UnicodeDecodeError as e:
        raise OffsetRecordError(str(e)) from None
    return ModernGroupKey(group, kind, member)


def _nullable(r: _Reader) -> str | None:
    n = r.uvarint() - 1
    return None if n < 0 else r._take(n).decode()


def _read_topic_partitions(r: _Reader) -> tuple[tuple[uuid.UUID, tuple[int, ...]], ...]:
    out = []
    for _ in range(max(r.uvarint() - 1, 0)):
        t = uuid.UUID(bytes=r._take(16))
        ps = tuple(r.i32() for _ in range(max(r.uvarint() - 1, 0)))
        r.skip_tags()
        out.append((t, ps))
    return tuple(out)


def decode_value(k: ModernGroupKey, raw: bytes | None) -> Value:
    """The value of ``k``'s record (version 0; later versions only add tagged fields, which
    are skipped); None for a tombstone or a type 4 or 15 record (not used)."""
    if raw is None or k.kind in (4, 15):
        return None
    r = _Reader(bytes(raw))
    version = r.i16()
    if version < 0:
        raise OffsetRecordError(f"bad value version {version} of record type {k.kind}")
    try:
        if k.kind in _EPOCHS:
            out: Value = r.i32()
        elif k.kind == SHARE_METADATA:
            out = r.i32()
            r.i64()  # the metadata hash: computed again
        elif k.kind == SHARE_MEMBER:
            rack, client_id, host = _nullable(r), r.compact_string(), r.compact_string()
            names = tuple(r.compact_string() for _ in range(max(r.uvarint() - 1, 0)))
            out = ShareMemberMetadata(rack, client_id, host, names)
        elif k.kind == SHARE_CURRENT:
            epoch, previous = r.i32(), r.i32()
            state = _STATE_NAMES.get(_I8.unpack(r._take(1))[0], M_STABLE)
            out = CurrentAssignment(epoch, previous, state, _read_topic_partitions(r), ())
        elif k.kind == MEMBER:
            instance, rack = _nullable(r), _nullable(r)
            client_id, host = r.compact_string(), r.compact_string()
            names = tuple(r.compact_string() for _ in range(max(r.uvarint() - 1, 0)))
            regex = _nullable(r)
            timeout = r.i32()
            out = MemberMetadata(instance, rack, client_id, host, names, regex, timeout,
                                 _nullable(r))  # fmt: skip
        elif k.kind in (TARGET_MEMBER, SHARE_TARGET_MEMBER):
            out = _read_topic_partitions(r)
        else:
            epoch, previous = r.i32(), r.i32()
            state = _STATE_NAMES.get(_I8.unpack(r._take(1))[0], M_STABLE)
            assigned = _read_topic_partitions(r)
            out = CurrentAssignment(epoch, previous, state, assigned, _read_topic_partitions(r))
        r.skip_tags()
    except UnicodeDecodeError as e:
        raise OffsetRecordError(str(e)) from None
    return out
