"""Kafka error codes by name, so handlers speak in names and the wire gets numbers."""

from __future__ import annotations

from kio.schema.errors import ErrorCode


def code(name: str) -> ErrorCode:
    """``code("UNKNOWN_TOPIC_OR_PARTITION")`` -> ErrorCode.unknown_topic_or_partition."""
    return ErrorCode[name.lower()]


NONE = ErrorCode.none
