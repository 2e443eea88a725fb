"""Small helpers every API handler uses to build kio responses."""

from __future__ import annotations

from typing import Any

from stratalog.protocol import codec
from stratalog.protocol.connection import Request
from stratalog.protocol.errors import code

AUTHORIZED_OPS_OMITTED = -(2**31)  # "not requested" in Kafka's authorized-operations fields
# Without an authorizer every operation is allowed; as Kafka, report the operations each resource
# type supports as bit sets of AclOperation codes.
TOPIC_OPERATIONS = 3576  # READ WRITE CREATE DELETE ALTER DESCRIBE DESCRIBE_CONFIGS ALTER_CONFIGS
CLUSTER_OPERATIONS = 8096  # CREATE ALTER DESCRIBE CLUSTER_ACTION *_CONFIGS IDEMPOTENT_WRITE
GROUP_OPERATIONS = 328  # READ DELETE DESCRIBE


def authorized(requested: object, operations: int) -> int:
    return operations if requested else AUTHORIZED_OPS_OMITTED


def reply(req: Request, /, **fields: Any) -> bytes:
    """Encode the response to ``req`` from plain field values."""
    cls = codec.response_class(req.api_key, req.api_version)
    body = codec.build(cls, throttle_time=0, **fields)
    return codec.encode_response(req.api_key, req.api_version, req.correlation_id, body)


def sub(req: Request, name: str, /, **fields: Any) -> Any:
    """A nested response entity of the request's version: ``sub(req, "MetadataResponseTopic")``."""
    cls = codec.nested(req.api_key, req.api_version, name)
    # A version without this entity also lacks the field that holds it; build() drops it.
    return None if cls is None else codec.build(cls, **fields)


def err(name: str) -> Any:
    return code(name)


NONE = code("NONE")
