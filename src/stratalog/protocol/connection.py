"""The server side of one Kafka connection as a state machine (after h11): bytes in, requests out.

``receive_data`` buffers what the socket delivered; ``next_event`` returns the next complete
request, ``NEED_DATA``, or raises ``ProtocolError`` when the peer must be disconnected. The size
prefix is checked against ``max_request_bytes`` before anything is allocated for the body.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

from stratalog.protocol import codec
from stratalog.protocol.versions import API_VERSIONS, is_supported

_I32 = struct.Struct(">i")
_I16 = struct.Struct(">h")


class ProtocolError(Exception):
    """The peer sent something that ends the connection."""


class _NeedData:
    def __repr__(self) -> str:
        return "NEED_DATA"


NEED_DATA: Any = _NeedData()


@dataclass(slots=True)
class Request:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    body: Any  # a kio request entity; None when the version is unsupported (ApiVersions only)
    size: int
    # Set by the broker when the client is over a quota: its answer carries this (KIP-219).
    throttle_ms: int = 0

    @property
    def supported(self) -> bool:
        return self.body is not None


def _read_unsigned_varint(buf: bytes | memoryview, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(buf):
            raise ProtocolError("truncated varint in request header")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7
        if shift > 28:
            raise ProtocolError("varint too long in request header")


def _skip_tagged_fields(buf: bytes | memoryview, pos: int) -> int:
    n, pos = _read_unsigned_varint(buf, pos)
    for _ in range(n):
        _tag, pos = _read_unsigned_varint(buf, pos)
        size, pos = _read_unsigned_varint(buf, pos)
        pos += size
    if pos > len(buf):
        raise ProtocolError("truncated tagged fields in request header")
    return pos


def parse_request(frame: bytes | memoryview) -> Request:
    """Decode one request frame (without its length prefix)."""
    if len(frame) < 10:
        raise ProtocolError(f"request of {len(frame)} bytes is shorter than a request header")
    api_key, version, correlation_id = codec.parse_request_header(frame)
    (n,) = _I16.unpack_from(frame, 8)
    pos = 10
    client_id: str | None = None
    if n >= 0:
        if pos + n > len(frame):
            raise ProtocolError("client id runs past the end of the request")
        client_id = bytes(frame[pos : pos + n]).decode("utf-8", "replace")
        pos += n
    if not is_supported(api_key, version):
        if api_key == API_VERSIONS:
            # Answered in the v0 format with UNSUPPORTED_VERSION so the client can retry lower.
            # As Kafka, a version past the newest is read with the newest's (flexible) header,
            # so its tagged fields must be there.
            if version >= 3:
                _skip_tagged_fields(frame, pos)
            return Request(api_key, version, correlation_id, client_id, None, len(frame))
        raise ProtocolError(f"unsupported API key {api_key} version {version}")
    if codec.is_flexible_request(api_key, version):
        pos = _skip_tagged_fields(frame, pos)
    try:
        body = codec.decode_body(api_key, version, frame, pos)
    except Exception as e:  # kio raises several types for short or malformed bodies
        raise ProtocolError(f"malformed request body for API {api_key} v{version}: {e}") from e
    return Request(api_key, version, correlation_id, client_id, body, len(frame))


class KafkaConnection:
    def __init__(self, max_request_bytes: int = 100 * 1024 * 1024) -> None:
        self.max_request_bytes = max_request_bytes
        # Received bytes are kept as the objects the transport delivered: a request that sits
        # inside one of them is parsed from a memoryview, without copying it first.
        self._buf: bytes = b""
        self._pos = 0
        self._more: list[bytes] = []
        self._more_len = 0
        self._closed = False

    def receive_data(self, data: bytes) -> None:
        if self._closed:
            raise ProtocolError("connection already failed")
        if self._pos >= len(self._buf) and not self._more:
            self._buf = data
            self._pos = 0
        else:
            self._more.append(data)
            self._more_len += len(data)

    @property
    def buffered(self) -> int:
        return len(self._buf) - self._pos + self._more_len

    def _coalesce(self) -> None:
        self._buf = b"".join([memoryview(self._buf)[self._pos :], *self._more])
        self._pos = 0
        self._more.clear()
        self._more_len = 0

    def next_frame(self) -> memoryview | Any:
        """The next whole frame (without its size prefix), or ``NEED_DATA``; raises
        ``ProtocolError`` for a size prefix outside ``0..max_request_bytes``, before any of the
        frame is kept. The view is valid until the next call."""
        avail = self.buffered
        if avail < 4:
            return NEED_DATA
        if len(self._buf) - self._pos < 4:
            self._coalesce()
        (size,) = _I32.unpack_from(self._buf, self._pos)
        if size < 0 or size > self.max_request_bytes:
            self._closed = True
            raise ProtocolError(
                f"request size {size} is outside 0..{self.max_request_bytes} (max_request_bytes)"
            )
        if avail < 4 + size:
            return NEED_DATA
        if len(self._buf) - self._pos < 4 + size:
            self._coalesce()
        start = self._pos + 4
        self._pos = start + size
        return memoryview(self._buf)[start : start + size]

    def next_event(self) -> Request | Any:
        frame = self.next_frame()
        if frame is NEED_DATA:
            return NEED_DATA
        try:
            return parse_request(frame)
        except ProtocolError:
            self._closed = True
            raise

    def fail(self) -> None:
        """The connection is ending: no more data is accepted."""
        self._closed = True
