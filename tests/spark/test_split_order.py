"""A streaming query across two splits under load keeps every key's order (stratalog.splits).

Two confluent-kafka producers write their own keys, each record carrying its key's sequence
number, fast enough that the broker splits the topic twice (2 to 4 to 8 partitions) while a
``stratalog-python`` streaming query reads it. The producers learn each split only at their next
metadata refresh, so for a moment they still send moved keys to the parents. The oracles: the
producers' delivery reports (what was written, where) and the sequence numbers. Each key's
records must come out of the query in the order written: in one task per micro-batch (a task's
rows are one ordered stream), across micro-batches in batch order. The same check on Spark's own
Kafka source, which reads each partition in a task of its own, finds keys split across tasks.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, ConfigResource

from ..conftest import create_topic
from .conftest import topic_name

pytestmark = pytest.mark.spark

KEYS = 24  # per producer


def _history(bootstrap: str, topic: str) -> str:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    res = ConfigResource(ConfigResource.Type.TOPIC, topic)
    return admin.describe_configs([res])[res].result(timeout=15)["partition.split.history"].value


def _write(bootstrap: str, topic: str, tag: str, stop: threading.Event, acked: list) -> None:
    """Records of keys ``<tag>0..``, each value "<key>:<seq>:<padding>", about 150 per second
    per key set and 300 B each; what was acknowledged goes to ``acked``."""
    producer = Producer({
        "bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True,
        "linger.ms": 5, "topic.metadata.refresh.interval.ms": 1000,
    })  # fmt: skip
    seqs = [0] * KEYS

    def report(err, msg) -> None:
        if err is None:
            acked.append((msg.key(), msg.value(), msg.partition(), msg.offset()))

    i = 0
    while not stop.is_set():
        k = i % KEYS
        key = b"%s%d" % (tag.encode(), k)
        producer.produce(topic, b"%s:%d:" % (key, seqs[k]) + b"x" * 280, key=key,
                         on_delivery=report)  # fmt: skip
        seqs[k] += 1
        i += 1
        producer.poll(0)
        if i % 20 == 0:
            time.sleep(0.01)
    assert producer.flush(60) == 0


def _order_violations(rows: list[tuple]) -> list[str]:
    """rows: (batch id, task, row index in the task, key, sequence). Each key's records of a
    micro-batch in one task, and its sequence numbers rising in (batch, row) order."""
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
    problems += [f"{k!r}: {s[:20]}" for k, s in seen.items() if s != sorted(s)]
    return problems


def _tagged(df, batch_id: int) -> list[tuple]:
    """The rows of a micro-batch with the task that read each and its index in that task."""

    def tag(index, rows):
        for j, r in enumerate(rows):
            yield (index, j, bytes(r.key), int(bytes(r.value).split(b":")[1]), r.partition,
                   r.offset)  # fmt: skip

    got = df.select("key", "value", "partition", "offset").rdd.mapPartitionsWithIndex(tag)
    return [(batch_id, *r) for r in got.collect()]


@pytest.mark.parametrize("max_offsets", [None, "1500"], ids=["all-available", "rate-limited"])
def test_a_query_across_two_splits_reads_every_key_in_order(
    spark, bootstrap, tmp_path, max_offsets
):
    """With ``maxOffsetsPerTrigger`` each micro-batch's ranges are cut, and a child's cut must
    follow its parent's (planning.cut_families) for the order to hold across micro-batches."""
    topic = topic_name("splits")
    create_topic(
        bootstrap, topic, 2,
        **{"partition.autoscale.enable": "true", "partition.autoscale.bytes.per.sec": "15000",
           "partition.autoscale.window.ms": "1000", "partition.autoscale.max.partitions": "8",
           "retention.ms": "-1"},
    )  # fmt: skip
    rows: list[tuple] = []
    reader = (
        spark.readStream.format("stratalog-python")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        # Small fetches: a task meets a child's batches long before its parent's range ends.
        .option("kafka.max.partition.fetch.bytes", "4096")
    )
    if max_offsets is not None:
        reader = reader.option("maxOffsetsPerTrigger", max_offsets)
    query = (
        reader.load()
        .writeStream.foreachBatch(lambda df, batch_id: rows.extend(_tagged(df, batch_id)))
        .option("checkpointLocation", str(tmp_path / "ckpt"))
        .trigger(processingTime="500 milliseconds")
        .start()
    )
    stop = threading.Event()
    acked: list[list] = [[], []]
    writers = [
        threading.Thread(target=_write, args=(bootstrap, topic, tag, stop, into))
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
            assert query.exception() is None, query.exception()
            time.sleep(0.5)
    finally:
        stop.set()
        query.stop()
    assert query.exception() is None
    assert _history(bootstrap, topic) == "2,4,8"  # split twice, under load

    # Every acknowledged record exactly once, where it was acknowledged.
    read = [(p, o) for *_, p, o in rows]
    assert len(read) == len(set(read))
    assert set(read) == set(written)
    assert all(written[(p, o)][1].split(b":")[1] == b"%d" % s for *_, s, p, o in rows)
    # Keys moved: some micro-batch held a key's records from a parent and its child.
    parts: dict[tuple[int, bytes], set[int]] = defaultdict(set)
    for batch, _, _, key, _, p, _ in rows:
        parts[(batch, key)].add(p)
    assert any(len(ps) > 1 for ps in parts.values())
    problems = _order_violations([r[:5] for r in rows])
    assert not problems, problems[:10]

    # Spark's Kafka source reads each partition in a task of its own: the same check finds
    # keys split across tasks.
    kafka_df = (
        spark.read.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .load()
    )
    assert _order_violations([r[:5] for r in _tagged(kafka_df, 0)])
