"""Security as Apache Kafka 4.4 does it: the same scenarios against a Kafka and a Stratalog
configured the same way (SSL with mutual TLS required, SASL_PLAINTEXT and SASL_SSL with PLAIN
from the same JAAS users and SCRAM users created through AlterUserScramCredentials), what a
client observes compared; and Kafka's own Java tools against Stratalog: kafka-configs creates
SCRAM users, the console producer and consumer log in over SASL_SSL and mutual TLS.

One Kafka and one Stratalog for the module (the JVM start is the module's main cost).
"""

from __future__ import annotations

import ssl
import struct
import subprocess
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from stratalog import Broker
from stratalog.peers.kafka import KafkaBroker, run_tool

from ..conftest import KAFKA_TEST_JVM, create_topic
from .clients import Security
from .conftest import PLAIN_USERS, SCRAM_USERS, add_scram_users, jaas_plain, secure_config
from .wire import API_VERSIONS, SASL_AUTHENTICATE, Closed, Conn

pytestmark = pytest.mark.kafka

LISTENERS = {"SSL": "SSL", "SASL_PLAINTEXT": "SASL_PLAINTEXT", "SASL_SSL": "SASL_SSL"}
TOOL_TIMEOUT = 90


def kafka_properties(certs: dict[str, Path]) -> dict[str, str]:
    """Kafka's settings for what secure_config gives Stratalog."""
    props = {
        "ssl.keystore.type": "PEM",
        "ssl.keystore.location": str(certs["broker.pem"]),
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": str(certs["ca.pem"]),
        "listener.name.ssl.ssl.client.auth": "required",
        "sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-256,SCRAM-SHA-512",
        "group.initial.rebalance.delay.ms": "0",
    }
    scram = "org.apache.kafka.common.security.scram.ScramLoginModule required;"
    for listener in ("sasl_plaintext", "sasl_ssl"):
        props[f"listener.name.{listener}.plain.sasl.jaas.config"] = jaas_plain(PLAIN_USERS)
        for mech in ("scram-sha-256", "scram-sha-512"):
            props[f"listener.name.{listener}.{mech}.sasl.jaas.config"] = scram
    return props


@dataclass
class Pair:
    stratalog: Broker
    kafka: KafkaBroker
    certs: dict[str, Path]

    def both(self, scenario: Callable[..., Any], *args: Any) -> tuple[Any, Any]:
        with ThreadPoolExecutor(2) as pool:
            s = pool.submit(scenario, self.stratalog.bootstraps, self.certs, *args)
            k = pool.submit(scenario, self.kafka.bootstraps, self.certs, *args)
            return s.result(120), k.result(120)


@pytest.fixture(scope="module")
def pair(
    tmp_path_factory: pytest.TempPathFactory, certs: dict[str, Path], plain_users_file: Path
) -> Iterator[Pair]:
    from ..conformance.conftest import start_kafka

    kafka = start_kafka(
        lambda: KafkaBroker(
            kafka_properties(certs), listeners=LISTENERS, jvm_options=KAFKA_TEST_JVM
        )
    )
    try:
        with Broker(
            tmp_path_factory.mktemp("parity") / "data",
            config=secure_config(certs, plain_users_file),
        ) as strat:
            for bs in (strat.bootstrap, kafka.bootstrap):
                add_scram_users(bs)
            yield Pair(strat, kafka, certs)
    finally:
        kafka.stop()


# -- scenarios: (bootstraps, certs) -> what a client observes ------------------------------------
def _conn(bs: dict[str, str], certs: dict[str, Path], listener: str) -> Conn:
    ca = certs["ca.pem"] if listener.endswith("SSL") else None
    cert = certs["client.pem"] if listener == "SSL" else None
    return Conn(bs[listener], ca, cert)


def _closed(c: Conn) -> bool:
    return c.is_closed(timeout=5)


def login(bs, certs, listener: str, mechanism: str, user: str, password: str) -> dict:
    with _conn(bs, certs, listener) as c:
        hs = c.handshake(mechanism)
        out = c.exchange(mechanism, user, password) if hs["error_code"] == 0 else {}
        closed = _closed(c) if out.get("error_code") else None
        return {
            "handshake": hs["error_code"],
            "mechanisms": sorted(hs["mechanisms"]),
            "authenticate": {k: v for k, v in out.items() if k != "auth_bytes"},
            "closed": closed,
        }


def login_ok(bs, certs, listener: str, mechanism: str) -> dict:
    if mechanism == "PLAIN":
        user, password = "alice", PLAIN_USERS["alice"]
    else:
        user, password = SCRAM_USERS[mechanism]
    with _conn(bs, certs, listener) as c:
        out = c.login(mechanism, user, password)
        md = c.metadata()
        return {
            "authenticate": out["error_code"],
            "session_lifetime": out["session_lifetime"],
            "metadata_port": [b["port"] for b in md["brokers"]]
            == [int(bs[listener].rsplit(":", 1)[1])],
            "handshake_again": c.handshake(mechanism)["error_code"],
            "authenticate_again": c.authenticate(b"x")["error_code"],
        }


def unknown_mechanism(bs, certs) -> dict:
    with _conn(bs, certs, "SASL_PLAINTEXT") as c:
        hs = c.handshake("GSSAPI")
        return {"error": hs["error_code"], "mechanisms": sorted(hs["mechanisms"]),
                "closed": _closed(c)}  # fmt: skip


def before_login(bs, certs, what: str) -> dict:
    """Send a request that is not allowed yet: is it answered, is the connection closed."""
    with _conn(bs, certs, "SASL_PLAINTEXT") as c:
        answers = []
        if what == "metadata":
            frames = [_metadata_frame(c)]
        elif what == "authenticate-first":
            frames = [c.frame(SASL_AUTHENTICATE, 2, auth_bytes=b"\0alice\0alice-secret")]
        elif what == "api-versions-twice":
            frames = [c.frame(API_VERSIONS, 3, client_software_name="t",
                              client_software_version="1")] * 2  # fmt: skip
        elif what == "metadata-after-handshake":
            frames = [c.frame(17, 1, mechanism="PLAIN"), _metadata_frame(c)]
        elif what == "oversized":
            frames = [struct.pack(">i", 524289)]
        elif what == "garbage":
            frames = [struct.pack(">i", 12) + b"\x7f" * 12]
        else:
            raise ValueError(what)
        try:
            c.send_raw(b"".join(frames))
            while True:
                answers.append(struct.unpack_from(">i", c.read_frame())[0])
        except (Closed, BrokenPipeError, ConnectionResetError):
            pass
        except TimeoutError:
            return {"answers": len(answers), "closed": False}
        return {"answers": len(answers), "closed": True}


def _metadata_frame(c: Conn) -> bytes:
    return c.frame(3, 12, topics=None, allow_auto_topic_creation=False,
                   include_topic_authorized_operations=False)  # fmt: skip


def handshake_v0_plain(bs, certs) -> dict:
    with _conn(bs, certs, "SASL_PLAINTEXT") as c:
        hs = c.handshake("PLAIN", version=0)
        token = b"\0alice\0" + PLAIN_USERS["alice"].encode()
        c.send_raw(struct.pack(">i", len(token)) + token)
        reply = c.read_frame()
        return {"handshake": hs["error_code"], "reply": reply,
                "metadata": len(c.metadata()["brokers"])}  # fmt: skip


def tls_client(bs, certs, stem: str | None) -> str:
    """What a TLS client with this certificate (or none) sees on the SSL listener."""
    ctx = ssl.create_default_context(cafile=str(certs["ca.pem"]))
    if stem is not None:
        ctx.load_cert_chain(str(certs[f"{stem}.pem"]))
    host, port = bs["SSL"].rsplit(":", 1)
    import socket

    try:
        with (
            socket.create_connection((host, int(port)), timeout=10) as raw,
            ctx.wrap_socket(raw, server_hostname=host) as s,
        ):
            c = Conn.__new__(Conn)
            c.sock, c._cid = s, 0
            return f"served: ApiVersions error {c.request(API_VERSIONS, 0)['error_code']}"
    except (ssl.SSLError, Closed, ConnectionResetError, BrokenPipeError):
        return "refused"


def broker_of_another_ca(bs, certs) -> str:
    """A client that trusts only the other CA refuses the broker's certificate."""
    ctx = ssl.create_default_context(cafile=str(certs["other-ca.pem"]))
    host, port = bs["SASL_SSL"].rsplit(":", 1)
    import socket

    try:
        with (
            socket.create_connection((host, int(port)), timeout=10) as raw,
            ctx.wrap_socket(raw, server_hostname=host),
        ):
            return "connected"
    except ssl.SSLCertVerificationError:
        # (The verify message differs: OpenSSL sends the CA along with the broker's
        # certificate, Java only the keystore's chain; either way it is not trusted.)
        return "refused"


# -- the comparisons -------------------------------------------------------------------------------
BAD_LOGINS = {
    "plain-wrong-password": ("SASL_PLAINTEXT", "PLAIN", "alice", "wrong"),
    "plain-unknown-user": ("SASL_SSL", "PLAIN", "nobody", "x"),
    "scram256-wrong-password": ("SASL_SSL", "SCRAM-SHA-256", "scram256", "wrong"),
    "scram512-unknown-user": ("SASL_PLAINTEXT", "SCRAM-SHA-512", "nobody", "x"),
    "scram-wrong-mechanism": ("SASL_PLAINTEXT", "SCRAM-SHA-512", "scram256", "pw-256"),
    "plain-empty-password": ("SASL_PLAINTEXT", "PLAIN", "alice", ""),
}


@pytest.mark.parametrize("case", list(BAD_LOGINS))
def test_failed_login(pair, case):
    strat, kafka = pair.both(login, *BAD_LOGINS[case])
    assert strat == kafka
    assert strat["authenticate"]["error_code"] == 58 and strat["closed"]


@pytest.mark.parametrize(
    ("listener", "mechanism"),
    [("SASL_PLAINTEXT", "PLAIN"), ("SASL_SSL", "SCRAM-SHA-256"), ("SASL_SSL", "SCRAM-SHA-512")],
)
def test_successful_login(pair, listener, mechanism):
    strat, kafka = pair.both(login_ok, listener, mechanism)
    assert strat == kafka
    assert strat["authenticate"] == 0 and strat["metadata_port"]


def test_unknown_mechanism(pair):
    strat, kafka = pair.both(unknown_mechanism)
    assert (
        strat
        == kafka
        == {
            "error": 33,
            "mechanisms": ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"],
            "closed": True,
        }
    )


@pytest.mark.parametrize(
    "what",
    [
        "metadata",
        "authenticate-first",
        "api-versions-twice",
        "oversized",
        "garbage",
    ],
)
def test_requests_before_login(pair, what):
    strat, kafka = pair.both(before_login, what)
    assert strat == kafka
    assert strat["closed"]


def test_request_after_the_handshake(pair):
    """Deliberate difference (docs/security.md): both close the connection when a request
    other than SaslAuthenticate follows the handshake; Kafka first answers it with that API's
    error response (ILLEGAL_SASL_STATE), Stratalog answers only the handshake."""
    strat, kafka = pair.both(before_login, "metadata-after-handshake")
    assert strat == {"answers": 1, "closed": True}
    assert kafka == {"answers": 2, "closed": True}


def test_handshake_v0_bare_tokens(pair):
    strat, kafka = pair.both(handshake_v0_plain)
    assert strat == kafka


@pytest.mark.parametrize("stem", ["client", "other-client", None])
def test_mutual_tls(pair, stem):
    strat, kafka = pair.both(tls_client, stem)
    assert strat == kafka
    assert (strat == "refused") == (stem != "client")


def test_client_refuses_a_broker_it_does_not_trust(pair):
    strat, kafka = pair.both(broker_of_another_ca)
    assert strat == kafka == "refused"


# -- Kafka's Java tools against Stratalog ---------------------------------------------------
def _properties(path: Path, sec: Security) -> Path:
    path.write_text("".join(f"{k}={v}\n" for k, v in sec.java().items()))
    return path


def _ok(result: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    assert result.returncode == 0, (
        f"exit {result.returncode}\n--- stdout ---\n{result.stdout}\n--- stderr ---\n"
        f"{result.stderr[-3000:]}"
    )
    return result


def _configs(bootstrap: str, *args: str) -> subprocess.CompletedProcess[str]:
    return run_tool("kafka-configs", "--bootstrap-server", bootstrap, *args, "--entity-type",
                    "users", timeout=TOOL_TIMEOUT)  # fmt: skip


def _outcome(result: subprocess.CompletedProcess[str]) -> tuple[int, list[str]]:
    """Exit status and the exception lines a failing tool printed."""
    errors = [ln for ln in result.stderr.splitlines() if "Exception:" in ln and "\tat " not in ln]
    return result.returncode, errors[:1]


def test_kafka_configs_manages_scram_users(pair):
    strat, kafka = pair.stratalog, pair.kafka
    user = f"java-{uuid.uuid4().hex[:6]}"
    # Both mechanisms at once, as Kafka's documentation shows it: the same outcome on both.
    both_at_once = (
        "SCRAM-SHA-256=[iterations=8192,password=java-pw],SCRAM-SHA-512=[password=java-pw]"
    )
    outcomes = [
        _outcome(_configs(bs, "--alter", "--add-config", both_at_once, "--entity-name", user))
        for bs in (strat.bootstrap, kafka.bootstrap)
    ]
    assert outcomes[0] == outcomes[1], outcomes
    print("kafka-configs with both mechanisms at once:", outcomes[1])
    for config in ("SCRAM-SHA-256=[iterations=8192,password=java-pw]",
                   "SCRAM-SHA-512=[password=java-pw]"):  # fmt: skip
        _ok(_configs(strat.bootstrap, "--alter", "--add-config", config, "--entity-name", user))
    # (kafka-configs --describe --entity-type users also asks DescribeClientQuotas, which
    # belongs to the quotas work: the credentials are read back with the API itself.)
    with Conn(strat.bootstrap) as c:
        (result,) = c.request(50, 0, users=[{"name": user}])["results"]
    assert result["credential_infos"] == [
        {"mechanism": 1, "iterations": 8192},
        {"mechanism": 2, "iterations": 4096},
    ]
    for mech in ("SCRAM-SHA-256", "SCRAM-SHA-512"):
        with Conn(strat.bootstraps["SASL_PLAINTEXT"]) as c:
            assert c.login(mech, user, "java-pw")["error_code"] == 0
    _ok(_configs(strat.bootstrap, "--alter", "--delete-config", "SCRAM-SHA-512",
                 "--entity-name", user))  # fmt: skip
    with Conn(strat.bootstraps["SASL_PLAINTEXT"]) as c:
        assert c.login("SCRAM-SHA-512", user, "java-pw")["error_code"] == 58


@pytest.mark.parametrize("listener", ["SASL_SSL", "SSL"])
def test_console_producer_and_consumer(pair, tmp_path, listener):
    strat, certs = pair.stratalog, pair.certs
    topic = f"java-{listener.lower()}-{uuid.uuid4().hex[:6]}"
    create_topic(strat.bootstrap, topic)
    if listener == "SSL":
        sec = Security("SSL", certs["ca.pem"], certs["client.crt"], certs["client.key"])
    else:
        sec = Security("SASL_SSL", certs["ca.pem"], mechanism="SCRAM-SHA-512",
                       user="scram512", password=SCRAM_USERS["SCRAM-SHA-512"][1])  # fmt: skip
    props = _properties(tmp_path / "client.properties", sec)
    lines = [f"java-{i}" for i in range(20)]
    _ok(run_tool(
        "kafka-console-producer", "--bootstrap-server", strat.bootstraps[listener],
        "--topic", topic, "--command-config", str(props),
        input="\n".join(lines) + "\n", timeout=TOOL_TIMEOUT,
    ))  # fmt: skip
    out = _ok(run_tool(
        "kafka-console-consumer", "--bootstrap-server", strat.bootstraps[listener],
        "--topic", topic, "--from-beginning", "--max-messages", str(len(lines)),
        "--command-config", str(props), "--timeout-ms", "30000", timeout=TOOL_TIMEOUT,
    )).stdout  # fmt: skip
    assert out.split() == lines
