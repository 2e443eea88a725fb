"""Fixtures for the Spark tests: one local SparkSession and one embedded broker per session.

Starting Spark costs 10-25 s, so every Spark test shares the session (``local[2,3]``: two
cores, three attempts per task, so a failed task is retried). Tests use their own topics.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition

from stratalog import Broker
from stratalog.peers.kafka import KafkaBroker

from ..conftest import KAFKA_TEST_JVM, SPARK_TEST_CONF, create_topic


@pytest.fixture(scope="session")
def spark_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    """One embedded broker for all Spark tests."""
    with Broker(tmp_path_factory.mktemp("spark-broker")) as b:
        yield b


@pytest.fixture(scope="session")
def kafka() -> Iterator[KafkaBroker]:
    """One Apache Kafka broker for every module that compares with it (a JVM start each costs
    seconds), stopped by its PID (process group) at the end; tests use their own topics."""
    broker = KafkaBroker(jvm_options=KAFKA_TEST_JVM).start()
    pid = broker.pid
    try:
        yield broker
    finally:
        broker.stop()
        assert pid is not None
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


@pytest.fixture(scope="session")
def spark():
    """One local SparkSession for all Spark tests; it never registers the source itself, so
    ``format("stratalog-python")`` resolves through Spark's discovery of ``pyspark_*`` modules."""
    from stratalog.spark import local_session

    # Spark's own Kafka connector too, so format("kafka") runs beside format("stratalog-python").
    session = local_session(
        "stratalog-tests",
        cores="2,3",
        kafka_connector=True,
        **SPARK_TEST_CONF,
    )
    try:
        yield session
    finally:
        session.stop()


@pytest.fixture
def bootstrap(spark_broker: Broker) -> str:
    return spark_broker.bootstrap


def topic_name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


@dataclass(frozen=True)
class Sent:
    """A record as the broker acknowledged it."""

    topic: str
    partition: int
    offset: int
    timestamp: int  # ms
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...] | None


@dataclass(frozen=True)
class Rec:
    """A record to produce."""

    value: bytes | None
    key: bytes | None = None
    partition: int = 0
    timestamp: int = 0  # ms; 0 lets the producer stamp it
    headers: tuple[tuple[str, bytes | None], ...] | None = None


def produce(bootstrap: str, topic: str, records: Sequence[Rec], **config) -> list[Sent]:
    """Produce with confluent-kafka, in order, and return what was delivered (with offsets);
    ``config`` adds or overrides producer settings."""
    producer = Producer(
        {"bootstrap.servers": bootstrap, "linger.ms": 5, "enable.idempotence": False, **config}
    )
    sent: list[Sent] = []
    errors: list[object] = []

    def on_delivery_of(rec: Rec):
        # Delivery reports do not carry the headers back: take them from the record.
        def on_delivery(err, msg) -> None:
            if err is not None:
                errors.append(err)
                return
            sent.append(
                Sent(
                    msg.topic(),
                    msg.partition(),
                    msg.offset(),
                    msg.timestamp()[1],
                    msg.key(),
                    msg.value(),
                    rec.headers or None,
                )
            )

        return on_delivery

    for r in records:
        kwargs: dict = {"partition": r.partition, "on_delivery": on_delivery_of(r)}
        if r.key is not None:
            kwargs["key"] = r.key
        if r.timestamp:
            kwargs["timestamp"] = r.timestamp
        if r.headers:
            kwargs["headers"] = list(r.headers)
        producer.produce(topic, r.value, **kwargs)
        producer.poll(0)
    remaining = producer.flush(30)
    assert remaining == 0, f"{remaining} records not delivered"
    assert not errors, errors
    assert len(sent) == len(records)
    return sent


def row_tuple(row) -> tuple:
    """A Spark row of the stratalog schema as hashable Python values (bytes, ms timestamps)."""
    d = row.asDict(recursive=True)
    hdrs = d.get("headers")
    return (
        d["topic"],
        d["partition"],
        d["offset"],
        d["ts_ms"],
        d["timestampType"],
        None if d["key"] is None else bytes(d["key"]),
        None if d["value"] is None else bytes(d["value"]),
        None
        if hdrs is None
        else tuple((h["key"], None if h["value"] is None else bytes(h["value"])) for h in hdrs),
    )


def sent_tuple(s: Sent) -> tuple:
    """The same shape as row_tuple for a produced record (CreateTime is timestampType 0)."""
    return (s.topic, s.partition, s.offset, s.timestamp, 0, s.key, s.value, s.headers)


def collect_records(df) -> list[tuple]:
    """Collect a stratalog DataFrame as row_tuple()s, with the timestamp in ms."""
    from pyspark.sql import functions as F

    return [row_tuple(r) for r in df.withColumn("ts_ms", F.unix_millis("timestamp")).collect()]


def end_offsets(bootstrap: str, topic: str) -> dict[int, int]:
    """The high watermark of every partition of a topic (confluent-kafka)."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "stratalog-tests-watermarks"})
    try:
        n = len(c.list_topics(topic, timeout=15).topics[topic].partitions)
        return {
            p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=15)[1] for p in range(n)
        }
    finally:
        c.close()


def consume_all(bootstrap: str, topic: str) -> list[Sent]:
    """Every record of a topic, read independently of Spark with a confluent-kafka consumer."""
    ends = end_offsets(bootstrap, topic)
    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": topic_name("stratalog-tests-check"),
            "enable.auto.commit": False,
            "enable.partition.eof": False,
        }
    )
    out: list[Sent] = []
    try:
        c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in ends])
        todo = {p for p, end in ends.items() if end > 0}
        deadline = time.monotonic() + 60
        while todo and time.monotonic() < deadline:
            msg = c.poll(1.0)
            if msg is None:
                continue
            assert msg.error() is None, msg.error()
            hdrs = msg.headers()
            out.append(
                Sent(
                    msg.topic(),
                    msg.partition(),
                    msg.offset(),
                    msg.timestamp()[1],
                    msg.key(),
                    msg.value(),
                    tuple((k, v) for k, v in hdrs) if hdrs else None,
                )
            )
            if msg.offset() + 1 >= ends[msg.partition()]:
                todo.discard(msg.partition())
        assert not todo, f"partitions {todo} of {topic} not read to their end {ends}"
    finally:
        c.close()
    return out


def finish(query, timeout: float) -> None:
    """Wait for a streaming query to end and stop it if it has not; its failure, if any, is
    left in ``query.exception()`` for the test to inspect."""
    try:
        query.awaitTermination(timeout)
    except Exception:
        pass  # query.exception() has it
    finally:
        if query.isActive:
            query.stop()


def write_transactions(kbs: str, prefix: str, t0: int) -> tuple[str, list[Sent], list[Sent]]:
    """A topic of two partitions written by a transactional producer: a committed transaction,
    an aborted one, and a second committed one, record i of a transaction at time ``t0`` +
    its index in the whole. Returns (topic, committed, aborted)."""
    name = topic_name(prefix)
    create_topic(kbs, name, 2)
    producer = Producer(
        {
            "bootstrap.servers": kbs,
            "transactional.id": f"jvm-on-kafka-{uuid.uuid4().hex[:8]}",
            "linger.ms": 5,
        }
    )
    delivered: list[tuple[int, int, bytes, bytes]] = []

    def on_delivery(err, msg) -> None:
        assert err is None, err
        delivered.append((msg.partition(), msg.offset(), msg.key(), msg.value()))

    producer.init_transactions(60)
    committed: list[Sent] = []
    aborted: list[Sent] = []
    for tag, n, commit in (("c1", 60, True), ("a1", 40, False), ("c2", 30, True)):
        producer.begin_transaction()
        start = len(delivered)
        for i in range(n):
            producer.produce(
                name,
                b"%s-v%03d" % (tag.encode(), i),
                b"%s-k%03d" % (tag.encode(), i),
                partition=i % 2,
                timestamp=t0 + start + i,
                headers=[("tx", tag.encode())],
                on_delivery=on_delivery,
            )
        producer.flush(30)
        assert len(delivered) == start + n
        if commit:
            producer.commit_transaction(30)
        else:
            producer.abort_transaction(30)
        for p, off, k, v in delivered[start:]:
            sent = Sent(name, p, off, t0 + start + int(v[-3:]), k, v, (("tx", tag.encode()),))
            (committed if commit else aborted).append(sent)
    # The coordinator writes the markers after EndTxn is answered: wait for the last ones
    # (three transactions, each with a marker in both partitions).
    deadline = time.monotonic() + 30
    while sum(end_offsets(kbs, name).values()) < len(delivered) + 6:
        assert time.monotonic() < deadline, "the broker did not write the transaction markers"
        time.sleep(0.1)
    return name, committed, aborted
