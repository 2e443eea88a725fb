"""Exactly-once writes through format("stratalog-python") and format("stratalog"): a task or
micro-batch that fails after its producer already sent part of its records is re-run, and the
broker drops the repeats.

The failures are injected with a UDF. It runs in the same Spark task as the sink's writer but in
another Python worker: before raising it waits until the sink has really sent records of that
task to the output topic, so every failure happens after a partial write. The sink sends in
batches of 5000 records per target partition, so the failing task gets 12,000 rows and fails at
row 7,000, with Arrow batches of 1000 rows flowing into the writer; values are padded so that the
UDF's Python worker flushes its results to Spark while the task runs (small rows sit in its
output buffer until the task ends).
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from pyspark.errors import StreamingQueryException
from pyspark.sql import functions as F

from ..conftest import create_topic
from .conftest import Rec, consume_all, produce, topic_name

pytestmark = pytest.mark.spark

ROWS_PER_TASK = 12_000
FAIL_AT = 7_000
SENT_BEFORE_FAILING = 5_000  # the sink's first batch for the partition
PAD = "-" + "x" * 50  # 5000 padded records stay below the sink's 512 KiB batch limit


@pytest.fixture
def small_arrow_batches(spark):
    """Feed the writer 1000-row Arrow batches so it sends while its task still runs."""
    key = "spark.sql.execution.arrow.maxRecordsPerBatch"
    old = spark.conf.get(key)
    spark.conf.set(key, "1000")
    try:
        yield
    finally:
        spark.conf.set(key, old)


def _failing_udf(bootstrap: str, topic: str, partition: int, fired: str, should_fail):
    """A UDF value -> value that, on the row ``FAIL_AT`` of a failing attempt, waits until the
    output partition holds at least SENT_BEFORE_FAILING records, notes that in ``fired`` and
    raises. Self-contained: it runs in executor Python workers."""
    fail_at, needed = FAIL_AT, SENT_BEFORE_FAILING

    def tag(n, value):
        if n == fail_at and should_fail():
            import time

            from stratalog.client.wire import LATEST, WireClient

            deadline = time.monotonic() + 60
            with WireClient(bootstrap) as c:
                while True:
                    end = c.list_offsets(topic, [partition], LATEST)[partition][0]
                    if end >= needed or time.monotonic() > deadline:
                        break
                    time.sleep(0.05)
            with open(fired, "a") as f:
                f.write(json.dumps({"end_offset_at_failure": end}) + "\n")
            raise RuntimeError(f"injected failure at row {n} after {end} records were sent")
        return value

    return F.udf(tag, "string")


def _fired(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


SINKS = pytest.mark.parametrize("sink", ["stratalog-python", "stratalog"])


@SINKS
def test_batch_write_exactly_once_under_a_task_retry(
    spark, bootstrap, tmp_path, small_arrow_batches, sink
):
    out = topic_name("eo-batch")
    create_topic(bootstrap, out, 2)
    fired = tmp_path / "fired"

    def first_attempt_of_task_0() -> bool:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        return ctx.partitionId() == 0 and ctx.attemptNumber() == 0

    # Task 0 writes ids 0..11999 to partition 0, task 1 writes the rest to partition 1.
    tag = _failing_udf(bootstrap, out, 0, str(fired), first_attempt_of_task_0)
    df = (
        spark.range(0, 2 * ROWS_PER_TASK, numPartitions=2)
        .withColumn("n", F.col("id") % ROWS_PER_TASK)
        .select(
            F.concat(F.lit("k"), F.col("id").cast("string")).alias("key"),
            tag(F.col("n"), F.concat(F.lit("v"), F.col("id").cast("string"), F.lit(PAD))).alias(
                "value"
            ),
            (F.col("id") >= ROWS_PER_TASK).cast("int").alias("partition"),
        )
    )
    df.write.format(sink).mode("append").option("kafka.bootstrap.servers", bootstrap).option(
        "topic", out
    ).save()

    failures = _fired(fired)
    assert len(failures) == 1, failures  # the first attempt failed, its retry succeeded
    assert failures[0]["end_offset_at_failure"] >= SENT_BEFORE_FAILING, failures

    records = consume_all(bootstrap, out)
    values = Counter(r.value for r in records)
    expected = {f"v{i}{PAD}".encode() for i in range(2 * ROWS_PER_TASK)}
    dupes = {v: c for v, c in values.items() if c > 1}
    assert not dupes, f"{len(dupes)} values written more than once, e.g. {list(dupes)[:3]}"
    assert set(values) == expected
    assert len(records) == 2 * ROWS_PER_TASK
    for r in records:
        i = int(r.value[1:].split(b"-")[0])
        assert r.key == f"k{i}".encode()
        assert r.partition == (i >= ROWS_PER_TASK)


@SINKS
def test_stream_write_exactly_once_after_a_failed_micro_batch(
    spark, bootstrap, tmp_path, small_arrow_batches, sink
):
    source, out = topic_name("eo-src"), topic_name("eo-out")
    create_topic(bootstrap, source, 1)
    create_topic(bootstrap, out, 1)
    sent = produce(
        bootstrap,
        source,
        [Rec(f"v{i}{PAD}".encode(), key=f"k{i}".encode()) for i in range(ROWS_PER_TASK)],
    )
    marker, fired = tmp_path / "fail-while-this-exists", tmp_path / "fired"
    marker.touch()
    marker_path = str(marker)

    def marker_exists() -> bool:
        import os

        return os.path.exists(marker_path)

    tag = _failing_udf(bootstrap, out, 0, str(fired), marker_exists)
    ckpt = tmp_path / "ckpt"

    def start():
        return (
            spark.readStream.format("stratalog-python")
            .option("kafka.bootstrap.servers", bootstrap)
            .option("subscribe", source)
            .option("startingOffsets", "earliest")
            .load()
            .select("key", tag(F.col("offset"), F.col("value").cast("string")).alias("value"))
            .writeStream.format(sink)
            .option("kafka.bootstrap.servers", bootstrap)
            .option("topic", out)
            .option("checkpointLocation", str(ckpt))
            .trigger(availableNow=True)
            .start()
        )

    query = start()
    try:
        with pytest.raises(StreamingQueryException, match="injected failure"):
            query.awaitTermination(120)
    finally:
        if query.isActive:
            query.stop()
    failures = _fired(fired)
    assert failures, "the micro-batch did not fail"
    assert all(f["end_offset_at_failure"] >= SENT_BEFORE_FAILING for f in failures), failures
    partial = consume_all(bootstrap, out)
    assert SENT_BEFORE_FAILING <= len(partial) < ROWS_PER_TASK  # a partial write is visible

    marker.unlink()
    query = start()
    try:
        assert query.awaitTermination(120), "the restarted query did not finish"
    finally:
        if query.isActive:
            query.stop()
    assert query.exception() is None

    records = consume_all(bootstrap, out)
    values = Counter(r.value for r in records)
    dupes = {v: c for v, c in values.items() if c > 1}
    assert not dupes, f"{len(dupes)} values written more than once, e.g. {list(dupes)[:3]}"
    assert len(records) == ROWS_PER_TASK
    assert sorted((r.key, r.value) for r in records) == sorted((s.key, s.value) for s in sent)
