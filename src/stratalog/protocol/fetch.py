"""Fetch responses, encoded by hand around the stored batches so they are never copied here.

The encoder returns a list of parts: small ``bytes`` for the framing it writes, and the record
parts exactly as storage handed them over (memory views of cached chunks, or file slices the
transport sends with ``sendfile``). The length prefix is computed from the parts' sizes.
From v16 a partition answered NOT_LEADER_OR_FOLLOWER may carry its current leader and the
response the leaders' endpoints (KIP-951), as tagged fields written only when set.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

from stratalog.protocol.wire import (
    I16,
    I32,
    I64,
    TAGS_NONE,
    array_len,
    bytes_len,
    endpoints_tag,
    leader_tag,
    string,
    uvarint,
)
from stratalog.splits import ORDER_TAG, decode_marks


@dataclass(slots=True)
class PartitionFetchResult:
    index: int
    error_code: int = 0
    high_watermark: int = -1
    last_stable_offset: int = -1
    log_start_offset: int = -1
    records: list[Any] = field(default_factory=list)  # bytes | memoryview | FileSlice
    records_size: int = 0
    null_records: bool = False
    current_leader: tuple[int, int] | None = None  # (leader id, leader epoch), KIP-951
    # (producer id, first offset) of the aborted transactions the records overlap
    aborted: list[tuple[int, int]] | None = None
    order: bytes | None = None  # a split child's order marks (stratalog.splits), v12+


def part_size(p: Any) -> int:
    return p.size if hasattr(p, "segment") else len(p)


def encode_fetch_response(
    version: int,
    correlation_id: int,
    topics: list[tuple[str, uuid.UUID | None, list[PartitionFetchResult]]],
    *,
    error_code: int = 0,
    session_id: int = 0,
    throttle_ms: int = 0,
    read_committed: bool = False,
    node_endpoints: list[tuple[int, str, int]] | None = None,
) -> tuple[list[Any], int]:
    """Return (parts, total size) of the whole response frame, length prefix included.
    ``node_endpoints``: (node id, host, port) of the leaders named in ``current_leader`` (v16+)."""
    flexible = version >= 12
    hints = version >= 16
    parts: list[Any] = []
    head = bytearray(b"\x00\x00\x00\x00")
    head += I32.pack(correlation_id)
    if flexible:
        head += TAGS_NONE
    head += I32.pack(throttle_ms)
    if version >= 7:
        head += I16.pack(error_code)
        head += I32.pack(session_id)
    head += array_len(len(topics), flexible)
    cur = head
    for name, topic_id, partitions in topics:
        if version >= 13:
            cur += (topic_id or uuid.UUID(int=0)).bytes
        else:
            cur += string(name, flexible)
        cur += array_len(len(partitions), flexible)
        for p in partitions:
            cur += I32.pack(p.index)
            cur += I16.pack(p.error_code)
            cur += I64.pack(p.high_watermark)
            cur += I64.pack(p.last_stable_offset)
            if version >= 5:
                cur += I64.pack(p.log_start_offset)
            # Aborted transactions: null unless the consumer reads committed data.
            if p.aborted:
                cur += array_len(len(p.aborted), flexible)
                for producer_id, first_offset in p.aborted:
                    cur += I64.pack(producer_id) + I64.pack(first_offset)
                    if flexible:
                        cur += TAGS_NONE
            elif read_committed or p.error_code:
                cur += array_len(0, flexible)
            else:
                cur += b"\x00" if flexible else I32.pack(-1)
            if version >= 11:
                cur += I32.pack(-1)  # preferred read replica
            if p.null_records:
                cur += bytes_len(None, flexible)
            else:
                cur += bytes_len(p.records_size, flexible)
            if p.records:
                parts.append(bytes(cur))
                parts.extend(p.records)
                cur = bytearray()
            if flexible:
                leader = hints and p.current_leader is not None
                order = p.order is not None
                cur += uvarint(leader + order)
                if leader:
                    cur += leader_tag(1, *p.current_leader)
                if order:
                    cur += uvarint(ORDER_TAG) + uvarint(len(p.order)) + p.order
        if flexible:
            cur += TAGS_NONE
    if hints and node_endpoints:
        cur += b"\x01" + endpoints_tag(0, node_endpoints)
    elif flexible:
        cur += TAGS_NONE
    if cur:
        parts.append(bytes(cur))
    total = sum(part_size(p) for p in parts)
    first = bytearray(parts[0])
    I32.pack_into(first, 0, total - 4)
    parts[0] = bytes(first)
    return parts, total


@dataclass(slots=True)
class FetchedPartition:
    """One partition of a decoded Fetch response; ``records`` is a view into the frame."""

    index: int
    error_code: int
    high_watermark: int
    last_stable_offset: int
    log_start_offset: int
    aborted: list[tuple[int, int]] | None
    records: memoryview | None
    order: list[tuple[int, int]] | None = None  # a split child's order marks (splits.py)


@dataclass(slots=True)
class FetchResponse:
    correlation_id: int
    error_code: int
    throttle_ms: int
    topics: list[tuple[str | uuid.UUID, list[FetchedPartition]]]


class _Reader:
    """Reads Kafka primitives from a frame; records stay views into it (never copied here)."""

    __slots__ = ("buf", "pos")

    def __init__(self, buf: memoryview) -> None:
        self.buf = buf
        self.pos = 0

    def take(self, n: int) -> memoryview:
        if n < 0 or self.pos + n > len(self.buf):
            raise ValueError(f"Fetch response truncated at byte {self.pos} (needs {n} more)")
        v = self.buf[self.pos : self.pos + n]
        self.pos += n
        return v

    def fixed(self, s) -> int:
        return s.unpack(self.take(s.size))[0]

    def uvarint(self) -> int:
        n = shift = 0
        while True:
            b = self.take(1)[0]
            n |= (b & 0x7F) << shift
            if not b & 0x80:
                return n
            shift += 7
            if shift > 35:
                raise ValueError(f"Fetch response has an overlong varint at byte {self.pos}")

    def length(self, flexible: bool, wide: bool = False) -> int:
        """An array, string or bytes length; -1 for null."""
        if flexible:
            return self.uvarint() - 1
        return self.fixed(I32 if wide else I16)

    def skip_tags(self) -> None:
        for _ in range(self.uvarint()):
            self.uvarint()  # tag
            self.take(self.uvarint())


def decode_fetch_response(version: int, frame: memoryview) -> FetchResponse:
    """A Fetch response frame (without its length prefix), versions 4 to 16.

    The client's counterpart of encode_fetch_response: by hand rather than through the codec so
    that megabytes of records are handed on as views of the frame instead of copied.
    """
    if not 4 <= version <= 16:
        raise ValueError(f"Fetch response version {version} is not supported here")
    flexible = version >= 12
    r = _Reader(memoryview(frame))
    correlation_id = r.fixed(I32)
    if flexible:
        r.skip_tags()
    throttle_ms = r.fixed(I32)
    error_code = 0
    if version >= 7:
        error_code = r.fixed(I16)
        r.fixed(I32)  # session id
    topics: list[tuple[str | uuid.UUID, list[FetchedPartition]]] = []
    for _ in range(max(0, r.length(flexible, wide=True))):
        if version >= 13:
            topic: str | uuid.UUID = uuid.UUID(bytes=bytes(r.take(16)))
        else:
            topic = bytes(r.take(r.length(flexible))).decode()
        parts = []
        for _ in range(max(0, r.length(flexible, wide=True))):
            index, perr = r.fixed(I32), r.fixed(I16)
            hw, lso = r.fixed(I64), r.fixed(I64)
            log_start = r.fixed(I64) if version >= 5 else -1
            n_aborted = r.length(flexible, wide=True)
            aborted = None if n_aborted < 0 else []
            for _ in range(max(0, n_aborted)):
                aborted.append((r.fixed(I64), r.fixed(I64)))
                if flexible:
                    r.skip_tags()
            if version >= 11:
                r.fixed(I32)  # preferred read replica
            size = r.length(flexible, wide=True)
            records = None if size < 0 else r.take(size)
            order = None
            if flexible:
                for _ in range(r.uvarint()):
                    tag, data = r.uvarint(), r.take(r.uvarint())
                    if tag == ORDER_TAG:
                        order = decode_marks(data)
            parts.append(FetchedPartition(index, perr, hw, lso, log_start, aborted, records, order))
        if flexible:
            r.skip_tags()
        topics.append((topic, parts))
    if flexible:
        r.skip_tags()
    if r.pos != len(r.buf):
        raise ValueError(f"Fetch response has {len(r.buf) - r.pos} bytes after its last field")
    return FetchResponse(correlation_id, error_code, throttle_ms, topics)
