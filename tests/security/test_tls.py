"""TLS listeners with real clients and real certificates (made by ``stratalog certs``' code).

One broker for the module with all four listeners (PLAINTEXT, SSL with mutual TLS required,
SASL_PLAINTEXT, SASL_SSL). kcat, confluent-kafka, aiokafka and kafka-python produce and consume
over SSL with a client certificate; Metadata answers each listener with its own address; the
client certificate's subject becomes the principal; a certificate from another CA, or none,
fails the handshake while a good client keeps being served; stored batches read from segment
files reach a TLS consumer intact (no sendfile there); and certificates or settings that cannot
work stop the broker at start with a message naming the file or setting.
"""

from __future__ import annotations

import ssl
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient

from stratalog import Broker
from stratalog.broker import metrics
from stratalog.config import ConfigError

from ..conftest import REPO, create_topic, read_values
from .clients import CLIENTS, Security, roundtrip
from .conftest import PLAIN_USERS, secure_config
from .tls_wire import api_versions, tls_socket


@pytest.fixture(scope="module")
def broker(
    tmp_path_factory: pytest.TempPathFactory, certs: dict[str, Path], plain_users_file: Path
) -> Iterator[Broker]:
    with Broker(
        tmp_path_factory.mktemp("tls") / "data", config=secure_config(certs, plain_users_file)
    ) as b:
        yield b


def _mtls(certs: dict[str, Path], stem: str = "client") -> Security:
    return Security("SSL", certs["ca.pem"], certs[f"{stem}.crt"], certs[f"{stem}.key"])


def _topic(broker: Broker) -> str:
    name = f"tls-{uuid.uuid4().hex[:8]}"
    create_topic(broker.bootstrap, name)
    return name


@pytest.mark.parametrize("client", CLIENTS)
def test_round_trip_over_ssl_with_a_client_certificate(broker, certs, client):
    topic = _topic(broker)
    got = roundtrip(client, broker.bootstraps["SSL"], topic, _mtls(certs))
    assert got == [f"{client}-{i}".encode() for i in range(50)]


def test_metadata_answers_with_the_listener_the_client_came_in_on(broker, certs):
    sasl = Security("SASL_SSL", certs["ca.pem"], mechanism="PLAIN", user="alice",
                    password=PLAIN_USERS["alice"])  # fmt: skip
    settings = {
        "PLAINTEXT": {},
        "SSL": _mtls(certs).librdkafka(),
        "SASL_SSL": sasl.librdkafka(),
    }
    for name, conf in settings.items():
        admin = AdminClient({"bootstrap.servers": broker.bootstraps[name], **conf})
        md = admin.list_topics(timeout=15)
        ((host, port),) = [(b.host, b.port) for b in md.brokers.values()]
        assert f"{host}:{port}" == broker.bootstraps[name], name


def _tls_socket(broker: Broker, certs: dict[str, Path], stem: str | None) -> ssl.SSLSocket:
    return tls_socket(broker.bootstraps["SSL"], certs, stem)


def test_client_certificate_subject_is_the_principal(broker, certs):
    with _tls_socket(broker, certs, "client") as s:
        assert api_versions(s) == 0
        ssl_server = next(x for x in broker.service.servers if x.listener.name == "SSL")
        principals = broker.call(lambda: [c.principal for c in ssl_server.connections])
        assert "User:CN=client,O=Stratalog test" in principals


@pytest.mark.parametrize("stem", ["other-client", None], ids=["other-ca", "no-certificate"])
def test_handshake_fails_without_a_trusted_client_certificate(broker, certs, stem):
    try:
        with _tls_socket(broker, certs, stem) as s:
            # TLS 1.3 finishes the client's side before the server checks its certificate:
            # the refusal arrives as an alert on the first read.
            api_versions(s)
    except (ssl.SSLError, ConnectionError, OSError) as e:
        assert not isinstance(e, TimeoutError), e
    else:
        raise AssertionError("the broker served a client without a trusted certificate")
    # Other clients are served throughout.
    with _tls_socket(broker, certs, "client") as s:
        assert api_versions(s) == 0
    # A failed handshake leaves no connection behind in the listener's set (it was kept from
    # its creation, and a connection never made is never lost); the good one above is gone too.
    server = next(x for x in broker.service.servers if x.listener.name == "SSL")
    for _ in range(100):
        if not broker.call(lambda: len(server.connections)):
            break
        time.sleep(0.05)
    assert broker.call(lambda: len(server.connections)) == 0


def test_history_reaches_a_tls_consumer_intact(broker, certs):
    """Batches read from segment files (not the page cache path's sendfile: TLS cannot) come
    out byte for byte."""
    from confluent_kafka import Producer

    topic = _topic(broker)
    values = [bytes([i % 251]) * 20_000 + i.to_bytes(4, "big") for i in range(300)]  # ~6 MB
    p = Producer({"bootstrap.servers": broker.bootstraps["PLAINTEXT"], "linger.ms": 5})
    for v in values:
        p.produce(topic, v, partition=0)
    assert p.flush(30) == 0
    copied = metrics.FETCH_COPIED_BYTES._value.get()
    got = _consume_all(broker.bootstraps["SSL"], topic, _mtls(certs), len(values))
    assert got == values
    assert metrics.FETCH_COPIED_BYTES._value.get() - copied >= sum(map(len, values))


def test_a_large_answer_to_a_slow_tls_reader(broker, certs):
    """A Fetch answer of about 12 MB over TLS to a client that reads slowly: it goes out in
    turns, waits for the transport to drain, and arrives whole."""
    from confluent_kafka import Producer

    from stratalog.records import iter_records
    from stratalog.storage.batch import parse_header

    from .wire import Conn

    topic = _topic(broker)
    p = Producer({"bootstrap.servers": broker.bootstraps["PLAINTEXT"], "linger.ms": 20,
                  "batch.size": 1 << 20, "message.max.bytes": 2 << 20})  # fmt: skip
    values = [i.to_bytes(4, "big") * 25_000 for i in range(120)]  # 100 KB each
    for v in values:
        p.produce(topic, v, partition=0)
    assert p.flush(30) == 0
    with Conn(broker.bootstraps["SSL"], certs["ca.pem"], certs["client.pem"], timeout=30) as c:
        part = {
            "partition": 0,
            "current_leader_epoch": -1,
            "fetch_offset": 0,
            "last_fetched_epoch": -1,
            "log_start_offset": -1,
            "partition_max_bytes": 64 << 20,
        }
        c.send_raw(c.frame(
            1, 12, cluster_id=None, replica_id=-1, max_wait=100, min_bytes=1,
            max_bytes=64 << 20, isolation_level=0, session_id=0, session_epoch=-1,
            topics=[{"topic": topic, "partitions": [part]}], forgotten_topics_data=[],
            rack_id="",
        ))  # fmt: skip
        time.sleep(0.5)  # the broker's writes back up meanwhile
        frame = c.read_frame(pause=0.002)  # and the client reads slowly
    from ..conformance import wire

    _cid, body = wire.decode(1, 12, frame)
    records = bytes(body.responses[0].partitions[0].records)
    got, pos = [], 0
    while pos < len(records):
        h = parse_header(records, pos)
        got += [r.value for r in iter_records(records[pos : pos + h.size], h)]
        pos += h.size
    assert got == values


def _consume_all(bootstrap: str, topic: str, sec: Security, n: int) -> list[bytes]:
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "tls-history", **sec.librdkafka()})
    out: list[bytes] = []
    try:
        c.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        deadline = time.monotonic() + 60
        while len(out) < n and time.monotonic() < deadline:
            for m in c.consume(500, 0.5):
                assert m.error() is None, m.error()
                out.append(m.value())
    finally:
        c.close()
    return out


# -- settings that cannot work ----------------------------------------------------------------
def _mismatched(certs: dict[str, Path], tmp_path: Path) -> str:
    path = tmp_path / "mismatch.pem"
    path.write_bytes(certs["client.key"].read_bytes() + certs["broker.crt"].read_bytes())
    return str(path)


def _key_only(certs: dict[str, Path], tmp_path: Path) -> str:
    path = tmp_path / "key-only.pem"
    path.write_bytes(certs["broker.key"].read_bytes())
    return str(path)


BAD_START = {
    "missing-keystore": (lambda c, t: {"ssl.keystore.location": str(t / "nope.pem")},
                         "ssl.keystore.location: {tmp}/nope.pem does not exist"),
    "key-does-not-match": (lambda c, t: {"ssl.keystore.location": _mismatched(c, t)},
                           "does not match its certificate"),
    "no-certificate": (lambda c, t: {"ssl.keystore.location": _key_only(c, t)},
                       "holds no certificate"),
    "no-keystore": (lambda c, t: {"ssl.keystore.location": ""},
                    "ssl.keystore.location is not set"),
    "truststore-not-pem": (lambda c, t: {"ssl.truststore.location": str(c["broker.key"])},
                           "holds no CA certificate"),
    "unknown-protocol": (lambda c, t: {"listener.security.protocol.map": "SSL:TLS"},
                         "unknown security protocol 'TLS'"),
    "unmapped-listener": (lambda c, t: {"listeners": "CLIENT://127.0.0.1:0"},
                          "no security protocol for listener CLIENT"),
    "mechanism": (lambda c, t: {"sasl.enabled.mechanisms": "GSSAPI"},
                  "GSSAPI is not supported"),
    "client-auth-without-truststore": (lambda c, t: {"ssl.truststore.location": ""},
                                       "ssl.client.auth=required checks client certificates"),
    "bad-listener": (lambda c, t: {"listeners": "SSL:127.0.0.1:9093"},
                     "is not NAME://host:port"),
    "plain-users-missing": (lambda c, t: {"sasl.plain.users.file": str(t / "none.jaas")},
                            "sasl.plain.users.file: {tmp}/none.jaas does not exist"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(BAD_START))
def test_settings_that_cannot_work_stop_the_start(certs, plain_users_file, tmp_path, case):
    make, message = BAD_START[case]
    config = secure_config(certs, plain_users_file, **make(certs, tmp_path))
    with pytest.raises(ConfigError) as e:
        Broker(tmp_path / "data", config=config).start()
    assert message.format(tmp=tmp_path) in str(e.value)


def test_serve_names_a_bad_certificate_in_one_line(certs, plain_users_file, tmp_path):
    args = [
        sys.executable, "-m", "stratalog.cli", "serve", "--data-dir", str(tmp_path / "d"),
        "--set", "listeners=SSL://127.0.0.1:0",
        "--set", f"ssl.keystore.location={_mismatched(certs, tmp_path)}",
    ]  # fmt: skip
    proc = subprocess.run(args, capture_output=True, text=True, timeout=60, cwd=REPO)
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "does not match its certificate" in lines[0], proc.stderr


def test_certs_command_writes_a_working_set(tmp_path):
    from typer.testing import CliRunner

    from stratalog.cli import app

    result = CliRunner().invoke(app, ["certs", "--out", str(tmp_path), "--host", "broker.test"])
    assert result.exit_code == 0, result.output
    for name in ("ca.pem", "broker.pem", "client.pem", "other-ca.pem", "other-client.pem"):
        assert (tmp_path / name).is_file()
    # The broker's keystore loads, and its certificate and the client's chain to the CA.
    ssl.create_default_context().load_cert_chain(str(tmp_path / "broker.pem"))
    verify = subprocess.run(
        ["openssl", "verify", "-CAfile", str(tmp_path / "ca.pem"),
         str(tmp_path / "broker.crt"), str(tmp_path / "client.crt")],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert verify.returncode == 0, verify.stdout + verify.stderr
    other = subprocess.run(
        ["openssl", "verify", "-CAfile", str(tmp_path / "ca.pem"),
         str(tmp_path / "other-client.crt")],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert other.returncode != 0
    san = subprocess.run(
        ["openssl", "x509", "-noout", "-ext", "subjectAltName", "-in",
         str(tmp_path / "broker.crt")],
        capture_output=True, text=True, timeout=30, check=True,
    ).stdout  # fmt: skip
    assert "IP Address:127.0.0.1" in san and "DNS:localhost" in san and "DNS:broker.test" in san


def test_large_produce_requests_over_tls_arrive_byte_for_byte(broker, certs):
    """Produce requests of up to 1 MB over TLS (each many TLS records, spanning several socket
    reads that the transport decrypts into the connection's own buffers), read back over
    PLAINTEXT: every value intact and in order."""
    from confluent_kafka import Producer

    topic = _topic(broker)
    values = [bytes([(i * 7 + j) % 256 for j in range(256)]) * 120 + i.to_bytes(4, "big")
              for i in range(400)]  # ~12 MB in batches of up to 1 MB  # fmt: skip
    p = Producer({"bootstrap.servers": broker.bootstraps["SSL"], "linger.ms": 20,
                  "batch.size": 1 << 20, "acks": "all", **_mtls(certs).librdkafka()})  # fmt: skip
    for v in values:
        p.produce(topic, v, partition=0)
    assert p.flush(30) == 0
    got = read_values(broker.bootstraps["PLAINTEXT"], topic, 1, len(values))
    assert got == values
