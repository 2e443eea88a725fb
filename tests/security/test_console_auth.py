"""The web console on a secured broker: its page and API take the admin endpoint's HTTP basic
credential (401 without one, 403 without DESCRIBE on the cluster), and then act as that user,
every request checked by the authorizer as the Kafka API checks it: topics the user may not
describe are not listed, and writes and reads the ACLs do not allow are answered 403."""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka.admin import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    AdminClient,
    NewTopic,
    ResourcePatternType,
    ResourceType,
)

from stratalog import Broker

from ..browser import cells, chromium, needs_chromium, notice, show, submit
from .conftest import PLAIN_USERS
from .test_acls import acl_config, client

ALICE = ("alice", PLAIN_USERS["alice"])
ADMIN = ("admin", PLAIN_USERS["admin"])


@pytest.fixture(scope="module")
def broker(
    tmp_path_factory: pytest.TempPathFactory, certs: dict[str, Path], plain_users_file: Path
) -> Iterator[Broker]:
    config = acl_config(certs, plain_users_file)
    with Broker(tmp_path_factory.mktemp("console-auth") / "data", config=config) as b:
        admin = AdminClient(client(b, "admin"))
        for f in admin.create_topics([NewTopic("secret", 1), NewTopic("shared", 1)]).values():
            f.result(15)
        yield b


def _allow(broker: Broker, rtype, name: str, op) -> None:
    admin = AdminClient(client(broker, "admin"))
    binding = AclBinding(rtype, name, ResourcePatternType.LITERAL, "User:alice", "*", op,
                         AclPermissionType.ALLOW)  # fmt: skip
    admin.create_acls([binding])[binding].result(15)


def call(broker: Broker, path: str, body=None, user: tuple[str, str] | None = None):
    """(HTTP status, answer) of a request to the console, as ``user`` if given."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(f"http://{broker.core.admin_address}{path}", data=data)
    if data is not None:
        request.add_header("content-type", "application/json")
    if user is not None:
        token = base64.b64encode(f"{user[0]}:{user[1]}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(request, timeout=20) as r:
            text = r.read()
            return r.status, json.loads(text) if path.startswith("/api/") else text
    except urllib.error.HTTPError as e:
        text = e.read().decode()
        try:
            return e.code, json.loads(text)
        except ValueError:
            return e.code, text


def test_the_console_needs_a_credential_and_describe_on_the_cluster(broker: Broker) -> None:
    for path in ("/", "/console.js", "/api/topics", "/api/overview"):
        assert call(broker, path)[0] == 401
        assert call(broker, path, user=("alice", "wrong"))[0] == 401
    assert call(broker, "/api/topics/create", {"name": "x"})[0] == 401
    status, text = call(broker, "/api/topics", user=ALICE)
    assert status == 403 and "may not DESCRIBE the cluster" in text
    assert call(broker, "/", user=ADMIN)[0] == 200


def test_the_console_acts_as_its_user(broker: Broker) -> None:
    _allow(broker, ResourceType.BROKER, "kafka-cluster", AclOperation.DESCRIBE)
    _allow(broker, ResourceType.TOPIC, "shared", AclOperation.DESCRIBE)

    # Alice sees the topic she may describe, not the other; the super user sees both.
    status, topics = call(broker, "/api/topics", user=ALICE)
    assert status == 200
    assert {t["name"] for t in topics} == {"shared"}
    assert {"secret", "shared"} <= {t["name"] for t in call(broker, "/api/topics", user=ADMIN)[1]}

    # Writes and reads the ACLs do not allow: 403, said by the Kafka error.
    status, doc = call(broker, "/api/topics/create", {"name": "alices"}, user=ALICE)
    assert status == 403 and "authorization" in doc["error"].lower()
    status, doc = call(broker, "/api/topics/delete", {"name": "shared"}, user=ALICE)
    assert status == 403, doc
    status, doc = call(broker, "/api/records?topic=shared", user=ALICE)  # DESCRIBE, not READ
    assert status == 403 and "may not READ" in doc["error"]
    status, doc = call(broker, "/api/records?topic=secret", user=ALICE)
    assert status == 403, doc
    reset = {"group": "alices-group", "topic": "shared", "to": "earliest"}
    status, doc = call(broker, "/api/groups/reset-offsets", reset, user=ALICE)
    assert status == 403, doc

    # What the ACLs allow, the console does.
    _allow(broker, ResourceType.TOPIC, "shared", AclOperation.READ)
    _allow(broker, ResourceType.GROUP, "alices-group", AclOperation.READ)
    assert call(broker, "/api/records?topic=shared", user=ALICE)[0] == 200
    status, doc = call(broker, "/api/groups/reset-offsets", reset, user=ALICE)
    assert status == 200, doc
    assert call(broker, "/api/topics/create", {"name": "admins"}, user=ADMIN)[0] == 200
    assert call(broker, "/api/topics/delete", {"name": "admins"}, user=ADMIN)[0] == 200


@needs_chromium
def test_in_a_browser_the_page_shows_what_its_user_may_see(broker: Broker) -> None:
    _allow(broker, ResourceType.BROKER, "kafka-cluster", AclOperation.DESCRIBE)
    _allow(broker, ResourceType.TOPIC, "shared", AclOperation.DESCRIBE)
    with chromium() as driver:
        # Credentials in the address, as a browser's login prompt would have them.
        show(driver, f"http://alice:{ALICE[1]}@{broker.core.admin_address}/", "/topics")
        assert [r[0] for r in cells(driver, "#topics-table")] == ["shared"]
        submit(driver, "create-topic", name="alices")
        kind, text = notice(driver)
        assert kind == "error" and "authorization" in text.lower()
