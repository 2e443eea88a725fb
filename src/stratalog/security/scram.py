"""SCRAM-SHA-256 and SCRAM-SHA-512 (RFC 5802, RFC 7677): credentials and the server's side.

A credential is what the broker keeps of a password: a random salt, the iteration count, and
two keys derived from ``SaltedPassword = PBKDF2(password, salt, iterations)``:
``StoredKey = H(HMAC(SaltedPassword, "Client Key"))`` and
``ServerKey = HMAC(SaltedPassword, "Server Key")``. Neither gives back the password, and the
exchange proves the client knows it without sending it.

The exchange (``ScramServer.step``, one token in, one out):

1. client-first ``n,,n=<user>,r=<client nonce>`` -> server-first
   ``r=<client nonce><server nonce>,s=<salt>,i=<iterations>``;
2. client-final ``c=biws,r=<nonce>,p=<ClientProof>`` -> server-final ``v=<ServerSignature>``,
   once ``H(ClientProof XOR HMAC(StoredKey, AuthMessage)) == StoredKey``.

Like Kafka's ScramSaslServer, only the gs2 header ``n`` (no channel binding) is accepted, an
authorization id must equal the user name, an unknown user fails at the first message, and the
messages sent back on failure never say whether the user exists.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import secrets
from collections.abc import Callable
from dataclasses import dataclass

MIN_ITERATIONS = 4096  # Kafka's ScramMechanism minimum
MAX_ITERATIONS = 16384  # Kafka's ScramControlManager maximum for AlterUserScramCredentials


@dataclass(frozen=True)
class Mechanism:
    name: str
    hash_name: str
    type: int  # the int8 of Describe/AlterUserScramCredentials (Kafka's admin ScramMechanism)

    @property
    def digest_size(self) -> int:
        return hashlib.new(self.hash_name).digest_size

    def hmac(self, key: bytes, msg: bytes) -> bytes:
        return hmac.new(key, msg, self.hash_name).digest()

    def h(self, data: bytes) -> bytes:
        return hashlib.new(self.hash_name, data).digest()

    def salted_password(self, password: str, salt: bytes, iterations: int) -> bytes:
        return hashlib.pbkdf2_hmac(self.hash_name, password.encode(), salt, iterations)


SHA_256 = Mechanism("SCRAM-SHA-256", "sha256", 1)
SHA_512 = Mechanism("SCRAM-SHA-512", "sha512", 2)
MECHANISMS = {m.name: m for m in (SHA_256, SHA_512)}
BY_TYPE = {m.type: m for m in (SHA_256, SHA_512)}


@dataclass(frozen=True)
class ScramCredential:
    salt: bytes
    stored_key: bytes
    server_key: bytes
    iterations: int

    def to_json(self) -> dict:
        b64 = base64.b64encode
        return {
            "salt": b64(self.salt).decode(),
            "stored_key": b64(self.stored_key).decode(),
            "server_key": b64(self.server_key).decode(),
            "iterations": self.iterations,
        }

    @classmethod
    def from_json(cls, raw: dict) -> ScramCredential:
        d = base64.b64decode
        return cls(d(raw["salt"]), d(raw["stored_key"]), d(raw["server_key"]), raw["iterations"])


def credential_from_salted(
    mech: Mechanism, salt: bytes, salted_password: bytes, iterations: int
) -> ScramCredential:
    """The credential kept for a salted password (what AlterUserScramCredentials sends)."""
    client_key = mech.hmac(salted_password, b"Client Key")
    return ScramCredential(
        salt, mech.h(client_key), mech.hmac(salted_password, b"Server Key"), iterations
    )


def make_credential(
    mech: Mechanism, password: str, iterations: int = MIN_ITERATIONS, salt: bytes | None = None
) -> ScramCredential:
    salt = salt if salt is not None else secrets.token_bytes(32)
    return credential_from_salted(
        mech, salt, mech.salted_password(password, salt, iterations), iterations
    )


def password_matches(mech: Mechanism, cred: ScramCredential, password: str) -> bool:
    """Whether ``password`` is the one ``cred`` was made from (for PLAIN against SCRAM users)."""
    salted = mech.salted_password(password, cred.salt, cred.iterations)
    return hmac.compare_digest(mech.h(mech.hmac(salted, b"Client Key")), cred.stored_key)


class AuthFailed(Exception):
    """Authentication failed. ``public`` messages go to the client as they are (Kafka's
    SaslAuthenticationException); others are replaced by a generic text that reveals nothing
    (Kafka's SaslException)."""

    def __init__(self, message: str, public: bool = False) -> None:
        super().__init__(message)
        self.public = public


# RFC 5802 grammar, as Kafka's ScramMessages checks it.
_VALUE_SAFE = r"[\x01-\x2b\x2d-\x3c\x3e-\x7f]"  # any 7-bit char but NUL, ',' and '='
_SASLNAME = rf"(?:{_VALUE_SAFE}|=2C|=3D)+"
_PRINTABLE = r"[\x21-\x2b\x2d-\x7e]+"
_VALUE = r"[\x01-\x2b\x2d-\x7f]+"
_B64 = r"(?:[A-Za-z0-9/+]{4})*(?:[A-Za-z0-9/+]{3}=|[A-Za-z0-9/+]{2}==)?"
_EXTENSIONS = rf"(?:,[A-Za-z]+={_VALUE})*"
_CLIENT_FIRST = re.compile(
    rf"n,(?:a=(?P<authzid>{_SASLNAME}))?,(?P<bare>(?:m={_VALUE},)?n=(?P<user>{_SASLNAME}),"
    rf"r=(?P<nonce>{_PRINTABLE})(?P<ext>{_EXTENSIONS}))"
)
_CLIENT_FINAL = re.compile(
    rf"(?P<without_proof>c=(?P<channel>{_B64}),r=(?P<nonce>{_PRINTABLE}){_EXTENSIONS}),"
    rf"p=(?P<proof>{_B64})"
)


def unescape_username(saslname: str) -> str:
    return saslname.replace("=2C", ",").replace("=3D", "=")


class ScramServer:
    """The server side of one SCRAM exchange; ``step`` raises ``AuthFailed``."""

    def __init__(
        self,
        mech: Mechanism,
        lookup: Callable[[str], ScramCredential | None],
        nonce: Callable[[], str] | None = None,
    ) -> None:
        self.mech = mech
        self._lookup = lookup
        self._nonce = nonce or (lambda: secrets.token_urlsafe(24))
        self._state = "first"
        self._cred: ScramCredential | None = None
        self._first_bare = ""
        self._server_first = ""
        self.authorization_id: str | None = None

    @property
    def complete(self) -> bool:
        return self._state == "complete"

    def step(self, token: bytes) -> bytes:
        try:
            if self._state == "first":
                return self._first(token)
            if self._state == "final":
                return self._final(token)
            raise AuthFailed(f"Unexpected challenge in SCRAM server state {self._state}")
        except AuthFailed:
            self._state = "failed"
            self._cred = None
            raise

    def _first(self, token: bytes) -> bytes:
        m = _CLIENT_FIRST.fullmatch(_text(token))
        if m is None:
            raise AuthFailed("Invalid SCRAM client first message format")
        user = unescape_username(m["user"])
        cred = self._lookup(user)
        if cred is None:
            raise AuthFailed("Authentication failed: Invalid user credentials")
        authzid = m["authzid"]
        if authzid and unescape_username(authzid) != user:
            raise AuthFailed(
                "Authentication failed: Client requested an authorization id that is different "
                "from username",
                public=True,
            )
        if cred.iterations < MIN_ITERATIONS:
            raise AuthFailed(f"Iterations {cred.iterations} is less than the minimum")
        self._cred = cred
        self._first_bare = m["bare"]
        self._server_first = (
            f"r={m['nonce']}{self._nonce()},s={base64.b64encode(cred.salt).decode()},"
            f"i={cred.iterations}"
        )
        self.authorization_id = user
        self._state = "final"
        return self._server_first.encode()

    def _final(self, token: bytes) -> bytes:
        m = _CLIENT_FINAL.fullmatch(_text(token))
        if m is None:
            raise AuthFailed("Invalid SCRAM client final message format")
        nonce = self._server_first[2 : self._server_first.index(",")]
        # As Kafka: the nonce must end with the server-first one (librdkafka before 2.x sends
        # the client's nonce twice; the proof covers what it sent, so this costs nothing).
        if not m["nonce"].endswith(nonce):
            raise AuthFailed("Invalid client nonce in the final client message.")
        cred = self._cred
        assert cred is not None
        mech = self.mech
        auth_message = f"{self._first_bare},{self._server_first},{m['without_proof']}".encode()
        proof = base64.b64decode(m["proof"])
        signature = mech.hmac(cred.stored_key, auth_message)
        if len(proof) != len(signature):
            raise AuthFailed("Invalid client credentials")
        client_key = bytes(a ^ b for a, b in zip(proof, signature, strict=True))
        if not hmac.compare_digest(mech.h(client_key), cred.stored_key):
            raise AuthFailed("Invalid client credentials")
        server_signature = mech.hmac(cred.server_key, auth_message)
        self._cred = None
        self._state = "complete"
        return b"v=" + base64.b64encode(server_signature)


def _text(token: bytes) -> str:
    try:
        return token.decode("utf-8")
    except UnicodeDecodeError:
        raise AuthFailed("SCRAM message is not UTF-8") from None


# -- the client's side, for tests and tools --------------------------------------------------------
class ScramClient:
    """The client side of one exchange (tests drive the server with it)."""

    def __init__(self, mech: Mechanism, user: str, password: str, nonce: str | None = None):
        self.mech = mech
        self.password = password
        saslname = user.replace("=", "=3D").replace(",", "=2C")
        self.first_bare = f"n={saslname},r={nonce or secrets.token_urlsafe(18)}"
        self._server_key = b""
        self._auth_message = b""

    def first(self) -> bytes:
        return f"n,,{self.first_bare}".encode()

    def final(self, server_first: bytes) -> bytes:
        fields = dict(kv.split("=", 1) for kv in server_first.decode().split(","))
        salt, iterations = base64.b64decode(fields["s"]), int(fields["i"])
        salted = self.mech.salted_password(self.password, salt, iterations)
        client_key = self.mech.hmac(salted, b"Client Key")
        without_proof = f"c=biws,r={fields['r']}"
        self._auth_message = f"{self.first_bare},{server_first.decode()},{without_proof}".encode()
        signature = self.mech.hmac(self.mech.h(client_key), self._auth_message)
        proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
        self._server_key = self.mech.hmac(salted, b"Server Key")
        return f"{without_proof},p={base64.b64encode(proof).decode()}".encode()

    def verify(self, server_final: bytes) -> bool:
        expected = b"v=" + base64.b64encode(self.mech.hmac(self._server_key, self._auth_message))
        return hmac.compare_digest(expected, server_final)
