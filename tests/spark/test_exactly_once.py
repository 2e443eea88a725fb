"""Exactly-once writes through format("stratalog-python") and format("stratalog"): a task or
micro-batch that fails after its producer already sent part of its records is re-run, and the
broker drops the repeats. With ``exactlyOnce=sorted`` that holds even when the re-run sees its
rows in another order (as a task after a shuffle may); with the default it holds when a re-run
sees the same order (a pipeline without a shuffle), and when it does not the broker sees other
rows under the sequences it has and the sink goes on at least once, losing nothing;
``exactlyOnce=false`` is at least once.

The first attempt of every write task fails once the broker acknowledged a set number of its
records (the sinks' ``testing.failAfterRecords`` option), so every failure follows a partial
write. The rows reach the sink through ``mapInArrow``, which can shuffle them differently on the
re-run: without the sinks' ordering, a re-run would send other rows under the sequences the
broker already has, and those rows would be lost while others were written twice.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path

import pytest
from pyspark.errors import StreamingQueryException
from pyspark.sql import functions as F

from ..conftest import create_topic
from .conftest import Rec, consume_all, produce, topic_name

pytestmark = pytest.mark.spark

ROWS_PER_TASK = 12_000
PARTITIONS = 3  # output partitions; a third of the rows have a null key (round-robin)
FAIL_AFTER = 5_000  # one partition's batch is 4,000 rows: the failure follows two of three
FAIL = "testing.failAfterRecords"
FAIL_ATTEMPTS = "testing.failAttempts"  # local[2,3]: three attempts fail the micro-batch

SINKS = pytest.mark.parametrize("sink", ["stratalog-python", "stratalog"])
# exactlyOnce=true keeps the rows' order and needs a re-run to see the same order; "sorted"
# orders each task's rows itself, so its re-runs get the rows in another order.
MODES = pytest.mark.parametrize("mode", ["true", "sorted"])


def _row(i: int) -> tuple[str | None, str]:
    return (None if i % 3 == 0 else f"k{i % 1000}", f"v{i}")


def _shuffling(seen: str, reorder_when):
    """A mapInArrow function that notes (task, attempt) in ``seen`` and, when
    ``reorder_when(attempt)``, puts the task's rows in a different order. Self-contained: it runs
    in executor Python workers."""

    def shuffle(batches):
        import json
        import random

        import pyarrow as pa
        from pyspark import TaskContext

        ctx = TaskContext.get()
        table = pa.Table.from_batches(list(batches))
        rows = table.to_pylist()
        if reorder_when(ctx.attemptNumber()):
            random.Random(ctx.attemptNumber() + 7).shuffle(rows)
        with open(seen, "a") as f:
            f.write(json.dumps({"task": ctx.partitionId(), "attempt": ctx.attemptNumber()}) + "\n")
        out = pa.Table.from_pylist(rows, schema=table.schema)
        yield from out.to_batches(max_chunksize=1000)

    return shuffle


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _rows_df(spark, tasks: int):
    n = tasks * ROWS_PER_TASK
    data = [_row(i) for i in range(n)]
    return spark.createDataFrame(data, "key string, value string").repartition(tasks), data


def _assert_exactly(records, expected: list[tuple[str | None, str]]) -> None:
    got = Counter(
        (r.key.decode() if r.key is not None else None, r.value.decode()) for r in records
    )
    want = Counter(expected)
    dupes = {k: c for k, c in got.items() if c > 1}
    assert not dupes, f"{len(dupes)} records written more than once, e.g. {list(dupes)[:3]}"
    missing = want - got
    assert not missing, f"{len(missing)} records lost, e.g. {list(missing)[:3]}"
    assert got == want


@SINKS
@MODES
def test_batch_write_exactly_once_under_a_task_retry(spark, bootstrap, tmp_path, sink, mode):
    out = topic_name("eo-batch")
    create_topic(bootstrap, out, PARTITIONS)
    seen = tmp_path / "seen"
    df, expected = _rows_df(spark, 2)
    reorder = mode == "sorted"
    df = df.mapInArrow(_shuffling(str(seen), lambda attempt: reorder and attempt > 0), df.schema)
    (
        df.write.format(sink)
        .mode("append")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("topic", out)
        .option("exactlyOnce", mode)
        .option(FAIL, str(FAIL_AFTER))
        .save()
    )
    attempts = Counter((s["task"], s["attempt"]) for s in _lines(seen))
    # Each task ran twice: its first attempt failed after a partial write, its retry wrote it.
    assert set(attempts) == {(0, 0), (0, 1), (1, 0), (1, 1)}, attempts
    _assert_exactly(consume_all(bootstrap, out), expected)


@SINKS
def test_a_rerun_in_another_order_under_the_default_loses_nothing(spark, bootstrap, tmp_path, sink):
    """exactlyOnce=true after a shuffle whose order varies: the re-run sends other rows under the
    sequences the first attempt wrote. The broker compares them with what it has and refuses
    them, and the sink writes the rest of those partitions at least once: nothing lost, and the
    only repeats are rows the failed attempt had written."""
    out = topic_name("eo-reorder")
    create_topic(bootstrap, out, PARTITIONS)
    seen = tmp_path / "seen"
    df, expected = _rows_df(spark, 1)
    df = df.mapInArrow(_shuffling(str(seen), lambda attempt: attempt > 0), df.schema)
    (
        df.write.format(sink)
        .mode("append")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("topic", out)
        .option(FAIL, str(FAIL_AFTER))
        .save()
    )
    assert {s["attempt"] for s in _lines(seen)} == {0, 1}
    got = Counter(
        (r.key.decode() if r.key is not None else None, r.value.decode())
        for r in consume_all(bootstrap, out)
    )
    missing = Counter(expected) - got
    assert not missing, f"{len(missing)} records lost, e.g. {list(missing)[:3]}"
    repeated = sum(got.values()) - len(expected)
    # Only rows the failed attempt had written (two of three partitions' batches) come twice.
    assert FAIL_AFTER <= repeated < ROWS_PER_TASK, repeated


@SINKS
def test_batch_write_at_least_once_when_exactly_once_is_off(spark, bootstrap, tmp_path, sink):
    out = topic_name("alo-batch")
    create_topic(bootstrap, out, PARTITIONS)
    df, expected = _rows_df(spark, 1)
    (
        df.write.format(sink)
        .mode("append")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("topic", out)
        .option("exactlyOnce", "false")
        .option(FAIL, str(FAIL_AFTER))
        .save()
    )
    got = Counter(
        (r.key.decode() if r.key is not None else None, r.value.decode())
        for r in consume_all(bootstrap, out)
    )
    assert set(got) == set(expected)  # nothing lost
    repeated = sum(c - 1 for c in got.values())
    # The failed attempt's acknowledged records are written again by the retry, under its own
    # producer id: at least once, as Spark's Kafka sink.
    assert repeated >= FAIL_AFTER, repeated


@SINKS
@MODES
def test_stream_write_exactly_once_after_a_failed_micro_batch(
    spark, bootstrap, tmp_path, sink, mode
):
    source, out = topic_name("eo-src"), topic_name("eo-out")
    create_topic(bootstrap, source, 1)  # one write task, as in the batch test
    create_topic(bootstrap, out, PARTITIONS)
    rows = [_row(i) for i in range(ROWS_PER_TASK)]
    produce(
        bootstrap,
        source,
        [Rec(v.encode(), key=None if k is None else k.encode()) for k, v in rows],
    )
    marker, seen = tmp_path / "restarted", tmp_path / "seen"
    marker_path, reorder = str(marker), mode == "sorted"

    def retried_or_restarted(attempt: int) -> bool:
        import os

        return reorder and (attempt > 0 or os.path.exists(marker_path))

    ckpt = tmp_path / "ckpt"

    def start(inject: bool):
        src = (
            spark.readStream.format("stratalog-python")
            .option("kafka.bootstrap.servers", bootstrap)
            .option("subscribe", source)
            .option("startingOffsets", "earliest")
            .load()
            .selectExpr("CAST(key AS STRING) AS key", "CAST(value AS STRING) AS value")
        )
        w = (
            src.mapInArrow(_shuffling(str(seen), retried_or_restarted), "key string, value string")
            .writeStream.format(sink)
            .option("kafka.bootstrap.servers", bootstrap)
            .option("topic", out)
            .option("exactlyOnce", mode)
            .option("checkpointLocation", str(ckpt))
            .trigger(availableNow=True)
        )
        if inject:  # every attempt of the micro-batch's task fails: the query stops
            w = w.option(FAIL, str(FAIL_AFTER)).option(FAIL_ATTEMPTS, "3")
        return w.start()

    query = start(inject=True)
    try:
        with pytest.raises(StreamingQueryException, match="injected failure"):
            query.awaitTermination(120)
    finally:
        if query.isActive:
            query.stop()
    partial = consume_all(bootstrap, out)
    assert FAIL_AFTER <= len(partial) < ROWS_PER_TASK, len(partial)  # a partial write
    # Three attempts (in three orders with "sorted"), each stopped after a partial write
    assert {s["attempt"] for s in _lines(seen)} == {0, 1, 2}

    marker.touch()  # with "sorted", the re-run sees the micro-batch's rows in another order
    query = start(inject=False)
    try:
        assert query.awaitTermination(120), "the restarted query did not finish"
    finally:
        if query.isActive:
            query.stop()
    assert query.exception() is None
    _assert_exactly(consume_all(bootstrap, out), rows)


def _sorted_sink_records(spark, bootstrap, sink: str, df) -> list[tuple]:
    out = topic_name("order-" + sink)
    create_topic(bootstrap, out, 2)
    (
        df.write.format(sink)
        .mode("append")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("topic", out)
        .option("exactlyOnce", "sorted")
        .save()
    )
    recs = sorted(consume_all(bootstrap, out), key=lambda r: (r.partition, r.offset))
    # A row without an event time is stamped when sent: only "recent" is comparable.
    recent = (time.time() - 600) * 1000
    return [
        (
            r.partition,
            r.key,
            r.value,
            r.headers or (),
            "sent" if r.timestamp > recent else r.timestamp,
        )
        for r in recs
    ]


def test_both_sorted_sinks_send_the_same_rows_as_the_same_records_in_the_same_order(
    spark, bootstrap
):
    """A query may move between the two sinks across a restart only if both turn a task's rows
    into the same records under the same sequences: with exactlyOnce=sorted, the same order
    whatever the input's. Headers with null names and values, binary keys, an explicit
    partition for some rows, and event times with microseconds (rounded down to milliseconds)."""
    from datetime import UTC, datetime, timedelta

    t0 = datetime(2026, 11, 23, 12, 0, 0, 123456, tzinfo=UTC)
    rows = [
        (None, "b", None, None, t0),
        (b"k1", "a", [("h", b"\x00\x01"), ("h", None)], None, t0),
        (b"k1", "a", [("h", b"\x00")], 1, t0 + timedelta(microseconds=999)),
        (b"k1", "a", [("h", None)], None, t0 - timedelta(microseconds=1)),
        (b"k1", "a", [(None, b"x")], None, t0),
        (b"k1", "a", [], 0, None),
        (b"k1", "a", None, None, t0),
        (b"k2\xff", "a\u00e9", [("g", b"z")], None, t0 - timedelta(days=1)),
        (b"k2", "a", [("g", b"z"), ("a", b"")], 1, t0),
        (b"", "", None, None, t0),
        (None, "", [("h\u00e9", b"\xff")], None, t0),
    ] * 3
    schema = (
        "key binary, value string, headers array<struct<key:string,value:binary>>, "
        "partition int, timestamp timestamp"
    )
    df = spark.createDataFrame(rows[::-1] + rows, schema).coalesce(1)
    py = _sorted_sink_records(spark, bootstrap, "stratalog-python", df)
    jvm = _sorted_sink_records(spark, bootstrap, "stratalog", df)
    assert len(jvm) == 2 * len(rows)
    assert py == jvm
    stamps = {r[4] for r in jvm}
    assert int(t0.timestamp() * 1000) in stamps  # 12:00:00.123456 written as .123
    # A `timestamp` column of another type is neither written nor sorted by, in either sink.
    df2 = df.withColumn("timestamp", F.lit(7).cast("long"))
    py2 = _sorted_sink_records(spark, bootstrap, "stratalog-python", df2)
    jvm2 = _sorted_sink_records(spark, bootstrap, "stratalog", df2)
    assert [r[:4] for r in py2] == [r[:4] for r in jvm2]
    assert {r[4] for r in py2 + jvm2} == {"sent"}


def test_python_sink_refuses_a_task_larger_than_its_ordering_memory(spark, bootstrap):
    out = topic_name("eo-cap")
    create_topic(bootstrap, out, 1)
    df = spark.range(0, 10_000, numPartitions=1).selectExpr("CAST(id AS STRING) AS value")
    with pytest.raises(Exception, match=r"exactlyOnce\.maxTaskBytes"):
        (
            df.write.format("stratalog-python")
            .mode("append")
            .option("kafka.bootstrap.servers", bootstrap)
            .option("topic", out)
            .option("exactlyOnce", "sorted")
            .option("exactlyOnce.maxTaskBytes", "1000")
            .save()
        )
    assert consume_all(bootstrap, out) == []  # refused before anything was sent


@SINKS
@pytest.mark.parametrize(
    ("option", "value"), [("exactlyOnce", "yes"), (FAIL, "-1"), (FAIL_ATTEMPTS, "x")]
)
def test_sink_options_with_bad_values_are_refused(spark, bootstrap, sink, option, value):
    df = spark.range(1).selectExpr("CAST(id AS STRING) AS value")
    with pytest.raises(Exception, match=option.replace(".", r"\.")):
        (
            df.write.format(sink)
            .mode("append")
            .option("kafka.bootstrap.servers", bootstrap)
            .option("topic", topic_name("bad-opt"))
            .option(option, value)
            .save()
        )


def test_sorted_jvm_sink_refuses_a_column_that_differs_from_a_sorted_one_only_by_case(
    spark, bootstrap
):
    # Spark would resolve the sort by `key` case-insensitively and find `KEY` too.
    df = spark.range(3).selectExpr("CAST(id AS STRING) AS key", "'x' AS KEY", "'v' AS value")
    with pytest.raises(Exception, match="cannot tell it from the column 'KEY'"):
        (
            df.write.format("stratalog")
            .mode("append")
            .option("kafka.bootstrap.servers", bootstrap)
            .option("topic", topic_name("case"))
            .option("exactlyOnce", "sorted")
            .save()
        )


def test_sorted_jvm_sink_is_refused_under_a_continuous_trigger(spark, bootstrap, tmp_path):
    # Spark sorts a write's rows for batch and micro-batch plans only, and refuses a sink that
    # asks for an ordering under a continuous trigger: "sorted" never silently fails to hold.
    out = topic_name("continuous")
    create_topic(bootstrap, out, 1)
    writer = (
        spark.readStream.format("rate")
        .option("rowsPerSecond", "10")
        .option("numPartitions", "1")
        .load()
        .selectExpr("CAST(value AS STRING) AS value")
        .writeStream.format("stratalog")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("topic", out)
        .option("exactlyOnce", "sorted")
        .option("checkpointLocation", str(tmp_path / "ckpt"))
        .trigger(continuous="1 second")
    )
    query = None
    try:
        with pytest.raises(Exception, match="cannot request distribution and ordering"):
            query = writer.start()
            query.awaitTermination(60)
    finally:
        if query is not None and query.isActive:
            query.stop()
