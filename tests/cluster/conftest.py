"""Fixtures for cluster mode: a real etcd process, and three real brokers on it.

Each test module gets its own etcd (module scope), and tests/conftest.py's ``_group`` already
keeps every test module on one pytest-xdist worker, so a module never shares its etcd across
workers.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from stratalog import Broker
from stratalog.cluster.etcd_server import EtcdServer
from stratalog.cluster.local_cluster import LocalCluster

from ..conformance import wire


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


@pytest.fixture
def short_lag_cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    """Three brokers of one test's own, dropping a backup from the in-sync set 3 s behind."""
    c = LocalCluster(tmp_path / "c", brokers=3, settings={"replica.lag.time.max.ms": "3000"})
    c.start()
    try:
        yield c
    finally:
        c.stop()


def in_process_brokers(
    etcd: EtcdServer, factory: pytest.TempPathFactory, prefix: str, config: dict
) -> Iterator[list[Broker]]:
    """Two in-process brokers of a new cluster on ``etcd`` (node ids 1 and 2), each with
    ``config`` besides its cluster settings; stopped when the generator is closed."""
    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    started: list[Broker] = []
    try:
        for node in (1, 2):
            own = {"cluster.etcd": etcd.endpoint, "cluster.name": name, "node.id": node}
            b = Broker(factory.mktemp(f"{prefix}-node{node}") / "data", config={**own, **config})
            started.append(b.start())
        yield started
    finally:
        for b in reversed(started):
            b.stop()


def wait_for(check, timeout: float = 15.0):
    """``check()``'s first truthy answer, or its last one after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        out = check()
        if out or time.monotonic() > deadline:
            return out
        time.sleep(0.1)


def wire_brokers(bootstrap: str) -> set[int]:
    """The node ids Metadata (v12, over the wire) names at ``bootstrap``."""
    md = wire.call(bootstrap, 3, 12, topics=[], allow_auto_topic_creation=False,
                   include_topic_authorized_operations=False)  # fmt: skip
    return {b["node_id"] for b in md["brokers"]}


def wire_isr(bootstrap: str, topic: str) -> list[list[int]]:
    """Each partition's in-sync replicas (sorted) as Metadata names them at ``bootstrap``."""
    md = wire.call(bootstrap, 3, 12, topics=[{"name": topic, "topic_id": None}],
                   allow_auto_topic_creation=False,
                   include_topic_authorized_operations=False)  # fmt: skip
    return [sorted(p["isr_nodes"]) for p in md["topics"][0]["partitions"]]
