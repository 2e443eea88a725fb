"""Raw TLS connections to a broker's SSL listener for the TLS tests: a socket with or without a
client certificate, and one ApiVersions round trip over it."""

from __future__ import annotations

import socket
import ssl
from pathlib import Path

from stratalog.protocol import codec


def tls_socket(address: str, certs: dict[str, Path], stem: str | None) -> ssl.SSLSocket:
    """A TLS connection to ``address`` trusting the test CA, presenting ``<stem>.pem``."""
    ctx = ssl.create_default_context(cafile=str(certs["ca.pem"]))
    if stem is not None:
        ctx.load_cert_chain(str(certs[f"{stem}.pem"]))
    host, port = address.rsplit(":", 1)
    raw = socket.create_connection((host, int(port)), timeout=10)
    return ctx.wrap_socket(raw, server_hostname=host)


def api_versions(sock: socket.socket, client_id: str = "tls-test") -> int:
    """Send ApiVersions v0 and return the answer's error code."""
    body = codec.build(codec.request_class(18, 0))
    sock.sendall(codec.encode_request(18, 0, 7, client_id, body))
    size = int.from_bytes(read_exact(sock, 4), "big")
    _cid, resp = codec.decode_response(18, 0, read_exact(sock, size))
    return int(resp.error_code)


def read_exact(sock: socket.socket, n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        if not chunk:
            raise ConnectionError("closed")
        out += chunk
    return out
