"""A thin wrapper over kio (pinned): request decoding and response encoding by API and version.

Everything that touches kio's classes goes through here or through ``build``, so a kio upgrade
is a change in one place. kio types fields strictly (``timedelta`` for durations, ``ErrorCode``
for errors) and fails only at encode time, after a request was applied; ``build`` coerces plain
values and drops fields a version does not have, so handlers can stay version-agnostic.
"""

from __future__ import annotations

import dataclasses
import datetime
import io
import struct
from functools import cache
from types import ModuleType
from typing import Any

from kio.index import load_request_schema, load_response_schema
from kio.schema.errors import ErrorCode
from kio.serial import entity_reader, entity_writer

_HEADER = struct.Struct(">hhi")
_I32 = struct.Struct(">i")


@cache
def request_class(api_key: int, version: int) -> type:
    return load_request_schema(api_key, version)


@cache
def response_class(api_key: int, version: int) -> type:
    return load_response_schema(api_key, version)


@cache
def response_module(api_key: int, version: int) -> ModuleType:
    import importlib

    return importlib.import_module(response_class(api_key, version).__module__)


@cache
def _reader(api_key: int, version: int) -> Any:
    return entity_reader(request_class(api_key, version))


@cache
def _writer(api_key: int, version: int) -> Any:
    return entity_writer(response_class(api_key, version))


@cache
def is_flexible_request(api_key: int, version: int) -> bool:
    return bool(request_class(api_key, version).__flexible__)


def decode_body(api_key: int, version: int, buf: bytes | memoryview, offset: int) -> Any:
    obj, _size = _reader(api_key, version)(buf, offset)
    return obj


def response_header(api_key: int, version: int, correlation_id: int) -> bytes:
    # ApiVersions answers with header v0 even when the request was flexible (clients rely on it).
    if api_key != 18 and response_class(api_key, version).__flexible__:
        return _I32.pack(correlation_id) + b"\x00"
    return _I32.pack(correlation_id)


def encode_response(api_key: int, version: int, correlation_id: int, body: Any) -> bytes:
    """The whole response frame: length prefix, header, body."""
    out = io.BytesIO()
    out.write(b"\x00\x00\x00\x00")
    out.write(response_header(api_key, version, correlation_id))
    _writer(api_key, version)(out, body)
    data = out.getbuffer()
    _I32.pack_into(data, 0, len(data) - 4)
    del data
    return out.getvalue()


# -- building kio entities from plain values --------------------------------------------------
_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)


@cache
def _fields(cls: type) -> dict[str, dataclasses.Field]:
    return {f.name: f for f in dataclasses.fields(cls)}


def _coerce(f: dataclasses.Field, value: Any) -> Any:
    kt = f.metadata.get("kafka_type")
    if kt == "error_code" and not isinstance(value, ErrorCode):
        return ErrorCode(value)
    if kt in ("timedelta_i32", "timedelta_i64") and not isinstance(value, datetime.timedelta):
        return datetime.timedelta(milliseconds=value)
    if kt == "datetime_i64" and isinstance(value, int):
        return None if value < 0 else _EPOCH + datetime.timedelta(milliseconds=value)
    return value


def build(cls: type, /, **values: Any) -> Any:
    """Construct ``cls`` from keyword values, ignoring keys it lacks and coercing types."""
    fields = _fields(cls)
    kw = {k: _coerce(fields[k], v) for k, v in values.items() if k in fields}
    return cls(**kw)


def nested(api_key: int, version: int, name: str) -> type | None:
    """A nested response entity class by name, e.g. ``nested(3, 12, "MetadataResponseTopic")``."""
    return getattr(response_module(api_key, version), name, None)


def parse_request_header(buf: bytes | memoryview) -> tuple[int, int, int]:
    """api_key, api_version, correlation_id from the first 8 bytes."""
    return _HEADER.unpack_from(buf, 0)


# -- the client side: requests out, responses in -------------------------------------------------
@cache
def _request_writer(api_key: int, version: int) -> Any:
    return entity_writer(request_class(api_key, version))


@cache
def _response_reader(api_key: int, version: int) -> Any:
    return entity_reader(response_class(api_key, version))


def encode_request(
    api_key: int, version: int, correlation_id: int, client_id: str | None, body: Any
) -> bytes:
    """The whole request frame: length prefix, header (v1 or v2), body."""
    out = io.BytesIO()
    out.write(b"\x00\x00\x00\x00")
    out.write(_HEADER.pack(api_key, version, correlation_id))
    if client_id is None:
        out.write(b"\xff\xff")
    else:
        cid = client_id.encode()
        out.write(struct.pack(">h", len(cid)) + cid)
    if is_flexible_request(api_key, version):
        out.write(b"\x00")
    _request_writer(api_key, version)(out, body)
    data = out.getbuffer()
    _I32.pack_into(data, 0, len(data) - 4)
    del data
    return out.getvalue()


def decode_response(api_key: int, version: int, frame: bytes) -> tuple[int, Any]:
    """(correlation id, response entity) from a response frame without its length prefix."""
    (correlation_id,) = _I32.unpack_from(frame, 0)
    pos = 4
    if api_key != 18 and response_class(api_key, version).__flexible__:
        pos += 1  # empty tagged fields of response header v1
    obj, _ = _response_reader(api_key, version)(frame, pos)
    return correlation_id, obj
