"""Shared pieces of the security tests: one set of real certificates for the session (a test CA,
a broker and a client certificate, and a second CA's), the listeners of a secured broker, and
the users every module logs in with."""

from __future__ import annotations

from pathlib import Path

import pytest

from stratalog.security.certs import make_test_certificates

# PLAIN users (sasl.plain.users.file, Kafka's JAAS syntax) and SCRAM users (created through
# AlterUserScramCredentials by each module).
PLAIN_USERS = {"alice": "alice-secret", "admin": "admin-secret"}
SCRAM_USERS = {"SCRAM-SHA-256": ("scram256", "pw-256"), "SCRAM-SHA-512": ("scram512", "pw-512")}
ALL_LISTENERS = ",".join(
    f"{name}://127.0.0.1:0" for name in ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
)


def jaas_plain(users: dict[str, str]) -> str:
    entries = " ".join(f'user_{u}="{p}"' for u, p in users.items())
    return f"org.apache.kafka.common.security.plain.PlainLoginModule required {entries};"


@pytest.fixture(scope="session")
def certs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The files of ``stratalog certs`` (security/certs.py), made once for the session."""
    return make_test_certificates(tmp_path_factory.mktemp("certs"))


@pytest.fixture(scope="session")
def plain_users_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("jaas") / "plain-users.jaas"
    path.write_text(f"KafkaServer {{\n  {jaas_plain(PLAIN_USERS)}\n}};\n")
    return path


def secure_config(certs: dict[str, Path], users_file: Path, **extra: object) -> dict:
    """A broker with all four listeners: SSL with mutual TLS required, SASL with PLAIN and
    both SCRAM mechanisms."""
    return {
        "listeners": ALL_LISTENERS,
        "ssl.keystore.location": str(certs["broker.pem"]),
        "ssl.truststore.location": str(certs["ca.pem"]),
        "ssl.client.auth": "required",
        "sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-256,SCRAM-SHA-512",
        "sasl.plain.users.file": str(users_file),
        **extra,
    }


def add_scram_users(bootstrap: str, users: dict[str, tuple[str, str]] = SCRAM_USERS) -> None:
    """Create SCRAM users the way Kafka's admin client does (AlterUserScramCredentials)."""
    from confluent_kafka.admin import (
        AdminClient,
        ScramCredentialInfo,
        ScramMechanism,
        UserScramCredentialUpsertion,
    )

    admin = AdminClient({"bootstrap.servers": bootstrap})
    ups = []
    for mech, (user, password) in users.items():
        info = ScramCredentialInfo(getattr(ScramMechanism, mech.replace("-", "_")), 4096)
        ups.append(UserScramCredentialUpsertion(user, info, password.encode()))
    for f in admin.alter_user_scram_credentials(ups).values():
        f.result(15)
