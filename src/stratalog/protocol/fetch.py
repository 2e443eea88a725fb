"""Fetch responses, encoded by hand around the stored batches so they are never copied here.

The encoder returns a list of parts: small ``bytes`` for the framing it writes, and the record
parts exactly as storage handed them over (memory views of cached chunks, or file slices the
transport sends with ``sendfile``). The length prefix is computed from the parts' sizes.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

from stratalog.protocol.wire import I16, I32, I64, TAGS_NONE, array_len, bytes_len, string


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
) -> tuple[list[Any], int]:
    """Return (parts, total size) of the whole response frame, length prefix included."""
    flexible = version >= 12
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
            if read_committed or p.error_code:
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
                cur += TAGS_NONE
        if flexible:
            cur += TAGS_NONE
    if flexible:
        cur += TAGS_NONE
    if cur:
        parts.append(bytes(cur))
    total = sum(part_size(p) for p in parts)
    first = bytearray(parts[0])
    I32.pack_into(first, 0, total - 4)
    parts[0] = bytes(first)
    return parts, total
