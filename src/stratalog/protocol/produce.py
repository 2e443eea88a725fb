"""Produce responses, encoded by hand: they are the most frequent response on a busy broker.

From v10 a partition answered NOT_LEADER_OR_FOLLOWER may carry its current leader (id and
epoch) and the response the leaders' endpoints (KIP-951), so a producer retries at the new
leader without a Metadata round trip; both are tagged fields, written only when set.
"""

from __future__ import annotations

from dataclasses import dataclass

from stratalog.protocol.wire import (
    I16,
    I32,
    I64,
    TAGS_NONE,
    array_len,
    endpoints_tag,
    leader_tag,
    nullable_string,
    string,
)


@dataclass(slots=True)
class PartitionProduceResult:
    index: int
    error_code: int = 0
    base_offset: int = -1
    log_append_time: int = -1
    log_start_offset: int = -1
    error_message: str | None = None
    current_leader: tuple[int, int] | None = None  # (leader id, leader epoch), KIP-951


def encode_produce_response(
    version: int,
    correlation_id: int,
    topics: list[tuple[str, list[PartitionProduceResult]]],
    throttle_ms: int = 0,
    node_endpoints: list[tuple[int, str, int]] | None = None,
) -> bytes:
    """``node_endpoints``: (node id, host, port) of the leaders named in partitions'
    ``current_leader`` (v10+)."""
    flexible = version >= 9
    hints = version >= 10
    out = bytearray(b"\x00\x00\x00\x00")
    out += I32.pack(correlation_id)
    if flexible:
        out += TAGS_NONE
    out += array_len(len(topics), flexible)
    for name, parts in topics:
        out += string(name, flexible)
        out += array_len(len(parts), flexible)
        for p in parts:
            out += I32.pack(p.index)
            out += I16.pack(p.error_code)
            out += I64.pack(p.base_offset)
            out += I64.pack(p.log_append_time)
            if version >= 5:
                out += I64.pack(p.log_start_offset)
            if version >= 8:
                out += array_len(0, flexible)  # record errors
                out += nullable_string(p.error_message, flexible)
            if hints and p.current_leader is not None:
                out += b"\x01" + leader_tag(0, *p.current_leader)
            elif flexible:
                out += TAGS_NONE
        if flexible:
            out += TAGS_NONE
    out += I32.pack(throttle_ms)
    if hints and node_endpoints:
        out += b"\x01" + endpoints_tag(0, node_endpoints)
    elif flexible:
        out += TAGS_NONE
    I32.pack_into(out, 0, len(out) - 4)
    return bytes(out)
