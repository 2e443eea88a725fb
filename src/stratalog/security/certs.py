"""A test CA and certificates for trying TLS (``stratalog certs --out DIR``); not for production.

Writes, all PEM, private keys unencrypted PKCS#8 (what Kafka's PEM keystore reads without
``ssl.key.password``):

* ``ca.pem``: the test CA's certificate, the truststore of brokers and clients
  (``ssl.truststore.location`` / ``ssl.ca.location``); ``ca-key.pem`` its key;
* ``broker.pem``: the broker's key and certificate (``ssl.keystore.location``), for
  ``127.0.0.1``, ``::1`` and ``localhost`` (plus ``--host`` names), also as ``broker.crt`` and
  ``broker.key``;
* ``client.pem`` (and ``client.crt``, ``client.key``): a client certificate with subject
  ``CN=client,O=Stratalog test``, for mutual TLS;
* ``other-ca.pem``, and ``other-client.*`` and ``other-broker.*`` signed by it: certificates
  from a CA nobody trusts, for negative tests.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

CLIENT_SUBJECT = "CN=client,O=Stratalog test"
OTHER_CLIENT_SUBJECT = "CN=intruder,O=Other test CA"


@dataclass(frozen=True)
class _Issued:
    key: object
    cert: object


def _key():
    from cryptography.hazmat.primitives.asymmetric import rsa

    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def _name(cn: str, org: str):
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    return x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, org),
            x509.NameAttribute(NameOID.COMMON_NAME, cn),
        ]
    )


def _builder(subject, issuer, public_key, days: int):
    from cryptography import x509

    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
    )


def _ca(cn: str, org: str, days: int) -> _Issued:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes

    key = _key()
    name = _name(cn, org)
    cert = (
        _builder(name, name, key.public_key(), days)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return _Issued(key, cert)


def _leaf(ca: _Issued, cn: str, org: str, days: int, hosts: list[str] | None) -> _Issued:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.x509.oid import ExtendedKeyUsageOID

    key = _key()
    b = (
        _builder(_name(cn, org), ca.cert.subject, key.public_key(), days)  # type: ignore[attr-defined]
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca.key.public_key()),  # type: ignore[attr-defined]
            critical=False,
        )
    )
    if hosts is not None:
        names: list[x509.GeneralName] = []
        for h in hosts:
            try:
                names.append(x509.IPAddress(ipaddress.ip_address(h)))
            except ValueError:
                names.append(x509.DNSName(h))
        b = b.add_extension(x509.SubjectAlternativeName(names), critical=False)
        usage = [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
    else:
        usage = [ExtendedKeyUsageOID.CLIENT_AUTH]
    b = b.add_extension(x509.ExtendedKeyUsage(usage), critical=False)
    return _Issued(key, b.sign(ca.key, hashes.SHA256()))  # type: ignore[arg-type]


def _pem_cert(issued: _Issued) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return issued.cert.public_bytes(serialization.Encoding.PEM)  # type: ignore[attr-defined]


def _pem_key(issued: _Issued) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return issued.key.private_bytes(  # type: ignore[attr-defined]
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _write(path: Path, data: bytes, private: bool = False) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    if private:
        tmp.chmod(0o600)
    tmp.replace(path)


def _write_leaf(out: Path, stem: str, issued: _Issued) -> None:
    cert, key = _pem_cert(issued), _pem_key(issued)
    _write(out / f"{stem}.pem", key + cert, private=True)
    _write(out / f"{stem}.crt", cert)
    _write(out / f"{stem}.key", key, private=True)


def make_test_certificates(
    out: Path, hosts: list[str] | None = None, days: int = 365
) -> dict[str, Path]:
    """Write the files listed in the module's docstring into ``out``; returns them by name."""
    out.mkdir(parents=True, exist_ok=True)
    names = ["127.0.0.1", "::1", "localhost", *(hosts or [])]
    ca = _ca("Stratalog test CA", "Stratalog test", days)
    other = _ca("Other test CA", "Other test CA", days)
    _write(out / "ca.pem", _pem_cert(ca))
    _write(out / "ca-key.pem", _pem_key(ca), private=True)
    _write(out / "other-ca.pem", _pem_cert(other))
    _write_leaf(out, "broker", _leaf(ca, "broker", "Stratalog test", days, names))
    _write_leaf(out, "client", _leaf(ca, "client", "Stratalog test", days, None))
    _write_leaf(out, "other-client", _leaf(other, "intruder", "Other test CA", days, None))
    _write_leaf(out, "other-broker", _leaf(other, "broker", "Other test CA", days, names))
    files = ["ca.pem", "ca-key.pem", "other-ca.pem"]
    for stem in ("broker", "client", "other-client", "other-broker"):
        files += [f"{stem}.pem", f"{stem}.crt", f"{stem}.key"]
    return {name: out / name for name in files}
