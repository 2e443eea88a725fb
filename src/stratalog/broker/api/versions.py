"""ApiVersions: the first request of every client."""

from __future__ import annotations

from stratalog.protocol import codec
from stratalog.protocol.connection import Request
from stratalog.protocol.versions import advertised

from .common import NONE, err


def handle_api_versions(core, req: Request, conn) -> bytes:
    if not req.supported:
        # Unsupported request version: answer in the v0 format (no throttle, header v0) with
        # UNSUPPORTED_VERSION and our ranges, so the client retries with a version we know.
        version = 0
        error = err("UNSUPPORTED_VERSION")
    else:
        version = req.api_version
        error = NONE
    cls = codec.response_class(18, version)
    mod = codec.response_module(18, version)
    keys = tuple(
        codec.build(mod.ApiVersion, api_key=k, min_version=lo, max_version=hi)
        for k, (lo, hi) in sorted(advertised().items())
    )
    body = codec.build(cls, error_code=error, api_keys=keys, throttle_time=0)
    return codec.encode_response(18, version, req.correlation_id, body)
