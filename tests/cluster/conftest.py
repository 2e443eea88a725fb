"""Fixtures for cluster mode: a real etcd process.

Each test module gets its own etcd (module scope), and tests/conftest.py's ``_group`` already
keeps every test module on one pytest-xdist worker, so a module never shares its etcd across
workers.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from stratalog.cluster.etcd_server import EtcdServer


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
