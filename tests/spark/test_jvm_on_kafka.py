"""format("stratalog") (the JVM connector) on a real Apache Kafka broker, against format("kafka").

The other Spark tests run the JVM connector on Stratalog brokers only. Here its reader speaks to
the reference Apache Kafka 4.4.0 (one broker for the module, stopped by its PID at the end) and
Spark's own Kafka source, reading the same broker, is the specification: the same options go
through both formats and every row must be the same (key, value, topic, partition, offset,
timestamp in microseconds, timestampType, headers). Covered: a multi-partition topic produced
with confluent-kafka, offsets as JSON and timestamps, a log start moved by DeleteRecords (to the
middle of a batch), a LogAppendTime topic, compressed batches
(checked to be compressed in Kafka's own segment files), a topic with transactions (one
committed, one aborted: their control batches sit in the log), a streaming read with
Trigger.AvailableNow, and a batch write with the JVM sink read back with confluent-kafka and
format("kafka").
"""

from __future__ import annotations

import json
import struct
import time
import uuid
from pathlib import Path
from typing import NamedTuple

import pytest

from stratalog.peers.kafka import KafkaBroker  # the session's `kafka` fixture (conftest.py)

from ..conftest import create_topic
from .conftest import (
    Rec,
    Sent,
    consume_all,
    end_offsets,
    produce,
    topic_name,
    write_transactions,
)

pytestmark = pytest.mark.spark

JVM = "stratalog"
# In the past (Kafka refuses CreateTimes over message.timestamp.after.max.ms, 1 hour, ahead of
# its clock) and inside its retention (7 days).
T0 = (int(time.time()) - 3600) * 1000
QUERY_TIMEOUT = 120  # seconds; a streaming query that has not finished by then fails the test

MAIN_PARTITIONS = 4
MAIN_RECORDS = 2000  # record i: partition i % 4, CreateTime T0 + i ms


# -- the broker ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def kbs(kafka: KafkaBroker) -> str:
    """Kafka's bootstrap address (127.0.0.1:<port>)."""
    return kafka.bootstrap


# -- helpers ---------------------------------------------------------------------------------------
def _produce(bootstrap: str, topic: str, records: list[Rec], **config) -> list[Sent]:
    return produce(bootstrap, topic, records, **{"linger.ms": 20, **config})


def _read(spark, fmt: str, bootstrap: str, **options):
    r = spark.read.format(fmt).option("kafka.bootstrap.servers", bootstrap)
    for k, v in options.items():
        r = r.option(k, v)
    return r.load()


def _plain(v):
    if isinstance(v, bytes | bytearray):
        return bytes(v)
    if isinstance(v, tuple | list):  # a Row is a tuple
        return tuple(_plain(x) for x in v)
    return v


def _rows(df) -> list[tuple]:
    """Every row (all columns), timestamps as microseconds since the epoch, sorted."""
    from pyspark.sql import functions as F

    df = df.select(
        *[F.unix_micros(F.col(c)).alias(c) if t == "timestamp" else F.col(c) for c, t in df.dtypes]
    )
    return sorted((_plain(r) for r in df.collect()), key=repr)


def _diff(ref: list[tuple], got: list[tuple]) -> str:
    only_ref = [r for r in ref if r not in got]
    only_got = [r for r in got if r not in ref]
    return (
        f"kafka {len(ref)} rows, stratalog {len(got)} rows; only in format('kafka') (first 3): "
        f"{only_ref[:3]}; only in format('stratalog') (first 3): {only_got[:3]}"
    )


def _compare(spark, bootstrap: str, **options) -> list[tuple]:
    """The same read through format("kafka") and format("stratalog"): the same schema, the same
    rows and the same number of tasks. Returns the reference rows."""
    ref_df = _read(spark, "kafka", bootstrap, **options)
    got_df = _read(spark, JVM, bootstrap, **options)
    assert got_df.schema == ref_df.schema, options
    ref, got = _rows(ref_df), _rows(got_df)
    assert got == ref, f"{options}: {_diff(ref, got)}"
    assert got_df.rdd.getNumPartitions() == ref_df.rdd.getNumPartitions(), options
    return ref


def _expected(sent: list[Sent], timestamp_type: int = 0) -> list[tuple]:
    """Produced records in the shape of _rows for the full schema with headers."""
    return sorted(
        (
            (
                s.key,
                s.value,
                s.topic,
                s.partition,
                s.offset,
                s.timestamp * 1000,
                timestamp_type,
                s.headers,
            )
            for s in sent
        ),
        key=repr,
    )


class Batch(NamedTuple):
    """A record batch's header, as Kafka stored it."""

    partition: int
    base: int  # base offset
    delta: int  # last offset delta
    attributes: int
    producer_id: int
    base_sequence: int
    count: int

    @property
    def codec(self) -> int:
        return self.attributes & 0x07

    @property
    def transactional(self) -> bool:
        return bool(self.attributes & 0x10)

    @property
    def control(self) -> bool:
        return bool(self.attributes & 0x20)


def _batches_on_disk(kafka: KafkaBroker, topic: str) -> list[Batch]:
    """Every record batch in Kafka's own segment files of a topic, read while the broker runs."""
    assert kafka.log_dir is not None
    out = []
    for part_dir in sorted((kafka.log_dir / "data").glob(f"{topic}-*")):
        partition = int(part_dir.name.rsplit("-", 1)[1])
        for segment in sorted(part_dir.glob("*.log")):
            data = segment.read_bytes()
            pos = 0
            while pos + 61 <= len(data):
                base, length = struct.unpack_from(">qi", data, pos)
                if length == 0:  # preallocated, unwritten tail
                    break
                attributes, delta = struct.unpack_from(">hi", data, pos + 21)
                producer_id, _epoch, sequence, count = struct.unpack_from(">qhii", data, pos + 43)
                out.append(Batch(partition, base, delta, attributes, producer_id, sequence, count))
                pos += 12 + length
    return out


def _main_records() -> list[Rec]:
    """Keys and null keys, null and empty values, binary values, headers (repeated names, null
    and empty ones) on some records and none on others, explicit CreateTimes."""
    out = []
    for i in range(MAIN_RECORDS):
        key = None if i % 9 == 4 else b"k%05d" % i
        if i % 13 == 3:
            value = None
        elif i % 17 == 5:
            value = b""
        else:
            value = b"v%05d-" % i + bytes([i % 256, 0, 255 - i % 256])
        headers = None
        if i % 5 == 1:
            headers = (("h", b"%d" % i),)
        elif i % 7 == 0:
            headers = (("h", b"1"), ("h", None), ("", b""))
        out.append(
            Rec(
                value,
                key=key,
                partition=i % MAIN_PARTITIONS,
                timestamp=T0 + i,
                headers=headers,
            )
        )
    return out


@pytest.fixture(scope="module")
def main(kbs: str) -> tuple[str, list[Sent]]:
    name = topic_name("kafka-main")
    create_topic(kbs, name, MAIN_PARTITIONS)
    # Idempotent: without it librdkafka may retry a batch (say after NOT_LEADER on a topic just
    # created) while the next one is appended, and a partition would then not hold its records
    # in send order (seen in CI: Kafka answered offset 0 of partition 0 for T0 + 1001).
    sent = _produce(kbs, name, _main_records(), **{"enable.idempotence": True})
    # The cases below count on record i at offset i // 4 of partition i % 4.
    misplaced = [s for s in sent if s.offset != (s.timestamp - T0) // MAIN_PARTITIONS]
    assert not misplaced, f"{len(misplaced)} records out of send order, e.g. {misplaced[:2]}"
    return name, sent


@pytest.fixture(scope="module")
def txn(kbs: str) -> tuple[str, list[Sent], list[Sent]]:
    return write_transactions(kbs, "kafka-txn", T0)


# -- 1. a plain batch read -------------------------------------------------------------------------
def test_batch_read_matches_kafka_source(spark, kbs, main):
    topic, sent = main
    # format("stratalog") is the JVM connector here (its scan describes itself so).
    plan = _read(spark, JVM, kbs, subscribe=topic)._jdf.queryExecution().executedPlan()
    assert f"stratalog subscribe [{topic}]" in plan.toString()
    ref = _compare(spark, kbs, subscribe=topic, includeHeaders="true")
    assert ref == _expected(sent)  # what confluent-kafka produced, at the offsets Kafka gave
    assert {r[3] for r in ref} == set(range(MAIN_PARTITIONS))
    assert any(r[0] is None for r in ref) and any(r[1] is None for r in ref)
    assert any(r[7] and ("h", None) in r[7] for r in ref) and any(r[7] is None for r in ref)
    # The default schema (no headers), and a query that reads two columns only.
    _compare(spark, kbs, subscribe=topic)
    for fmt in ("kafka", JVM):
        df = _read(spark, fmt, kbs, assign=json.dumps({topic: [1, 3]}))
        assert df.groupBy("partition").count().orderBy("partition").collect() == [
            (1, MAIN_RECORDS // MAIN_PARTITIONS),
            (3, MAIN_RECORDS // MAIN_PARTITIONS),
        ], fmt
    # kafka.max.partition.fetch.bytes, small: Kafka cuts its answers in the middle of batches.
    _compare(spark, kbs, subscribe=topic, **{"kafka.max.partition.fetch.bytes": "700"})


def test_log_append_time_topic(spark, kafka, kbs):
    """LogAppendTime: Kafka stamps each batch's max timestamp (compressed batches too, without
    rewriting their records) and both formats must read that, as timestampType 1."""
    topic = topic_name("kafka-lat")
    create_topic(kbs, topic, 2, **{"message.timestamp.type": "LogAppendTime"})
    before = int(time.time() * 1000)
    # Repetitive values: librdkafka sends a batch uncompressed when compressing does not pay.
    recs = [
        Rec(b"value %02d " % i * 8, key=b"k%d" % i, partition=i % 2, timestamp=T0)
        for i in range(50)
    ]
    _produce(kbs, topic, recs[:25], **{"compression.type": "lz4"})
    _produce(kbs, topic, recs[25:])
    assert {b.codec for b in _batches_on_disk(kafka, topic)} == {0, 3}
    ref = _compare(spark, kbs, subscribe=topic, includeHeaders="true")
    assert len(ref) == 50
    assert {r[6] for r in ref} == {1}  # timestampType LogAppendTime, both formats
    assert all(r[5] >= before * 1000 for r in ref)  # the broker's time, not T0


# -- 2. offsets as JSON and timestamps -------------------------------------------------------------
def test_offsets_json_and_timestamps(spark, kbs, main):
    topic, _ = main
    per = MAIN_RECORDS // MAIN_PARTITIONS
    cases = [
        {
            "startingOffsets": json.dumps({topic: {"0": 10, "1": -2, "2": 333, "3": per}}),
            "endingOffsets": json.dumps({topic: {"0": 100, "1": 7, "2": -1, "3": per}}),
        },
        {
            "assign": json.dumps({topic: [0, 2]}),
            "startingOffsets": json.dumps({topic: {"0": 250, "2": -2}}),
            "endingOffsets": json.dumps({topic: {"0": -1, "2": 1}}),
            "minPartitions": "5",
        },
        {"startingTimestamp": str(T0 + 1001)},
        {"startingTimestamp": str(T0 + 400), "endingTimestamp": str(T0 + 1234)},
        {
            "startingOffsetsByTimestamp": json.dumps(
                {topic: {"0": T0, "1": T0 + 1800, "2": T0 + 3, "3": T0 + 1999}}
            ),
        },
    ]
    for options in cases:
        options = {"subscribe": topic, **options} if "assign" not in options else options
        ref = _compare(spark, kbs, includeHeaders="true", **options)
        assert ref, options
    # The first case, worked out: partition 0 from 10 to 100, partition 1 from 0 to 7, ...
    first = _read(spark, JVM, kbs, subscribe=topic, **cases[0]).select("partition", "offset")
    spans: dict[int, list[int]] = {}
    for r in first.collect():
        spans.setdefault(r.partition, []).append(r.offset)
    assert {p: sorted(o) for p, o in spans.items()} == {
        0: list(range(10, 100)),
        1: list(range(7)),
        2: list(range(333, per)),
    }
    # startingTimestamp T0 + 1001: record i = 1001 onwards, in every partition.
    ts = _read(spark, JVM, kbs, subscribe=topic, startingTimestamp=str(T0 + 1001))
    starts = {r.partition: r[1] for r in ts.groupBy("partition").min("offset").collect()}
    # (An intermittent failure read one partition from its start: say who answered what.)
    assert ts.count() == MAIN_RECORDS - 1001, (starts, _kafka_offsets_for_time(kbs, topic))


def _kafka_offsets_for_time(kbs: str, topic: str) -> dict[int, int]:
    """What Kafka answers confluent-kafka's offsets_for_times for T0 + 1001, per partition."""
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": kbs, "group.id": "jvm-on-kafka-times"})
    try:
        asked = [TopicPartition(topic, p, T0 + 1001) for p in range(MAIN_PARTITIONS)]
        return {tp.partition: tp.offset for tp in c.offsets_for_times(asked, timeout=15)}
    finally:
        c.close()


def test_log_start_moved_by_delete_records(spark, kafka, kbs):
    """Records deleted with DeleteRecords, the log start in the middle of a batch: earliest is
    the log start, and offsets before it are lost data (skipped with failOnDataLoss=false)."""
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import AdminClient

    topic = topic_name("kafka-deleted")
    create_topic(kbs, topic, 2)
    recs = [Rec(b"v%03d" % i, key=b"k%03d" % i, partition=i % 2) for i in range(400)]
    sent = _produce(kbs, topic, recs, **{"linger.ms": 50})
    admin = AdminClient({"bootstrap.servers": kbs})
    cut = {0: 51, 1: 120}
    futures = admin.delete_records([TopicPartition(topic, p, o) for p, o in cut.items()])
    for tp, f in futures.items():
        assert f.result(timeout=15).low_watermark == cut[tp.partition]
    # The new log start of partition 0 is inside a batch, whose first records are still stored.
    assert any(
        b.partition == 0 and b.base < cut[0] <= b.base + b.delta
        for b in _batches_on_disk(kafka, topic)
    )
    ref = _compare(spark, kbs, subscribe=topic, includeHeaders="true")
    assert ref == _expected([s for s in sent if s.offset >= cut[s.partition]])
    below = json.dumps({topic: {"0": 10, "1": -2}})
    _compare(spark, kbs, subscribe=topic, startingOffsets=below, failOnDataLoss="false")
    for fmt in ("kafka", JVM):
        with pytest.raises(Exception) as info:
            _read(spark, fmt, kbs, subscribe=topic, startingOffsets=below).collect()
        if fmt == JVM:
            assert "failOnDataLoss" in str(info.value), str(info.value)[:2000]


# -- 3. compressed batches and transactions --------------------------------------------------------
@pytest.mark.parametrize("codec", ["lz4", "zstd", "gzip", "snappy"])
def test_compressed_batches(spark, kafka, kbs, codec):
    topic = topic_name(f"kafka-{codec}")
    create_topic(kbs, topic, 3)
    recs = [
        Rec(
            (b"%s value %04d " % (codec.encode(), i)) * (1 + i % 7),
            key=None if i % 10 == 0 else b"k%04d" % i,
            partition=i % 3,
            timestamp=T0 + i,
            headers=(("n", b"%d" % i),) if i % 3 else None,
        )
        for i in range(600)
    ]
    sent = _produce(kbs, topic, recs, **{"compression.type": codec, "linger.ms": 50})
    # Kafka kept the producer's compressed batches, several records each. (A batch of one
    # short record may go uncompressed: librdkafka sends it as is when compressing saves
    # nothing, as it did on a loaded machine for the first record it sent.)
    codec_id = {"gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}[codec]
    batches = _batches_on_disk(kafka, topic)
    assert batches and {b.codec for b in batches if b.count > 1} == {codec_id}
    assert {b.codec for b in batches} <= {0, codec_id}
    assert max(b.count for b in batches) > 1
    ref = _compare(spark, kbs, subscribe=topic, includeHeaders="true")
    assert ref == _expected(sent)
    # Ranges that begin and end inside compressed batches, and answers cut mid-batch.
    inner = next(b for b in batches if b.partition == 1 and b.count >= 3)
    _compare(
        spark,
        kbs,
        subscribe=topic,
        startingOffsets=json.dumps({topic: {"0": 3, "1": inner.base + 1, "2": -2}}),
        endingOffsets=json.dumps({topic: {"0": -1, "1": inner.base + inner.delta, "2": 150}}),
        **{"kafka.max.partition.fetch.bytes": "512"},
    )


def test_transactional_topic_read_uncommitted(spark, kafka, kbs, txn):
    topic, committed, aborted = txn
    # The log holds the control batches (transaction markers) between the records.
    batches = _batches_on_disk(kafka, topic)
    markers = [(b.partition, b.base) for b in batches if b.control]
    assert len(markers) == 6 and all(b.transactional for b in batches)
    ends = end_offsets(kbs, topic)
    assert sum(ends.values()) == len(committed) + len(aborted) + len(markers)
    # format("kafka") reads read_uncommitted by default: the aborted records too, the markers
    # never. format("stratalog") returns the same rows.
    ref = _compare(spark, kbs, subscribe=topic, includeHeaders="true")
    assert ref == _expected(committed + aborted)
    assert any(r[7] == (("tx", b"a1"),) for r in ref)
    # Ranges that start, and end, at a marker: the first commit marker of each partition.
    first = {p: min(base for q, base in markers if q == p) for p in (0, 1)}
    _compare(
        spark,
        kbs,
        subscribe=topic,
        includeHeaders="true",
        startingOffsets=json.dumps({topic: {"0": first[0], "1": 0}}),
        endingOffsets=json.dumps({topic: {"0": -1, "1": first[1] + 1}}),
    )
    _compare(
        spark,
        kbs,
        subscribe=topic,
        startingOffsets=json.dumps({topic: {"0": first[0], "1": first[1]}}),
        endingOffsets=json.dumps({topic: {"0": first[0] + 1, "1": first[1] + 1}}),
    )
    # read_committed hides the aborted records, in both of Stratalog's readers as in
    # format("kafka").
    committed_only = {"kafka.isolation.level": "read_committed", "includeHeaders": "true"}
    ref = _rows(_read(spark, "kafka", kbs, subscribe=topic, **committed_only))
    assert ref == _expected(committed)
    for fmt in (JVM, "stratalog-python"):
        assert _rows(_read(spark, fmt, kbs, subscribe=topic, **committed_only)) == ref, fmt
    assert _rows(
        _read(spark, JVM, kbs, subscribe=topic, **{"kafka.isolation.level": "read_uncommitted"})
    ) == _rows(_read(spark, "kafka", kbs, subscribe=topic))


# -- 4. a streaming read ---------------------------------------------------------------------------
def test_stream_available_now(spark, kbs, main, txn, tmp_path: Path):
    topics = f"{main[0]},{txn[0]}"
    results = {}
    for fmt in ("kafka", JVM):
        name = f"jvm_on_kafka_{fmt}_{uuid.uuid4().hex[:6]}"
        query = (
            spark.readStream.format(fmt)
            .option("kafka.bootstrap.servers", kbs)
            .option("subscribe", topics)
            .option("startingOffsets", "earliest")
            .option("includeHeaders", "true")
            .option("maxOffsetsPerTrigger", "1000")
            .load()
            .writeStream.format("memory")
            .queryName(name)
            .option("checkpointLocation", str(tmp_path / fmt))
            .trigger(availableNow=True)
            .start()
        )
        try:
            assert query.awaitTermination(QUERY_TIMEOUT), f"{fmt}: the query did not finish"
        finally:
            if query.isActive:
                query.stop()
        assert query.exception() is None, query.exception()
        batches = [p for p in query.recentProgress if p["numInputRows"] > 0]
        assert len(batches) >= 2, f"{fmt}: maxOffsetsPerTrigger made {len(batches)} batch(es)"
        results[fmt] = _rows(spark.table(name))
        spark.catalog.dropTempView(name)
    assert results[JVM] == results["kafka"], _diff(results["kafka"], results[JVM])
    _, committed, aborted = txn
    assert len(results[JVM]) == MAIN_RECORDS + len(committed) + len(aborted)


# -- 5. a batch write ------------------------------------------------------------------------------
def test_batch_write_into_kafka(spark, kafka, kbs):
    from datetime import UTC, datetime

    from pyspark.sql.types import (
        ArrayType,
        BinaryType,
        IntegerType,
        StringType,
        StructField,
        StructType,
        TimestampType,
    )

    topic = topic_name("kafka-sink")
    create_topic(kbs, topic, 3)
    schema = StructType(
        [
            StructField("key", BinaryType()),
            StructField("value", BinaryType()),
            StructField("partition", IntegerType()),
            StructField(
                "headers",
                ArrayType(
                    StructType(
                        [StructField("key", StringType()), StructField("value", BinaryType())]
                    )
                ),
            ),
            StructField("timestamp", TimestampType()),
        ]
    )
    rows = []
    for i in range(300):
        key = None if i % 11 == 0 else b"k%03d" % i
        value = b"" if i % 13 == 0 else b"value-%03d" % i
        headers = [("h", b"%d" % i), ("n", None)] if i % 4 == 0 else None
        stamp = datetime.fromtimestamp((T0 + i * 1000) / 1000, UTC)
        rows.append((key, value, i % 3, headers, stamp))
    df = spark.createDataFrame(rows, schema).repartition(2)
    df.write.format(JVM).option("kafka.bootstrap.servers", kbs).option("topic", topic).mode(
        "append"
    ).save()

    def shape(key, value, partition, headers, ts_ms):
        hdrs = tuple((k, None if v is None else bytes(v)) for k, v in headers) if headers else None
        return (
            None if key is None else bytes(key),
            None if value is None else bytes(value),
            partition,
            hdrs,
            ts_ms,
        )

    want = sorted((shape(*r[:4], T0 + i * 1000) for i, r in enumerate(rows)), key=repr)
    assert sum(end_offsets(kbs, topic).values()) == len(rows)  # each row once
    # Kafka took the sink's idempotent batches: producer ids derived from the job and task
    # (never allocated by InitProducerId), each numbering its batches from sequence 0.
    batches = _batches_on_disk(kafka, topic)
    assert batches and all(b.producer_id >= 0 and not b.transactional for b in batches)
    for pid in {b.producer_id for b in batches}:
        for partition in range(3):
            mine = sorted(
                (b.base, b.base_sequence, b.count)
                for b in batches
                if b.producer_id == pid and b.partition == partition
            )
            sequences = [seq for _, seq, _ in mine]
            assert sequences == [sum(n for *_, n in mine[:i]) for i in range(len(mine))]
    read = consume_all(kbs, topic)
    got = sorted(
        (shape(s.key, s.value, s.partition, s.headers, s.timestamp) for s in read), key=repr
    )
    assert got == want
    back = (
        _read(spark, "kafka", kbs, subscribe=topic, includeHeaders="true")
        .selectExpr(
            "key", "value", "partition", "headers", "unix_millis(timestamp)", "timestampType"
        )
        .collect()
    )
    assert {r.timestampType for r in back} == {0}  # CreateTime, from the timestamp column
    assert sorted((shape(*_plain(r)[:5]) for r in back), key=repr) == want
