"""One connection's SASL authentication as a sans-IO state machine (Kafka's
SaslServerAuthenticator): frames in, a reply and whether to close out.

Before authentication a SASL listener answers only ApiVersions (once) and SaslHandshake; any
other request, a frame that is not a request, or a second ApiVersions closes the connection
without an answer, as Kafka does. The frame size limit (``sasl.server.max.receive.size``) is
the connection's, checked from the size prefix before anything is read (protocol/connection.py).

* SaslHandshake names a mechanism: one of ``sasl.enabled.mechanisms`` is answered NONE with the
  list, and the exchange begins; any other is answered UNSUPPORTED_SASL_MECHANISM with the list,
  and the connection closes. A v1 handshake carries the tokens in SaslAuthenticate requests; v0
  as bare size-prefixed frames (a failure then can only close the connection).
* SaslAuthenticate carries one token of the mechanism (``plain.PlainServer``,
  ``scram.ScramServer``). A failure is answered SASL_AUTHENTICATION_FAILED with Kafka's message
  and the connection closes; success sets the principal (``User:<name>``) and, with
  ``connections.max.reauth.ms``, the session's lifetime, which the answer carries (KIP-368).
* Re-authentication (KIP-368): on an authenticated connection whose session expires, a
  SaslHandshake (at most one a second) starts the exchange again, with the same mechanism, and
  it must end with the same principal. A connection whose session expired and that sends
  anything else is closed (``expired``). Without a session lifetime a SaslHandshake or
  SaslAuthenticate after authentication goes to the ordinary handlers, which answer
  ILLEGAL_SASL_STATE (broker/api/sasl.py).
"""

from __future__ import annotations

import logging
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from stratalog.protocol import codec
from stratalog.protocol.connection import ProtocolError, Request, parse_request
from stratalog.protocol.errors import code
from stratalog.protocol.versions import API_VERSIONS, SASL_AUTHENTICATE, SASL_HANDSHAKE
from stratalog.security.credentials import CredentialStore
from stratalog.security.oauthbearer import JwtValidator, OAuthBearerServer
from stratalog.security.plain import PlainServer
from stratalog.security.scram import MECHANISMS, AuthFailed, ScramServer

log = logging.getLogger(__name__)

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
MIN_REAUTH_INTERVAL_S = 1.0  # as Kafka: at most one re-authentication a second

HANDSHAKE_OR_VERSIONS = "handshake-or-versions"
HANDSHAKE = "handshake"
AUTHENTICATE = "authenticate"
COMPLETE = "complete"
FAILED = "failed"
REAUTH_HANDSHAKE = "reauth-handshake"
REAUTH_BAD_MECHANISM = "reauth-bad-mechanism"


@dataclass(frozen=True, slots=True)
class Reply:
    """What to do with one frame: send ``data`` (a whole frame, or nothing), then close the
    connection if ``close``."""

    data: bytes | None
    close: bool = False


CLOSE = Reply(None, True)


class SaslAuthenticator:
    def __init__(
        self,
        mechanisms: list[str],
        credentials: CredentialStore,
        api_versions: Callable[[Request], bytes],
        reauth_ms: int = 0,
        clock: Callable[[], float] = time.monotonic,
        tokens: JwtValidator | None = None,
    ) -> None:
        self.mechanisms = list(mechanisms)
        self._tokens = tokens  # OAUTHBEARER's validator
        self._credentials = credentials
        self._api_versions = api_versions
        self._reauth_ms = reauth_ms
        self._clock = clock
        self.state = HANDSHAKE_OR_VERSIONS
        self.principal: str | None = None  # "User:<name>" once authenticated
        self.mechanism: str | None = None
        self.expires_at: float | None = None  # the session's end (clock time), if it has one
        self._headers = True  # tokens in SaslAuthenticate requests (handshake v1)
        self._server: Any = None
        self._previous: tuple[str, str] | None = None  # re-authenticating: (mechanism, principal)
        self._last_reauth = float("-inf")
        self.sessions = 0  # exchanges completed on this connection (re-authentications + 1)
        self._session_ms = 0  # the current session's lifetime, told to the client

    # -- what the connection asks --------------------------------------------------------------
    @property
    def active(self) -> bool:
        """Frames go here, not to the broker's handlers (before authentication, or during a
        re-authentication)."""
        return self.state != COMPLETE

    def expired(self) -> bool:
        return self.expires_at is not None and self._clock() > self.expires_at

    def takes(self, frame: bytes | memoryview) -> bool:
        """On an authenticated connection: whether this frame (a SaslHandshake) begins a
        re-authentication; if so it is handed to ``receive`` next."""
        if self.state != COMPLETE or self.expires_at is None or len(frame) < 2:
            return False
        if _I16.unpack_from(frame, 0)[0] != SASL_HANDSHAKE:
            return False
        now = self._clock()
        if now - self._last_reauth < MIN_REAUTH_INTERVAL_S:
            return False
        assert self.mechanism is not None and self.principal is not None
        self._last_reauth = now
        self._previous = (self.mechanism, self.principal)
        self.state = REAUTH_HANDSHAKE
        return True

    # -- frames --------------------------------------------------------------------------------
    def receive(self, frame: bytes | memoryview) -> Reply:
        try:
            if self.state in (HANDSHAKE_OR_VERSIONS, HANDSHAKE, REAUTH_HANDSHAKE):
                return self._handshake_state(frame)
            if self.state == AUTHENTICATE:
                return self._authenticate(frame)
            return self._fail(f"frame received in SASL state {self.state}")
        except ProtocolError as e:
            return self._fail(str(e))

    def _fail(self, why: str) -> Reply:
        log.info("closing a connection during SASL authentication: %s", why)
        self.state = FAILED
        self._server = None
        return CLOSE

    def _handshake_state(self, frame: bytes | memoryview) -> Reply:
        if len(frame) < 8:
            return self._fail("a frame too short for a request header")
        api_key = _I16.unpack_from(frame, 0)[0]
        if api_key not in (API_VERSIONS, SASL_HANDSHAKE):
            return self._fail(f"unexpected request (API key {api_key}) during SASL handshake")
        if api_key == API_VERSIONS and self.state != HANDSHAKE_OR_VERSIONS:
            return self._fail(f"unexpected ApiVersions request in SASL state {self.state}")
        req = parse_request(frame)
        if api_key == API_VERSIONS:
            data = self._api_versions(req)
            if req.supported:
                self.state = HANDSHAKE
            return Reply(data)
        mechanism = req.body.mechanism
        if mechanism not in self.mechanisms:
            return Reply(self._handshake_reply(req, "UNSUPPORTED_SASL_MECHANISM"), close=True)
        self._headers = req.api_version >= 1
        if self._previous is not None and mechanism != self._previous[0]:
            # Answered as accepted; the next frame fails (Kafka's REAUTH_BAD_MECHANISM).
            self.state = REAUTH_BAD_MECHANISM
            return Reply(self._handshake_reply(req, "NONE"))
        self.mechanism = mechanism
        self._server = self._new_server(mechanism)
        self.state = AUTHENTICATE
        return Reply(self._handshake_reply(req, "NONE"))

    def _handshake_reply(self, req: Request, error: str) -> bytes:
        cls = codec.response_class(SASL_HANDSHAKE, req.api_version)
        body = codec.build(cls, error_code=code(error), mechanisms=tuple(self.mechanisms))
        return codec.encode_response(SASL_HANDSHAKE, req.api_version, req.correlation_id, body)

    def _new_server(self, mechanism: str) -> Any:
        creds = self._credentials
        if mechanism == "PLAIN":
            return PlainServer(creds.check_plain)
        if mechanism == "OAUTHBEARER":
            assert self._tokens is not None  # the broker's config checked it
            return OAuthBearerServer(self._tokens)
        return ScramServer(MECHANISMS[mechanism], lambda user: creds.get(user, mechanism))

    def _authenticate(self, frame: bytes | memoryview) -> Reply:
        if not self._headers:
            return self._raw_token(bytes(frame))
        if len(frame) < 8:
            return self._fail("a frame too short for a request header")
        api_key = _I16.unpack_from(frame, 0)[0]
        if api_key != SASL_AUTHENTICATE:
            return self._fail(f"unexpected request (API key {api_key}) during SASL authentication")
        req = parse_request(frame)
        server = self._server
        try:
            token = server.step(bytes(req.body.auth_bytes))
            if server.complete:
                self._complete(server.authorization_id, getattr(server, "expires_at", None))
        except AuthFailed as e:
            return Reply(self._authenticate_reply(req, "SASL_AUTHENTICATION_FAILED", e), True)
        lifetime = 0
        if self.state == COMPLETE and self.expires_at is not None:
            lifetime = self._session_ms
        return Reply(self._authenticate_reply(req, "NONE", None, token, lifetime))

    def _complete(self, user: str, credential_expiry: float | None = None) -> None:
        """``credential_expiry``: when the credential itself ends (an OAUTHBEARER token's
        ``exp``, seconds since the epoch), which bounds a re-authenticating session too."""
        principal = f"User:{user}"
        if self._previous is not None and principal != self._previous[1]:
            old = self._previous[1].replace(":", ".", 1)
            raise AuthFailed(
                f"Cannot change principals during re-authentication from {old}: "
                f"{principal.replace(':', '.', 1)}",
                public=True,
            )
        self.principal = principal
        self.sessions += 1
        self._previous = None
        self._server = None
        self.state = COMPLETE
        if self._reauth_ms > 0:
            # The session lasts connections.max.reauth.ms, or less if the credential ends first.
            self._session_ms = self._reauth_ms
            if credential_expiry is not None:
                remaining_ms = int(max(0.0, credential_expiry - time.time()) * 1000)
                self._session_ms = max(1, min(self._reauth_ms, remaining_ms))
            self.expires_at = self._clock() + self._session_ms / 1000

    def _authenticate_reply(
        self,
        req: Request,
        error: str,
        failure: AuthFailed | None,
        token: bytes = b"",
        lifetime_ms: int = 0,
    ) -> bytes:
        if failure is not None:
            self.state = FAILED
            self._server = None
            what = "re-authentication" if self._previous is not None else "authentication"
            message = (
                str(failure)
                if failure.public
                else f"Authentication failed during {what} due to invalid credentials with "
                f"SASL mechanism {self.mechanism}"
            )
            log.info("SASL %s failed (%s): %s", self.mechanism, what, failure)
        else:
            message = None
        cls = codec.response_class(SASL_AUTHENTICATE, req.api_version)
        body = codec.build(
            cls,
            error_code=code(error),
            error_message=message,
            auth_bytes=token,
            session_lifetime=lifetime_ms,
        )
        return codec.encode_response(SASL_AUTHENTICATE, req.api_version, req.correlation_id, body)

    def _raw_token(self, token: bytes) -> Reply:
        """Handshake v0: the token is the whole frame, the answer a bare size-prefixed frame."""
        server = self._server
        try:
            out = server.step(token)
            if server.complete:
                self._complete(server.authorization_id, getattr(server, "expires_at", None))
        except AuthFailed as e:
            return self._fail(f"SASL {self.mechanism} failed: {e}")
        return Reply(_I32.pack(len(out)) + out)
