"""The client's errors: an error code in an answer, or a connection that failed."""

from __future__ import annotations


class WireError(Exception):
    """A Kafka error code in an answer, or a broken connection."""

    def __init__(self, message: str, error_code: int = -1) -> None:
        super().__init__(message)
        self.error_code = error_code


class ConnectionLost(WireError):
    """A broker could not be reached, or its connection broke before the answer came: in a
    cluster, the sign of a broker's loss (and of its partitions' leader change)."""
