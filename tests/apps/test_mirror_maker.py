"""Kafka's MirrorMaker 2 (``org.apache.kafka:connect-mirror`` 4.3.1 from Maven Central,
``org.apache.kafka.connect.mirror.MirrorMaker``, unchanged) mirrors a topic and a consumer
group's offsets from one Stratalog broker to another, and the group fails over.

Cluster ``east`` holds topic ``orders``; a consumer group reads part of it and commits there.
MirrorMaker (dedicated mode, driving cluster ``west``) copies the topic to ``east.orders`` on
``west`` and, with ``sync.group.offsets.enabled``, writes the group's offsets translated to the
mirrored topic. Then the group fails over: a consumer of the same group on ``west`` resumes from
the translated offsets. Oracle: every record is on ``west`` with the same keys and values in the
same order per partition, and the records the group read on ``east`` plus what it reads on
``west`` cover all of them (MirrorMaker translates conservatively: re-reads are allowed, a gap is
not).

Active-active: one MirrorMaker drives both clusters, ``east->west`` and ``west->east`` with the
default replication policy and every topic (``.*``). Each cluster has its own ``orders``; each
ends up with the other's as ``east.orders`` / ``west.orders``, and nothing is mirrored back
(``east.west.orders``): MirrorMaker's cycle detection works from the topic names and the
heartbeats it reads from each cluster. A topic config of the source (``retention.ms``, set at
creation and changed later) reaches the mirrored topic.

Both scenarios also run between two Apache Kafka 4.4.0 brokers (``[kafka]``), skipped without
assertions unless ``STRATALOG_APPS_ON_KAFKA=1`` (they check the oracle, not Stratalog).
``python -m stratalog.bench.mirror`` measures the mirror's throughput and lag on both.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ResourceType,
)

from stratalog import Broker
from stratalog.peers.kafka import KafkaBroker

from ..conftest import KAFKA_TEST_JVM, create_topic
from .conftest import JavaApp, read_topic

pytestmark = pytest.mark.kafka

MIRROR_MAKER = "org.apache.kafka.connect.mirror.MirrorMaker"
RECORDS, PARTITIONS, READ_ON_EAST = 300, 3, 150
TIMEOUT = 90.0


ON_KAFKA = pytest.mark.skipif(
    not os.environ.get("STRATALOG_APPS_ON_KAFKA"),
    reason="MirrorMaker between two Apache Kafka brokers checks the oracle: "
    "STRATALOG_APPS_ON_KAFKA=1",
)


@pytest.fixture(params=["stratalog", pytest.param("kafka", marks=ON_KAFKA)])
def east_west(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[tuple[Broker, Broker] | tuple[KafkaBroker, KafkaBroker]]:
    """Two fresh Stratalog brokers, or two reference Apache Kafka brokers."""
    if request.param == "kafka":
        with (
            KafkaBroker(jvm_options=KAFKA_TEST_JVM) as east,
            KafkaBroker(jvm_options=KAFKA_TEST_JVM) as west,
        ):
            yield east, west
        return
    with Broker(tmp_path / "east") as east, Broker(tmp_path / "west") as west:
        yield east, west


def _properties(path: Path, east: str, west: str, *, both_ways: bool = False) -> Path:
    """MirrorMaker's properties: ``east->west`` for ``orders`` only, or (``both_ways``) both
    directions for every topic (the default ``topics = .*``)."""
    one = "replication.factor"
    flows = (
        [
            "east->west.enabled = true",
            "west->east.enabled = true",
            "sync.topic.configs.enabled = true",
            "sync.topic.configs.interval.seconds = 1",
        ]
        if both_ways
        else [
            "east->west.enabled = true",
            "east->west.topics = orders",
            "west->east.enabled = false",
        ]
    )
    lines = [
        "clusters = east, west",
        f"east.bootstrap.servers = {east}",
        f"west.bootstrap.servers = {west}",
        *flows,
        f"{one} = 1",
        *(
            f"{t}.{one} = 1"
            for t in ("checkpoints.topic", "heartbeats.topic", "offset-syncs.topic")
        ),
        *(f"{s}.storage.{one} = 1" for s in ("offset", "status", "config")),
        "sync.group.offsets.enabled = true",
        "sync.group.offsets.interval.seconds = 1",
        "emit.checkpoints.interval.seconds = 1",
        "emit.heartbeats.interval.seconds = 1",
        "refresh.topics.interval.seconds = 2",
        "refresh.groups.interval.seconds = 2",
        "offset.lag.max = 10",
        "sync.topic.acls.enabled = false",
        "tasks.max = 1",
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def _produce(bootstrap: str, prefix: bytes = b"order") -> None:
    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for i in range(RECORDS):
        p.produce(
            "orders", b"%s-%03d" % (prefix, i), key=b"k%d" % (i % 7), partition=i % PARTITIONS
        )
    assert p.flush(30) == 0


def _consume(bootstrap: str, topic: str, group: str, limit: int, timeout: float) -> list[bytes]:
    """Read with ``group`` from its committed offsets (earliest if none), commit, stop after
    ``limit`` records or ``timeout``."""
    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    got: list[bytes] = []
    try:
        c.subscribe([topic])
        deadline = time.monotonic() + timeout
        idle_since = time.monotonic()
        while len(got) < limit and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is None:
                if got and time.monotonic() - idle_since > 5:
                    break
                continue
            assert m.error() is None, m.error()
            got.append(m.value())
            idle_since = time.monotonic()
        if got:
            c.commit(asynchronous=False)
    finally:
        c.close()
    return got


def _translated(west: str, group: str) -> dict[int, int]:
    c = Consumer({"bootstrap.servers": west, "group.id": group})
    try:
        tps = [TopicPartition("east.orders", p) for p in range(PARTITIONS)]
        return {tp.partition: tp.offset for tp in c.committed(tps, timeout=10) if tp.offset >= 0}
    finally:
        c.close()


def test_mirror_maker_mirrors_a_topic_and_a_group_fails_over(east_west, tmp_path):
    east, west = east_west
    create_topic(east.bootstrap, "orders", PARTITIONS)
    _produce(east.bootstrap)
    read_on_east = _consume(east.bootstrap, "orders", "billing", READ_ON_EAST, 30)
    assert len(read_on_east) == READ_ON_EAST

    props = _properties(tmp_path / "mm2.properties", east.bootstrap, west.bootstrap)
    mm2 = JavaApp("connect", MIRROR_MAKER, str(props), "--clusters", "west", log_dir=tmp_path)
    try:
        mm2.start()
        admin = AdminClient({"bootstrap.servers": west.bootstrap})
        deadline = time.monotonic() + TIMEOUT
        while "east.orders" not in admin.list_topics(timeout=10).topics:
            assert mm2.alive, "MirrorMaker exited\n" + mm2.tail()
            assert time.monotonic() < deadline, "no east.orders on west\n" + mm2.tail()
            time.sleep(1)
        mirrored = read_topic(west.bootstrap, "east.orders", until=RECORDS, timeout=TIMEOUT)
        originals = read_topic(east.bootstrap, "orders", until=RECORDS)
        for part in range(PARTITIONS):
            mine = [(k, v) for q, _o, k, v in sorted(mirrored) if q == part]
            theirs = [(k, v) for q, _o, k, v in sorted(originals) if q == part]
            assert mine == theirs, part
        # The group's offsets, translated to the mirror, written on west by MirrorMaker.
        deadline = time.monotonic() + TIMEOUT
        while not (translated := _translated(west.bootstrap, "billing")):
            assert mm2.alive, "MirrorMaker exited\n" + mm2.tail()
            assert time.monotonic() < deadline, "no translated offsets\n" + mm2.tail()
            time.sleep(1)
        assert sum(translated.values()) <= READ_ON_EAST  # never past what was read
        # Admin views of west list the group MirrorMaker made.
        groups = admin.list_consumer_groups()
        assert "billing" in {g.group_id for g in groups.result(15).valid}
    finally:
        mm2.stop()
    # Failover: the group resumes on west where the translation put it.
    read_on_west = _consume(west.bootstrap, "east.orders", "billing", RECORDS, 30)
    expected = {b"order-%03d" % i for i in range(RECORDS)}
    assert set(read_on_east) | set(read_on_west) == expected
    assert len(read_on_west) >= RECORDS - READ_ON_EAST  # resumed, not from the end


def _wait_for_topic(admin: AdminClient, topic: str, mm2: JavaApp) -> None:
    deadline = time.monotonic() + TIMEOUT
    while topic not in admin.list_topics(timeout=10).topics:
        assert mm2.alive, "MirrorMaker exited\n" + mm2.tail()
        assert time.monotonic() < deadline, f"no {topic}\n" + mm2.tail()
        time.sleep(0.5)


def _assert_same_per_partition(mirror: str, topic: str, source: str) -> None:
    mirrored = read_topic(mirror, topic, until=RECORDS, timeout=TIMEOUT)
    originals = read_topic(source, "orders", until=RECORDS)
    assert len(mirrored) == len(originals) == RECORDS, (topic, len(mirrored))
    for part in range(PARTITIONS):
        mine = [(k, v) for q, _o, k, v in sorted(mirrored) if q == part]
        theirs = [(k, v) for q, _o, k, v in sorted(originals) if q == part]
        assert mine == theirs, (topic, part)


def _topic_config(admin: AdminClient, topic: str, name: str) -> str | None:
    res = ConfigResource(ResourceType.TOPIC, topic)
    return admin.describe_configs([res])[res].result(timeout=10)[name].value


def test_mirror_maker_active_active_with_prefixes_and_no_loop(east_west, tmp_path):
    east, west = east_west
    create_topic(east.bootstrap, "orders", PARTITIONS, **{"retention.ms": "86400000"})
    create_topic(west.bootstrap, "orders", PARTITIONS)
    _produce(east.bootstrap, b"east")
    _produce(west.bootstrap, b"west")

    props = _properties(tmp_path / "mm2.properties", east.bootstrap, west.bootstrap, both_ways=True)
    mm2 = JavaApp("connect", MIRROR_MAKER, str(props), log_dir=tmp_path)
    admins = {c: AdminClient({"bootstrap.servers": c.bootstrap}) for c in (east, west)}
    try:
        mm2.start()
        _wait_for_topic(admins[west], "east.orders", mm2)
        _wait_for_topic(admins[east], "west.orders", mm2)
        _assert_same_per_partition(west.bootstrap, "east.orders", east.bootstrap)
        _assert_same_per_partition(east.bootstrap, "west.orders", west.bootstrap)
        # The config east's orders was created with came along with the topic...
        assert _topic_config(admins[west], "east.orders", "retention.ms") == "86400000"
        # ...and a change to it is synchronised (sync.topic.configs.interval.seconds = 1).
        res = ConfigResource(
            ResourceType.TOPIC,
            "orders",
            incremental_configs=[
                ConfigEntry("retention.ms", "43200000", incremental_operation=AlterConfigOpType.SET)
            ],
        )
        admins[east].incremental_alter_configs([res])[res].result(timeout=10)
        deadline = time.monotonic() + TIMEOUT
        while (got := _topic_config(admins[west], "east.orders", "retention.ms")) != "43200000":
            assert mm2.alive, "MirrorMaker exited\n" + mm2.tail()
            assert time.monotonic() < deadline, f"retention.ms {got} on west\n" + mm2.tail()
            time.sleep(0.5)
        # Heartbeats went both ways (each cluster's heartbeats topic is mirrored to the other),
        # so each direction has seen the other's mirrored topics; give it a few topic refreshes
        # (refresh.topics.interval.seconds = 2) to mirror one back, if it were going to.
        _wait_for_topic(admins[west], "east.heartbeats", mm2)
        _wait_for_topic(admins[east], "west.heartbeats", mm2)
        time.sleep(6)
        assert mm2.alive, "MirrorMaker exited\n" + mm2.tail()
        on_east = set(admins[east].list_topics(timeout=10).topics)
        on_west = set(admins[west].list_topics(timeout=10).topics)
    finally:
        mm2.stop()
    assert {"orders", "west.orders"} <= on_east and {"orders", "east.orders"} <= on_west
    loops = {t for t in on_east | on_west if t.startswith(("east.west.", "west.east."))}
    assert not loops, (loops, sorted(on_east), sorted(on_west))
    # Each side's own orders is untouched by the mirror of the other.
    assert len(read_topic(east.bootstrap, "orders", until=RECORDS)) == RECORDS
    assert len(read_topic(west.bootstrap, "orders", until=RECORDS)) == RECORDS
