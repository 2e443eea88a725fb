"""SASL/OAUTHBEARER with JWT validation: tokens signed by a key of the configured JSON Web Key
Set, unexpired, for the expected audience and issuer, name the principal; anything else is
answered with RFC 7628's error challenge and then SASL_AUTHENTICATION_FAILED.

A real broker; tokens minted here with real RSA keys (PyJWT); confluent-kafka's OAUTHBEARER
(its token callback) produces and consumes, and the raw exchange is driven step by step."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import jwt
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from cryptography.hazmat.primitives.asymmetric import rsa

from stratalog import Broker
from stratalog.config import BrokerConfig, ConfigError

from ..conftest import create_topic
from .wire import Conn

AUDIENCE, ISSUER = "stratalog", "https://idp.example"
SASL_AUTHENTICATION_FAILED = 58


def _rsa():
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The identity provider's signing key (in the key set) and an impostor's (not in it)."""
    signing, impostor = _rsa(), _rsa()
    jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(signing.public_key()))
    jwk |= {"kid": "k1", "use": "sig", "alg": "RS256"}
    path = tmp_path_factory.mktemp("jwks") / "jwks.json"
    path.write_text(json.dumps({"keys": [jwk]}))
    return {"signing": signing, "impostor": impostor, "jwks": path}


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory, keys: dict) -> Iterator[Broker]:
    config = {
        "listeners": "PLAINTEXT://127.0.0.1:0,SASL_PLAINTEXT://127.0.0.1:0",
        "sasl.enabled.mechanisms": "OAUTHBEARER,SCRAM-SHA-256",
        "sasl.oauthbearer.jwks.endpoint.url": keys["jwks"].as_uri(),
        "sasl.oauthbearer.expected.audience": AUDIENCE,
        "sasl.oauthbearer.expected.issuer": ISSUER,
        "connections.max.reauth.ms": 3_600_000,
    }
    with Broker(tmp_path_factory.mktemp("oauth") / "data", config=config) as b:
        yield b


def _token(keys: dict, *, key: str = "signing", alg: str = "RS256", kid: str = "k1", **claims):
    now = int(time.time())
    body = {"sub": "alice", "aud": AUDIENCE, "iss": ISSUER, "iat": now, "exp": now + 600}
    body |= claims
    body = {k: v for k, v in body.items() if v is not None}
    signer = keys[key] if alg != "HS256" else "a-shared-secret-of-enough-length-32b"
    return jwt.encode(body, signer, algorithm=alg, headers={"kid": kid})


def _message(token: str, authzid: str = "") -> bytes:
    gs2 = f"n,a={authzid}," if authzid else "n,,"
    return f"{gs2}\x01auth=Bearer {token}\x01\x01".encode()


def _exchange(broker: Broker, message: bytes) -> tuple[dict, dict | None]:
    """The first SaslAuthenticate answer, and the second (after the client's \\x01) when the
    first is the error challenge."""
    with Conn(broker.bootstraps["SASL_PLAINTEXT"]) as c:
        assert c.handshake("OAUTHBEARER")["error_code"] == 0
        first = c.authenticate(message)
        if first["error_code"] or not first["auth_bytes"]:
            return first, None
        return first, c.authenticate(b"\x01")


def test_a_valid_token_logs_in_and_its_expiry_bounds_the_session(broker, keys):
    exp = int(time.time()) + 120
    first, second = _exchange(broker, _message(_token(keys, exp=exp)))
    assert first["error_code"] == 0 and second is None
    # connections.max.reauth.ms is an hour; the token ends in two minutes: the session too.
    assert 0 < first["session_lifetime"] <= 120_000


@pytest.mark.parametrize(
    ("case", "claims"),
    [
        ("expired", {"exp": int(time.time()) - 3600}),
        ("no expiry", {"exp": None}),
        ("another audience", {"aud": "someone-else"}),
        ("another issuer", {"iss": "https://evil.example"}),
        ("no subject", {"sub": None}),
        ("not yet valid", {"nbf": int(time.time()) + 3600}),
        ("signed by another key", {"key": "impostor"}),
        ("a key id not in the set", {"kid": "k9"}),
        ("a shared secret (HS256)", {"alg": "HS256"}),
    ],
)
def test_a_bad_token_gets_the_error_challenge_then_fails(broker, keys, case, claims):
    opts = {k: claims.pop(k) for k in ("key", "alg", "kid") if k in claims}
    first, second = _exchange(broker, _message(_token(keys, **opts, **claims)))
    assert first["error_code"] == 0, case
    assert json.loads(first["auth_bytes"]) == {"status": "invalid_token"}, case
    assert second is not None and second["error_code"] == SASL_AUTHENTICATION_FAILED, case


def test_unsigned_and_malformed_messages_are_refused(broker, keys):
    unsigned = jwt.encode({"sub": "alice", "exp": int(time.time()) + 60}, None, algorithm="none")
    first, second = _exchange(broker, _message(unsigned))
    assert json.loads(first["auth_bytes"]) == {"status": "invalid_token"}
    assert second is not None and second["error_code"] == SASL_AUTHENTICATION_FAILED
    # Not RFC 7628's form at all: failed at once.
    for message in (b"auth=Bearer x", b"n,,\x01auth=Bearer x\x01", b"\xff\xfe", b"n,,\x01\x01"):
        first, second = _exchange(broker, message)
        assert first["error_code"] == SASL_AUTHENTICATION_FAILED and second is None, message


def test_an_authorization_id_other_than_the_subject_is_refused(broker, keys):
    first, second = _exchange(broker, _message(_token(keys), authzid="mallory"))
    assert json.loads(first["auth_bytes"]) == {"status": "invalid_token"}
    assert second is not None and second["error_code"] == SASL_AUTHENTICATION_FAILED
    ok, _ = _exchange(broker, _message(_token(keys), authzid="alice"))
    assert ok["error_code"] == 0


def test_confluent_kafka_produces_and_consumes_with_oauthbearer(broker, keys):
    minted: list[str] = []

    def oauth_cb(_config):
        token = _token(keys, sub="pipeline")
        minted.append(token)
        return token, time.time() + 600

    common = {
        "bootstrap.servers": broker.bootstraps["SASL_PLAINTEXT"],
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "OAUTHBEARER",
        "oauth_cb": oauth_cb,
    }
    create_topic(broker.bootstrap, "oauth-topic", 1)
    p = Producer(common)
    for i in range(5):
        p.produce("oauth-topic", b"v%d" % i)
    assert p.flush(30) == 0
    c = Consumer({**common, "group.id": "oauth-group"})
    try:
        c.assign([TopicPartition("oauth-topic", 0, 0)])
        got = []
        deadline = time.monotonic() + 30
        while len(got) < 5 and time.monotonic() < deadline:
            m = c.poll(1)
            if m is not None:
                assert not m.error(), m.error()
                got.append(m.value())
    finally:
        c.close()
    assert got == [b"v%d" % i for i in range(5)]
    assert minted  # the callback's tokens were what logged in


def test_a_broker_without_a_key_set_does_not_start(tmp_path):
    base = {"listeners": "SASL_PLAINTEXT://127.0.0.1:0", "sasl.enabled.mechanisms": "OAUTHBEARER"}
    with pytest.raises(ConfigError, match=r"sasl\.oauthbearer\.jwks\.endpoint\.url is not set"):
        BrokerConfig(base)
    missing = {**base, "sasl.oauthbearer.jwks.endpoint.url": str(tmp_path / "nope.json")}
    with pytest.raises(ConfigError, match="cannot read"):
        BrokerConfig(missing)
    (tmp_path / "bad.json").write_text("{}")
    bad = {**base, "sasl.oauthbearer.jwks.endpoint.url": str(tmp_path / "bad.json")}
    with pytest.raises(ConfigError, match="not a JSON Web Key Set"):
        BrokerConfig(bad)
    http = {**base, "sasl.oauthbearer.jwks.endpoint.url": "https://idp.example/jwks"}
    with pytest.raises(ConfigError, match="only a file of keys is read"):
        BrokerConfig(http)


def test_kafkas_java_client_logs_in_with_a_token_file(broker, keys, tmp_path):
    # Kafka's own login handler reading a signed token from a file (its file-based token
    # endpoint), as a Java application or Kafka's tools are configured.
    from stratalog.peers.kafka import run_tool

    token = tmp_path / "token.jwt"
    token.write_text(_token(keys, sub="java-app"))
    config = tmp_path / "client.properties"
    config.write_text(
        "security.protocol=SASL_PLAINTEXT\n"
        "sasl.mechanism=OAUTHBEARER\n"
        "sasl.login.callback.handler.class="
        "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginCallbackHandler\n"
        f"sasl.oauthbearer.token.endpoint.url={token.as_uri()}\n"
        "sasl.jaas.config="
        "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required ;\n"
    )
    create_topic(broker.bootstrap, "oauth-java", 1)
    allowed = {"org.apache.kafka.sasl.oauthbearer.allowed.urls": token.as_uri()}
    at = ["--bootstrap-server", broker.bootstraps["SASL_PLAINTEXT"], "--topic", "oauth-java"]
    produced = run_tool(
        "kafka-console-producer", *at, "--command-config", str(config),
        input="j1\nj2\n", timeout=90, jvm_properties=allowed,
    )  # fmt: skip
    assert produced.returncode == 0, produced.stderr[-2000:]
    consumed = run_tool(
        "kafka-console-consumer", *at, "--command-config", str(config),
        "--from-beginning", "--max-messages", "2", "--timeout-ms", "30000",
        timeout=90, jvm_properties=allowed,
    )  # fmt: skip
    assert consumed.stdout.split() == ["j1", "j2"], consumed.stdout + consumed.stderr[-2000:]
