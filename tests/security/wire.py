"""A raw Kafka connection (plain TCP or TLS) that speaks the SASL exchange step by step, so
tests see exactly what a broker answers, and when it closes, before and after authentication.
Requests are built and responses decoded with kio through tests/conformance/wire.py."""

from __future__ import annotations

import socket
import ssl
import struct
import time
from pathlib import Path
from typing import Any

from stratalog.security.scram import MECHANISMS, ScramClient

from ..conformance import wire

SASL_HANDSHAKE, SASL_AUTHENTICATE, API_VERSIONS, METADATA = 17, 36, 18, 3


class Closed(Exception):
    """The broker closed the connection."""


class Conn:
    def __init__(
        self,
        bootstrap: str,
        ca: Path | None = None,
        cert: Path | None = None,
        timeout: float = 10.0,
    ) -> None:
        host, port = bootstrap.rsplit(":", 1)
        sock = socket.create_connection((host, int(port)), timeout=timeout)
        if ca is not None:
            ctx = ssl.create_default_context(cafile=str(ca))
            if cert is not None:
                ctx.load_cert_chain(str(cert))
            sock = ctx.wrap_socket(sock, server_hostname=host)
        self.sock = sock
        self._cid = 0

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> Conn:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- frames --------------------------------------------------------------------------------
    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def read_frame(self, pause: float = 0.0) -> bytes:
        size = struct.unpack(">i", self._read(4))[0]
        return self._read(size, pause)

    def _read(self, n: int, pause: float = 0.0) -> bytes:
        """Exactly ``n`` bytes; with ``pause``, sleeping that long after each 64 KiB read (a
        slow reader)."""
        out = bytearray(n)
        view = memoryview(out)
        got = 0
        while got < n:
            try:
                k = self.sock.recv_into(view[got:], min(n - got, 65536))
            except (ConnectionResetError, BrokenPipeError, ssl.SSLError) as e:
                raise Closed(str(e)) from e
            if not k:
                raise Closed("EOF")
            got += k
            if pause:
                time.sleep(pause)
        return bytes(out)

    def is_closed(self, timeout: float = 5.0) -> bool:
        """True if the broker closes the connection (EOF or reset) within ``timeout``."""
        self.sock.settimeout(timeout)
        try:
            while True:
                chunk = self.sock.recv(65536)
                if not chunk:
                    return True
        except TimeoutError:
            return False
        except (ConnectionResetError, BrokenPipeError, ssl.SSLError):
            return True
        except OSError:
            return True

    # -- requests ------------------------------------------------------------------------------
    def frame(self, api_key: int, version: int, **values: Any) -> bytes:
        self._cid += 1
        return wire.request_frame(
            api_key, version, wire.build(api_key, version, **values), self._cid
        )

    def request(self, api_key: int, version: int, **values: Any) -> dict[str, Any]:
        self.send_raw(self.frame(api_key, version, **values))
        cid, body = wire.decode(api_key, version, self.read_frame())
        assert cid == self._cid
        return wire.plain(body)

    def handshake(self, mechanism: str, version: int = 1) -> dict[str, Any]:
        return self.request(SASL_HANDSHAKE, version, mechanism=mechanism)

    def authenticate(self, token: bytes, version: int = 2) -> dict[str, Any]:
        return self.request(SASL_AUTHENTICATE, version, auth_bytes=token)

    def login(self, mechanism: str, user: str, password: str, version: int = 2) -> dict[str, Any]:
        """Handshake and the whole exchange; the last SaslAuthenticate answer (or the first
        that failed)."""
        hs = self.handshake(mechanism)
        assert hs["error_code"] == 0, hs
        return self.exchange(mechanism, user, password, version)

    def exchange(
        self, mechanism: str, user: str, password: str, version: int = 2
    ) -> dict[str, Any]:
        """The SaslAuthenticate steps after a handshake."""
        if mechanism == "PLAIN":
            return self.authenticate(f"\0{user}\0{password}".encode(), version)
        client = ScramClient(MECHANISMS[mechanism], user, password)
        first = self.authenticate(client.first(), version)
        if first["error_code"] != 0:
            return first
        final = self.authenticate(client.final(first["auth_bytes"]), version)
        if final["error_code"] == 0:
            assert client.verify(final["auth_bytes"]), "the server's signature is wrong"
        return final

    def metadata(self) -> dict[str, Any]:
        return self.request(
            METADATA, 12, topics=None, allow_auto_topic_creation=False,
            include_topic_authorized_operations=False,
        )  # fmt: skip
