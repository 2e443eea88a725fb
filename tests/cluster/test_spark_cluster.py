"""Spark against a three-broker cluster, given only the cluster's bootstrap list.

A real etcd and three real broker processes (LocalCluster), a real local SparkSession, and
confluent-kafka to produce (acks=all) and to read back. Leaders are spread over the brokers, so
every read and write must find each partition's leader: the JVM connector format("stratalog"),
the Python data source format("stratalog-python") and Spark's own format("kafka"). The oracles
are confluent-kafka's delivery reports and its own consumer, never the code under test.
"""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from ..conftest import SPARK_TEST_CONF
from .test_client_routing import PARTITIONS, create_spread_topic, leaders_of

pytestmark = pytest.mark.spark

Record = tuple[int, int, bytes | None, bytes]  # partition, offset, key, value
OUTPUT_SCHEMA = "partition int, offset bigint, key binary, value binary"


@pytest.fixture(scope="module")
def spark():
    from pyspark.sql import SparkSession

    from stratalog.spark import local_session

    running = SparkSession.getActiveSession()
    if running is not None:  # tests/spark's session, in the same process: theirs to stop
        yield running
        return
    # Spark's own Kafka connector too (resolved from Maven Central once, then from ~/.ivy2).
    session = local_session(
        "stratalog-cluster-tests", cores="2,3", kafka_connector=True, **SPARK_TEST_CONF
    )
    try:
        yield session
    finally:
        session.stop()


class Acks:
    """What the brokers acknowledged, from the producer's delivery reports."""

    def __init__(self) -> None:
        self.acked: dict[tuple[int, int], tuple[bytes | None, bytes]] = {}
        self.failed = 0
        self.unsent = 0
        self.lock = threading.Lock()

    def __call__(self, err, msg) -> None:
        with self.lock:
            if err is None:
                self.acked[(msg.partition(), msg.offset())] = (msg.key(), msg.value())
            else:
                self.failed += 1

    def records(self) -> list[Record]:
        with self.lock:
            return sorted((p, o, k, v) for (p, o), (k, v) in self.acked.items())


def producer(bootstrap: str) -> Producer:
    return Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "enable.idempotence": True,
            "linger.ms": 5,
            "message.timeout.ms": 60000,
        }
    )


def produce(bootstrap: str, topic: str, n: int, tag: str) -> list[Record]:
    acks = Acks()
    p = producer(bootstrap)
    for i in range(n):
        p.produce(topic, b"%s-%06d" % (tag.encode(), i), key=b"k%d" % (i % 11),
                  on_delivery=acks)  # fmt: skip
        p.poll(0)
    assert p.flush(60) == 0
    assert acks.failed == 0 and len(acks.acked) == n
    return acks.records()


def rows(df) -> list[Record]:
    return sorted(
        (r["partition"], r["offset"], r["key"] and bytes(r["key"]), bytes(r["value"]))
        for r in df.select("partition", "offset", "key", "value").collect()
    )


def consume_all(bootstrap: str, topic: str) -> list[Record]:
    """Every record of the topic, read by confluent-kafka up to the watermarks."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"check-{topic}",
                  "enable.auto.commit": False})  # fmt: skip
    out: list[Record] = []
    try:
        ends = {
            p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=15)[1]
            for p in range(PARTITIONS)
        }
        c.assign([TopicPartition(topic, p, 0) for p in ends])
        todo = {p for p, e in ends.items() if e > 0}
        deadline = time.monotonic() + 60
        while todo and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is None:
                continue
            assert m.error() is None, m.error()
            out.append((m.partition(), m.offset(), m.key(), m.value()))
            if m.offset() + 1 >= ends[m.partition()]:
                todo.discard(m.partition())
        assert not todo, f"partitions {todo} not read to their ends {ends}"
    finally:
        c.close()
    return sorted(out)


def test_every_source_reads_every_partition_from_its_leader(cluster, spark):
    topic = "spread-read"
    leaders = create_spread_topic(cluster.bootstrap, topic)
    assert set(leaders.values()) == {1, 2, 3}
    sent = produce(cluster.bootstrap, topic, 900, "r")
    for fmt in ("stratalog-python", "stratalog", "kafka"):
        df = (
            spark.read.format(fmt)
            .option("kafka.bootstrap.servers", cluster.bootstrap)
            .option("subscribe", topic)
            .option("startingOffsets", "earliest")
            .option("endingOffsets", "latest")
            .load()
        )
        assert rows(df) == sent, fmt
    # Split into more tasks than partitions: each task starts at its partition's leader. Given
    # one broker's address, planning must still ask every partition's leader.
    for fmt in ("stratalog-python", "stratalog"):
        df = (
            spark.read.format(fmt)
            .option("kafka.bootstrap.servers", cluster.brokers[2].bootstrap)
            .option("subscribe", topic)
            .option("minPartitions", "12")
            .load()
        )
        assert df.rdd.getNumPartitions() > PARTITIONS, fmt
        assert rows(df) == sent, fmt


@pytest.mark.parametrize("sink", ["stratalog-python", "stratalog"])
def test_the_writer_writes_to_every_leader(cluster, spark, sink):
    topic = f"spread-write-{sink}"
    create_spread_topic(cluster.bootstrap, topic)
    data = [(f"k{i % 13}", f"w-{i:05d}") for i in range(1200)]
    df = spark.createDataFrame(data, "key string, value string").repartition(4)
    (
        df.write.format(sink)
        .option("kafka.bootstrap.servers", cluster.bootstrap)
        .option("topic", topic)
        .mode("append")
        .save()
    )
    got = consume_all(cluster.bootstrap, topic)
    assert sorted(v for *_, v in got) == sorted(v.encode() for _, v in data)  # each once
    assert {p for p, *_ in got} == set(range(PARTITIONS))
    by_key: dict[bytes | None, set[int]] = {}
    for p, _o, k, _v in got:
        by_key.setdefault(k, set()).add(p)
    assert all(len(ps) == 1 for ps in by_key.values())  # a key stays on its partition


def _produce_while(bootstrap: str, topic: str, acks: Acks, stop: threading.Event) -> None:
    p = producer(bootstrap)
    i = 0
    while not stop.is_set():
        p.produce(topic, b"s-%06d" % i, key=b"k%d" % (i % 7), on_delivery=acks)
        i += 1
        p.poll(0.004)  # about 200 records a second
    acks.unsent = p.flush(60)


def _output(spark, out: Path) -> list[Record]:
    # The file sink's metadata log lists only the files of committed batches.
    if not (out / "_spark_metadata").exists():
        return []
    return rows(spark.read.schema(OUTPUT_SCHEMA).parquet(str(out)))


# Each source through one kind of leader change (the Python client's own tests follow both
# kinds; four Spark streams would cost make test another 40 s).
@pytest.mark.parametrize(
    ("source", "how"),
    [("stratalog", signal.SIGKILL), ("stratalog-python", signal.SIGTERM)],
    ids=["stratalog-kill", "stratalog-python-stop"],
)
def test_a_stream_goes_on_through_a_leader_change_exactly_once(
    cluster, spark, tmp_path, how, source
):
    topic = f"spread-stream-{source}-{how.name.lower()}"
    leaders = create_spread_topic(cluster.bootstrap, topic)
    # Not the first broker, which the checks ask; the reader's bootstrap lists it first.
    victim = next(b for b in cluster.brokers[1:] if b.node_id in leaders.values())
    others = [b for b in cluster.brokers if b is not victim]
    bootstrap = ",".join(b.bootstrap for b in [victim, *others])
    acks, stop = Acks(), threading.Event()
    sending = threading.Thread(target=_produce_while, args=(cluster.bootstrap, topic, acks, stop))
    sending.start()
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    query = None
    stopped = False
    try:
        query = (
            spark.readStream.format(source)
            .option("kafka.bootstrap.servers", bootstrap)
            .option("subscribe", topic)
            .option("startingOffsets", "earliest")
            .option("maxOffsetsPerTrigger", "400")
            .load()
            .select("partition", "offset", "key", "value")
            .writeStream.format("parquet")
            .option("path", str(out))
            .option("checkpointLocation", str(ckpt))
            .trigger(processingTime="500 milliseconds")
            .start()
        )
        deadline = time.monotonic() + 90
        while len(_output(spark, out)) < 300:  # a few batches read before the change
            assert query.isActive, query.exception()
            assert time.monotonic() < deadline, "the query read nothing"
            time.sleep(0.5)
        cluster.stop_broker(victim, how)
        stopped = True
        time.sleep(6)  # the leases expire and the leaders move, while records keep coming
        stop.set()
        sending.join(90)
        assert not sending.is_alive()
        expected = acks.records()
        assert len(expected) > 1000 and acks.failed == acks.unsent == 0
        moved = leaders_of(others[0].bootstrap, topic)
        assert victim.node_id not in moved.values() and -1 not in moved.values(), moved
        deadline = time.monotonic() + 120
        while len(_output(spark, out)) < len(expected):
            assert query.isActive, query.exception()
            assert time.monotonic() < deadline, (len(_output(spark, out)), len(expected))
            time.sleep(1)
        assert query.isActive and query.exception() is None
    finally:
        stop.set()
        sending.join(90)
        if query is not None:
            query.stop()
        if stopped:
            cluster.start_broker(victim)
    got = _output(spark, out)
    positions = [(p, o) for p, o, _k, _v in got]
    assert len(positions) == len(set(positions)), "a record was read twice"
    assert len({v for *_, v in got}) == len(got), "a value was read twice"
    # Every produced record was acknowledged (none failed, none left unsent): the output is
    # exactly the acknowledged records, at the offsets the reports gave.
    assert set(expected) - set(got) == set(), "acknowledged records are missing"
    assert got == expected
