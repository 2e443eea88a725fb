"""SASL/OAUTHBEARER (RFC 7628, KIP-255/KIP-768) with the token checked as a JSON Web Token, as
Kafka's OAuthBearerValidatorCallbackHandler checks it.

The client's one message is the GS2 header ``n,[a=<authzid>],`` and ``\\x01``-separated key=value
pairs, ``auth=Bearer <token>`` among them, ending ``\\x01\\x01``. The token must be signed by one
of the keys of ``sasl.oauthbearer.jwks.endpoint.url`` (a JSON Web Key Set in a file, named by
a ``file:`` URL or a path) with an asymmetric algorithm (RS, PS or ES: a shared secret would let
every holder mint tokens), be unexpired (``exp`` required; ``nbf`` and ``iat`` honoured, with
``sasl.oauthbearer.clock.skew.seconds`` of slack), and name the principal in
``sasl.oauthbearer.sub.claim.name`` (``sub``); ``sasl.oauthbearer.expected.audience`` and
``sasl.oauthbearer.expected.issuer`` are checked when set. Unsigned tokens (Kafka's default
"unsecured" handler for trying it out) are never accepted.

A bad token is answered, as RFC 7628 says and Kafka does, with the JSON error challenge
``{"status":"invalid_token"}``; the client's reply (a lone ``\\x01``) then fails the exchange
with SASL_AUTHENTICATION_FAILED. The token's expiry bounds the session when re-authentication
is on (``connections.max.reauth.ms``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

import jwt

from stratalog.security.scram import AuthFailed

ASYMMETRIC = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512")
INVALID_TOKEN = json.dumps({"status": "invalid_token"}, separators=(",", ":")).encode()


class OAuthConfigError(ValueError):
    """A validation setting that cannot work; the message names it."""


def _keys_file(url: str) -> Path:
    parsed = urlparse(url)
    if parsed.scheme in ("http", "https"):
        raise OAuthConfigError(
            "sasl.oauthbearer.jwks.endpoint.url: only a file of keys is read (file:///path or "
            f"a path), not {url}: fetch the identity provider's JWKS into a file"
        )
    return Path(unquote(parsed.path) if parsed.scheme == "file" else url)


@dataclass(frozen=True)
class JwtValidator:
    keys: jwt.PyJWKSet
    audience: tuple[str, ...] = ()
    issuer: str | None = None
    sub_claim: str = "sub"
    skew_s: int = 30

    @classmethod
    def from_settings(
        cls,
        jwks_url: str,
        audience: str = "",
        issuer: str = "",
        sub_claim: str = "sub",
        skew_s: int = 30,
    ) -> JwtValidator:
        if not jwks_url:
            raise OAuthConfigError(
                "sasl.oauthbearer.jwks.endpoint.url is not set: OAUTHBEARER needs the keys that "
                "sign the tokens (unsigned tokens are never accepted)"
            )
        path = _keys_file(jwks_url)
        try:
            keys = jwt.PyJWKSet.from_json(path.read_text(encoding="utf-8"))
        except OSError as e:
            raise OAuthConfigError(
                f"sasl.oauthbearer.jwks.endpoint.url: cannot read {path}: {e.strerror or e}"
            ) from None
        except (jwt.PyJWKSetError, jwt.InvalidKeyError, ValueError) as e:
            raise OAuthConfigError(
                f"sasl.oauthbearer.jwks.endpoint.url: {path} is not a JSON Web Key Set: {e}"
            ) from None
        if not any(k.key_type in ("RSA", "EC") for k in keys.keys):
            raise OAuthConfigError(
                f"sasl.oauthbearer.jwks.endpoint.url: {path} holds no public key (RSA or EC)"
            )
        return cls(
            keys,
            tuple(a.strip() for a in audience.split(",") if a.strip()),
            issuer or None,
            sub_claim or "sub",
            skew_s,
        )

    def _key(self, header: dict[str, Any]) -> jwt.PyJWK:
        kid = header.get("kid")
        for k in self.keys.keys:
            if kid is None or k.key_id == kid:
                return k
        raise AuthFailed(f"no key {kid!r} in the key set")

    def validate(self, token: str) -> tuple[str, float]:
        """(the principal's name, the token's expiry in seconds since the epoch); AuthFailed
        with the reason otherwise."""
        try:
            header = jwt.get_unverified_header(token)
            if header.get("alg") not in ASYMMETRIC:
                raise AuthFailed(f"token algorithm {header.get('alg')!r} is not accepted")
            key = self._key(header)
            claims = jwt.decode(
                token,
                key.key,
                algorithms=[header["alg"]],
                audience=list(self.audience) or None,
                issuer=self.issuer,
                leeway=self.skew_s,
                options={"require": ["exp"], "verify_aud": bool(self.audience)},
            )
        except jwt.PyJWTError as e:
            raise AuthFailed(f"token refused: {e}") from None
        principal = claims.get(self.sub_claim)
        if not isinstance(principal, str) or not principal:
            raise AuthFailed(f"token has no {self.sub_claim!r} claim naming the principal")
        return principal, float(claims["exp"])


class OAuthBearerServer:
    """The server's side of one exchange (``step``, one token in, one out)."""

    def __init__(self, validator: JwtValidator) -> None:
        self._validator = validator
        self._refused: str | None = None
        self.complete = False
        self.authorization_id: str | None = None
        self.expires_at: float | None = None  # the token's expiry, seconds since the epoch

    def step(self, message: bytes) -> bytes:
        if self._refused is not None:
            # The client's answer to the error challenge: the exchange fails now.
            raise AuthFailed(self._refused)
        try:
            text = message.decode("utf-8")
        except UnicodeDecodeError:
            raise AuthFailed("OAUTHBEARER message is not UTF-8") from None
        gs2, sep, rest = text.partition("\x01")
        if not sep or not rest.endswith("\x01\x01") or not gs2.startswith("n,"):
            raise AuthFailed("OAUTHBEARER message is not of RFC 7628's form")
        authzid = ""
        for attr in gs2[2:].split(","):
            if attr.startswith("a="):
                authzid = attr[2:]
        pairs = dict(kv.split("=", 1) for kv in rest[:-2].split("\x01") if "=" in kv)
        auth = pairs.get("auth", "")
        if not auth.lower().startswith("bearer "):
            raise AuthFailed("OAUTHBEARER message has no auth=Bearer token")
        try:
            principal, expiry = self._validator.validate(auth[7:].strip())
            if authzid and authzid != principal:
                raise AuthFailed(f"authorization id {authzid!r} is not the token's principal")
        except AuthFailed as e:
            self._refused = str(e)
            return INVALID_TOKEN
        self.authorization_id = principal
        self.expires_at = expiry
        self.complete = True
        return b""
