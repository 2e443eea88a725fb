"""Brokers reach etcd over TLS with client certificates (`cluster.etcd.ssl.*`, docs/cluster.md).

A real etcd serves https with ``--client-cert-auth`` and the certificates of ``stratalog certs``;
two brokers (``stratalog cluster up``'s processes) join it, replicate a topic, and a Kafka client
produces and consumes. Each way of getting it wrong stops a broker at start, within seconds,
with a sentence naming the problem: an https URL without a CA, a client certificate from another
CA, a truststore that does not hold etcd's CA, no client certificate, a plain-http broker at the
TLS etcd, and a TLS broker at a plain etcd.
"""

from __future__ import annotations

import asyncio
import os
import ssl
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from stratalog import Broker
from stratalog.cluster.errors import ClusterError
from stratalog.cluster.etcd import EtcdStore
from stratalog.cluster.etcd_server import EtcdServer, EtcdServerTls
from stratalog.cluster.etcd_tls import EtcdTls
from stratalog.cluster.local_cluster import LocalCluster
from stratalog.config import ConfigError
from stratalog.security.certs import make_test_certificates

from ..conftest import read_values
from .conftest import wait_for, wire_brokers, wire_isr

QUICK = 4.0  # seconds: a refusal is named at once, not retried until a timeout


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return make_test_certificates(tmp_path_factory.mktemp("etcd-certs"))


@pytest.fixture(scope="module")
def tls_cluster(
    tmp_path_factory: pytest.TempPathFactory, certs: dict[str, Path]
) -> Iterator[LocalCluster]:
    """etcd over https requiring client certificates, and two brokers on it."""
    c = LocalCluster(
        tmp_path_factory.mktemp("etcd-tls") / "c",
        brokers=2,
        settings={"admin.port": "-1"},
        etcd_certs=certs,
    )
    c.start()
    try:
        yield c
    finally:
        c.stop()


def test_brokers_on_a_tls_etcd_replicate_and_serve_kafka_clients(tls_cluster, certs):
    assert tls_cluster.etcd.endpoint.startswith("https://127.0.0.1:")
    one, two = (b.bootstrap for b in tls_cluster.brokers)
    assert wait_for(lambda: wire_brokers(one) == {1, 2} and wire_brokers(two) == {1, 2}, 20)

    admin = AdminClient({"bootstrap.servers": tls_cluster.bootstrap})
    topic = NewTopic("over-tls", 2, 2, config={"min.insync.replicas": "2"})
    admin.create_topics([topic])["over-tls"].result(timeout=30)
    assert wait_for(lambda: wire_isr(one, "over-tls") == [[1, 2], [1, 2]], 20)

    p = Producer({"bootstrap.servers": one, "acks": "all", "enable.idempotence": True})
    for i in range(100):
        p.produce("over-tls", b"v%d" % i, partition=i % 2)
    assert p.flush(30) == 0

    got = read_values(two, "over-tls", 2, 100)
    assert sorted(got) == sorted(b"v%d" % i for i in range(100))

    # The metadata is in that etcd, readable with a trusted client certificate only.
    async def cluster_keys() -> int:
        tls = EtcdTls(str(certs["ca.pem"]), str(certs["client.pem"]))
        async with await EtcdStore.connect([tls_cluster.etcd.endpoint], tls=tls) as store:
            return len(await store.get_prefix("/stratalog/"))

    assert asyncio.run(cluster_keys()) > 0
    # etcd itself turns away a client without a certificate (its /health, over https).
    health = f"{tls_cluster.etcd.endpoint}/health"
    anonymous = ssl.create_default_context(cafile=str(certs["ca.pem"]))
    with pytest.raises(OSError):  # (URLError and SSLError are OSErrors)
        urllib.request.urlopen(health, timeout=3, context=anonymous).close()
    with_cert = EtcdServerTls.from_test_certificates(certs).client_context()
    with urllib.request.urlopen(health, timeout=3, context=with_cert) as r:
        assert b'"true"' in r.read()


def _start(tmp_path: Path, **settings: object) -> None:
    """Start an in-process broker that is expected to fail at start."""
    config = {"cluster.name": "etcd-tls-negative", "node.id": 9, "admin.port": -1, **settings}
    b = Broker(tmp_path / "data", config=config)
    b.start()
    b.stop()
    pytest.fail("the broker started")


def test_an_https_url_without_a_ca_is_refused_when_configured(tls_cluster, tmp_path):
    with pytest.raises(ConfigError, match=r"cluster\.etcd\.ssl\.truststore\.location is not set"):
        _start(tmp_path, **{"cluster.etcd": tls_cluster.etcd.endpoint})

    async def connect() -> None:
        await EtcdStore.connect([tls_cluster.etcd.endpoint], timeout=2)

    with pytest.raises(ClusterError, match="no CA to check its certificate"):
        asyncio.run(connect())


def test_settings_for_tls_with_a_plain_url_are_refused(tmp_path, certs):
    with pytest.raises(ConfigError, match="plain http endpoints"):
        _start(
            tmp_path,
            **{
                "cluster.etcd": "http://127.0.0.1:2379",
                "cluster.etcd.ssl.truststore.location": str(certs["ca.pem"]),
            },
        )


def test_a_missing_or_mismatched_keystore_is_named_at_start(tls_cluster, tmp_path, certs):
    base = {
        "cluster.etcd": tls_cluster.etcd.endpoint,
        "cluster.etcd.ssl.truststore.location": str(certs["ca.pem"]),
    }
    with pytest.raises(ConfigError, match=r"keystore\.location: .*nope\.pem does not exist"):
        _start(
            tmp_path, **base, **{"cluster.etcd.ssl.keystore.location": str(tmp_path / "nope.pem")}
        )
    mismatched = tmp_path / "mismatched.pem"
    mismatched.write_bytes(certs["client.key"].read_bytes() + certs["broker.crt"].read_bytes())
    with pytest.raises(ConfigError, match="does not match its certificate"):
        _start(tmp_path, **base, **{"cluster.etcd.ssl.keystore.location": str(mismatched)})


@pytest.mark.parametrize(
    ("truststore", "keystore", "message"),
    [
        ("ca.pem", "other-broker.pem", r"refused the client certificate .*another CA"),
        ("ca.pem", None, r"asks for a client certificate \(--client-cert-auth\)"),
        ("other-ca.pem", "broker.pem", r"etcd's certificate at https://.* is not trusted"),
    ],
    ids=["client-cert-from-another-ca", "no-client-cert", "etcd-cert-from-another-ca"],
)
def test_a_certificate_either_side_refuses_stops_the_broker_at_once(
    tls_cluster, tmp_path, certs, truststore, keystore, message
):
    settings = {
        "cluster.etcd": tls_cluster.etcd.endpoint,
        "cluster.etcd.ssl.truststore.location": str(certs[truststore]),
    }
    if keystore:
        settings["cluster.etcd.ssl.keystore.location"] = str(certs[keystore])
    t0 = time.monotonic()
    with pytest.raises(ClusterError, match=message):
        _start(tmp_path, **settings)
    assert time.monotonic() - t0 < QUICK


def test_a_plain_http_broker_at_a_tls_etcd_exits_with_the_reason(tls_cluster, tmp_path):
    # The command line, as an operator sees it: a message on stderr and a failed exit.
    plain = tls_cluster.etcd.endpoint.replace("https://", "http://")
    cmd = [sys.executable, "-m", "stratalog.cli", "serve", "--data-dir", str(tmp_path / "d"),
           "--port", "0", "--node-id", "7", "--etcd", plain, "--set", "admin.port=-1"]  # fmt: skip
    env = {**os.environ, "GRPC_VERBOSITY": "NONE"}
    t0 = time.monotonic()
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env)
    took = time.monotonic() - t0
    assert r.returncode != 0
    assert "cannot join the cluster" in r.stderr
    assert f"etcd at {plain} speaks TLS" in r.stderr, r.stderr[-2000:]
    assert "https://" in r.stderr
    # Interpreter start and imports included: nowhere near a retry loop's timeout.
    assert took < 20, took


def test_a_tls_broker_at_a_plain_etcd_is_told_so(tmp_path_factory, tmp_path, certs):
    with EtcdServer(tmp_path_factory.mktemp("plain-etcd") / "data") as plain:
        https = plain.endpoint.replace("http://", "https://")
        t0 = time.monotonic()
        with pytest.raises(ClusterError, match=r"does not complete a TLS handshake"):
            _start(
                tmp_path,
                **{
                    "cluster.etcd": https,
                    "cluster.etcd.ssl.truststore.location": str(certs["ca.pem"]),
                    "cluster.etcd.ssl.keystore.location": str(certs["broker.pem"]),
                },
            )
        assert time.monotonic() - t0 < QUICK
