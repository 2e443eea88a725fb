"""The web console's API in a cluster of two real brokers on a real etcd: each broker's own
console and `stratalog console`'s service show every partition's leader, replicas and in-sync
replicas as confluent-kafka's metadata has them, the offsets and records of partitions either
broker leads, and the groups whichever broker coordinates."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from stratalog import Broker
from stratalog.cluster.etcd_server import EtcdServer
from stratalog.console import remote

from .conftest import in_process_brokers, wait_for

PARTITIONS = 4


@pytest.fixture(scope="module")
def brokers(etcd: EtcdServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Broker]]:
    started = in_process_brokers(etcd, tmp_path_factory, "console", {})
    try:
        two = next(started)
        bootstrap = ",".join(b.bootstrap for b in two)
        admin = AdminClient({"bootstrap.servers": bootstrap})
        assert wait_for(lambda: len(admin.list_topics(timeout=10).brokers) == 2)
        admin.create_topics([NewTopic("spread", PARTITIONS, 2)])["spread"].result(30)

        def in_sync() -> bool:
            t = admin.list_topics("spread", timeout=10).topics["spread"]
            return len(t.partitions) == PARTITIONS and all(
                p.leader >= 0 and len(p.isrs) == 2 for p in t.partitions.values()
            )

        assert wait_for(in_sync, 30)
        p = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
        for i in range(3 * PARTITIONS):
            p.produce("spread", b"r%d" % i, partition=i % PARTITIONS)
        assert p.flush(30) == 0
        c = Consumer({"bootstrap.servers": bootstrap, "group.id": "spread-readers"})
        c.commit(offsets=[TopicPartition("spread", i, 1) for i in range(PARTITIONS)],
                 asynchronous=False)  # fmt: skip
        c.close()
        yield two
    finally:
        started.close()


def _get(broker: Broker, path: str):
    with urllib.request.urlopen(f"http://{broker.core.admin_address}{path}", timeout=30) as r:
        return json.loads(r.read())


def _expected(brokers: list[Broker]) -> list[tuple]:
    admin = AdminClient({"bootstrap.servers": brokers[0].bootstrap})
    t = admin.list_topics("spread", timeout=10).topics["spread"]
    return [
        (i, p.leader, sorted(p.replicas), sorted(p.isrs)) for i, p in sorted(t.partitions.items())
    ]


def _shown(topic: dict) -> list[tuple]:
    return [
        (p["partition"], p["leader"], sorted(p["replicas"]), sorted(p["isr"]))
        for p in topic["partitions"]
    ]


def test_each_brokers_console_shows_the_whole_cluster(brokers: list[Broker]) -> None:
    expected = _expected(brokers)
    assert len({leader for _, leader, _, _ in expected}) == 2  # both brokers lead some
    for b in brokers:
        topic = _get(b, "/api/topics/spread")
        assert _shown(topic) == expected
        assert [(p["start"], p["end"]) for p in topic["partitions"]] == [(0, 3)] * PARTITIONS
        for i in range(PARTITIONS):
            page = _get(b, f"/api/records?topic=spread&partition={i}")
            assert [r["offset"] for r in page["records"]] == [0, 1, 2]
        overview = _get(b, "/api/overview")
        assert sorted(x["id"] for x in overview["brokers"]) == [1, 2]
        assert overview["under_replicated"] == 0
        groups = {g["group"]: g for g in _get(b, "/api/groups")}
        assert groups["spread-readers"]["lag"] == 2 * PARTITIONS
        group = _get(b, "/api/groups/spread-readers")
        assert [(o["partition"], o["committed"], o["lag"]) for o in group["offsets"]] == [
            (i, 1, 2) for i in range(PARTITIONS)
        ]


def test_stratalog_console_shows_the_whole_cluster(brokers: list[Broker]) -> None:
    bootstrap = brokers[0].bootstrap
    service = remote.make_service(bootstrap, remote.admin_address(bootstrap))()
    try:
        topic = service.topic("spread")
        assert _shown(topic) == _expected(brokers)
        assert topic["hot"]["bytes"] > 0  # from a broker's /status
        assert service.group("spread-readers")["lag"] == 2 * PARTITIONS
    finally:
        service.client.close()
