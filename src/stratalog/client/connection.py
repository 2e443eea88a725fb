"""One blocking connection to one broker: framing, correlation ids, a reusable receive buffer."""

from __future__ import annotations

import itertools
import socket
import ssl
import struct
from typing import Any

from stratalog.client import security
from stratalog.client.errors import ConnectionLost, WireError
from stratalog.client.security import ClientSecurity
from stratalog.protocol import codec

_I32 = struct.Struct(">i")

Address = tuple[str, int]


class BrokerConnection:
    """Requests to one broker, answered in order; not thread-safe."""

    def __init__(
        self,
        address: Address,
        *,
        timeout: float,
        client_id: str,
        security: ClientSecurity | None = None,
    ) -> None:
        self.address = address
        self.timeout = timeout
        self.client_id = client_id
        self.security = security
        self._sock: socket.socket | None = None
        self._ids = itertools.count(1)
        # Receive buffer reused by roundtrip(scratch=True): a fresh 8 MiB bytearray per Fetch
        # costs a memset and, once glibc maps it afresh, a page fault per 4 KiB (a tenth of a
        # Spark reader's CPU per row, measured with py-spy).
        self._scratch = bytearray()

    def open(self) -> socket.socket:
        if self._sock is None:
            host, port = self.address
            try:
                s = socket.create_connection(self.address, timeout=self.timeout)
            except OSError as e:
                raise ConnectionLost(
                    f"cannot reach a broker at {host}:{port}: {e.strerror or e}"
                ) from None
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sec = self.security
            if sec is not None and sec.tls:
                try:
                    s = sec.context().wrap_socket(s, server_hostname=host)
                except ssl.SSLError as e:
                    s.close()
                    # Not ConnectionLost: another broker would not make it work.
                    raise WireError(f"TLS with the broker at {host}:{port} failed: {e}") from None
                except OSError as e:
                    s.close()
                    raise ConnectionLost(f"TLS with {host}:{port} broke: {e}") from None
            self._sock = s
            if sec is not None and sec.sasl:
                try:
                    security.authenticate(sec, self.request, _body)
                except BaseException:
                    self.close()
                    raise
        return self._sock

    @property
    def is_open(self) -> bool:
        return self._sock is not None

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def _recv_exactly(self, n: int, scratch: bool = False) -> memoryview:
        # A read-only view of the buffer, not bytes(buf): a Fetch response is megabytes, and the
        # codec copies out the fields it keeps anyway.
        sock = self.open()
        if scratch:
            if len(self._scratch) < n:
                # Views of the old buffer handed out earlier keep it alive; it is not resized.
                self._scratch = bytearray(n)
            view = memoryview(self._scratch)[:n]
        else:
            view = memoryview(bytearray(n))
        got = 0
        while got < n:
            k = sock.recv_into(view[got:])
            if k == 0:
                self.close()
                raise ConnectionLost("the broker closed the connection")
            got += k
        return view.toreadonly()

    def roundtrip(
        self, api_key: int, version: int, body: Any, scratch: bool = False
    ) -> tuple[int, memoryview]:
        """Send one request; (its correlation id, the response frame without length prefix).
        With ``scratch`` the frame lives in the connection's reused buffer, valid until the next
        call."""
        cid = next(self._ids) & 0x7FFFFFFF
        frame = codec.encode_request(api_key, version, cid, self.client_id, body)
        sock = self.open()
        try:
            sock.sendall(frame)
            (size,) = _I32.unpack(self._recv_exactly(4))
            return cid, self._recv_exactly(size, scratch)
        except OSError as e:
            self.close()
            raise ConnectionLost(f"connection to the broker failed: {e}") from None

    def check_correlation(self, got: int, cid: int) -> None:
        if got != cid:
            self.close()
            raise WireError(f"correlation id {got} does not match request {cid}")

    def request(self, api_key: int, version: int, body: Any) -> Any:
        cid, data = self.roundtrip(api_key, version, body)
        got, resp = codec.decode_response(api_key, version, data)
        self.check_correlation(got, cid)
        return resp


def _body(api_key: int, version: int, **fields: Any) -> Any:
    return codec.build(codec.request_class(api_key, version), **fields)
