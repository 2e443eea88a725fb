"""TLS terminated in a process of its own (``ssl.offload``): the same listeners, the same
clients, the same principals, with the record layer in the Go offload process and the
connections handed to the broker in clear over a private Unix socket after a PROXY v2 header.

One broker for the module with the four listeners of the other security tests, SSL with mutual
TLS required and SASL_SSL both offloaded. Real clients round-trip over both; the client
certificate's subject and the SASL user are the principals; a client without a trusted
certificate is refused while others are served; a fetch goes out by sendfile (which the
broker's own TLS cannot); the process is started again after kill -9 and does not outlive the
broker; and bytes on the Unix socket that are not a PROXY header close that connection only.
"""

from __future__ import annotations

import os
import signal
import socket
import ssl
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from stratalog import Broker
from stratalog.broker import metrics

from ..conftest import create_topic
from .clients import Security, roundtrip
from .conftest import SCRAM_USERS, add_scram_users, secure_config
from .tls_wire import api_versions, tls_socket


@pytest.fixture(scope="module")
def broker(
    tmp_path_factory: pytest.TempPathFactory, certs: dict[str, Path], plain_users_file: Path
) -> Iterator[Broker]:
    config = secure_config(certs, plain_users_file, **{"ssl.offload": True})
    with Broker(tmp_path_factory.mktemp("offload") / "data", config=config) as b:
        add_scram_users(b.bootstraps["PLAINTEXT"])
        yield b


def _server(broker: Broker, name: str):
    return next(s for s in broker.service.servers if s.listener.name == name)


def _topic(broker: Broker) -> str:
    name = f"off-{uuid.uuid4().hex[:8]}"
    create_topic(broker.bootstraps["PLAINTEXT"], name)
    return name


def _mtls(certs: dict[str, Path], stem: str = "client") -> Security:
    return Security("SSL", certs["ca.pem"], certs[f"{stem}.crt"], certs[f"{stem}.key"])


def _principals(broker: Broker, name: str) -> list[str]:
    server = _server(broker, name)
    return broker.call(lambda: [c.principal for c in server.connections])


@pytest.mark.parametrize("client", ["kcat", "confluent-kafka", "aiokafka", "kafka-python"])
def test_round_trip_over_offloaded_ssl(broker, certs, client):
    got = roundtrip(client, broker.bootstraps["SSL"], _topic(broker), _mtls(certs))
    assert got == [f"{client}-{i}".encode() for i in range(50)]


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_round_trip_over_offloaded_sasl_ssl(broker, certs, mechanism):
    if mechanism == "PLAIN":
        user, password = "alice", "alice-secret"
    else:
        user, password = SCRAM_USERS[mechanism]
    sec = Security("SASL_SSL", certs["ca.pem"], mechanism=mechanism, user=user, password=password)
    got = roundtrip("confluent-kafka", broker.bootstraps["SASL_SSL"], _topic(broker), sec, 20)
    assert got == [f"confluent-kafka-{i}".encode() for i in range(20)]


def _tls_socket(broker: Broker, certs: dict[str, Path], stem: str | None) -> ssl.SSLSocket:
    return tls_socket(broker.bootstraps["SSL"], certs, stem)


def test_principals_and_client_addresses_come_through(broker, certs):
    with _tls_socket(broker, certs, "client") as s:
        assert api_versions(s) == 0
        assert "User:CN=client,O=Stratalog test" in _principals(broker, "SSL")
        server = _server(broker, "SSL")
        peers = broker.call(lambda: [c.peer for c in server.connections])
        assert "127.0.0.1" in peers  # the client's address, not the Unix socket's


@pytest.mark.parametrize("stem", ["other-client", None], ids=["other-ca", "no-certificate"])
def test_a_client_without_a_trusted_certificate_is_refused(broker, certs, stem):
    try:
        with _tls_socket(broker, certs, stem) as s:
            api_versions(s)  # (TLS 1.3: the refusal arrives as an alert on the first read)
    except (ssl.SSLError, ConnectionError, OSError) as e:
        assert not isinstance(e, TimeoutError), e
    else:
        raise AssertionError("a client without a trusted certificate was served")
    with _tls_socket(broker, certs, "client") as s:
        assert api_versions(s) == 0


def test_fetches_over_offloaded_tls_go_out_by_sendfile(broker, certs):
    """The broker's own TLS copies every fetched byte; offloaded, the broker's socket is in
    clear and stored batches go out by sendfile (its counter grows by what was read)."""
    from confluent_kafka import Consumer, Producer

    topic = _topic(broker)
    p = Producer({"bootstrap.servers": broker.bootstraps["PLAINTEXT"]})
    for i in range(200):
        p.produce(topic, value=b"%d-" % i + b"x" * 2000)
    assert p.flush(30) == 0
    before = metrics.FETCH_SENDFILE_BYTES._value.get()
    c = Consumer(
        {
            "bootstrap.servers": broker.bootstraps["SSL"],
            "group.id": f"g-{topic}",
            "auto.offset.reset": "earliest",
            **_mtls(certs).librdkafka(),
        }
    )
    c.subscribe([topic])
    got = 0
    deadline = time.monotonic() + 30
    while got < 200 and time.monotonic() < deadline:
        m = c.poll(0.5)
        if m is not None and m.error() is None:
            got += 1
    c.close()
    assert got == 200
    assert metrics.FETCH_SENDFILE_BYTES._value.get() - before >= 200 * 2000


def test_bytes_that_are_not_a_proxy_header_close_that_connection_only(broker, certs):
    path = _server(broker, "SSL")._offload.socket_path
    assert os.stat(path).st_mode & 0o777 == 0o600
    assert os.stat(path.parent).st_mode & 0o777 == 0o700
    with socket.socket(socket.AF_UNIX) as raw:
        raw.settimeout(10)
        raw.connect(str(path))
        raw.sendall(b"GET / HTTP/1.1\r\n\r\n" + b"\0" * 64)
        assert raw.recv(100) == b""  # closed by the broker
    with _tls_socket(broker, certs, "client") as s:
        assert api_versions(s) == 0


def test_the_offload_process_is_started_again_after_kill_9(broker, certs):
    offload = _server(broker, "SSL")._offload
    pid = offload.process.pid
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while True:
        try:
            with _tls_socket(broker, certs, "client") as s:
                assert api_versions(s) == 0
            break
        except OSError:
            assert time.monotonic() < deadline, "the offload process did not come back"
            time.sleep(0.2)
    assert offload.process.pid != pid


def test_the_offload_process_ends_with_the_broker(certs, plain_users_file, tmp_path):
    config = secure_config(certs, plain_users_file, **{"ssl.offload": True})
    with Broker(tmp_path / "data", config=config) as b:
        pids = [s._offload.process.pid for s in b.service.servers if s._offload is not None]
        assert len(pids) == 2  # SSL and SASL_SSL
    for pid in pids:
        deadline = time.monotonic() + 10
        while _alive(pid):
            assert time.monotonic() < deadline, f"offload process {pid} outlived the broker"
            time.sleep(0.05)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
