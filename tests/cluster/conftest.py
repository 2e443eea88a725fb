"""Fixtures for cluster mode: a real etcd process, and three real brokers on it.

Each test module gets its own etcd (module scope), and tests/conftest.py's ``_group`` already
keeps every test module on one pytest-xdist worker, so a module never shares its etcd across
workers.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from stratalog.cluster.etcd_server import EtcdServer
from stratalog.cluster.local_cluster import LocalCluster


@pytest.fixture(scope="module")
def etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdServer]:
    """One single-member etcd on free loopback ports for the whole module; tests use their own
    key prefixes."""
    server = EtcdServer(tmp_path_factory.mktemp("etcd") / "data")
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """Three brokers and their etcd for the whole module (`stratalog cluster up`'s), stopped by
    PID at its end; a module that needs other settings defines its own."""
    c = LocalCluster(tmp_path_factory.mktemp("cluster") / "c", brokers=3)
    c.start()
    try:
        yield c
    finally:
        c.stop()
