"""The PROXY v2 header the TLS offload process sends (protocol/proxy_header.py), byte by byte,
against headers built here from the specification's layout, and what is refused."""

from __future__ import annotations

import struct

import pytest

from stratalog.protocol.proxy_header import SIGNATURE, ProxyHeaderError, parse


def _header(family: int, addrs: bytes, tlvs: bytes = b"", command: int = 0x21) -> bytes:
    body = addrs + tlvs
    return SIGNATURE + bytes([command, family]) + struct.pack(">H", len(body)) + body


V4 = bytes([10, 1, 2, 3]) + bytes([127, 0, 0, 1]) + struct.pack(">HH", 51000, 9093)
V6 = bytes(15) + b"\x01" + bytes(15) + b"\x01" + struct.pack(">HH", 40000, 9093)


def test_ipv4_with_a_client_certificate_and_bytes_after_it() -> None:
    der = b"\x30\x82certificate"
    raw = _header(0x11, V4, b"\xe0" + struct.pack(">H", len(der)) + der) + b"kafka bytes"
    header, used = parse(raw)
    assert (header.client_host, header.client_port, header.client_cert) == ("10.1.2.3", 51000, der)
    assert raw[used:] == b"kafka bytes"


def test_ipv6_without_a_certificate_and_other_tlvs_skipped() -> None:
    header, used = parse(_header(0x21, V6, b"\x04" + struct.pack(">H", 3) + b"abc"))
    assert (header.client_host, header.client_port, header.client_cert) == ("::1", 40000, None)
    assert used == len(SIGNATURE) + 4 + len(V6) + 6


def test_incomplete_headers_wait_for_more() -> None:
    raw = _header(0x11, V4)
    for n in range(len(raw)):
        assert parse(raw[:n]) is None, n


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"GET / HTTP/1.1\r\n\r\n", "signature"),
        (b"PROXY TCP4 1.2.3.4 5.6.7.8 1 2\r\n", "signature"),
        (_header(0x11, V4, command=0x20), "PROXY command"),
        (_header(0x31, V4), "family"),
        (_header(0x11, V4[:6]), "addresses"),
        (_header(0x11, V4, b"\xe0\x00\x09abc"), "TLV"),
        (_header(0x11, V4, b"\xe0\x00"), "TLV"),
        (SIGNATURE + b"\x21\x11\xff\xff", "header of"),
    ],
)
def test_what_is_not_the_offload_processs_header_is_refused(raw: bytes, message: str) -> None:
    with pytest.raises(ProxyHeaderError, match=message):
        parse(raw)
