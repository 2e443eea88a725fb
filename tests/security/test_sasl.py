"""SASL with real clients: PLAIN, SCRAM-SHA-256 and SCRAM-SHA-512 over SASL_SSL and
SASL_PLAINTEXT, users managed through Describe/AlterUserScramCredentials, and what the broker
answers at each step of a good and a bad exchange.

One broker for the module (all four listeners; PLAIN users from a JAAS file, SCRAM users
created through the admin API), and a second one with ``connections.max.reauth.ms`` for
KIP-368. The answers compared here are also compared with Apache Kafka's in
test_kafka_parity.py.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka.admin import (
    AdminClient,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialDeletion,
    UserScramCredentialUpsertion,
)

from stratalog import Broker
from stratalog.broker import metrics

from ..conftest import create_topic
from .clients import CLIENTS, Security, roundtrip
from .conftest import PLAIN_USERS, SCRAM_USERS, add_scram_users, secure_config
from .wire import API_VERSIONS, SASL_AUTHENTICATE, Conn

SASL_AUTHENTICATION_FAILED = 58
UNSUPPORTED_SASL_MECHANISM = 33
ILLEGAL_SASL_STATE = 34
MECHANISMS = ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]


@pytest.fixture(scope="module")
def broker(
    tmp_path_factory: pytest.TempPathFactory, certs: dict[str, Path], plain_users_file: Path
) -> Iterator[Broker]:
    with Broker(
        tmp_path_factory.mktemp("sasl") / "data", config=secure_config(certs, plain_users_file)
    ) as b:
        add_scram_users(b.bootstrap)
        yield b


def _login(mechanism: str) -> tuple[str, str]:
    if mechanism == "PLAIN":
        return "alice", PLAIN_USERS["alice"]
    return SCRAM_USERS[mechanism]


def _sec(certs: dict[str, Path], protocol: str, mechanism: str, user=None, password=None):
    u, p = _login(mechanism)
    ca = certs["ca.pem"] if protocol == "SASL_SSL" else None
    return Security(protocol, ca, mechanism=mechanism, user=user or u, password=password or p)


def _topic(broker: Broker) -> str:
    name = f"sasl-{uuid.uuid4().hex[:8]}"
    create_topic(broker.bootstrap, name)
    return name


CASES = [(c, "SASL_SSL", m) for c in CLIENTS for m in MECHANISMS] + [
    (c, "SASL_PLAINTEXT", "SCRAM-SHA-512") for c in CLIENTS
]


@pytest.mark.parametrize(("client", "protocol", "mechanism"), CASES)
def test_round_trip(broker, certs, client, protocol, mechanism):
    topic = _topic(broker)
    got = roundtrip(client, broker.bootstraps[protocol], topic, _sec(certs, protocol, mechanism))
    assert got == [f"{client}-{i}".encode() for i in range(50)]


def test_plain_accepts_a_scram_users_password(broker, certs):
    user, password = SCRAM_USERS["SCRAM-SHA-256"]
    sec = _sec(certs, "SASL_SSL", "PLAIN", user, password)
    topic = _topic(broker)
    assert len(roundtrip("confluent-kafka", broker.bootstraps["SASL_SSL"], topic, sec, 3)) == 3


def test_principal_is_the_sasl_user(broker, certs):
    with Conn(broker.bootstraps["SASL_SSL"], certs["ca.pem"]) as c:
        assert c.login("SCRAM-SHA-512", *SCRAM_USERS["SCRAM-SHA-512"])["error_code"] == 0
        server = next(s for s in broker.service.servers if s.listener.name == "SASL_SSL")
        principals = broker.call(lambda: [x.principal for x in server.connections])
        assert "User:scram512" in principals


# -- the exchange, step by step ------------------------------------------------------------------
@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_wrong_password_fails_and_closes(broker, mechanism):
    user, _ = _login(mechanism)
    with Conn(broker.bootstraps["SASL_PLAINTEXT"]) as c:
        out = c.login(mechanism, user, "wrong")
        assert out["error_code"] == SASL_AUTHENTICATION_FAILED
        if mechanism == "PLAIN":
            assert out["error_message"] == "Authentication failed: Invalid username or password"
        else:
            # Nothing that tells whether the user exists.
            assert out["error_message"] == (
                "Authentication failed during authentication due to invalid credentials with "
                f"SASL mechanism {mechanism}"
            )
        assert c.is_closed()


def test_unknown_scram_user_gets_the_same_answer_as_a_wrong_password(broker):
    with Conn(broker.bootstraps["SASL_PLAINTEXT"]) as c:
        out = c.login("SCRAM-SHA-256", "nobody", "x")
        assert out["error_code"] == SASL_AUTHENTICATION_FAILED
        assert "invalid credentials with SASL mechanism SCRAM-SHA-256" in out["error_message"]
        assert c.is_closed()


def test_unknown_mechanism_lists_the_enabled_ones_and_closes(broker):
    with Conn(broker.bootstraps["SASL_PLAINTEXT"]) as c:
        out = c.handshake("GSSAPI")
        assert out["error_code"] == UNSUPPORTED_SASL_MECHANISM
        assert sorted(out["mechanisms"]) == MECHANISMS
        assert c.is_closed()


def test_requests_before_authentication_close_the_connection(broker):
    # No credentials at all: the first real request is refused by closing, with no answer.
    with Conn(broker.bootstraps["SASL_PLAINTEXT"]) as c:
        c.send_raw(c.frame(3, 12, topics=None, allow_auto_topic_creation=False,
                           include_topic_authorized_operations=False))  # fmt: skip
        assert c.is_closed()
    # ApiVersions is answered (once), then only SaslHandshake.
    with Conn(broker.bootstraps["SASL_PLAINTEXT"]) as c:
        assert c.request(API_VERSIONS, 3, client_software_name="t",
                         client_software_version="1")["error_code"] == 0  # fmt: skip
        c.send_raw(c.frame(API_VERSIONS, 3, client_software_name="t", client_software_version="1"))
        assert c.is_closed()
    # SaslAuthenticate before SaslHandshake.
    with Conn(broker.bootstraps["SASL_PLAINTEXT"]) as c:
        c.send_raw(c.frame(SASL_AUTHENTICATE, 2, auth_bytes=b"\0alice\0alice-secret"))
        assert c.is_closed()
    # After the handshake, anything but SaslAuthenticate.
    with Conn(broker.bootstraps["SASL_PLAINTEXT"]) as c:
        assert c.handshake("PLAIN")["error_code"] == 0
        c.send_raw(c.frame(API_VERSIONS, 0))
        assert c.is_closed()


def test_after_authentication_sasl_requests_are_illegal_state(broker):
    with Conn(broker.bootstraps["SASL_PLAINTEXT"]) as c:
        ok = c.login("PLAIN", "alice", PLAIN_USERS["alice"])
        assert ok["error_code"] == 0 and ok["session_lifetime"] == 0
        assert c.handshake("PLAIN")["error_code"] == ILLEGAL_SASL_STATE
        again = c.authenticate(b"\0alice\0alice-secret")
        assert again["error_code"] == ILLEGAL_SASL_STATE
        assert len(c.metadata()["brokers"]) == 1  # the connection stays and serves


def test_sasl_requests_on_a_plaintext_listener_are_illegal_state(broker):
    with Conn(broker.bootstraps["PLAINTEXT"]) as c:
        assert c.handshake("PLAIN")["error_code"] == ILLEGAL_SASL_STATE
        assert c.authenticate(b"x")["error_code"] == ILLEGAL_SASL_STATE
        assert len(c.metadata()["brokers"]) == 1


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_handshake_v0_carries_bare_tokens(broker, mechanism):
    """SaslHandshake v0: the tokens travel as bare size-prefixed frames (pre-KIP-152 clients)."""
    from stratalog.security.scram import MECHANISMS as SCRAM
    from stratalog.security.scram import ScramClient

    user, password = _login(mechanism)
    with Conn(broker.bootstraps["SASL_PLAINTEXT"]) as c:
        assert c.handshake(mechanism, version=0)["error_code"] == 0
        if mechanism == "PLAIN":
            c.send_raw(_prefixed(f"\0{user}\0{password}".encode()))
            assert c.read_frame() == b""
        else:
            client = ScramClient(SCRAM[mechanism], user, password)
            c.send_raw(_prefixed(client.first()))
            c.send_raw(_prefixed(client.final(c.read_frame())))
            assert client.verify(c.read_frame())
        assert len(c.metadata()["brokers"]) == 1


def _prefixed(data: bytes) -> bytes:
    return len(data).to_bytes(4, "big") + data


# -- credentials -----------------------------------------------------------------------------------
def _describe(admin: AdminClient, users: list[str]) -> dict[str, list[tuple[str, int]]]:
    out = {}
    for user, f in admin.describe_user_scram_credentials(users).items():
        infos = f.result(15).scram_credential_infos
        out[user] = sorted((i.mechanism.name, i.iterations) for i in infos)
    return out


def test_credentials_are_managed_and_checked(broker, certs):
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    ups = [
        UserScramCredentialUpsertion(
            "dave", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 8192), b"dave-first-pass"
        ),
        UserScramCredentialUpsertion(
            "erin", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 4096), b"e1"
        ),
    ]
    for f in admin.alter_user_scram_credentials(ups).values():
        f.result(15)
    assert _describe(admin, ["dave", "erin"]) == {
        "dave": [("SCRAM_SHA_256", 8192)],
        "erin": [("SCRAM_SHA_512", 4096)],
    }
    with Conn(broker.bootstraps["SASL_PLAINTEXT"]) as c:
        assert c.login("SCRAM-SHA-256", "dave", "dave-first-pass")["error_code"] == 0
    # A new password replaces the old one; a deleted credential no longer logs in.
    new = UserScramCredentialUpsertion(
        "dave", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 4096), b"dave-second-pass"
    )
    gone = UserScramCredentialDeletion("erin", ScramMechanism.SCRAM_SHA_512)
    for f in admin.alter_user_scram_credentials([new, gone]).values():
        f.result(15)
    with Conn(broker.bootstraps["SASL_PLAINTEXT"]) as c:
        out = c.login("SCRAM-SHA-256", "dave", "dave-first-pass")
        assert out["error_code"] == SASL_AUTHENTICATION_FAILED
    with Conn(broker.bootstraps["SASL_PLAINTEXT"]) as c:
        assert c.login("SCRAM-SHA-256", "dave", "dave-second-pass")["error_code"] == 0
    with Conn(broker.bootstraps["SASL_PLAINTEXT"]) as c:
        assert c.login("SCRAM-SHA-512", "erin", "e1")["error_code"] == SASL_AUTHENTICATION_FAILED
    # The file holds salts and keys, never a password.
    text = (broker.data_dir / "meta" / "scram-credentials.json").read_text()
    assert "dave-second-pass" not in text and "stored_key" in text
    users = json.loads(text)["users"]
    assert set(users) >= {"dave", "scram256", "scram512"} and "erin" not in users


def test_alter_and_describe_answer_kafkas_errors(broker):
    from .wire import Conn as Raw

    with Raw(broker.bootstrap) as c:
        out = c.request(51, 0, deletions=[
            {"name": "nobody", "mechanism": 1},
            {"name": "", "mechanism": 1},
        ], upsertions=[
            {"name": "few", "mechanism": 1, "iterations": 100, "salt": b"s", "salted_password": b"p"},  # noqa: E501
            {"name": "many", "mechanism": 2, "iterations": 20000, "salt": b"s", "salted_password": b"p"},  # noqa: E501
            {"name": "odd", "mechanism": 9, "iterations": 4096, "salt": b"s", "salted_password": b"p"},  # noqa: E501
            {"name": "twice", "mechanism": 1, "iterations": 4096, "salt": b"s", "salted_password": b"p"},  # noqa: E501
            {"name": "twice", "mechanism": 2, "iterations": 4096, "salt": b"s", "salted_password": b"p"},  # noqa: E501
        ])  # fmt: skip
        got = {r["user"]: (r["error_code"], r["error_message"]) for r in out["results"]}
        assert got == {
            "nobody": (91, "Attempt to delete a user credential that does not exist"),
            "": (93, "Username must not be empty"),
            "few": (93, "Too few iterations"),
            "many": (93, "Too many iterations"),
            "odd": (33, "Unknown SCRAM mechanism"),
            "twice": (92, "A user credential cannot be altered twice in the same request"),
        }
        out = c.request(50, 0, users=[{"name": "nobody"}, {"name": "scram256"}, {"name": "x"},
                                      {"name": "x"}])  # fmt: skip
        got = {r["user"]: (r["error_code"], r["credential_infos"]) for r in out["results"]}
        assert got == {
            "nobody": (91, []),
            "scram256": (0, [{"mechanism": 1, "iterations": 4096}]),
            "x": (92, []),
        }


def test_credentials_survive_a_restart(tmp_path, certs, plain_users_file):
    config = secure_config(certs, plain_users_file)
    with Broker(tmp_path / "data", config=config) as b:
        add_scram_users(b.bootstrap, {"SCRAM-SHA-512": ("kept", "kept-pw")})
    with Broker(tmp_path / "data", config=config) as b:
        c = Conn(b.bootstraps["SASL_PLAINTEXT"])
        assert c.login("SCRAM-SHA-512", "kept", "kept-pw")["error_code"] == 0
        c.close()


# -- re-authentication (KIP-368) ----------------------------------------------------------------
REAUTH_MS = 1500


@pytest.fixture(scope="module")
def reauth_broker(
    tmp_path_factory: pytest.TempPathFactory, certs: dict[str, Path], plain_users_file: Path
) -> Iterator[Broker]:
    config = secure_config(certs, plain_users_file, **{"connections.max.reauth.ms": REAUTH_MS})
    with Broker(tmp_path_factory.mktemp("reauth") / "data", config=config) as b:
        add_scram_users(b.bootstrap)
        yield b


def test_session_lifetime_is_sent_and_an_expired_session_is_closed(reauth_broker):
    with Conn(reauth_broker.bootstraps["SASL_PLAINTEXT"]) as c:
        ok = c.login("SCRAM-SHA-256", *SCRAM_USERS["SCRAM-SHA-256"])
        assert ok["error_code"] == 0 and ok["session_lifetime"] == REAUTH_MS
        assert len(c.metadata()["brokers"]) == 1
        time.sleep(REAUTH_MS / 1000 + 0.3)
        c.send_raw(c.frame(3, 12, topics=None, allow_auto_topic_creation=False,
                           include_topic_authorized_operations=False))  # fmt: skip
        assert c.is_closed()


def test_reauthentication_extends_the_session(reauth_broker):
    user, password = SCRAM_USERS["SCRAM-SHA-512"]
    with Conn(reauth_broker.bootstraps["SASL_PLAINTEXT"]) as c:
        assert c.login("SCRAM-SHA-512", user, password)["error_code"] == 0
        time.sleep(1.1)  # at most one re-authentication a second, as Kafka
        again = c.login("SCRAM-SHA-512", user, password)
        assert again["error_code"] == 0 and again["session_lifetime"] == REAUTH_MS
        time.sleep(0.7)  # past the first session's end, within the second's
        assert len(c.metadata()["brokers"]) == 1


def test_reauthentication_keeps_mechanism_and_principal(reauth_broker):
    with Conn(reauth_broker.bootstraps["SASL_PLAINTEXT"]) as c:
        assert c.login("PLAIN", "alice", PLAIN_USERS["alice"])["error_code"] == 0
        time.sleep(1.1)
        # As Kafka: another mechanism is accepted at the handshake, and the exchange then fails.
        assert c.handshake("SCRAM-SHA-256")["error_code"] == 0
        c.send_raw(c.frame(SASL_AUTHENTICATE, 2, auth_bytes=b"n,,n=x,r=abc"))
        assert c.is_closed()
    with Conn(reauth_broker.bootstraps["SASL_PLAINTEXT"]) as c:
        assert c.login("PLAIN", "alice", PLAIN_USERS["alice"])["error_code"] == 0
        time.sleep(1.1)
        out = c.login("PLAIN", "admin", PLAIN_USERS["admin"])
        assert out["error_code"] == SASL_AUTHENTICATION_FAILED
        assert "Cannot change principals during re-authentication" in out["error_message"]
        assert c.is_closed()


@pytest.mark.parametrize("client", ["confluent-kafka", "kafka-python"])
def test_clients_reauthenticate_and_keep_working(reauth_broker, certs, client):
    """Both clients implement KIP-368: a producer that runs for 2.5 session lifetimes keeps
    its connection (re-authenticating) and every record is delivered."""
    reauth = metrics.SASL_AUTHENTICATIONS.labels("reauthenticated")
    before = reauth._value.get()
    topic = f"reauth-{uuid.uuid4().hex[:8]}"
    create_topic(reauth_broker.bootstrap, topic)
    sec = _sec(certs, "SASL_SSL", "SCRAM-SHA-256")
    bs = reauth_broker.bootstraps["SASL_SSL"]
    sent = 0
    deadline = time.monotonic() + 2.5 * REAUTH_MS / 1000
    if client == "confluent-kafka":
        from confluent_kafka import Producer

        p = Producer({"bootstrap.servers": bs, **sec.librdkafka()})
        while time.monotonic() < deadline:
            p.produce(topic, b"x", partition=0)
            p.poll(0.05)
            sent += 1
        assert p.flush(30) == 0
    else:
        from kafka import KafkaProducer

        kp = KafkaProducer(bootstrap_servers=bs, **sec.kafka_python())
        while time.monotonic() < deadline:
            kp.send(topic, b"x", partition=0).get(timeout=30)
            time.sleep(0.05)
            sent += 1
        kp.close()
    assert reauth._value.get() > before
    got = roundtrip("confluent-kafka", bs, topic, sec, n=0)
    assert len(got) == sent
