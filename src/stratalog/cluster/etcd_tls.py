"""TLS to etcd: the client's PEM material, and what went wrong when a connection fails.

A broker reaches an https etcd with ``cluster.etcd.ssl.truststore.location`` (the CAs etcd's
certificate must chain to) and, for etcd's ``--client-cert-auth``,
``cluster.etcd.ssl.keystore.location`` (one PEM file holding the broker's private key and its
certificate chain, as Kafka's PEM keystore; ``cluster.etcd.ssl.key.password`` if the key is
encrypted). gRPC takes the material as bytes (``grpc.ssl_channel_credentials``), with the key
unencrypted, so :meth:`EtcdTls.grpc_material` splits and decrypts the keystore in memory.

gRPC reports a TLS mismatch as a bare ``UNAVAILABLE`` ("Socket closed", "Unwrap failed",
"Handshake read failed") and would be retried until the connect timeout. :func:`diagnose`
repeats the handshake with Python's ssl module, which says which side refused what, so the
broker stops at once with a sentence naming the setting to fix.
"""

from __future__ import annotations

import re
import socket
import ssl
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from stratalog.config import ConfigError

TRUSTSTORE = "cluster.etcd.ssl.truststore.location"
KEYSTORE = "cluster.etcd.ssl.keystore.location"
KEY_PASSWORD = "cluster.etcd.ssl.key.password"
_PROBE_TIMEOUT = 2.0
_NEEDED_BY = "an https etcd"
_KEY_BLOCK = re.compile(
    rb"-----BEGIN ((?:ENCRYPTED |RSA |EC )?PRIVATE KEY)-----.+?-----END \1-----", re.S
)


@dataclass(frozen=True)
class EtcdTls:
    """How a client proves itself to, and checks, an https etcd (file paths, read on use)."""

    truststore: str  # PEM bundle of the CAs etcd's certificate must chain to
    keystore: str = ""  # PEM: private key and certificate chain; empty: no client certificate
    key_password: str = ""

    def grpc_material(self) -> tuple[bytes, bytes | None, bytes | None]:
        """(root CAs, unencrypted private key, certificate chain), PEM bytes, for
        ``grpc.ssl_channel_credentials``. Raises ValueError (ConfigError, for a file that
        cannot be read) naming the setting at fault."""
        from cryptography import x509
        from cryptography.hazmat.primitives import serialization

        from stratalog.security.tls import read_pem

        root = read_pem(TRUSTSTORE, self.truststore, _NEEDED_BY)
        if b"-----BEGIN CERTIFICATE-----" not in root:
            raise ValueError(f"{TRUSTSTORE}: {self.truststore} holds no CA certificate")
        if not self.keystore:
            return root, None, None
        pem = read_pem(KEYSTORE, self.keystore, _NEEDED_BY)
        try:
            chain = x509.load_pem_x509_certificates(pem)
        except ValueError:
            chain = []
        if not chain:
            raise ValueError(
                f"{KEYSTORE}: {self.keystore} holds no certificate (it holds the private key "
                "and the certificate chain)"
            )
        found = _KEY_BLOCK.search(pem)
        if found is None:
            raise ValueError(
                f"{KEYSTORE}: {self.keystore} holds no private key (it holds the private key "
                "and the certificate chain)"
            )
        block = found.group(0)
        password = self.key_password.encode() or None
        try:
            key = serialization.load_pem_private_key(block, password=password)
        except TypeError:  # encrypted without a password, or a password for a plain key
            if password is None:
                raise ValueError(
                    f"{KEYSTORE}: the private key in {self.keystore} is encrypted: set "
                    f"{KEY_PASSWORD}"
                ) from None
            key = serialization.load_pem_private_key(block, password=None)
        except ValueError:
            raise ValueError(
                f"{KEY_PASSWORD} does not decrypt the private key in {self.keystore}"
                if password
                else f"{KEYSTORE}: the private key in {self.keystore} does not parse"
            ) from None
        if key.public_key() != chain[0].public_key():
            raise ValueError(
                f"{KEYSTORE}: the private key in {self.keystore} does not match its certificate"
            )
        plain = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        certs = b"".join(c.public_bytes(serialization.Encoding.PEM) for c in chain)
        return root, plain, certs

    def client_context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=self.truststore)
        if self.keystore:
            ctx.load_cert_chain(self.keystore, password=self.key_password or None)
        return ctx


def _alert(e: ssl.SSLError) -> str:
    """The TLS alert a peer sent, if that is what ``e`` is ("" otherwise)."""
    text = f"{e.reason or ''} {e}".upper()
    for alert in ("CERTIFICATE_REQUIRED", "BAD_CERTIFICATE", "UNKNOWN_CA", "HANDSHAKE_FAILURE"):
        if alert in text:
            return alert
    return "ALERT" if "ALERT" in text else ""


def diagnose(endpoint: str, tls: EtcdTls | None, timeout: float = _PROBE_TIMEOUT) -> str | None:
    """Why a gRPC connection to ``endpoint`` failed, when a TLS handshake tells (a plain client
    at a TLS etcd, a TLS client at a plain one, a certificate either side refuses); None when
    it does not (refused, unreachable, slow: worth retrying). Blocking: run it in a thread."""
    if "://" not in endpoint:
        endpoint = f"http://{endpoint}"
    parts = urlsplit(endpoint)
    host, port = parts.hostname or "", parts.port or 0
    try:
        raw = socket.create_connection((host, port), timeout)
    except OSError:
        return None  # nothing listening (yet): the caller's retries and timeout apply
    with raw:
        if tls is None:
            return _plain_at_tls(endpoint, raw, host)
        return _tls_problem(endpoint, raw, host, tls)


def _plain_at_tls(endpoint: str, raw: socket.socket, host: str) -> str | None:
    # A plain client: does the server complete (or answer with an alert) a TLS handshake?
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    try:
        with ctx.wrap_socket(raw, server_hostname=host):
            pass
    except ssl.SSLError as e:
        if not _alert(e):
            return None
    except OSError:
        return None
    https = endpoint.replace("http://", "https://", 1)
    return (
        f"etcd at {endpoint} speaks TLS (its client URL is https), and this broker talks plain "
        f"http to it: name it {https} in cluster.etcd and set {TRUSTSTORE} to the CA that "
        f"signed etcd's certificate (and {KEYSTORE} if etcd runs with --client-cert-auth)"
    )


def _tls_problem(endpoint: str, raw: socket.socket, host: str, tls: EtcdTls) -> str | None:
    try:
        ctx = tls.client_context()
    except (OSError, ssl.SSLError) as e:
        return f"cannot use the TLS settings for etcd ({TRUSTSTORE}, {KEYSTORE}): {e}"
    try:
        with ctx.wrap_socket(raw, server_hostname=host) as conn:
            # In TLS 1.3 the client's certificate is judged after the client's handshake ends:
            # a refusal arrives as an alert on the first read.
            conn.sendall(b"GET /version HTTP/1.1\r\nHost: etcd\r\nConnection: close\r\n\r\n")
            conn.recv(64)
    except ssl.SSLCertVerificationError as e:
        return (
            f"etcd's certificate at {endpoint} is not trusted ({e.verify_message}): it must "
            f"chain to a CA in {TRUSTSTORE} ({tls.truststore}) and name {host}; a certificate "
            "from another CA?"
        )
    except ssl.SSLError as e:
        alert = _alert(e)
        if alert and not tls.keystore:
            return (
                f"etcd at {endpoint} asks for a client certificate (--client-cert-auth) and "
                f"refused the connection without one ({alert}): set {KEYSTORE} to a PEM file "
                "with the broker's key and a certificate from the CA etcd trusts"
            )
        if alert:
            return (
                f"etcd at {endpoint} refused the client certificate in {KEYSTORE} "
                f"({tls.keystore}, {alert}): it must chain to the CA etcd trusts "
                "(its --trusted-ca-file); a certificate from another CA?"
            )
        return _not_tls(endpoint, f"{e.reason or e}")
    except (ConnectionResetError, ConnectionAbortedError, BrokenPipeError) as e:
        return _not_tls(endpoint, str(e) or type(e).__name__)
    except OSError:
        return None
    return None  # the handshake and a request went through: not a TLS problem


def _not_tls(endpoint: str, why: str) -> str:
    plain = endpoint.replace("https://", "http://", 1)
    return (
        f"etcd at {endpoint} does not complete a TLS handshake ({why}): is its client URL "
        f"{plain} (no --cert-file)? A plain etcd is named with http:// in cluster.etcd"
    )


def etcd_client_tls(config: Any) -> EtcdTls | None:
    """The broker's TLS to an https etcd (``cluster.etcd.ssl.*``), its files read and checked
    now (a missing file, a keystore without a key or certificate, a key that does not match
    its certificate or does not decrypt: a ConfigError naming the setting); None for a plain
    http etcd or none at all."""
    if not any(e.lower().startswith("https://") for e in config.etcd_endpoints):
        return None
    tls = EtcdTls(
        config["cluster.etcd.ssl.truststore.location"],
        config["cluster.etcd.ssl.keystore.location"],
        config["cluster.etcd.ssl.key.password"],
    )
    try:
        tls.grpc_material()
        tls.client_context()  # the CA bundle parses for OpenSSL too
    except ValueError as e:
        raise ConfigError(str(e)) from None
    except ssl.SSLError as e:
        raise ConfigError(
            f"cluster.etcd.ssl.truststore.location: {tls.truststore} is not a usable PEM "
            f"bundle ({e.reason or e})"
        ) from None
    return tls
