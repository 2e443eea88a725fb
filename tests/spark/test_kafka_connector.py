"""Spark's own Kafka connector (spark-sql-kafka-0-10) against Stratalog and against Apache Kafka.

The same batch read, streaming read with a checkpoint (stopped and restarted) and batch write run
on both brokers through ``format("kafka")``, and the results must be the same; on Stratalog,
``format("kafka")`` and ``format("stratalog-python")`` must return the same rows.
"""

from __future__ import annotations

import json
import time

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from .conftest import Rec, consume_all, produce, topic_name

pytestmark = pytest.mark.spark
T0 = int(time.time() * 1000) - 3_600_000


def _create(bootstrap: str, topic: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(30)


def _records(n: int, start: int = 0) -> list[Rec]:
    return [
        Rec(
            value=b"v%d" % i,
            key=b"k%d" % (i % 4),
            partition=i % 3,
            timestamp=T0 + i,
            headers=(("h", b"%d" % i),) if i % 2 else None,
        )
        for i in range(start, start + n)
    ]


def _rows(df) -> list[tuple]:
    rows = df.selectExpr(
        "partition", "offset", "key", "value", "timestampType", "unix_millis(timestamp) AS ts"
    ).collect()
    return sorted(
        (
            r["partition"],
            r["offset"],
            r["key"] and bytes(r["key"]),
            bytes(r["value"]),
            r["timestampType"],
            r["ts"],
        )
        for r in rows
    )


def batch_read(spark, bootstrap: str, topic: str) -> list[tuple]:
    produce(bootstrap, topic, _records(60))
    df = (
        spark.read.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", json.dumps({topic: {"0": 2, "1": -2, "2": 5}}))
        .option("endingOffsets", json.dumps({topic: {"0": 15, "1": -1, "2": 18}}))
        .load()
    )
    return _rows(df)


def stream_read(spark, bootstrap: str, topic: str, tmp) -> list[tuple]:
    produce(bootstrap, topic, _records(30))
    out, ckpt = tmp / "out", tmp / "ckpt"

    def run() -> None:
        q = (
            spark.readStream.format("kafka")
            .option("kafka.bootstrap.servers", bootstrap)
            .option("subscribe", topic)
            .option("startingOffsets", "earliest")
            .load()
            .selectExpr("partition", "offset", "CAST(value AS STRING) AS value")
            .writeStream.format("parquet")
            .option("path", str(out))
            .option("checkpointLocation", str(ckpt))
            .trigger(availableNow=True)
            .start()
        )
        assert q.awaitTermination(120)
        assert q.exception() is None

    run()
    produce(bootstrap, topic, _records(20, start=30))
    run()
    rows = spark.read.parquet(str(out)).collect()
    return sorted((r["partition"], r["offset"], r["value"]) for r in rows)


def batch_write(spark, bootstrap: str, topic: str) -> dict[int, list[tuple]]:
    data = [(f"k{i % 5}", f"w{i}", i % 3) for i in range(45)]
    (
        spark.createDataFrame(data, "key string, value string, partition int")
        .write.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("topic", topic)
        .save()
    )
    got = consume_all(bootstrap, topic)
    by_part: dict[int, list[tuple]] = {}
    for s in got:
        by_part.setdefault(s.partition, []).append((s.offset, s.key, s.value))
    # Spark's tasks write concurrently, so the order of records within a partition differs
    # between runs on any broker: compare the offsets and the records, not their pairing.
    return {
        p: ([o for o, _, _ in sorted(v)], sorted((k, val) for _, k, val in v))
        for p, v in sorted(by_part.items())
    }


def _on_both(spark_broker, kafka, fn, *args) -> tuple:
    out = []
    for bs in (spark_broker.bootstrap, kafka.bootstrap):
        topic = topic_name("kc")
        _create(bs, topic, 3)
        out.append(fn(bs, topic, *args))
    return tuple(out)


def test_batch_read_same_on_both(spark, spark_broker, kafka):
    strat, ref = _on_both(spark_broker, kafka, lambda bs, t: batch_read(spark, bs, t))
    assert strat == ref
    assert len(strat) == 13 + 20 + 13


def test_stream_read_with_restart_same_on_both(spark, spark_broker, kafka, tmp_path):
    runs = iter(["s", "k"])
    strat, ref = _on_both(
        spark_broker,
        kafka,
        lambda bs, t: stream_read(spark, bs, t, tmp_path / next(runs)),
    )
    assert strat == ref
    assert [(p, o) for p, o, _ in strat] == sorted({(p, o) for p, o, _ in strat})  # no dups
    assert len(strat) == 50


def test_batch_write_same_on_both(spark, spark_broker, kafka):
    strat, ref = _on_both(spark_broker, kafka, lambda bs, t: batch_write(spark, bs, t))
    assert strat == ref
    assert sum(len(records) for _, records in strat.values()) == 45


def test_kafka_and_stratalog_formats_agree(spark, spark_broker):
    bs = spark_broker.bootstrap
    topic = topic_name("fmt")
    _create(bs, topic, 3)
    produce(bs, topic, _records(40))

    def load(fmt: str):
        return (
            spark.read.format(fmt)
            .option("kafka.bootstrap.servers", bs)
            .option("subscribe", topic)
            .option("includeHeaders", "true")
            .load()
        )

    a, b = load("kafka"), load("stratalog-python")
    assert a.schema == b.schema
    cols = a.columns
    rows = [sorted(tuple(map(repr, r)) for r in df.select(*cols).collect()) for df in (a, b)]
    assert rows[0] == rows[1]
    assert len(rows[0]) == 40
