"""TLS for the SSL and SASL_SSL listeners: the server context from PEM files, and principals.

Settings follow Kafka's PEM keystore (``ssl.keystore.type=PEM``): ``ssl.keystore.location`` is
one PEM file holding the broker's private key (PKCS#8, encrypted with ``ssl.key.password`` or
not) and its certificate chain; ``ssl.truststore.location`` is a PEM bundle of the CAs that
client certificates are checked against; ``ssl.client.auth`` is ``none``, ``requested`` or
``required`` (mutual TLS). Everything is checked when the broker starts, and each problem is
reported with the setting and file it concerns, not as an OpenSSL error code.

With a client certificate the connection's principal is ``User:`` and the certificate's subject
in RFC 4514 form (``CN=alice,O=Example``), as Kafka's default principal builder names it.
"""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import Any

from stratalog.config import ConfigError

CLIENT_AUTH = {
    "none": ssl.CERT_NONE,
    "requested": ssl.CERT_OPTIONAL,
    "required": ssl.CERT_REQUIRED,
}
_PROTOCOLS = {"TLSv1.2": ssl.TLSVersion.TLSv1_2, "TLSv1.3": ssl.TLSVersion.TLSv1_3}
ANONYMOUS = "User:ANONYMOUS"


def read_pem(setting: str, location: str, needed_by: str = "a listener with TLS") -> bytes:
    """The bytes of the PEM file ``setting`` names; a ConfigError naming the setting if it is
    not set or cannot be read."""
    if not location:
        raise ConfigError(f"{setting} is not set: {needed_by} needs it")
    path = Path(location)
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise ConfigError(f"{setting}: {location} does not exist") from None
    except IsADirectoryError:
        raise ConfigError(f"{setting}: {location} is a directory, not a PEM file") from None
    except OSError as e:
        raise ConfigError(f"{setting}: cannot read {location}: {e.strerror or e}") from None


def _check_keystore(location: str, password: str) -> None:
    pem = read_pem("ssl.keystore.location", location)
    if b"-----BEGIN CERTIFICATE-----" not in pem:
        raise ConfigError(
            f"ssl.keystore.location: {location} holds no certificate (a PEM keystore holds the "
            "private key and the certificate chain)"
        )
    if b"PRIVATE KEY-----" not in pem:
        raise ConfigError(
            f"ssl.keystore.location: {location} holds no private key (a PEM keystore holds the "
            "private key and the certificate chain)"
        )
    if b"-----BEGIN ENCRYPTED PRIVATE KEY-----" in pem and not password:
        raise ConfigError(
            f"ssl.keystore.location: the private key in {location} is encrypted: set "
            "ssl.key.password"
        )


def _versions(text: str) -> tuple[ssl.TLSVersion, ssl.TLSVersion]:
    names = [s.strip() for s in text.split(",") if s.strip()]
    unknown = [n for n in names if n not in _PROTOCOLS]
    if unknown or not names:
        raise ConfigError(
            f"ssl.enabled.protocols: {', '.join(unknown) or 'nothing'} given; the broker speaks "
            f"{' and '.join(_PROTOCOLS)}"
        )
    versions = sorted(_PROTOCOLS[n] for n in names)
    return versions[0], versions[-1]


def replication_contexts(config: Any) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """(server, client) contexts of the replication link with ``cluster.replication.tls``:
    mutual TLS, both ends presenting the broker's own certificate and checking the peer's
    against the truststore (and the peer's registered host name against its certificate)."""
    truststore = config["ssl.truststore.location"]
    if not truststore:
        raise ConfigError(
            "cluster.replication.tls needs ssl.truststore.location: the CAs that peer brokers' "
            "certificates are checked against"
        )
    server = server_context(config, client_auth="required")
    client = ssl.create_default_context(cafile=truststore)
    client.minimum_version, client.maximum_version = _versions(config["ssl.enabled.protocols"])
    client.load_cert_chain(
        config["ssl.keystore.location"], password=config["ssl.key.password"] or None
    )
    return server, client


def server_context(config: Any, client_auth: str | None = None) -> ssl.SSLContext:
    """The TLS context of a listener (``config[name]`` gives the settings); ``client_auth``
    overrides ``ssl.client.auth`` (a SASL_SSL listener asks for no certificate)."""
    for setting in ("ssl.keystore.type", "ssl.truststore.type"):
        if config[setting].upper() != "PEM":
            raise ConfigError(f"{setting} must be PEM, not {config[setting]!r}")
    auth = client_auth if client_auth is not None else config["ssl.client.auth"]
    keystore = config["ssl.keystore.location"]
    password = config["ssl.key.password"]
    _check_keystore(keystore, password)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version, ctx.maximum_version = _versions(config["ssl.enabled.protocols"])
    try:
        ctx.load_cert_chain(keystore, password=password or None)
    except ssl.SSLError as e:
        text = str(e)
        if "KEY_VALUES_MISMATCH" in text or "key values mismatch" in text:
            raise ConfigError(
                f"ssl.keystore.location: the private key in {keystore} does not match its "
                "certificate"
            ) from None
        if "bad decrypt" in text or "BAD_DECRYPT" in text:
            raise ConfigError(
                f"ssl.key.password does not decrypt the private key in {keystore}"
            ) from None
        raise ConfigError(
            f"ssl.keystore.location: {keystore} is not a usable PEM key and certificate chain "
            f"({e.reason or text})"
        ) from None
    truststore = config["ssl.truststore.location"]
    if truststore:
        pem = read_pem("ssl.truststore.location", truststore)
        if b"-----BEGIN CERTIFICATE-----" not in pem:
            raise ConfigError(
                f"ssl.truststore.location: {truststore} holds no CA certificate (a PEM bundle)"
            )
        try:
            ctx.load_verify_locations(cafile=truststore)
        except ssl.SSLError as e:
            raise ConfigError(
                f"ssl.truststore.location: {truststore} is not a usable PEM bundle "
                f"({e.reason or e})"
            ) from None
    if auth not in CLIENT_AUTH:
        raise ConfigError(f"ssl.client.auth must be none, requested or required, not {auth!r}")
    if auth != "none" and not truststore:
        raise ConfigError(
            f"ssl.client.auth={auth} checks client certificates against "
            "ssl.truststore.location, which is not set"
        )
    ctx.verify_mode = CLIENT_AUTH[auth]
    return ctx


def principal_of(ssl_object: Any) -> str:
    """``User:<subject>`` of a verified client certificate, else ``User:ANONYMOUS``."""
    if ssl_object is None:
        return ANONYMOUS
    try:
        der = ssl_object.getpeercert(binary_form=True)
    except (ValueError, ssl.SSLError):
        return ANONYMOUS
    if not der:
        return ANONYMOUS
    from cryptography import x509

    subject = x509.load_der_x509_certificate(der).subject.rfc4514_string()
    return f"User:{subject}"
