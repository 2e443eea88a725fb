"""Security in a cluster: two brokers on one etcd, each with a PLAINTEXT and a SASL_PLAINTEXT
listener. SCRAM users created through one broker log in on the other (the credentials are in
etcd), and Metadata over the SASL listener names every broker's SASL address (each broker
registers its listeners)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from stratalog import Broker
from stratalog.cluster.etcd_server import EtcdServer

from ..security.conftest import add_scram_users
from ..security.wire import Conn
from .conftest import in_process_brokers, wait_for

LISTENERS = "PLAINTEXT://127.0.0.1:0,SASL_PLAINTEXT://127.0.0.1:0"


@pytest.fixture(scope="module")
def brokers(etcd: EtcdServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Broker]]:
    config = {"listeners": LISTENERS, "admin.port": -1}
    started = in_process_brokers(etcd, tmp_path_factory, "sec", config)
    try:
        two = next(started)
        yield two
    finally:
        started.close()


def test_users_created_on_one_broker_log_in_on_the_other(brokers):
    first, second = brokers
    add_scram_users(first.bootstrap, {"SCRAM-SHA-512": ("everywhere", "pw-cluster")})

    def logs_in() -> bool:
        with Conn(second.bootstraps["SASL_PLAINTEXT"]) as c:
            return c.login("SCRAM-SHA-512", "everywhere", "pw-cluster")["error_code"] == 0

    assert wait_for(logs_in)
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

    assert wait_for(brokers_seen) == want

    def plaintext_seen() -> list[str]:
        # (first registered before second and learns of it through its etcd watch)
        with Conn(first.bootstrap) as c:  # PLAINTEXT: the PLAINTEXT addresses
            return sorted(f"{b['host']}:{b['port']}" for b in c.metadata()["brokers"])

    plain = sorted(b.bootstrap for b in brokers)
    assert wait_for(lambda: plaintext_seen() == plain and plain) == plain
