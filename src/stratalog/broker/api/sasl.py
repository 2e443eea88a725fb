"""SaslHandshake and SaslAuthenticate where no authentication is under way.

A SASL listener hands these to its connection's authenticator (security/sasl.py) before and
while authenticating; they reach the handlers here only on a PLAINTEXT or SSL listener, or
after authentication without a re-authentication: Kafka answers both ILLEGAL_SASL_STATE and
keeps the connection.
"""

from __future__ import annotations

from stratalog.protocol.connection import Request

from .common import err, reply


def handle_sasl_handshake(core, req: Request, conn) -> bytes:
    return reply(req, error_code=err("ILLEGAL_SASL_STATE"), mechanisms=())


def handle_sasl_authenticate(core, req: Request, conn) -> bytes:
    return reply(
        req,
        error_code=err("ILLEGAL_SASL_STATE"),
        error_message="SaslAuthenticate request received after successful authentication",
        auth_bytes=b"",
        session_lifetime=0,
    )
