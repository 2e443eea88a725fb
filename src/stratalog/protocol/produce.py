"""Produce responses, encoded by hand: they are the most frequent response on a busy broker."""

from __future__ import annotations

from dataclasses import dataclass

from stratalog.protocol.wire import I16, I32, I64, TAGS_NONE, array_len, nullable_string, string


@dataclass(slots=True)
class PartitionProduceResult:
    index: int
    error_code: int = 0
    base_offset: int = -1
    log_append_time: int = -1
    log_start_offset: int = -1
    error_message: str | None = None


def encode_produce_response(
    version: int,
    correlation_id: int,
    topics: list[tuple[str, list[PartitionProduceResult]]],
    throttle_ms: int = 0,
) -> bytes:
    flexible = version >= 9
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
            if flexible:
                out += TAGS_NONE
        if flexible:
            out += TAGS_NONE
    out += I32.pack(throttle_ms)
    if flexible:
        out += TAGS_NONE
    I32.pack_into(out, 0, len(out) - 4)
    return bytes(out)
