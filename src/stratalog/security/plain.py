"""SASL/PLAIN (RFC 4616): ``[authzid] NUL user NUL password``, checked in one step.

As Kafka's PlainSaslServer: an empty user or password, a wrong password and an authorization id
other than the user each fail with the message Kafka sends. Passwords travel in the clear inside
the connection, so PLAIN belongs on SASL_SSL listeners.
"""

from __future__ import annotations

from collections.abc import Callable

from stratalog.security.scram import AuthFailed


class PlainServer:
    def __init__(self, verify: Callable[[str, str], bool]) -> None:
        self._verify = verify
        self.complete = False
        self.authorization_id: str | None = None

    def step(self, token: bytes) -> bytes:
        try:
            text = token.decode("utf-8")
        except UnicodeDecodeError:
            raise AuthFailed("Invalid SASL/PLAIN response: not UTF-8", public=True) from None
        parts = text.split("\x00", 3)
        if len(parts) != 3:
            raise AuthFailed(
                f"Invalid SASL/PLAIN response: expected 3 tokens, got {min(len(parts), 4)}",
                public=True,
            )
        authzid, user, password = parts
        if not user:
            raise AuthFailed("Authentication failed: username not specified", public=True)
        if not password:
            raise AuthFailed("Authentication failed: password not specified", public=True)
        if not self._verify(user, password):
            raise AuthFailed("Authentication failed: Invalid username or password", public=True)
        if authzid and authzid != user:
            raise AuthFailed(
                "Authentication failed: Client requested an authorization id that is different "
                "from username",
                public=True,
            )
        self.authorization_id = user
        self.complete = True
        return b""
