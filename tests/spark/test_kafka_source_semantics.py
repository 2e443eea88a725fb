"""Stratalog's Spark sources against Spark's own format("kafka") (spark-sql-kafka-0-10), one broker.

Spark's Kafka source is the specification: every test runs the same options through
format("kafka") first (the reference, on the same Stratalog broker) and then asserts that
format("stratalog-python") behaves the same. The Scala file each behaviour comes from is cited
(paths under connector/kafka-0-10-sql/src/main/scala/org/apache/spark/sql/kafka010/).
Deliberate differences are listed in docs/compatibility.md, under Spark.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from ..conftest import create_topic
from .conftest import Rec, finish, produce, topic_name, write_transactions

pytestmark = pytest.mark.spark

PY = "stratalog-python"  # the Python data source; "stratalog" is the JVM connector

# Recent enough to stay inside the broker's retention (records stamped years ago are dropped).
T0 = (int(time.time()) - 600) * 1000
QUERY_TIMEOUT = 90


# -- helpers ---------------------------------------------------------------------------------
def _read(spark, fmt: str, bootstrap: str, **options):
    r = spark.read.format(fmt).option("kafka.bootstrap.servers", bootstrap)
    for k, v in options.items():
        r = r.option(k, v)
    return r.load()


def _rows(df) -> list[tuple]:
    return sorted(
        (r.topic, r.partition, r.offset, r.key and bytes(r.key), r.value and bytes(r.value))
        for r in df.collect()
    )


def _kafka_error(spark, bootstrap: str, **options) -> str:
    """The reference: format("kafka") must fail with these options; its message."""
    with pytest.raises(Exception) as info:
        _read(spark, "kafka", bootstrap, **options).collect()
    return str(info.value)


def _stratalog_error(spark, bootstrap: str, **options) -> str:
    """format("stratalog-python") must fail with these options (as the reference does); its
    message."""
    with pytest.raises(Exception) as info:
        rows = _read(spark, PY, bootstrap, **options).collect()
        pytest.fail(f"format('stratalog-python') did not fail; it returned {len(rows)} rows")
    return str(info.value)


def _stream(spark, fmt: str, bootstrap: str, ckpt: Path, sink: Path | None = None, **options):
    """One availableNow run; returns the query (terminated) without raising its exception."""
    r = spark.readStream.format(fmt).option("kafka.bootstrap.servers", bootstrap)
    for k, v in options.items():
        r = r.option(k, v)
    w = r.load().selectExpr("topic", "partition", "offset", "value").writeStream
    w = w.format("parquet").option("path", str(sink)) if sink else w.format("noop")
    q = w.option("checkpointLocation", str(ckpt)).trigger(availableNow=True).start()
    finish(q, QUERY_TIMEOUT)
    return q


def _input_rows(q) -> list[int]:
    return [p.numInputRows for p in q.recentProgress]


def _checkpoint_offsets(ckpt: Path) -> dict[int, dict]:
    files = [f for f in (ckpt / "offsets").iterdir() if f.name.isdigit()]
    return {int(f.name): json.loads(f.read_text().splitlines()[-1]) for f in files}


@pytest.fixture(scope="module")
def base(spark_broker) -> str:
    """2 partitions x 10 records; record i is in partition i % 2, stamped T0 + i seconds."""
    name = topic_name("review")
    create_topic(spark_broker.bootstrap, name, 2)
    produce(
        spark_broker.bootstrap,
        name,
        [
            Rec(b"v%d" % i, key=b"k%d" % i, partition=i % 2, timestamp=T0 + i * 1000)
            for i in range(20)
        ],
    )
    return name


# -- 1. option handling: divergences -----------------------------------------------------------
def test_batch_start_offset_after_end_offset_fails(spark, bootstrap, base):
    # KafkaSourceProvider.checkOffsetLimitValidity: a specific start > specific end fails
    # (KafkaExceptions.unresolvedStartOffsetGreaterThanEndOffset).
    opts = {
        "subscribe": base,
        "startingOffsets": json.dumps({base: {"0": 8, "1": 2}}),
        "endingOffsets": json.dumps({base: {"0": 3, "1": 5}}),
    }
    assert "start offset 8 is greater than the end offset 3" in _kafka_error(
        spark, bootstrap, **opts
    )
    _stratalog_error(spark, bootstrap, **opts)


def test_batch_start_offset_beyond_the_end_fails(spark, bootstrap, base):
    # KafkaBatch: a resolved start past the resolved end (latest) fails
    # (KafkaExceptions.resolvedStartOffsetGreaterThanEndOffset), it is not read as empty.
    opts = {"subscribe": base, "startingOffsets": json.dumps({base: {"0": 100, "1": 2}})}
    assert "start offset 100 is greater than the resolved end offset 10" in _kafka_error(
        spark, bootstrap, **opts
    )
    _stratalog_error(spark, bootstrap, **opts)


def test_batch_ending_offset_beyond_the_end_fails(spark, bootstrap, base):
    # KafkaBatchPartitionReader / KafkaDataConsumer.get: offsets up to untilOffset must exist;
    # asking for 100 of a 10-record partition fails (OffsetOutOfRangeException), instead of
    # returning the 10 records that exist.
    opts = {"subscribe": base, "endingOffsets": json.dumps({base: {"0": 100, "1": -1}})}
    msg = _kafka_error(spark, bootstrap, **opts, **{"kafkaConsumer.pollTimeoutMs": "500"})
    assert "OffsetOutOfRange" in msg
    _stratalog_error(spark, bootstrap, **opts)


@pytest.mark.parametrize("extra", ["partition", "topic"])
def test_batch_starting_offsets_must_name_exactly_the_assigned_partitions(
    spark, bootstrap, base, extra
):
    # KafkaOffsetReaderAdmin.fetchPartitionOffsets (validateTopicPartitions) and KafkaBatch:
    # a partition or topic in startingOffsets that is not subscribed fails the query.
    spec = {base: {"0": 1, "1": 2}}
    if extra == "partition":
        spec[base]["5"] = 0
    else:
        spec["no-such-topic"] = {"0": 0}
    opts = {"subscribe": base, "startingOffsets": json.dumps(spec)}
    assert "don't match what are assigned" in _kafka_error(spark, bootstrap, **opts)
    _stratalog_error(spark, bootstrap, **opts)


def test_batch_start_timestamp_after_end_timestamp_fails(spark, bootstrap, base):
    # KafkaSourceProvider.checkOffsetLimitValidity: start timestamp > end timestamp fails
    # (KafkaExceptions.unresolvedStartTimestampGreaterThanEndTimestamp).
    opts = {
        "subscribe": base,
        "startingOffsetsByTimestamp": json.dumps({base: {"0": T0 + 10_000, "1": T0 + 10_000}}),
        "endingOffsetsByTimestamp": json.dumps({base: {"0": T0 + 2_000, "1": T0 + 2_000}}),
    }
    assert "is greater than the end timestamp" in _kafka_error(spark, bootstrap, **opts)
    _stratalog_error(spark, bootstrap, **opts)


def test_batch_starting_timestamp_wins_over_starting_offsets(spark, bootstrap, base):
    # KafkaSourceProvider.getKafkaOffsetRangeLimit: startingTimestamp > startingOffsetsByTimestamp
    # > startingOffsets, and validateBatchOptions only checks the one that wins, so
    # startingOffsets=latest beside startingTimestamp is ignored, not an error.
    opts = {"subscribe": base, "startingTimestamp": str(T0 + 10_000), "startingOffsets": "latest"}
    ref = _rows(_read(spark, "kafka", bootstrap, **opts))
    assert [(p, o) for _, p, o, _, _ in ref] == [(p, o) for p in (0, 1) for o in range(5, 10)]
    assert _rows(_read(spark, PY, bootstrap, **opts)) == ref


@pytest.mark.parametrize(
    ("partitions", "records", "min_partitions"),
    [(1, 5, 4), (2, 10, 3)],
    ids=["one-partition-5-records-min-4", "two-partitions-min-3"],
)
def test_min_partitions_gives_sparks_task_count(
    spark, bootstrap, partitions, records, min_partitions
):
    # KafkaOffsetRangeCalculator.getRanges: a range is cut into round(size / total * min)
    # parts of remaining / (parts - part) offsets each, so 5 offsets and minPartitions=4 are
    # 4 tasks (1, 1, 1, 2), not ceil-sized steps.
    topic = topic_name("minparts")
    create_topic(bootstrap, topic, partitions)
    produce(bootstrap, topic, [Rec(b"m%d" % i, partition=i % partitions) for i in range(records)])
    opts = {"subscribe": topic, "minPartitions": str(min_partitions)}
    ref = _read(spark, "kafka", bootstrap, **opts)
    got = _read(spark, PY, bootstrap, **opts)
    assert _rows(got) == _rows(ref)
    assert got.rdd.getNumPartitions() == ref.rdd.getNumPartitions()


def test_subscribe_pattern_is_trimmed(spark, bootstrap, base):
    # KafkaSourceProvider.strategy: SubscribePatternStrategy(value.trim()).
    opts = {"subscribePattern": f" {base} "}
    ref = _rows(_read(spark, "kafka", bootstrap, **opts))
    assert len(ref) == 20
    assert _rows(_read(spark, PY, bootstrap, **opts)) == ref


def test_unsupported_kafka_consumer_options_are_rejected(spark, bootstrap, base):
    # KafkaSourceProvider.validateGeneralOptions: kafka.auto.offset.reset (and key/value
    # deserializer, enable.auto.commit, interceptor.classes) fail with an explanation.
    opts = {"subscribe": base, "kafka.auto.offset.reset": "earliest"}
    assert "auto.offset.reset' is not supported" in _kafka_error(spark, bootstrap, **opts)
    assert "auto.offset.reset" in _stratalog_error(spark, bootstrap, **opts)


@pytest.fixture(scope="module")
def transactions(spark_broker) -> tuple[str, list, list]:
    # (timestamps of the last hour: older ones would be retention's to remove)
    return write_transactions(spark_broker.bootstrap, "txn", (int(time.time()) - 3600) * 1000)


@pytest.mark.parametrize("fmt", ["stratalog-python", "stratalog"])
def test_read_committed_leaves_aborted_transactions_out_as_the_kafka_source(
    spark, bootstrap, transactions, fmt
):
    # Spark's own Kafka source on Stratalog's transactional topic, and each of Stratalog's
    # readers, with read_committed: the committed records only (markers and aborted records are
    # offset gaps); read_uncommitted: the aborted ones too. The oracle is what the producer was
    # told.
    topic, committed, aborted = transactions
    want = {(s.partition, s.offset, s.value) for s in committed}
    every = want | {(s.partition, s.offset, s.value) for s in aborted}
    for level, expected in (("read_committed", want), ("read_uncommitted", every)):
        opts = {"subscribe": topic, "kafka.isolation.level": level}
        ref = _rows(_read(spark, "kafka", bootstrap, **opts))
        assert {(r[1], r[2], r[4]) for r in ref} == expected and len(ref) == len(expected)
        assert _rows(_read(spark, fmt, bootstrap, **opts)) == ref, level


@pytest.mark.parametrize("fmt", ["stratalog-python", "stratalog"])
def test_read_committed_where_nothing_is_transactional_reads_everything(
    spark, bootstrap, base, fmt
):
    # On a topic without transactions read_committed hides nothing. A value Kafka does not
    # know fails, naming the option.
    ref = _rows(_read(spark, "kafka", bootstrap, subscribe=base))
    committed = {"subscribe": base, "kafka.isolation.level": "read_committed"}
    assert _rows(_read(spark, "kafka", bootstrap, **committed)) == ref
    assert _rows(_read(spark, fmt, bootstrap, **committed)) == ref
    opts = {"subscribe": base, "kafka.isolation.level": "read_uncommitted"}
    assert _rows(_read(spark, fmt, bootstrap, **opts)) == ref
    with pytest.raises(Exception, match=r"isolation\.level' must be"):
        _read(spark, fmt, bootstrap, subscribe=base, **{"kafka.isolation.level": "dirty"}).collect()


def test_assign_of_a_missing_partition_fails_with_its_name(spark, bootstrap, base):
    # A deliberate difference (docs/compatibility.md): ConsumerStrategy.AssignStrategy does not
    # check partitions against the topic, so format("kafka") reads the others and nothing of
    # the missing one; format("stratalog-python") names the partition that does not exist.
    opts = {"assign": json.dumps({base: [0, 7]}), "fetchOffset.numRetries": "1"}
    assert len(_rows(_read(spark, "kafka", bootstrap, **opts))) == 10
    assert "no [7]" in _stratalog_error(spark, bootstrap, **opts)


# -- 2. streaming: divergences -----------------------------------------------------------------
# Both of Stratalog's streaming readers: the Python data source and the JVM one.
READERS = pytest.mark.parametrize("fmt", ["stratalog-python", "stratalog"])


@READERS
def test_a_read_committed_stream_stops_before_an_open_transaction(spark, bootstrap, tmp_path, fmt):
    # Streaming with read_committed: a batch ends at the last stable offset, so the records of
    # a transaction still open are read only by a batch after its commit; its marker is a gap.
    topic = topic_name("open-txn")
    create_topic(bootstrap, topic, 1)
    produce(bootstrap, topic, [Rec(b"plain%d" % i) for i in range(5)])
    txn = Producer({"bootstrap.servers": bootstrap, "transactional.id": topic, "linger.ms": 5})
    txn.init_transactions(30)
    txn.begin_transaction()
    for i in range(3):
        txn.produce(topic, b"txn%d" % i, partition=0)
    assert txn.flush(30) == 0
    opts = {"subscribe": topic, "startingOffsets": "earliest"}
    opts["kafka.isolation.level"] = "read_committed"
    values: dict[str, list] = {}
    for reader in ("kafka", fmt):
        out = tmp_path / f"{reader}-out"
        first = _stream(spark, reader, bootstrap, tmp_path / reader, out, **opts)
        assert first.exception() is None, first.exception()
        values[reader] = [sorted(r.value for r in spark.read.parquet(str(out)).collect())]
    txn.commit_transaction(30)
    for reader in ("kafka", fmt):
        out = tmp_path / f"{reader}-out"
        second = _stream(spark, reader, bootstrap, tmp_path / reader, out, **opts)
        assert second.exception() is None, second.exception()
        values[reader].append(sorted(r.value for r in spark.read.parquet(str(out)).collect()))
    plain = [b"plain%d" % i for i in range(5)]
    assert values["kafka"] == [plain, sorted(plain + [b"txn%d" % i for i in range(3)])]
    assert values[fmt] == values["kafka"]


@READERS
def test_stream_start_beyond_the_end_fails_on_data_loss(spark, bootstrap, base, tmp_path, fmt):
    # KafkaOffsetReaderAdmin.getOffsetRangesFromResolvedOffsets: untilOffset < fromOffset is
    # reportDataLoss ("Partition ...'s offset was changed from 100 to 10"), which fails the
    # query while failOnDataLoss=true (the default), in KafkaMicroBatchStream.
    opts = {"subscribe": base, "startingOffsets": json.dumps({base: {"0": 100, "1": 0}})}
    ref = _stream(spark, "kafka", bootstrap, tmp_path / "k", **opts)
    assert ref.exception() is not None
    assert "Some data may have been lost" in str(ref.exception())
    got = _stream(spark, fmt, bootstrap, tmp_path / "s", **opts)
    assert got.exception() is not None, f"no failure; rows per batch {_input_rows(got)}"
    assert "data may have been lost" in str(got.exception())


@READERS
def test_stream_start_beyond_the_end_without_fail_on_data_loss_resumes_at_the_end(
    spark, bootstrap, tmp_path, fmt
):
    # Same path with failOnDataLoss=false: the negative range is dropped and the next batch
    # starts at the partition's real end, so records produced after it are read.
    topic = topic_name("reset")
    create_topic(bootstrap, topic, 1)
    produce(bootstrap, topic, [Rec(b"old%d" % i) for i in range(5)])
    opts = {
        "subscribe": topic,
        "startingOffsets": json.dumps({topic: {"0": 50}}),
        "failOnDataLoss": "false",
    }
    result = {}
    for reader in ("kafka", fmt):
        ckpt = tmp_path / reader
        first = _stream(spark, reader, bootstrap, ckpt, **opts)
        assert first.exception() is None, first.exception()
        produce(bootstrap, topic, [Rec(b"new%d" % i) for i in range(3)])
        second = _stream(spark, reader, bootstrap, ckpt, **opts)
        assert second.exception() is None, second.exception()
        result[reader] = sum(_input_rows(second))
    assert result["kafka"] == 3
    assert result[fmt] == result["kafka"], result


def test_stream_start_log_is_kept_out_of_pattern_subscriptions(spark, spark_broker, tmp_path):
    # A deliberate difference (docs/compatibility.md): Spark's Kafka source keeps a query's
    # initial offsets in its checkpoint (sources/0/0); a Python data source cannot reach the
    # checkpoint, so format("stratalog-python") logs them in a topic of the broker. That topic
    # must not show up in anyone's pattern subscription.
    from stratalog.spark.planning import START_LOG_TOPIC

    bootstrap = spark_broker.bootstrap
    topic = topic_name("startlog")
    create_topic(bootstrap, topic, 1)
    produce(bootstrap, topic, [Rec(b"r")])
    q = _stream(spark, PY, bootstrap, tmp_path / "s", subscribe=topic)
    assert q.exception() is None, q.exception()
    admin = AdminClient({"bootstrap.servers": bootstrap})
    assert START_LOG_TOPIC in set(admin.list_topics(timeout=15).topics)
    topics = {r.topic for r in _read(spark, PY, bootstrap, subscribePattern=".*").collect()}
    assert topic in topics and START_LOG_TOPIC not in topics


# -- regression tests: behaviours that already match ---------------------------------------------
def test_option_names_and_keywords_are_case_insensitive(spark, bootstrap, base):
    # KafkaSourceProvider: CaseInsensitiveMap of options; getKafkaOffsetRangeLimit lower-cases
    # "earliest"/"latest".
    opts = {
        "SUBSCRIBE": base,
        "StartingOffsets": "EARLIEST",
        "ENDINGOFFSETS": json.dumps({base: {"0": 4, "1": -1}}),
        "INCLUDEHEADERS": "True",
        "MinPartitions": "1",
    }
    ref = _read(spark, "kafka", bootstrap, **opts)
    got = _read(spark, PY, bootstrap, **opts)
    assert got.schema == ref.schema
    assert len(_rows(ref)) == 14
    assert _rows(got) == _rows(ref)


def test_subscribe_several_topics_pattern_and_assign_match_kafka(spark, bootstrap):
    # ConsumerStrategy: SubscribeStrategy (comma list, trimmed), SubscribePatternStrategy
    # (found anywhere in a name: Regex.findFirstIn), AssignStrategy (JSON of topic ->
    # partitions).
    prefix = topic_name("multi")
    a, b = f"{prefix}-a", f"{prefix}-b"
    create_topic(bootstrap, a, 2)
    create_topic(bootstrap, b, 3)
    produce(bootstrap, a, [Rec(b"a%d" % i, partition=i % 2) for i in range(6)])
    produce(bootstrap, b, [Rec(b"b%d" % i, partition=i % 3) for i in range(9)])
    cases = [
        {"subscribe": f" {a} , {b},"},
        {"subscribePattern": f"{prefix}-.*"},
        {"assign": json.dumps({a: [1], b: [0, 2]})},
        {
            "subscribe": f"{a},{b}",
            "startingOffsets": json.dumps({a: {"0": 1, "1": -2}, b: {"0": -2, "1": 2, "2": 1}}),
            "endingOffsets": json.dumps({a: {"0": -1, "1": 2}, b: {"0": 2, "1": -1, "2": 3}}),
        },
    ]
    for opts in cases:
        ref = _rows(_read(spark, "kafka", bootstrap, **opts))
        assert ref, opts
        assert _rows(_read(spark, PY, bootstrap, **opts)) == ref, opts


@pytest.mark.parametrize("fmt", [PY, "stratalog"])
def test_subscribe_pattern_leaves_out_internal_topics_like_kafka(spark, bootstrap, base, fmt):
    # SubscribePatternStrategy: the topics the admin client lists (listTopics(), internal ones
    # left out), so a pattern never reads __consumer_offsets, which a group's commit created.
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"{base}-g"})
    try:
        c.commit(offsets=[TopicPartition(base, 0, 1)], asynchronous=False)
    finally:
        c.close()
    assert (
        "__consumer_offsets"
        in AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=15).topics
    )
    for pattern in ("__consumer_offsets", f"^__consumer_off|^{base}$"):
        opts = {"subscribePattern": pattern}
        ref = _rows(_read(spark, "kafka", bootstrap, **opts))
        assert all(t == base for t, *_ in ref), pattern
        assert _rows(_read(spark, fmt, bootstrap, **opts)) == ref, pattern


def test_timestamp_options_match_kafka(spark, bootstrap, base):
    # KafkaOffsetReaderAdmin.readTimestampOffsets: a timestamp is ListOffsets(forTimestamp);
    # no match is latest for an end, an error (or latest with the strategy) for a start.
    cases = [
        {"startingOffsetsByTimestamp": json.dumps({base: {"0": -2, "1": T0 + 11_000}})},
        {"endingTimestamp": str(T0 + 10**9)},
        {"startingTimestamp": str(T0 + 3_000), "endingTimestamp": str(T0 + 15_000)},
        {"startingTimestamp": str(T0 + 10**9), "startingOffsetsByTimestampStrategy": "latest"},
    ]
    for opts in cases:
        ref = _rows(_read(spark, "kafka", bootstrap, subscribe=base, **opts))
        assert _rows(_read(spark, PY, bootstrap, subscribe=base, **opts)) == ref, opts
    opts = {"subscribe": base, "startingTimestamp": str(T0 + 10**9)}
    assert "No offset matched" in _kafka_error(spark, bootstrap, **opts)
    _stratalog_error(spark, bootstrap, **opts)


def test_more_than_one_strategy_fails_like_kafka(spark, bootstrap, base):
    # KafkaSourceProvider.validateGeneralOptions: only one of subscribe, subscribepattern, assign.
    opts = {"subscribe": base, "subscribePattern": base}
    assert "Only one of the following options" in _kafka_error(spark, bootstrap, **opts)
    with pytest.raises(Exception, match="exactly one of"):
        _read(spark, PY, bootstrap, **opts).collect()


def test_null_and_empty_keys_values_and_headers_match_kafka(spark, bootstrap):
    # KafkaRecordToRowConverter: null key/value stay null, empty stay empty; headers are null
    # when a record has none, and keep order, duplicates and null values.
    topic = topic_name("nulls")
    create_topic(bootstrap, topic, 1)
    p = Producer({"bootstrap.servers": bootstrap})
    p.produce(topic, value=None, key=None)
    p.produce(topic, value=b"", key=b"")
    p.produce(topic, value=b"a", key=None)
    p.produce(topic, value=None, key=b"k")
    p.produce(topic, value=b"h", headers=[("", b""), ("x", None), ("x", b"2")])
    assert p.flush(15) == 0

    def load(fmt):
        df = _read(spark, fmt, bootstrap, subscribe=topic, includeHeaders="true")
        return df.schema, [tuple(r) for r in df.orderBy("offset").collect()]

    ref = load("kafka")
    assert ref[1][1][:2] == (bytearray(b""), bytearray(b""))
    assert load("stratalog-python") == ref


def test_log_append_time_and_compressed_batches_match_kafka(spark, bootstrap):
    # KafkaRecordToRowConverter: timestampType is the batch's (1 = LogAppendTime).
    topic = topic_name("lat")
    create_topic(bootstrap, topic, 1, **{"message.timestamp.type": "LogAppendTime"})
    produce(bootstrap, topic, [Rec(b"l", timestamp=T0)])
    cols = ["offset", "timestamp", "timestampType"]
    ref = _read(spark, "kafka", bootstrap, subscribe=topic).select(*cols).collect()
    assert ref[0].timestampType == 1
    assert _read(spark, PY, bootstrap, subscribe=topic).select(*cols).collect() == ref
    for codec in ("gzip", "zstd"):
        topic = topic_name(codec)
        create_topic(bootstrap, topic, 1)
        p = Producer({"bootstrap.servers": bootstrap, "compression.type": codec, "linger.ms": 20})
        for i in range(50):
            p.produce(
                topic, b"v%d" % i, b"k" if i % 3 == 0 else None, headers=[("h", b"1")] * (i % 2)
            )
        assert p.flush(15) == 0
        for headers in ("false", "true"):
            got = {
                fmt: sorted(
                    map(
                        repr,
                        _read(
                            spark, fmt, bootstrap, subscribe=topic, includeHeaders=headers
                        ).collect(),
                    )
                )
                for fmt in ("kafka", "stratalog-python")
            }
            assert len(got["kafka"]) == 50
            assert got["stratalog-python"] == got["kafka"], (codec, headers)


@READERS
def test_max_offsets_per_trigger_batches_and_checkpoint_offsets_match_kafka(
    spark, bootstrap, tmp_path, fmt
):
    # KafkaMicroBatchStream.rateLimit (prorated, floor, ceil below one) under
    # Trigger.AvailableNow, and KafkaSourceOffset's JSON {"topic": {"partition": offset}}.
    topic = topic_name("rate")
    create_topic(bootstrap, topic, 3)
    produce(bootstrap, topic, [Rec(b"v%d" % i, partition=i % 3) for i in range(30)])
    opts = {"subscribe": topic, "startingOffsets": "earliest", "maxOffsetsPerTrigger": "7"}
    batches, offsets = {}, {}
    for reader in ("kafka", fmt):
        q = _stream(spark, reader, bootstrap, tmp_path / reader, **opts)
        assert q.exception() is None, q.exception()
        batches[reader] = _input_rows(q)
        offsets[reader] = _checkpoint_offsets(tmp_path / reader)
    assert batches["kafka"] == [6, 6, 6, 6, 6]
    assert batches[fmt] == batches["kafka"]
    assert offsets[fmt] == offsets["kafka"]


@READERS
def test_kafka_checkpoint_restarts_with_stratalog(spark, bootstrap, tmp_path, fmt):
    # Switching format("kafka") to format("stratalog-python") on a running query's checkpoint:
    # KafkaSourceOffset JSON is read back as this source's start, no record twice or lost.
    topic = topic_name("switch")
    create_topic(bootstrap, topic, 3)
    produce(bootstrap, topic, [Rec(b"a%d" % i, partition=i % 3) for i in range(30)])
    ckpt, sink = tmp_path / "ckpt", tmp_path / "out"
    opts = {"subscribe": topic, "startingOffsets": "earliest"}
    q = _stream(spark, "kafka", bootstrap, ckpt, sink, **opts)
    assert q.exception() is None, q.exception()
    produce(bootstrap, topic, [Rec(b"b%d" % i, partition=i % 3) for i in range(9)])
    q = _stream(spark, fmt, bootstrap, ckpt, sink, **opts)
    assert q.exception() is None, q.exception()
    assert sum(_input_rows(q)) == 9
    rows = [(r.partition, r.offset) for r in spark.read.parquet(str(sink)).collect()]
    assert sorted(rows) == [(p, o) for p in range(3) for o in range(13)]


@READERS
def test_a_restart_before_the_first_batch_keeps_the_first_start(spark, bootstrap, tmp_path, fmt):
    # KafkaMicroBatchStream.getOrCreateInitialPartitionOffsets: the resolved starting offsets
    # are written to the checkpoint before any batch, so startingOffsets=latest means the end
    # when the query first started, not when it restarted.
    topic = topic_name("first-start")
    create_topic(bootstrap, topic, 1)
    produce(bootstrap, topic, [Rec(b"before%d" % i) for i in range(5)])
    got = {}
    for reader in ("kafka", fmt):
        ckpt = tmp_path / reader
        first = _stream(spark, reader, bootstrap, ckpt, subscribe=topic)
        assert first.exception() is None, first.exception()
        assert sum(_input_rows(first)) == 0
        produce(bootstrap, topic, [Rec(b"after-%s-%d" % (reader.encode(), i)) for i in range(3)])
        second = _stream(spark, reader, bootstrap, ckpt, subscribe=topic)
        assert second.exception() is None, second.exception()
        got[reader] = sum(_input_rows(second))
    assert got["kafka"] == 3
    assert got[fmt] == got["kafka"], got
