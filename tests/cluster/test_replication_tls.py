"""Replication between brokers over mutual TLS (`cluster.replication.tls`): the replication
listener speaks TLS and asks for a certificate; brokers whose certificates chain to the
truststore replicate (acks=all with two in sync); a broker whose certificate another CA signed
never gets a backup link, so it never joins the in-sync set.

Real etcd, real brokers, real certificates (``stratalog certs``)."""

from __future__ import annotations

import socket
import ssl
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from stratalog import Broker
from stratalog.cluster.etcd_server import EtcdServer
from stratalog.security.certs import make_test_certificates

from ..conformance import wire
from .conftest import in_process_brokers, wait_for, wire_brokers, wire_isr


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return make_test_certificates(tmp_path_factory.mktemp("repl-certs"))


def _tls(certs: dict[str, Path], keystore: str = "broker.pem") -> dict:
    return {
        "admin.port": -1,
        "replica.lag.time.max.ms": 2000,  # a backup without a link leaves the in-sync set soon
        "cluster.replication.tls": True,
        "cluster.replication.port": _free_port(),
        "ssl.keystore.location": str(certs[keystore]),
        "ssl.truststore.location": str(certs["ca.pem"]),
    }


@pytest.fixture(scope="module")
def brokers(
    etcd: EtcdServer, tmp_path_factory: pytest.TempPathFactory, certs: dict[str, Path]
) -> Iterator[list[Broker]]:
    # The two brokers share one certificate (it names 127.0.0.1).
    config = _tls(certs)
    del config["cluster.replication.port"]  # each picks a free one
    started = in_process_brokers(etcd, tmp_path_factory, "repl-tls", config)
    try:
        yield next(started)
    finally:
        started.close()


def _leader(bootstrap: str, topic: str) -> int:
    md = wire.call(bootstrap, 3, 12, topics=[{"name": topic, "topic_id": None}],
                   allow_auto_topic_creation=False,
                   include_topic_authorized_operations=False)  # fmt: skip
    return md["topics"][0]["partitions"][0]["leader_id"]


def test_the_replication_listener_speaks_mutual_tls(brokers, certs):
    port = brokers[0].service.core.cluster.replication_port
    ctx = ssl.create_default_context(cafile=str(certs["ca.pem"]))
    ctx.load_cert_chain(str(certs["broker.pem"]))
    raw = socket.create_connection(("127.0.0.1", port), 5)
    with raw, ctx.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
        assert tls.version() in ("TLSv1.2", "TLSv1.3")
    # Without a certificate the handshake (or the first read after it, in TLS 1.3) fails.
    anonymous = ssl.create_default_context(cafile=str(certs["ca.pem"]))
    raw = socket.create_connection(("127.0.0.1", port), 5)
    refused = pytest.raises((ssl.SSLError, ConnectionResetError, OSError))
    with raw, refused, anonymous.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
        tls.sendall(b"\x00" * 16)
        if not tls.recv(1):
            raise ConnectionResetError("closed without an answer")


def test_brokers_replicate_over_tls_and_a_stranger_never_joins(
    brokers, etcd, certs, tmp_path_factory
):
    first, _second = brokers
    # (each broker learns of the other through its etcd watch)
    assert wait_for(lambda: wire_brokers(first.bootstrap) == {1, 2}, 30)
    admin = AdminClient({"bootstrap.servers": first.bootstrap})
    admin.create_topics([NewTopic("tls-rep", 2, 2, config={"min.insync.replicas": "2"})])[
        "tls-rep"
    ].result(timeout=30)
    assert wait_for(lambda: wire_isr(first.bootstrap, "tls-rep") == [[1, 2], [1, 2]], 30)
    p = Producer({"bootstrap.servers": first.bootstrap, "acks": "all", "enable.idempotence": True})
    for i in range(200):
        p.produce("tls-rep", b"r%d" % i, partition=i % 2)
    assert p.flush(30) == 0

    # A third broker of the same cluster whose certificate another CA signed.
    cluster = first.config["cluster.name"]
    config = {
        **_tls(certs, keystore="other-broker.pem"),
        "cluster.etcd": etcd.endpoint,
        "cluster.name": cluster,
        "node.id": 3,
    }
    stranger = Broker(tmp_path_factory.mktemp("stranger") / "data", config=config).start()
    try:
        # 3's links never form (the others do not trust the certificate it serves, nor the one
        # it presents as a client), so a write commits once the in-sync set has dropped the
        # side it cannot reach, which never comes back.
        admin.create_topics([NewTopic("tls-three", 1, 3)])["tls-three"].result(timeout=30)
        assert wait_for(lambda: 3 in wire_brokers(first.bootstrap), 30)
        p.produce("tls-three", b"after the stranger came")
        assert p.flush(30) == 0
        # Whoever leads, 3 and the other two never share a link: the in-sync set ends as the
        # two that trust each other, or 3 alone if it leads.
        leader = _leader(first.bootstrap, "tls-three")
        settled = [[3]] if leader == 3 else [[1, 2]]
        assert wait_for(lambda: wire_isr(first.bootstrap, "tls-three") == settled, 30)
        time.sleep(3)  # a link that could form would have caught up an almost empty log by now
        assert wire_isr(first.bootstrap, "tls-three") == settled
    finally:
        stranger.stop()


def test_transaction_markers_cross_an_ssl_inter_broker_listener(etcd, certs, tmp_path_factory):
    # The brokers know each other only on an SSL listener requiring client certificates (the
    # clients use PLAINTEXT): a transaction over partitions of both brokers completes only if
    # the coordinator's markers reach the other broker over TLS with its own certificate.
    from confluent_kafka import Consumer, TopicPartition

    config = {
        "admin.port": -1,
        "listeners": "SSL://127.0.0.1:0,PLAINTEXT://127.0.0.1:0",
        "inter.broker.listener.name": "SSL",
        "ssl.client.auth": "required",
        "ssl.keystore.location": str(certs["broker.pem"]),
        "ssl.truststore.location": str(certs["ca.pem"]),
    }
    started = in_process_brokers(etcd, tmp_path_factory, "markers-tls", config)
    try:
        first, second = next(started)
        plain = first.bootstraps["PLAINTEXT"]
        assert wait_for(lambda: wire_brokers(plain) == {1, 2}, 30)
        admin = AdminClient({"bootstrap.servers": plain})
        admin.create_topics([NewTopic("tls-txn", 4, 1)])["tls-txn"].result(timeout=30)
        md = wire.call(plain, 3, 12, topics=[{"name": "tls-txn", "topic_id": None}],
                       allow_auto_topic_creation=False,
                       include_topic_authorized_operations=False)  # fmt: skip
        leaders = {p["leader_id"] for p in md["topics"][0]["partitions"]}
        assert leaders == {1, 2}, leaders  # the transaction spans both brokers
        p = Producer({"bootstrap.servers": plain, "transactional.id": "tls-markers"})
        p.init_transactions(30)
        p.begin_transaction()
        for i in range(40):
            p.produce("tls-txn", b"t%d" % i, partition=i % 4)
        p.commit_transaction(30)
        reader = {"group.id": "tls-markers-reader", "isolation.level": "read_committed"}
        c = Consumer({"bootstrap.servers": second.bootstraps["PLAINTEXT"], **reader})
        try:
            c.assign([TopicPartition("tls-txn", i, 0) for i in range(4)])
            got = []
            deadline = time.monotonic() + 30
            while len(got) < 40 and time.monotonic() < deadline:
                m = c.poll(0.5)
                if m is not None and not m.error():
                    got.append(m.value())
        finally:
            c.close()
        assert sorted(got) == sorted(b"t%d" % i for i in range(40))
    finally:
        started.close()
