"""A handler's request without what was refused, and its answer with the refusals added."""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable, Iterable
from typing import Any

from stratalog.protocol import codec
from stratalog.protocol.connection import Request

from ..api.common import err, sub
from .access import TOPIC_DENIED, Handler


def then(answer, fn: Callable[[bytes], bytes]):
    """``fn`` applied to a handler's answer (a frame), now or once it is ready."""
    if answer is None:
        return None
    if isinstance(answer, bytes | bytearray):
        return fn(bytes(answer))

    async def later() -> bytes:
        return fn(await answer)

    return later()


def edited(req: Request, answer, fn: Callable[[Any], Any]):
    """The answer with its decoded body passed through ``fn`` and encoded again."""

    def apply(frame: bytes) -> bytes:
        _cid, body = codec.decode_response(req.api_key, req.api_version, frame[4:])
        return codec.encode_response(req.api_key, req.api_version, req.correlation_id, fn(body))

    return then(answer, apply)


def extended(req: Request, answer, field: str, extra: list):
    """The answer with ``extra`` entries after those of its list ``field``."""
    if not extra:
        return answer
    return edited(
        req,
        answer,
        lambda body: dataclasses.replace(body, **{field: (*getattr(body, field), *extra)}),
    )


def with_body(req: Request, **fields: Any) -> Request:
    """The request with some of its body's fields replaced."""
    return Request(
        req.api_key,
        req.api_version,
        req.correlation_id,
        req.client_id,
        dataclasses.replace(req.body, **fields),
        req.size,
        req.throttle_ms,
    )


def request_entity(req: Request, name: str) -> type:
    """A nested request entity class of the request's version, by name."""
    cls = codec.request_class(req.api_key, req.api_version)
    return getattr(importlib.import_module(cls.__module__), name)


def split(items: Iterable, allowed: Callable[[Any], bool]) -> tuple[list, list]:
    kept, denied = [], []
    for item in items:
        (kept if allowed(item) else denied).append(item)
    return kept, denied


def per_topic(
    core,
    req: Request,
    conn,
    handler: Handler,
    *,
    field: str,
    allowed: Callable[[str], bool],
    name: Callable[[Any], str],
    answer_field: str,
    entry: Callable[[Any], Any],
):
    """The usual shape: the request's list ``field`` of per-topic entries; the denied ones are
    left out of the handler's request and answered by ``entry`` in the answer's
    ``answer_field``."""
    items = getattr(req.body, field)
    kept, denied = split(items, lambda t: allowed(name(t)))
    if not denied:
        return handler(core, req, conn)
    answer = handler(core, with_body(req, **{field: tuple(kept)}), conn)
    return extended(req, answer, answer_field, [entry(t) for t in denied])


def topic_denied(
    req: Request,
    schema: tuple[str, str],
    topic: dict[str, Any],
    index_field: str,
    indexes: Iterable[int],
    **empty: Any,
):
    """A refused topic's answer entry: every asked partition TOPIC_AUTHORIZATION_FAILED, with
    the ``empty`` values its other fields take then. ``schema``: the topic entry's and the
    partition entry's names in the answer."""
    partitions = tuple(
        sub(req, schema[1], **{index_field: i}, error_code=err(TOPIC_DENIED), **empty)
        for i in indexes
    )
    return sub(req, schema[0], **topic, partitions=partitions)
