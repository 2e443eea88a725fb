"""Stratalog's own wire client (what the CLI, replay and the Python Spark source and sink use)
on secured listeners: TLS with mutual TLS, SASL PLAIN and SCRAM, with the settings a Kafka
client takes; and clear errors for each way it can be wrong.

A real broker with real certificates; what is written through one listener is read back through
another, and through confluent-kafka, so the client's success is not its own word."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition

from stratalog import Broker
from stratalog.client.errors import WireError
from stratalog.client.security import SecurityConfigError, from_config
from stratalog.client.wire import WireClient
from stratalog.records import build_batch, iter_records

from .conftest import PLAIN_USERS, SCRAM_USERS, add_scram_users, secure_config

T0 = (int(time.time()) - 60) * 1000


@pytest.fixture(scope="module")
def broker(
    tmp_path_factory: pytest.TempPathFactory, certs: dict[str, Path], plain_users_file: Path
) -> Iterator[Broker]:
    with Broker(
        tmp_path_factory.mktemp("own") / "data", config=secure_config(certs, plain_users_file)
    ) as b:
        add_scram_users(b.bootstrap)
        yield b


def _jaas(user: str, password: str) -> str:
    return f'org.apache.kafka.common.security.scram.ScramLoginModule required username="{user}" password="{password}";'  # noqa: E501


def _settings(certs: dict[str, Path], listener: str, mechanism: str | None) -> dict[str, str]:
    out = {"security.protocol": listener}
    if "SSL" in listener:
        out["ssl.truststore.location"] = str(certs["ca.pem"])
    if listener == "SSL":  # the broker requires a client certificate there
        out["ssl.keystore.location"] = str(certs["client.pem"])
    if mechanism == "PLAIN":
        out |= {"sasl.mechanism": "PLAIN", "sasl.username": "alice"}
        out["sasl.password"] = PLAIN_USERS["alice"]
    elif mechanism is not None:
        out["sasl.mechanism"] = mechanism
        out["sasl.jaas.config"] = _jaas(*SCRAM_USERS[mechanism])
    return out


CASES = [
    ("SSL", None),
    ("SASL_PLAINTEXT", "PLAIN"),
    ("SASL_PLAINTEXT", "SCRAM-SHA-256"),
    ("SASL_SSL", "SCRAM-SHA-512"),
    ("SASL_SSL", "PLAIN"),
]


@pytest.mark.parametrize(("listener", "mechanism"), CASES)
def test_the_wire_client_writes_and_reads_on_a_secured_listener(broker, certs, listener, mechanism):
    topic = f"own-{listener}-{mechanism}".lower()
    sec = from_config(_settings(certs, listener, mechanism))
    values = [b"%s-%d" % (topic.encode(), i) for i in range(5)]
    with WireClient(broker.bootstraps[listener], security=sec) as c:
        c.create_topic(topic, 1)
        batch = build_batch([(None, v, T0 + i) for i, v in enumerate(values)])
        assert c.produce(topic, {0: batch}) == {0: (0, 0)}
        data = c.fetch(topic, {0: 0})[0]
        assert [r.value for r in iter_records(bytes(data.records))] == values
    # The same records through another client on the PLAINTEXT listener.
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": topic})
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        got = []
        while len(got) < len(values):
            m = consumer.poll(10)
            assert m is not None and not m.error(), m and m.error()
            got.append(m.value())
    finally:
        consumer.close()
    assert got == values


def test_a_wrong_password_is_named(broker, certs):
    settings = _settings(certs, "SASL_SSL", "SCRAM-SHA-256")
    settings["sasl.jaas.config"] = _jaas(SCRAM_USERS["SCRAM-SHA-256"][0], "not-the-password")
    c = WireClient(broker.bootstraps["SASL_SSL"], security=from_config(settings))
    with c, pytest.raises(WireError, match="SASL authentication of 'scram256' failed") as info:
        c.metadata(None)
    assert info.value.error_code == 58  # SASL_AUTHENTICATION_FAILED


def test_a_mechanism_the_listener_does_not_offer_is_named(tmp_path, certs, plain_users_file):
    config = secure_config(certs, plain_users_file, **{"sasl.enabled.mechanisms": "PLAIN"})
    with Broker(tmp_path / "data", config=config) as b:
        sec = from_config(_settings(certs, "SASL_PLAINTEXT", "SCRAM-SHA-512"))
        c = WireClient(b.bootstraps["SASL_PLAINTEXT"], security=sec)
        with c, pytest.raises(WireError, match="SCRAM-SHA-512 refused: the listener offers PLAIN"):
            c.metadata(None)


def test_a_broker_certificate_from_another_ca_is_refused(broker, certs):
    settings = _settings(certs, "SASL_SSL", "PLAIN")
    settings["ssl.truststore.location"] = str(certs["other-ca.pem"])
    c = WireClient(broker.bootstraps["SASL_SSL"], security=from_config(settings))
    failed = r"TLS with the broker at .* failed: .*CERTIFICATE_VERIFY"
    with c, pytest.raises(WireError, match=failed):
        c.metadata(None)


def test_without_a_client_certificate_mutual_tls_is_refused(broker, certs):
    settings = _settings(certs, "SSL", None)
    del settings["ssl.keystore.location"]
    c = WireClient(broker.bootstraps["SSL"], security=from_config(settings))
    with c, pytest.raises(WireError):
        c.metadata(None)


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"security.protocol": "TLS"}, "security.protocol must be one of"),
        ({"security.protocol": "SASL_SSL", "sasl.username": "u", "sasl.password": "p"},
         "sasl.mechanism GSSAPI is not offered"),
        ({"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN"},
         "sasl.jaas.config: SASL_PLAINTEXT needs a user name and password"),
        ({"security.protocol": "SSL", "ssl.truststore.type": "JKS"},
         "ssl.truststore.type: only PEM files are read, not JKS"),
    ],
)  # fmt: skip
def test_settings_that_cannot_work_are_named(settings, message):
    with pytest.raises(SecurityConfigError, match=message):
        from_config(settings)


def test_jaas_credentials_are_read_as_a_java_client_writes_them():
    jaas = (
        "org.apache.kafka.common.security.plain.PlainLoginModule required "
        'username="bob" password="a \\"quoted\\" secret";'
    )
    sec = from_config({"security.protocol": "SASL_SSL", "sasl.mechanism": "plain"} | {
        "sasl.jaas.config": jaas
    })  # fmt: skip
    assert (sec.mechanism, sec.username, sec.password) == ("PLAIN", "bob", 'a "quoted" secret')
    assert sec.tls and sec.sasl


def _cli(args: list[str], stdin: str = "") -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "stratalog.cli", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_the_cli_commands_take_a_kafka_command_config(broker, certs, tmp_path):
    # The client commands over SASL_SSL with SCRAM, configured as Kafka's tools are (a
    # properties file, the JAAS line continued over two lines as such files often have it).
    user, password = SCRAM_USERS["SCRAM-SHA-512"]
    config = tmp_path / "client.properties"
    config.write_text(
        "# Kafka client settings\n"
        "security.protocol=SASL_SSL\n"
        f"ssl.truststore.location={certs['ca.pem']}\n"
        "ssl.truststore.type=PEM\n"
        "sasl.mechanism=SCRAM-SHA-512\n"
        "sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required \\\n"
        f'    username="{user}" password="{password}";\n'
    )
    at = ["-b", broker.bootstraps["SASL_SSL"]]
    cfg = ["--command-config", str(config)]
    for args, stdin in (
        ([*cfg, "topics", "create", "cli-secured", "--partitions", "1", *at], ""),
        ([*cfg, "produce", "cli-secured", *at], "one\ntwo\nthree\n"),
    ):
        r = _cli(args, stdin)
        assert r.returncode == 0, r.stderr
    r = _cli([*cfg, "consume", "cli-secured", "--from-beginning", "--max-messages", "3", *at])
    assert r.returncode == 0 and r.stdout.split() == ["one", "two", "three"], r.stderr
    r = _cli([*cfg, "replay", "cli-secured", "--from", "0", "--to", "9999999999999", *at])
    assert r.returncode == 0, r.stderr
    assert [json.loads(line)["value"] for line in r.stdout.splitlines()] == ["one", "two", "three"]
    # A wrong setting is one line naming it, before anything is sent.
    config.write_text("security.protocol=SASL_SSL\nsasl.mechanism=GSSAPI\n")
    r = _cli([*cfg, "topics", "list", *at])
    assert r.returncode != 0 and "sasl.mechanism GSSAPI is not offered" in r.stderr
