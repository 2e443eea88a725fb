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
