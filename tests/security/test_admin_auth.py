"""The HTTP admin endpoint (/status, /metrics) asks for a credential when security is on: HTTP
basic authentication as a SASL user (PLAIN from the users file, or SCRAM), who with the
authorizer on must also be allowed DESCRIBE on the cluster. Without security (the default
PLAINTEXT listener, no authorizer) it stays open, as before."""

from __future__ import annotations

import base64
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from confluent_kafka.admin import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
)

from stratalog import Broker

from .conftest import PLAIN_USERS, add_scram_users, secure_config

AUTHORIZER = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"


def get(broker: Broker, path: str, user: str | None = None, password: str = "") -> int:
    """The HTTP status of GET ``path`` on the broker's admin endpoint."""
    request = urllib.request.Request(f"http://{broker.core.admin_address}{path}")
    if user is not None:
        token = base64.b64encode(f"{user}:{password}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(request, timeout=10) as r:
            r.read()
            return r.status
    except urllib.error.HTTPError as e:
        if e.code == 401:
            assert e.headers["WWW-Authenticate"] == 'Basic realm="stratalog"'
        return e.code


def test_open_without_security(tmp_path):
    with Broker(tmp_path / "data") as b:
        assert get(b, "/status") == 200
        assert get(b, "/metrics") == 200


def test_sasl_listeners_need_a_sasl_users_credential(
    tmp_path, certs: dict[str, Path], plain_users_file: Path
):
    with Broker(tmp_path / "data", config=secure_config(certs, plain_users_file)) as b:
        add_scram_users(b.bootstrap, {"SCRAM-SHA-256": ("scraper", "scrape-pw")})
        for path in ("/status", "/metrics"):
            assert get(b, path) == 401
            assert get(b, path, "alice", "wrong") == 401
            assert get(b, path, "nobody", "x") == 401
            assert get(b, path, "alice", PLAIN_USERS["alice"]) == 200
            assert get(b, path, "scraper", "scrape-pw") == 200
            assert get(b, path, "scraper", "scrape-pw!") == 401
    config = secure_config(certs, plain_users_file, **{"admin.auth": "none"})
    with Broker(tmp_path / "data2", config=config) as b:
        assert get(b, "/status") == 200


def test_basic_can_be_asked_for_without_security(tmp_path, plain_users_file: Path):
    config = {"admin.auth": "basic", "sasl.plain.users.file": str(plain_users_file)}
    with Broker(tmp_path / "data", config=config) as b:
        assert get(b, "/metrics") == 401
        assert get(b, "/metrics", "admin", PLAIN_USERS["admin"]) == 200


def test_with_the_authorizer_the_user_needs_describe_on_the_cluster(
    tmp_path, certs: dict[str, Path], plain_users_file: Path
):
    config = secure_config(
        certs,
        plain_users_file,
        **{"authorizer.class.name": AUTHORIZER, "super.users": "User:admin"},
    )
    with Broker(tmp_path / "data", config=config) as b:
        alice = ("alice", PLAIN_USERS["alice"])
        assert get(b, "/status", *alice) == 403
        assert get(b, "/status", "admin", PLAIN_USERS["admin"]) == 200
        admin = AdminClient({
            "bootstrap.servers": b.bootstraps["SASL_PLAINTEXT"],
            "security.protocol": "sasl_plaintext", "sasl.mechanism": "PLAIN",
            "sasl.username": "admin", "sasl.password": PLAIN_USERS["admin"],
        })  # fmt: skip
        binding = AclBinding(ResourceType.BROKER, "kafka-cluster", ResourcePatternType.LITERAL,
                             "User:alice", "*", AclOperation.DESCRIBE,
                             AclPermissionType.ALLOW)  # fmt: skip
        admin.create_acls([binding])[binding].result(15)
        assert get(b, "/status", *alice) == 200
        assert get(b, "/metrics", *alice) == 200


@pytest.mark.parametrize(
    "header", ["Bearer x", "Basic !!!", "Basic " + base64.b64encode(b"no-colon").decode()]
)
def test_malformed_credentials(tmp_path, plain_users_file: Path, header: str):
    config = {"admin.auth": "basic", "sasl.plain.users.file": str(plain_users_file)}
    with Broker(tmp_path / "data", config=config) as b:
        request = urllib.request.Request(f"http://{b.core.admin_address}/status")
        request.add_header("Authorization", header)
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(request, timeout=10)
        assert e.value.code == 401
