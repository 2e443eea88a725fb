"""Streaming reads: readStream.format("stratalog-python") and format("stratalog") with availableNow
triggers and a checkpoint."""

from __future__ import annotations

from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient, NewPartitions

from ..conftest import create_topic
from .conftest import Rec, produce, topic_name

pytestmark = pytest.mark.spark

QUERY_TIMEOUT = 120  # seconds; a query that has not finished by then fails the test


@pytest.fixture(params=["stratalog-python", "stratalog"])
def fmt(request) -> str:
    """Every test runs on both streaming readers: the Python data source and the JVM one."""
    return request.param


def _run(fmt, spark, bootstrap, topic, ckpt: Path, out: Path, **options) -> list:
    """One availableNow run into a parquet sink; returns the progress of its micro-batches."""
    reader = (
        spark.readStream.format(fmt)
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
    )
    for k, v in options.items():
        reader = reader.option(k, v)
    query = (
        reader.load()
        .selectExpr("topic", "partition", "offset", "key", "value")
        .writeStream.format("parquet")
        .option("path", str(out))
        .option("checkpointLocation", str(ckpt))
        .trigger(availableNow=True)
        .start()
    )
    try:
        assert query.awaitTermination(QUERY_TIMEOUT), "the availableNow query did not finish"
    finally:
        if query.isActive:
            query.stop()
    assert query.exception() is None, query.exception()
    return list(query.recentProgress)


def _output(spark, out: Path) -> list[tuple]:
    return [
        (r.partition, r.offset, None if r.key is None else bytes(r.key), bytes(r.value))
        for r in spark.read.parquet(str(out)).collect()
    ]


def _expected(sent) -> list[tuple]:
    return sorted((s.partition, s.offset, s.key, s.value) for s in sent)


def _recs(tag: str, partitions: range, n: int) -> list[Rec]:
    return [
        Rec(f"{tag}-p{p}-v{i}".encode(), key=f"{tag}-k{i}".encode(), partition=p)
        for p in partitions
        for i in range(n)
    ]


def _input_rows(progress: list) -> list[int]:
    return [p.numInputRows for p in progress]


def test_stream_read_then_restart_reads_exactly_the_new_records(spark, bootstrap, tmp_path, fmt):
    topic = topic_name("stream")
    create_topic(bootstrap, topic, 3)
    first = produce(bootstrap, topic, _recs("a", range(3), 20))
    ckpt, out = tmp_path / "ckpt", tmp_path / "out"

    progress = _run(fmt, spark, bootstrap, topic, ckpt, out, startingOffsets="earliest")
    assert sum(_input_rows(progress)) == 60
    assert sorted(_output(spark, out)) == _expected(first)

    second = produce(bootstrap, topic, _recs("b", range(3), 10))
    progress = _run(fmt, spark, bootstrap, topic, ckpt, out, startingOffsets="earliest")
    # The restart read exactly the new records: 30 rows, none of the first run's.
    assert sum(_input_rows(progress)) == 30
    rows = _output(spark, out)
    positions = [(p, o) for p, o, _, _ in rows]
    assert len(positions) == len(set(positions)) == 90  # no duplicates
    assert sorted(rows) == _expected(first + second)  # no gaps
    for p in range(3):
        assert sorted(o for q, o in positions if q == p) == list(range(30))

    # Nothing new: a third run reads nothing.
    progress = _run(fmt, spark, bootstrap, topic, ckpt, out, startingOffsets="earliest")
    assert sum(_input_rows(progress)) == 0
    assert len(_output(spark, out)) == 90


def test_max_offsets_per_trigger_limits_batches(spark, bootstrap, tmp_path, fmt):
    topic = topic_name("rate")
    create_topic(bootstrap, topic, 4)
    sizes = [40, 25, 10, 5]
    sent = []
    for p, n in enumerate(sizes):
        sent += produce(bootstrap, topic, _recs("r", range(p, p + 1), n))
    ckpt, out = tmp_path / "ckpt", tmp_path / "out"
    progress = _run(
        fmt,
        spark,
        bootstrap,
        topic,
        ckpt,
        out,
        startingOffsets="earliest",
        maxOffsetsPerTrigger="20",
    )
    rows = _input_rows(progress)
    assert sum(rows) == 80
    assert max(rows) <= 20, rows
    assert len([n for n in rows if n > 0]) >= 4, rows
    assert sorted(_output(spark, out)) == _expected(sent)


def test_max_offsets_per_trigger_below_the_partition_count_still_reads_everything(
    spark, bootstrap, tmp_path, fmt
):
    # A limit smaller than the number of partitions with data: each batch must still make
    # progress (Spark's Kafka source rounds a partition's share of less than one offset up).
    topic = topic_name("rate-small")
    create_topic(bootstrap, topic, 3)
    sent = produce(bootstrap, topic, _recs("s", range(3), 4))
    ckpt, out = tmp_path / "ckpt", tmp_path / "out"
    progress = _run(
        fmt,
        spark,
        bootstrap,
        topic,
        ckpt,
        out,
        startingOffsets="earliest",
        maxOffsetsPerTrigger="2",
    )
    rows = _input_rows(progress)
    assert sum(rows) == 12, rows
    assert max(rows) <= 3, rows  # at most one offset per partition over the limit
    assert sorted(_output(spark, out)) == _expected(sent)


def test_partition_added_between_runs_is_read_from_its_start(spark, bootstrap, tmp_path, fmt):
    topic = topic_name("grow")
    create_topic(bootstrap, topic, 2)
    first = produce(bootstrap, topic, _recs("a", range(2), 5))
    ckpt, out = tmp_path / "ckpt", tmp_path / "out"
    progress = _run(fmt, spark, bootstrap, topic, ckpt, out, startingOffsets="earliest")
    assert sum(_input_rows(progress)) == 10

    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_partitions([NewPartitions(topic, 3)])[topic].result(timeout=15)
    second = produce(bootstrap, topic, _recs("b", range(3), 4))
    progress = _run(fmt, spark, bootstrap, topic, ckpt, out, startingOffsets="earliest")
    assert sum(_input_rows(progress)) == 12
    rows = _output(spark, out)
    assert sorted(rows) == _expected(first + second)
    assert sorted(o for p, o, _, _ in rows if p == 2) == [0, 1, 2, 3]


def test_starting_offsets_latest_for_a_new_checkpoint_starts_at_the_current_end(
    spark, bootstrap, tmp_path, fmt
):
    # startingOffsets=latest (the streaming default) takes effect per new checkpoint, as in
    # Spark's Kafka source: a new query starts at the end offsets of the moment it starts.
    topic = topic_name("latest")
    create_topic(bootstrap, topic, 1)
    produce(bootstrap, topic, _recs("old", range(1), 5))
    ckpt_a, out_a = tmp_path / "ckpt-a", tmp_path / "out-a"
    assert sum(_input_rows(_run(fmt, spark, bootstrap, topic, ckpt_a, out_a))) == 0

    newer = produce(bootstrap, topic, _recs("new", range(1), 3))
    assert sum(_input_rows(_run(fmt, spark, bootstrap, topic, ckpt_a, out_a))) == 3
    assert sorted(_output(spark, out_a)) == _expected(newer)

    # A second query with its own, new checkpoint and the same options starts at offset 8.
    ckpt_b, out_b = tmp_path / "ckpt-b", tmp_path / "out-b"
    assert sum(_input_rows(_run(fmt, spark, bootstrap, topic, ckpt_b, out_b))) == 0
    latest = produce(bootstrap, topic, _recs("latest", range(1), 2))
    assert sum(_input_rows(_run(fmt, spark, bootstrap, topic, ckpt_b, out_b))) == 2
    assert sorted(_output(spark, out_b)) == _expected(latest)
