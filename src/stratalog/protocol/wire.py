"""Primitive encoders for the hand-written hot-path responses (Produce, Fetch)."""

from __future__ import annotations

import struct

I16 = struct.Struct(">h")
I32 = struct.Struct(">i")
I64 = struct.Struct(">q")


def uvarint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def array_len(n: int, flexible: bool) -> bytes:
    return uvarint(n + 1) if flexible else I32.pack(n)


def string(s: str, flexible: bool) -> bytes:
    b = s.encode()
    return (uvarint(len(b) + 1) if flexible else I16.pack(len(b))) + b


def nullable_string(s: str | None, flexible: bool) -> bytes:
    if s is None:
        return b"\x00" if flexible else I16.pack(-1)
    return string(s, flexible)


def bytes_len(n: int | None, flexible: bool) -> bytes:
    """Length prefix of a (nullable) bytes/records field; None encodes null."""
    if n is None:
        return b"\x00" if flexible else I32.pack(-1)
    return uvarint(n + 1) if flexible else I32.pack(n)


TAGS_NONE = b"\x00"


# -- KIP-951: where the leader went, in tagged fields of Produce (v10+) and Fetch (v16+) ---------
def leader_tag(tag: int, leader_id: int, leader_epoch: int) -> bytes:
    """One tagged field holding a LeaderIdAndEpoch (a partition's CurrentLeader)."""
    body = I32.pack(leader_id) + I32.pack(leader_epoch) + TAGS_NONE
    return uvarint(tag) + uvarint(len(body)) + body


def endpoints_tag(tag: int, endpoints: list[tuple[int, str, int]]) -> bytes:
    """One tagged field holding the NodeEndpoints array: (node id, host, port), rack null."""
    body = bytearray(array_len(len(endpoints), True))
    for node_id, host, port in endpoints:
        body += I32.pack(node_id) + string(host, True) + I32.pack(port)
        body += nullable_string(None, True) + TAGS_NONE
    return uvarint(tag) + uvarint(len(body)) + bytes(body)
