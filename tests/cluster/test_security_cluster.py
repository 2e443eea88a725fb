"""Security in a cluster: two brokers on one etcd, each with a PLAINTEXT and a SASL_PLAINTEXT
listener. SCRAM users created through one broker log in on the other (the credentials are in
etcd), and Metadata over the SASL listener names every broker's SASL address (each broker
registers its listeners)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest

from stratalog import Broker
from stratalog.cluster.etcd_server import EtcdServer

from ..security.conftest import add_scram_users
from ..security.wire import Conn

LISTENERS = "PLAINTEXT://127.0.0.1:0,SASL_PLAINTEXT://127.0.0.1:0"


@pytest.fixture(scope="module")
def brokers(etcd: EtcdServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Broker]]:
    name = f"sec-{uuid.uuid4().hex[:8]}"
    started: list[Broker] = []
    try:
        for node in (1, 2):
            config = {
                "cluster.etcd": etcd.endpoint,
                "cluster.name": name,
                "node.id": node,
                "listeners": LISTENERS,
                "admin.port": -1,
            }
            b = Broker(tmp_path_factory.mktemp(f"sec-node{node}") / "data", config=config)
            started.append(b.start())
        yield started
    finally:
        for b in reversed(started):
            b.stop()


def _wait(check, timeout: float = 15.0):
    deadline = time.monotonic() + timeout
    while True:
        out = check()
        if out or time.monotonic() > deadline:
            return out
        time.sleep(0.1)


def test_users_created_on_one_broker_log_in_on_the_other(brokers):
    first, second = brokers
    add_scram_users(first.bootstrap, {"SCRAM-SHA-512": ("everywhere", "pw-cluster")})

    def logs_in() -> bool:
        with Conn(second.bootstraps["SASL_PLAINTEXT"]) as c:
            return c.login("SCRAM-SHA-512", "everywhere", "pw-cluster")["error_code"] == 0

    assert _wait(logs_in)
    # Nothing is written to the data directory in cluster mode: etcd holds them.
    assert not (first.data_dir / "meta" / "scram-credentials.json").exists()


def test_metadata_names_every_broker_on_the_listener_used(brokers):
    first, second = brokers
    add_scram_users(first.bootstrap, {"SCRAM-SHA-256": ("md-user", "md-pw")})
    want = sorted(b.bootstraps["SASL_PLAINTEXT"] for b in brokers)

    def brokers_seen() -> list[str] | None:
        with Conn(second.bootstraps["SASL_PLAINTEXT"]) as c:
            if c.login("SCRAM-SHA-256", "md-user", "md-pw")["error_code"] != 0:
                return None
            seen = sorted(f"{b['host']}:{b['port']}" for b in c.metadata()["brokers"])
            return seen if seen == want else None

    assert _wait(brokers_seen) == want
    with Conn(first.bootstrap) as c:  # PLAINTEXT: the PLAINTEXT addresses
        seen = sorted(f"{b['host']}:{b['port']}" for b in c.metadata()["brokers"])
    assert seen == sorted(b.bootstrap for b in brokers)
