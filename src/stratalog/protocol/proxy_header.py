"""The PROXY protocol v2 header (HAProxy's) that the TLS offload process puts before each
connection it hands the broker (security/tls_offload/main.go), sans-IO.

Only what that process sends is taken: the PROXY command over TCP (IPv4 or IPv6), the client's
address, and TLV 0xE0 (in the range the specification leaves to applications) with the DER of
the client certificate the handshake verified. Anything else is an error, and the broker closes
the connection: the socket is only reachable by the broker's own user.
"""

from __future__ import annotations

import ipaddress
import struct
from dataclasses import dataclass

SIGNATURE = b"\r\n\r\n\x00\r\nQUIT\n"
_FIXED = len(SIGNATURE) + 4  # signature, version and command, family, length
_MAX_LENGTH = 16 * 1024  # addresses and a certificate chain's leaf
TLV_CLIENT_CERT = 0xE0


class ProxyHeaderError(ValueError):
    """Not a PROXY v2 header of the kind the offload process sends."""


@dataclass(frozen=True, slots=True)
class ProxyHeader:
    client_host: str
    client_port: int
    client_cert: bytes | None  # DER of the verified client certificate, if any


def parse(data: bytes | bytearray | memoryview) -> tuple[ProxyHeader, int] | None:
    """The header at the start of ``data`` and its length, or None while it is incomplete."""
    view = memoryview(data)
    if len(view) < _FIXED:
        seen = bytes(view[: len(SIGNATURE)])
        if seen != SIGNATURE[: len(seen)]:
            raise ProxyHeaderError("no PROXY v2 signature")
        return None
    if bytes(view[: len(SIGNATURE)]) != SIGNATURE:
        raise ProxyHeaderError("no PROXY v2 signature")
    version_command, family, length = struct.unpack_from(">BBH", view, len(SIGNATURE))
    if version_command != 0x21:
        raise ProxyHeaderError(f"not a v2 PROXY command (0x{version_command:02x})")
    if length > _MAX_LENGTH:
        raise ProxyHeaderError(f"a header of {length} bytes")
    if len(view) < _FIXED + length:
        return None
    body = view[_FIXED : _FIXED + length]
    if family == 0x11:
        size = 4
    elif family == 0x21:
        size = 16
    else:
        raise ProxyHeaderError(f"not TCP over IPv4 or IPv6 (family 0x{family:02x})")
    if len(body) < 2 * size + 4:
        raise ProxyHeaderError("addresses cut short")
    host = str(ipaddress.ip_address(bytes(body[:size])))
    (port,) = struct.unpack_from(">H", body, 2 * size)
    cert = None
    at = 2 * size + 4
    while at < len(body):
        if at + 3 > len(body):
            raise ProxyHeaderError("a TLV cut short")
        kind, n = struct.unpack_from(">BH", body, at)
        if at + 3 + n > len(body):
            raise ProxyHeaderError("a TLV cut short")
        if kind == TLV_CLIENT_CERT:
            cert = bytes(body[at + 3 : at + 3 + n])
        at += 3 + n
    return ProxyHeader(host, port, cert), _FIXED + length
