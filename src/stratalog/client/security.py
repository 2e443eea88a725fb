"""How Stratalog's own clients (the wire client, the CLI, the Spark data sources) reach a secured
listener: TLS and SASL (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512), configured with the settings a
Kafka client takes.

``security.protocol`` is PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL. TLS: the CAs to trust in
``ssl.truststore.location`` (a PEM bundle; ``ssl.ca.location``, librdkafka's name, too), and for
mutual TLS the client's key and certificate chain in ``ssl.keystore.location`` (one PEM file, as
Kafka's PEM keystore; or librdkafka's ``ssl.certificate.location`` and ``ssl.key.location``;
``ssl.key.password`` if the key is encrypted). Host names are checked
unless ``ssl.endpoint.identification.algorithm`` is empty, as in Kafka's clients. SASL:
``sasl.mechanism`` and the user's name and password, from ``sasl.jaas.config`` (the JAAS line a
Java client or Spark's Kafka source is given) or ``sasl.username`` / ``sasl.password``
(librdkafka's).
"""

from __future__ import annotations

import re
import ssl
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stratalog.client.errors import WireError
from stratalog.security.scram import MECHANISMS, ScramClient

PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
SASL_MECHANISMS = ("PLAIN", *MECHANISMS)
SASL_HANDSHAKE, SASL_HANDSHAKE_V = 17, 1
SASL_AUTHENTICATE, SASL_AUTHENTICATE_V = 36, 2
_JAAS_OPTION = re.compile(r'(\w+)\s*=\s*"((?:[^"\\]|\\.)*)"')


class SecurityConfigError(ValueError):
    """A client security setting that cannot work; the message starts with its name."""


@dataclass(frozen=True)
class ClientSecurity:
    protocol: str = "PLAINTEXT"
    truststore: str | None = None
    keystore: str | None = None  # the client's certificate chain (and key, in one PEM file)
    key: str | None = None  # the client's key when in a file of its own
    key_password: str | None = None
    check_hostname: bool = True
    mechanism: str | None = None
    username: str | None = None
    password: str | None = None

    @property
    def tls(self) -> bool:
        return self.protocol in ("SSL", "SASL_SSL")

    @property
    def sasl(self) -> bool:
        return self.protocol in ("SASL_PLAINTEXT", "SASL_SSL")

    def context(self) -> ssl.SSLContext:
        """The TLS context: the configured CAs (the system's without), the client's
        certificate for mutual TLS."""
        ctx = ssl.create_default_context(cafile=self.truststore)
        ctx.check_hostname = self.check_hostname
        if self.keystore:
            try:
                ctx.load_cert_chain(self.keystore, self.key, password=self.key_password)
            except (OSError, ssl.SSLError) as e:
                raise SecurityConfigError(
                    f"ssl.keystore.location: cannot load a key and certificate from "
                    f"{self.keystore}: {e}"
                ) from None
        return ctx


def _jaas_credentials(jaas: str) -> tuple[str | None, str | None]:
    options = {k: v.replace('\\"', '"') for k, v in _JAAS_OPTION.findall(jaas)}
    return options.get("username"), options.get("password")


def from_config(settings: Mapping[str, str]) -> ClientSecurity:
    """The security of Kafka client ``settings`` (names without Spark's ``kafka.`` prefix);
    a setting that cannot work raises SecurityConfigError naming it."""
    get = {k.lower(): v for k, v in settings.items()}.get
    protocol = (get("security.protocol") or "PLAINTEXT").strip().upper()
    if protocol not in PROTOCOLS:
        raise SecurityConfigError(
            f"security.protocol must be one of {', '.join(PROTOCOLS)}, not {protocol!r}"
        )
    for setting in ("ssl.truststore.type", "ssl.keystore.type"):
        kind = get(setting)
        if kind is not None and kind.upper() != "PEM":
            raise SecurityConfigError(f"{setting}: only PEM files are read, not {kind}")
    mechanism = (get("sasl.mechanism") or get("sasl.mechanisms") or "GSSAPI").strip().upper()
    username, password = get("sasl.username"), get("sasl.password")
    if get("sasl.jaas.config"):
        username, password = _jaas_credentials(get("sasl.jaas.config") or "")
    sec = ClientSecurity(
        protocol=protocol,
        truststore=get("ssl.truststore.location") or get("ssl.ca.location"),
        keystore=get("ssl.keystore.location") or get("ssl.certificate.location"),
        key=get("ssl.key.location"),
        key_password=get("ssl.key.password"),
        check_hostname=(get("ssl.endpoint.identification.algorithm") or "https") != "",
        mechanism=mechanism if protocol.startswith("SASL") else None,
        username=username,
        password=password,
    )
    if sec.sasl:
        if mechanism not in SASL_MECHANISMS:
            raise SecurityConfigError(
                f"sasl.mechanism {mechanism} is not offered by this client: use one of "
                f"{', '.join(SASL_MECHANISMS)}"
            )
        if username is None or password is None:
            raise SecurityConfigError(
                f'sasl.jaas.config: {protocol} needs a user name and password (username="..." '
                'password="..." in it), or sasl.username and sasl.password'
            )
    return sec


def read_properties(path: str) -> dict[str, str]:
    """A Kafka client properties file (what Kafka's tools take with ``--command-config``):
    ``key=value`` or ``key: value`` lines, ``#`` and ``!`` comments, a trailing backslash
    continuing a line (as a JAAS line often is)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as e:
        why = e.strerror or e
        raise SecurityConfigError(f"command config: cannot read {path}: {why}") from None
    out: dict[str, str] = {}
    logical = ""
    for raw in text.splitlines():
        line = raw.strip() if not logical else raw.lstrip()
        if not logical and (not line or line[0] in "#!"):
            continue
        if line.endswith("\\") and not line.endswith("\\\\"):
            logical += line[:-1]
            continue
        logical += line
        m = re.match(r"([^=:\s]+)\s*[=:]\s*(.*)$", logical)
        if m is None:
            raise SecurityConfigError(f"command config {path}: {logical!r} is not key=value")
        out[m.group(1)] = m.group(2)
        logical = ""
    return out


def librdkafka_settings(sec: ClientSecurity) -> dict[str, str]:
    """The same security as librdkafka (confluent-kafka) takes it."""
    out = {"security.protocol": sec.protocol}
    if sec.tls:
        if sec.truststore:
            out["ssl.ca.location"] = sec.truststore
        if sec.keystore:
            out["ssl.certificate.location"] = sec.keystore
            out["ssl.key.location"] = sec.key or sec.keystore
        if sec.key_password:
            out["ssl.key.password"] = sec.key_password
        out["ssl.endpoint.identification.algorithm"] = "https" if sec.check_hostname else "none"
    if sec.sasl:
        assert sec.mechanism and sec.username is not None and sec.password is not None
        out |= {
            "sasl.mechanism": sec.mechanism,
            "sasl.username": sec.username,
            "sasl.password": sec.password,
        }
    return out


Request = Callable[[int, int, Any], Any]


def authenticate(sec: ClientSecurity, request: Request, build: Callable[..., Any]) -> None:
    """The SASL exchange on a new connection: ``request(api_key, version, body)`` sends one
    request and returns its decoded answer; ``build(api_key, version, **fields)`` makes a body.
    Raises WireError if the broker refuses."""
    assert sec.mechanism is not None and sec.username is not None and sec.password is not None
    hs = request(
        SASL_HANDSHAKE,
        SASL_HANDSHAKE_V,
        build(SASL_HANDSHAKE, SASL_HANDSHAKE_V, mechanism=sec.mechanism),
    )
    if hs.error_code:
        raise WireError(
            f"SASL mechanism {sec.mechanism} refused: the listener offers "
            f"{', '.join(hs.mechanisms) or 'none'}",
            int(hs.error_code),
        )

    def step(token: bytes) -> bytes:
        body = build(SASL_AUTHENTICATE, SASL_AUTHENTICATE_V, auth_bytes=token)
        resp = request(SASL_AUTHENTICATE, SASL_AUTHENTICATE_V, body)
        if resp.error_code:
            raise WireError(
                f"SASL authentication of {sec.username!r} failed: "
                f"{resp.error_message or resp.error_code.name}",
                int(resp.error_code),
            )
        return bytes(resp.auth_bytes)

    if sec.mechanism == "PLAIN":
        step(f"\0{sec.username}\0{sec.password}".encode())
        return
    client = ScramClient(MECHANISMS[sec.mechanism], sec.username, sec.password)
    server_first = step(client.first())
    if not client.verify(step(client.final(server_first))):
        raise WireError("the broker's SCRAM signature is wrong: it does not know the password")
