"""Streaming queries across two splits under load keep every key's order (stratalog.splits).

Two confluent-kafka producers write their own keys, each record carrying its key's sequence
number, fast enough that the broker splits the topic twice (2 to 4 to 8 partitions) while a
streaming query of ``format("stratalog-python")`` or of the JVM connector ``format("stratalog")``
reads it with small fetches, with all available offsets per micro-batch or with
``maxOffsetsPerTrigger`` (a child's cut must then follow its parent's). The producers learn each
split only at their next metadata refresh, so for a moment they still send moved keys to the
parents. The oracles: the producers' delivery reports (what was written, where) and the sequence
numbers. Each key's records must come out in the order written: in one task per family and
micro-batch (a task's rows are one ordered stream), across micro-batches in batch order. Batch
reads of the same topic: one task per family in both connectors (minPartitions does not cut
them), the same rows in both; Spark's Kafka source, a task per partition, is the negative
control that shows the order check fails on this data.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, ConfigResource

from ..conftest import create_topic
from .conftest import topic_name

pytestmark = pytest.mark.spark

KEYS = 24  # per producer
JVM = "stratalog"
FETCH_BYTES = "4096"  # small: a task meets a child's batches long before its parent's end
FAMILIES = {frozenset({0, 2, 4, 6}), frozenset({1, 3, 5, 7})}  # created with 2, split twice


def _history(bootstrap: str, topic: str) -> str:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    res = ConfigResource(ConfigResource.Type.TOPIC, topic)
    return admin.describe_configs([res])[res].result(timeout=15)["partition.split.history"].value


def _write(
    bootstrap: str, topic: str, tag: str, stop: threading.Event, acked: list, times: dict
) -> None:
    """Records of keys ``<tag>0..``, each value "<key>:<seq>:<padding>", about 150 per second
    per key set and 300 B each; what was acknowledged goes to ``acked``, and to ``times`` each
    record's (key, seq) -> [time sent, time its delivery report came]."""
    producer = Producer({
        "bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True,
        "linger.ms": 5, "topic.metadata.refresh.interval.ms": 1000,
    })  # fmt: skip
    seqs = [0] * KEYS

    def report(err, msg) -> None:
        if err is None:
            acked.append((msg.key(), msg.value(), msg.partition(), msg.offset()))
            times[(msg.key(), int(msg.value().split(b":")[1]))].append(time.monotonic())

    i = 0
    while not stop.is_set():
        k = i % KEYS
        key = b"%s%d" % (tag.encode(), k)
        times[(key, seqs[k])] = [time.monotonic()]
        producer.produce(topic, b"%s:%d:" % (key, seqs[k]) + b"x" * 280, key=key,
                         on_delivery=report)  # fmt: skip
        seqs[k] += 1
        i += 1
        producer.poll(0)
        if i % 20 == 0:
            time.sleep(0.01)
    assert producer.flush(60) == 0


def _order_violations(rows: list[tuple], times: dict) -> list[str]:
    """rows: (batch id, task, row index in the task, key, sequence). Each key's records of a
    micro-batch in one task, and read in the order written. A producer orders a key's records
    only within a partition: while it still sends a moved key to the parent, a batch for the
    child can be appended first. So record B read before record A of the same key is out of
    order only if A was acknowledged before B was sent (then the log must hold A first);
    ``times`` gives each (key, seq) its [sent, acknowledged] times."""
    problems = []
    tasks: dict[tuple[int, bytes], set[int]] = defaultdict(set)
    for batch, task, _, key, _ in rows:
        tasks[(batch, key)].add(task)
    problems += [
        f"batch {b}: {k!r} in tasks {sorted(t)}" for (b, k), t in tasks.items() if len(t) > 1
    ]
    seen: dict[bytes, list[int]] = defaultdict(list)
    for _, _, _, key, seq in sorted(rows, key=lambda r: (r[0], r[1], r[2])):
        seen[key].append(seq)
    for key, seqs in seen.items():
        for i, later in enumerate(seqs):
            sent = times[(key, later)][0]
            problems += [
                f"{key!r}: {later} read before {earlier}, acknowledged before {later} was sent"
                for earlier in seqs[i + 1 :]
                if earlier < later and times[(key, earlier)][-1] < sent
            ]
    return problems


def _tagged(df, batch_id: int) -> list[tuple]:
    """The rows of a micro-batch with the task that read each and its index in that task."""

    def tag(index, rows):
        for j, r in enumerate(rows):
            yield (index, j, bytes(r.key), int(bytes(r.value).split(b":")[1]), r.partition,
                   r.offset)  # fmt: skip

    got = df.select("key", "value", "partition", "offset").rdd.mapPartitionsWithIndex(tag)
    return [(batch_id, *r) for r in got.collect()]


@dataclass
class SplitRun:
    """A topic split twice under load while a streaming query read it."""

    topic: str
    # (batch id, task, row index in the task, key, sequence, partition, offset) of the query
    rows: list[tuple]
    written: dict[tuple[int, int], tuple[bytes, bytes]]  # (partition, offset) -> (key, value)
    times: dict[tuple[bytes, int], list[float]]  # (key, seq) -> [sent, acknowledged]
    error: str | None  # the query's failure


def _query_across_splits(
    spark, fmt: str, bootstrap: str, ckpt: Path, max_offsets: str | None
) -> SplitRun:
    """Splits a new topic twice under load while a streaming query of ``fmt`` reads it."""
    topic = topic_name("splits")
    create_topic(
        bootstrap, topic, 2,
        **{"partition.autoscale.enable": "true", "partition.autoscale.bytes.per.sec": "15000",
           "partition.autoscale.window.ms": "1000", "partition.autoscale.max.partitions": "8",
           "retention.ms": "-1"},
    )  # fmt: skip
    rows: list[tuple] = []
    reader = (
        spark.readStream.format(fmt)
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("kafka.max.partition.fetch.bytes", FETCH_BYTES)
    )
    if max_offsets is not None:
        reader = reader.option("maxOffsetsPerTrigger", max_offsets)
    query = (
        reader.load()
        .writeStream.foreachBatch(lambda df, batch_id: rows.extend(_tagged(df, batch_id)))
        .option("checkpointLocation", str(ckpt))
        .trigger(processingTime="500 milliseconds")
        .start()
    )
    stop = threading.Event()
    acked: list[list] = [[], []]
    times: dict[tuple[bytes, int], list[float]] = {}
    writers = [
        threading.Thread(target=_write, args=(bootstrap, topic, tag, stop, into, times))
        for tag, into in zip("ab", acked, strict=True)
    ]
    try:
        for w in writers:
            w.start()
        deadline = time.monotonic() + 60
        while _history(bootstrap, topic) != "2,4,8" and time.monotonic() < deadline:
            time.sleep(0.5)
        time.sleep(2)  # the producers write to all eight for a while
        stop.set()
        for w in writers:
            w.join(90)
        written = {(p, o): (k, v) for rows_ in acked for k, v, p, o in rows_}
        deadline = time.monotonic() + 120
        while len(rows) < len(written) and time.monotonic() < deadline:
            if query.exception() is not None:
                break
            time.sleep(0.5)
    finally:
        stop.set()
        query.stop()
    error = query.exception()
    return SplitRun(topic, rows, written, times, None if error is None else str(error))


@pytest.fixture(scope="module")
def split_run(spark, spark_broker, tmp_path_factory) -> SplitRun:
    """A JVM query with all available offsets in each micro-batch; its topic serves the batch
    reads too."""
    ckpt = tmp_path_factory.mktemp("splits") / "ckpt"
    return _query_across_splits(spark, JVM, spark_broker.bootstrap, ckpt, None)


def _check_query(run: SplitRun, bootstrap: str) -> None:
    """Every acknowledged record once, in one task per family and micro-batch, each key's
    records in the order written."""
    assert run.error is None, run.error
    assert _history(bootstrap, run.topic) == "2,4,8"  # split twice, under load
    rows = run.rows
    read = [(p, o) for *_, p, o in rows]
    assert len(read) == len(set(read))
    assert set(read) == set(run.written)
    assert all(run.written[(p, o)][1].split(b":")[1] == b"%d" % s for *_, s, p, o in rows)
    # Keys moved: some micro-batch held a key's records from a parent and its child.
    parts: dict[tuple[int, bytes], set[int]] = defaultdict(set)
    for batch, _, _, key, _, p, _ in rows:
        parts[(batch, key)].add(p)
    assert any(len(ps) > 1 for ps in parts.values())
    # One task per family in every micro-batch: never more than two, each within a family.
    by_batch: dict[int, list[tuple]] = defaultdict(list)
    for r in rows:
        by_batch[r[0]].append(r)
    for batch_rows in by_batch.values():
        tasks = _task_partitions(batch_rows)
        assert len(tasks) <= 2
        assert all(any(t <= f for f in FAMILIES) for t in tasks), tasks
    problems = _order_violations([r[:5] for r in rows], run.times)
    assert not problems, problems[:10]


def _batch(spark, fmt: str, bootstrap: str, topic: str, **options: str):
    r = (
        spark.read.format(fmt)
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("kafka.max.partition.fetch.bytes", FETCH_BYTES)
    )
    for k, v in options.items():
        r = r.option(k, v)
    return r.load()


def _rows(df) -> list[tuple]:
    """Every row of the Kafka schema but headers, timestamps in microseconds, sorted."""
    from pyspark.sql import functions as F

    cols = ["key", "value", "topic", "partition", "offset", "timestampType"]
    got = df.select(*cols, F.unix_micros("timestamp").alias("ts")).collect()
    return sorted(tuple(bytes(v) if isinstance(v, bytearray) else v for v in r) for r in got)


def _task_partitions(tagged: list[tuple]) -> set[frozenset[int]]:
    """The partitions each task of a read held (tagged rows as _tagged gives them)."""
    tasks: dict[int, set[int]] = defaultdict(set)
    for _, task, _, _, _, p, _ in tagged:
        tasks[task].add(p)
    return {frozenset(ps) for ps in tasks.values()}


def test_a_jvm_query_across_two_splits_reads_every_key_in_order(split_run, bootstrap):
    _check_query(split_run, bootstrap)


@pytest.mark.parametrize(
    ("fmt", "max_offsets"),
    [("stratalog-python", None), ("stratalog-python", "1500"), (JVM, "1500")],
    ids=["python", "python-rate-limited", "jvm-rate-limited"],
)
def test_a_query_across_two_splits_reads_every_key_in_order(
    spark, bootstrap, tmp_path, fmt, max_offsets
):
    run = _query_across_splits(spark, fmt, bootstrap, tmp_path / "ckpt", max_offsets)
    _check_query(run, bootstrap)
    if max_offsets is not None:
        sizes: dict[int, int] = defaultdict(int)
        for r in run.rows:
            sizes[r[0]] += 1
        assert max(sizes.values()) <= int(max_offsets)  # the limit held: the ranges were cut


def test_a_jvm_batch_read_of_a_split_topic_keeps_order_and_matches_the_python_source(
    spark, split_run, bootstrap
):
    topic = split_run.topic
    # minPartitions would cut a plain topic's eight partitions into sixteen tasks; a split
    # topic's families are never cut.
    jvm = _batch(spark, JVM, bootstrap, topic, minPartitions="16")
    python = _batch(spark, "stratalog-python", bootstrap, topic, minPartitions="16")
    assert jvm.rdd.getNumPartitions() == 2
    assert python.rdd.getNumPartitions() == 2

    jvm_rows = _rows(jvm)
    assert jvm_rows == _rows(python)
    assert {(p, o) for _, _, _, p, o, _, _ in jvm_rows} == set(split_run.written)

    tagged = _tagged(jvm, 0)
    assert _task_partitions(tagged) == FAMILIES
    assert _task_partitions(_tagged(python, 0)) == FAMILIES
    problems = _order_violations([r[:5] for r in tagged], split_run.times)
    assert not problems, problems[:10]

    # Spark's Kafka source reads each partition in a task of its own: the same check finds
    # keys split across tasks in this topic.
    kafka = _batch(spark, "kafka", bootstrap, topic)
    assert _order_violations([r[:5] for r in _tagged(kafka, 0)], split_run.times)
