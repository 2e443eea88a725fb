"""format("stratalog") against Spark's own format("kafka") (spark-sql-kafka-0-10) on one broker.

The JVM reader takes the Kafka source's options and schema, so Spark's Kafka source is the
specification: every scenario runs the same options through format("kafka") (the reference,
on the same Stratalog broker) and through format("stratalog"), and compares what Spark
returns: the schema, every row (key, value, topic, partition, offset, timestamp in
microseconds, timestampType, headers), the number of planned partitions where minPartitions
or offset ranges decide it, and failures (both must fail; the JVM reader's message must name
the problem). (Streaming reads are compared in test_stream_read.py and
test_kafka_source_semantics.py, writes in test_kafka_sink_semantics.py, for both connectors.)
"""

from __future__ import annotations

import json
import time

import pytest
from confluent_kafka import Producer

from stratalog.client.wire import WireClient
from stratalog.spark.planning import START_LOG_TOPIC, StartLog, options_key

from ..conftest import create_topic
from .conftest import Rec, Sent, produce, topic_name

pytestmark = pytest.mark.spark

JVM = "stratalog"
# Recent enough to stay inside the broker's retention (records stamped years ago are dropped).
T0 = (int(time.time()) - 600) * 1000
# Spark's Kafka source retries a failed offset lookup 3 times, 1 s apart, and waits
# kafkaConsumer.pollTimeoutMs (120 s) for offsets that do not exist: keep its failures short.
# format("stratalog") ignores the fetchOffset options.
FAST = {
    "fetchOffset.numRetries": "1",
    "fetchOffset.retryIntervalMs": "10",
    "kafkaConsumer.pollTimeoutMs": "500",
}


# -- helpers ---------------------------------------------------------------------------------
def _read(spark, fmt: str, bootstrap: str, **options):
    r = spark.read.format(fmt).option("kafka.bootstrap.servers", bootstrap)
    for k, v in options.items():
        r = r.option(k, v)
    return r.load()


def _plain(v):
    """Row values as hashable Python values (bytes, tuples)."""
    if isinstance(v, bytes | bytearray):
        return bytes(v)
    if isinstance(v, tuple | list):  # Row is a tuple
        return tuple(_plain(x) for x in v)
    return v


def _rows(df) -> list[tuple]:
    """Every row, timestamps as microseconds since the epoch, in a stable order."""
    from pyspark.sql import functions as F

    if any(t == "timestamp" for _, t in df.dtypes):
        df = df.select(
            *[
                F.unix_micros(F.col(f"`{c}`")).alias(c) if t == "timestamp" else F.col(f"`{c}`")
                for c, t in df.dtypes
            ]
        )
    return sorted((_plain(r) for r in df.collect()), key=repr)


def _diff(ref: list[tuple], got: list[tuple]) -> str:
    only_ref = [r for r in ref if r not in got]
    only_got = [r for r in got if r not in ref]
    return (
        f"kafka {len(ref)} rows, stratalog {len(got)} rows; only in kafka (first 5): "
        f"{only_ref[:5]}; only in stratalog (first 5): {only_got[:5]}"
    )


def _compare(spark, bootstrap: str, query=None, **options) -> list[tuple]:
    """Runs ``query`` (default: the whole DataFrame) over both formats with the same options;
    asserts the same schema and rows; returns the reference rows."""
    ref_df = _read(spark, "kafka", bootstrap, **options)
    got_df = _read(spark, JVM, bootstrap, **options)
    if query is not None:
        ref_df, got_df = query(ref_df), query(got_df)
    assert got_df.schema == ref_df.schema, options
    ref, got = _rows(ref_df), _rows(got_df)
    assert got == ref, f"{options}: {_diff(ref, got)}"
    return ref


def _tasks(spark, bootstrap: str, **options) -> tuple[int, int]:
    """The number of partitions (tasks) each format plans: (kafka, stratalog)."""
    return tuple(
        _read(spark, fmt, bootstrap, **options).rdd.getNumPartitions() for fmt in ("kafka", JVM)
    )


def _errors(spark, bootstrap: str, **options) -> tuple[str, str]:
    """Both formats must fail with these options; their messages (kafka, stratalog)."""
    msgs = []
    for fmt in ("kafka", JVM):
        with pytest.raises(Exception) as info:
            rows = _read(spark, fmt, bootstrap, **FAST, **options).collect()
            pytest.fail(f"format({fmt!r}) did not fail with {options}; it read {len(rows)} rows")
        msgs.append(str(info.value))
    return msgs[0], msgs[1]


def _expected(sent: list[Sent], headers: bool = True) -> list[tuple]:
    """Produced records in the shape _rows gives for the source's full schema."""
    rows = []
    for s in sent:
        row = (s.key, s.value, s.topic, s.partition, s.offset, s.timestamp * 1000, 0)
        rows.append((*row, s.headers) if headers else row)
    return sorted(rows, key=repr)


def _produce_with(bootstrap: str, topic: str, config: dict, records: list[Rec]) -> None:
    """Produce with extra producer settings (compression), batched by linger.ms."""
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 50, **config})
    for r in records:
        p.produce(
            topic,
            r.value,
            r.key,
            partition=r.partition,
            headers=list(r.headers) if r.headers else None,
        )
    assert p.flush(30) == 0


# -- data ------------------------------------------------------------------------------------
MAIN_PARTITIONS = 3
MAIN_RECORDS = 36  # record i: partition i % 3, offset i // 3, CreateTime T0 + i seconds


def _main_records() -> list[Rec]:
    """Keys and null keys, null and empty values, binary bytes, headers (repeated names, null
    and empty ones) on some records and none on others, explicit timestamps."""
    out = []
    for i in range(MAIN_RECORDS):
        key = None if i % 5 == 2 else b"k%02d" % i
        if i % 7 == 3:
            value = None
        elif i % 11 == 4:
            value = b""
        else:
            value = b"v%02d-" % i + bytes([i, 0, 255 - i])
        headers = None
        if i % 5 == 1:
            headers = (("h", b"%d" % i),)
        elif i % 4 == 0:
            headers = (("h", b"1"), ("h", None), ("", b""))
        out.append(
            Rec(
                value,
                key=key,
                partition=i % MAIN_PARTITIONS,
                timestamp=T0 + i * 1000,
                headers=headers,
            )
        )
    return out


@pytest.fixture(scope="module")
def main(spark_broker) -> tuple[str, list[Sent]]:
    bootstrap = spark_broker.bootstrap
    name = topic_name("jvm-main")
    create_topic(bootstrap, name, MAIN_PARTITIONS)
    return name, produce(bootstrap, name, _main_records())


def _ts(partition: int, offset: int) -> int:
    """The CreateTime of a record of the main topic."""
    return T0 + (offset * MAIN_PARTITIONS + partition) * 1000


# -- plain reads -------------------------------------------------------------------------------
def test_plain_read_matches_kafka_and_what_was_produced(spark, bootstrap, main):
    topic, sent = main
    opts = {"subscribe": topic, "includeHeaders": "true"}
    ref = _compare(spark, bootstrap, **opts)
    assert ref == _expected(sent)
    # What the comparison covers: nulls, no headers as null, CreateTime, all offsets.
    assert any(r[0] is None for r in ref) and any(r[1] is None for r in ref)
    assert any(r[1] == b"" for r in ref)
    assert any(r[7] is None for r in ref) and any(r[7] and ("h", None) in r[7] for r in ref)
    assert {r[6] for r in ref} == {0}
    assert _tasks(spark, bootstrap, **opts) == (MAIN_PARTITIONS, MAIN_PARTITIONS)
    # The default (no includeHeaders) has no headers column; explicit earliest/latest too.
    ref = _compare(
        spark, bootstrap, subscribe=topic, startingOffsets="earliest", endingOffsets="latest"
    )
    assert ref == _expected(sent, headers=False)
    names = [f.name for f in _read(spark, JVM, bootstrap, subscribe=topic).schema.fields]
    assert names == ["key", "value", "topic", "partition", "offset", "timestamp", "timestampType"]


@pytest.mark.parametrize(
    ("codec", "topic_config"),
    [
        ("gzip", {}),
        ("snappy", {}),
        ("lz4", {}),
        ("zstd", {}),
        ("zstd", {"message.timestamp.type": "LogAppendTime"}),
    ],
    ids=["gzip", "snappy", "lz4", "zstd", "zstd-log-append-time"],
)
def test_compressed_batches_match_kafka(spark, bootstrap, codec, topic_config):
    # Batches of many records (linger.ms=50), compressed by librdkafka; then a read that starts
    # and ends inside batches, with minPartitions cutting through them.
    topic = topic_name(f"jvm-{codec}")
    create_topic(bootstrap, topic, 2, **topic_config)
    n = 300
    records = [
        Rec(
            b"value-%05d-" % i + b"abc" * (i % 40),
            key=None if i % 4 == 0 else b"key-%d" % (i % 10),
            partition=i % 2,
            headers=(("h", b"%d" % i), ("z", None)) if i % 3 == 0 else None,
        )
        for i in range(n)
    ]
    _produce_with(bootstrap, topic, {"compression.type": codec}, records)
    ref = _compare(spark, bootstrap, subscribe=topic, includeHeaders="true")
    assert len(ref) == n
    assert sorted(r[1] for r in ref) == sorted(r.value for r in records)
    assert {r[6] for r in ref} == ({1} if topic_config else {0})  # LogAppendTime is 1
    opts = {
        "subscribe": topic,
        "includeHeaders": "true",
        "startingOffsets": json.dumps({topic: {"0": 7, "1": -2}}),
        "endingOffsets": json.dumps({topic: {"0": 143, "1": -1}}),
        "minPartitions": "7",
    }
    assert len(_compare(spark, bootstrap, **opts)) == (143 - 7) + n // 2


# -- offsets, timestamps, subscriptions --------------------------------------------------------
def test_offsets_json_with_earliest_and_latest_match_kafka(spark, bootstrap, main):
    topic, _ = main
    cases = [
        {
            "startingOffsets": json.dumps({topic: {"0": -2, "1": 3, "2": 11}}),
            "endingOffsets": json.dumps({topic: {"0": 5, "1": -1, "2": 12}}),
        },
        {
            "startingOffsets": "earliest",
            "endingOffsets": json.dumps({topic: {"0": 2, "1": 1, "2": 1}}),
        },
        {"startingOffsets": json.dumps({topic: {"0": 10, "1": -2, "2": 11}})},
        # An empty range (4 to 4) in one partition.
        {
            "startingOffsets": json.dumps({topic: {"0": 4, "1": 4, "2": 4}}),
            "endingOffsets": json.dumps({topic: {"0": 4, "1": 6, "2": -1}}),
        },
        # Every range empty.
        {"startingOffsets": json.dumps({topic: {"0": 12, "1": 12, "2": 12}})},
    ]
    sizes = [len(_compare(spark, bootstrap, subscribe=topic, **opts)) for opts in cases]
    assert sizes == [5 + 9 + 1, 2 + 1 + 1, 2 + 12 + 1, 0 + 2 + 8, 0]
    # KafkaOffsetReaderAdmin.getOffsetRangesFromUnresolvedOffsets: without minPartitions there
    # is one task per assigned partition, empty or not.
    tasks = [_tasks(spark, bootstrap, subscribe=topic, **opts) for opts in cases]
    assert [j for _, j in tasks] == [k for k, _ in tasks], f"(kafka, stratalog): {tasks}"


def test_timestamp_options_match_kafka(spark, bootstrap, main):
    # ListOffsets by timestamp: the first offset stamped at or after it; for an end no match is
    # latest, for a start it fails unless startingOffsetsByTimestampStrategy=latest.
    # startingTimestamp > startingOffsetsByTimestamp > startingOffsets (and so for the end).
    topic, _ = main
    never = T0 + 10**9
    cases = [
        {"startingTimestamp": str(T0 + 10_000)},
        {"startingTimestamp": str(T0 + 5_000), "endingTimestamp": str(T0 + 30_000)},
        {"endingTimestamp": str(never)},
        {
            "startingOffsetsByTimestamp": json.dumps(
                {topic: {"0": _ts(0, 3), "1": -2, "2": never}}
            ),
            "startingOffsetsByTimestampStrategy": "latest",
        },
        {"endingOffsetsByTimestamp": json.dumps({topic: {"0": _ts(0, 4), "1": never, "2": T0}})},
        {
            "startingOffsetsByTimestamp": json.dumps(
                {topic: {"0": _ts(0, 2), "1": _ts(1, 5), "2": T0}}
            ),
            "endingOffsetsByTimestamp": json.dumps(
                {topic: {"0": _ts(0, 9), "1": _ts(1, 5), "2": never}}
            ),
        },
        {"startingTimestamp": str(never), "startingOffsetsByTimestampStrategy": "LATEST"},
        # A timestamp wins over startingOffsets/endingOffsets, which are then not checked.
        {"startingTimestamp": str(T0 + 6_000), "startingOffsets": "latest"},
        {"endingTimestamp": str(T0 + 9_000), "endingOffsets": "earliest"},
    ]
    got = []
    for opts in cases:
        got.append(
            sorted((r[3], r[4]) for r in _compare(spark, bootstrap, subscribe=topic, **opts))
        )
    # Spot checks that the cases mean what they say.
    everything = [(p, o) for p in range(MAIN_PARTITIONS) for o in range(12)]
    assert got[0] == [(p, o) for p, o in everything if _ts(p, o) >= T0 + 10_000]
    assert got[2] == everything
    assert got[3] == [(0, o) for o in range(3, 12)] + [(1, o) for o in range(12)]
    assert got[4] == [(0, o) for o in range(4)] + [(1, o) for o in range(12)]
    assert got[5] == [(0, o) for o in range(2, 9)] + [(2, o) for o in range(12)]
    assert got[6] == []
    assert got[7] == [(p, o) for p, o in everything if _ts(p, o) >= T0 + 6_000]


@pytest.fixture(scope="module")
def subs(spark_broker) -> str:
    """Topics <prefix>-a (2 partitions, 8 records), <prefix>-b (3, 9) and x<prefix>-a-old (1, 1)."""
    bootstrap = spark_broker.bootstrap
    prefix = topic_name("jvm-sub")
    a, b, other = f"{prefix}-a", f"{prefix}-b", f"x{prefix}-a-old"
    create_topic(bootstrap, a, 2)
    create_topic(bootstrap, b, 3)
    create_topic(bootstrap, other, 1)
    produce(bootstrap, a, [Rec(b"a%d" % i, key=b"%d" % i, partition=i % 2) for i in range(8)])
    produce(bootstrap, b, [Rec(b"b%d" % i, partition=i % 3) for i in range(9)])
    produce(bootstrap, other, [Rec(b"not me")])
    return prefix


def test_assign_and_subscribe_match_kafka(spark, bootstrap, subs):
    a, b = f"{subs}-a", f"{subs}-b"
    cases = [
        ({"subscribe": f" {a} , {b},"}, 17),
        ({"subscribePattern": f" ^{subs}-.* "}, 17),
        ({"assign": json.dumps({a: [1], b: [0, 2]})}, 4 + 3 + 3),
        (
            {
                "assign": json.dumps({a: [0], b: [1, 2]}),
                "startingOffsets": json.dumps({a: {"0": 1}, b: {"1": -2, "2": 2}}),
                "endingOffsets": json.dumps({a: {"0": -1}, b: {"1": 2, "2": -1}}),
            },
            3 + 2 + 1,
        ),
    ]
    for opts, n in cases:
        ref = _compare(spark, bootstrap, includeHeaders="true", **opts)
        assert len(ref) == n, opts
        assert {r[2] for r in ref} == {a, b}, opts


def test_subscribe_pattern_selects_the_topics_kafka_selects(spark, bootstrap, subs):
    # SubscribePatternStrategy.assignedTopicPartitions (admin): the topics listed by the admin
    # client whose name the pattern is *found* in (Regex.findFirstIn), so "<prefix>-a" also
    # selects "x<prefix>-a-old".
    for pattern in (f"{subs}-.*", f"{subs}-a"):
        ref = _compare(spark, bootstrap, subscribePattern=pattern)
        assert f"{subs}-a" in {r[2] for r in ref}, pattern


def test_patterns_never_match_the_start_log_topic(spark, bootstrap):
    # A deliberate difference (docs/compatibility.md): format("stratalog-python") streaming queries
    # log their starts in __stratalog_spark_starts, which pattern subscriptions never match;
    # format("kafka") sees it as any other topic.
    topic = topic_name("jvm-startlog")
    create_topic(bootstrap, topic, 1)
    produce(bootstrap, topic, [Rec(b"r%d" % i) for i in range(3)])
    # What a format("stratalog-python") streaming query over the topic logs when it starts.
    with WireClient(bootstrap) as client:
        StartLog(client, options_key({"subscribe": topic})).record_start({topic: {0: 0}})
    opts = {"subscribePattern": f"^({topic}|{START_LOG_TOPIC})$"}
    ref = _rows(_read(spark, "kafka", bootstrap, **opts))
    assert START_LOG_TOPIC in {r[2] for r in ref}
    got = _rows(_read(spark, JVM, bootstrap, **opts))
    assert got == [r for r in ref if r[2] != START_LOG_TOPIC]
    assert len(got) == 3
    # Named explicitly, it is read like any topic.
    assert _rows(_read(spark, JVM, bootstrap, subscribe=START_LOG_TOPIC))


# -- minPartitions and column pruning ----------------------------------------------------------
def test_min_partitions_plans_sparks_tasks(spark, bootstrap):
    # KafkaOffsetRangeCalculator: ranges are cut in proportion to their size (rounded), small
    # ones stay whole; with as many ranges as minPartitions nothing is cut.
    one = topic_name("jvm-min1")
    create_topic(bootstrap, one, 1)
    produce(bootstrap, one, [Rec(b"m%d" % i) for i in range(5)])
    uneven = topic_name("jvm-min3")
    create_topic(bootstrap, uneven, 3)
    produce(bootstrap, uneven, [Rec(b"u%d" % i, partition=0) for i in range(50)])
    produce(bootstrap, uneven, [Rec(b"u%d" % i, partition=1) for i in range(7)])
    produce(bootstrap, uneven, [Rec(b"u%d" % i, partition=2) for i in range(1)])
    cases = [
        ({"subscribe": one, "minPartitions": "4"}, 5),
        ({"subscribe": uneven, "minPartitions": "5"}, 58),
        ({"subscribe": uneven, "minPartitions": "12"}, 58),
        ({"subscribe": uneven, "minPartitions": "2"}, 58),
        (
            {
                "subscribe": uneven,
                "minPartitions": "6",
                "startingOffsets": json.dumps({uneven: {"0": 40, "1": 0, "2": -2}}),
            },
            18,
        ),
        # Two ranges of 5 and an empty one, minPartitions=3.
        (
            {
                "subscribe": uneven,
                "minPartitions": "3",
                "startingOffsets": json.dumps({uneven: {"0": 45, "1": 2, "2": 1}}),
            },
            10,
        ),
    ]
    for opts, n in cases:
        assert len(_compare(spark, bootstrap, **opts)) == n, opts
    tasks = [_tasks(spark, bootstrap, **opts) for opts, _ in cases]
    assert tasks[0][0] == 4 and tasks[2][0] > tasks[1][0] > 3 and tasks[3][0] == 3, tasks
    assert [j for _, j in tasks] == [k for k, _ in tasks], f"(kafka, stratalog): {tasks}"


@pytest.fixture(scope="module")
def big(spark_broker) -> tuple[str, list[Sent]]:
    """2 partitions x 5000 records: more than one columnar batch (4096 rows) per task."""
    bootstrap = spark_broker.bootstrap
    name = topic_name("jvm-big")
    create_topic(bootstrap, name, 2)
    records = [
        Rec(
            b"x" * (i % 97),
            key=None if i % 9 == 0 else b"%d" % i,
            partition=i % 2,
            timestamp=T0 + i,
            headers=(("a", b"%d" % i), ("b", None)) if i % 10 == 0 else None,
        )
        for i in range(10_000)
    ]
    return name, produce(bootstrap, name, records)


def test_column_pruning_queries_match_kafka(spark, bootstrap, big):
    topic, sent = big
    opts = {"subscribe": topic, "includeHeaders": "true"}
    queries = {
        "count-and-sum": lambda df: df.selectExpr("count(*)", "sum(length(value))"),
        "offset-only": lambda df: df.select("offset"),
        "key-and-time": lambda df: df.select("key", "timestamp", "timestampType"),
        "filtered": lambda df: df.where("partition = 1 AND offset BETWEEN 4090 AND 4100").select(
            "value", "topic"
        ),
        "headers": lambda df: df.select("headers", "offset"),
    }
    got = {name: _compare(spark, bootstrap, query=q, **opts) for name, q in queries.items()}
    assert got["count-and-sum"] == [(10_000, sum(len(s.value) for s in sent))]
    assert got["offset-only"] == sorted(((o,) for o in range(5000) for _ in range(2)), key=repr)
    assert len(got["key-and-time"]) == 10_000
    assert len(got["filtered"]) == 11
    assert sum(1 for h, _ in got["headers"] if h is not None) == 1000
    assert [_read(spark, fmt, bootstrap, **opts).count() for fmt in ("kafka", JVM)] == [10_000] * 2


def test_nested_header_field_queries_match_kafka(spark, bootstrap, main):
    # Spark prunes nested fields too (spark.sql.optimizer.nestedSchemaPruning.enabled): a query
    # of headers.value asks the source for headers as array<struct<value: binary>> only.
    topic, sent = main
    queries = {
        "header-values": lambda df: df.selectExpr("offset", "partition", "headers.value AS hv"),
        "header-keys": lambda df: df.selectExpr("offset", "partition", "headers.key AS hk"),
        "transform": lambda df: df.selectExpr("offset", "transform(headers, h -> h.key) AS hk"),
    }
    failures = []
    for name, query in queries.items():
        try:
            ref = _compare(spark, bootstrap, query=query, subscribe=topic, includeHeaders="true")
            assert len(ref) == len(sent)
        except Exception as e:  # a failed query or a mismatch: all of them are reported below
            text = " ".join(str(e).split())
            at = max(text.find("most recent failure"), 0)  # Spark's task error, if it is one
            failures.append(f"{name}: {text[at : at + 220]}")
    assert not failures, "\n".join(failures)


# -- failures ----------------------------------------------------------------------------------
# "TOPIC" in an option value or a message stands for the main topic's name.
ERROR_CASES = [
    pytest.param(
        dict(
            subscribe="TOPIC",
            startingOffsets='{"TOPIC": {"0": 8, "1": 2, "2": 0}}',
            endingOffsets='{"TOPIC": {"0": 3, "1": 5, "2": -1}}',
        ),
        "start offset 8 is greater than the end offset 3",
        id="start-after-end",
    ),
    pytest.param(
        dict(subscribe="TOPIC", startingOffsets='{"TOPIC": {"0": 100, "1": 2, "2": 0}}'),
        "start offset 100 of TOPIC-0 is greater than the resolved end offset 12",
        id="start-past-the-end",
    ),
    pytest.param(
        dict(subscribe="TOPIC", endingOffsets='{"TOPIC": {"0": 100, "1": -1, "2": -1}}'),
        "offsets up to 100 of TOPIC-0, which ends at 12",
        id="end-past-the-end-fail-on-data-loss",
    ),
    pytest.param(
        dict(subscribe="TOPIC", startingOffsets="latest"),
        "'startingOffsets' can't be 'latest'",
        id="starting-offsets-latest",
    ),
    pytest.param(
        dict(subscribe="TOPIC", startingOffsets='{"TOPIC": {"0": -1, "1": 0, "2": 0}}'),
        "'startingOffsets' can't use -1",
        id="starting-offsets-json-latest",
    ),
    pytest.param(
        dict(subscribe="TOPIC", endingOffsets="earliest"),
        "'endingOffsets' can't be 'earliest'",
        id="ending-offsets-earliest",
    ),
    pytest.param(
        dict(subscribe="TOPIC", endingOffsets='{"TOPIC": {"0": -2, "1": 3, "2": 3}}'),
        "'endingOffsets' can't use -2",
        id="ending-offsets-json-earliest",
    ),
    pytest.param(
        dict(subscribe="TOPIC", startingOffsets='{"TOPIC": {"0": 1, "1": 1, "2": 1, "5": 0}}'),
        "named but not assigned: TOPIC-5",
        id="offsets-of-an-unassigned-partition",
    ),
    pytest.param(
        dict(subscribe="TOPIC-missing"),
        "topic 'TOPIC-missing' does not exist",
        id="missing-topic",
    ),
    pytest.param(
        dict(subscribe="TOPIC", startingOffsets='{"TOPIC": {"0": 1,'),
        "'startingOffsets' is not valid JSON",
        id="malformed-json",
    ),
    pytest.param(
        dict(assign='{"TOPIC": [0, 1'),
        "'assign' is not valid JSON",
        id="malformed-assign",
    ),
    pytest.param(
        dict(subscribe="TOPIC", assign='{"TOPIC": [0]}'),
        "not 'subscribe' and 'assign'",
        id="subscribe-and-assign",
    ),
    pytest.param(
        dict(),
        "exactly one of 'subscribe', 'subscribePattern' or 'assign'",
        id="no-subscription",
    ),
    pytest.param(
        dict(subscribe="TOPIC", failOnDataLoss="yes"),
        "'failOnDataLoss' must be 'true' or 'false', not 'yes'",
        id="bad-bool",
    ),
    pytest.param(
        dict(subscribe="TOPIC", includeHeaders="maybe"),
        "'includeHeaders' must be 'true' or 'false', not 'maybe'",
        id="bad-bool-include-headers",
    ),
    # Spark parses booleans as given (Scala's toBoolean): " true" is not a boolean.
    pytest.param(
        dict(subscribe="TOPIC", failOnDataLoss=" true"),
        "'failOnDataLoss' must be 'true' or 'false'",
        id="bool-with-spaces",
    ),
    pytest.param(
        dict(subscribe="TOPIC", minPartitions="0"),
        "'minPartitions' must be a positive integer",
        id="min-partitions-zero",
    ),
    pytest.param(
        dict(subscribePattern="TOPIC-(["),
        "'subscribePattern' is not a valid regex",
        id="bad-pattern",
    ),
    pytest.param(
        dict(
            subscribe="TOPIC", startingTimestamp=str(T0 + 10_000), endingTimestamp=str(T0 + 5_000)
        ),
        f"start timestamp ({T0 + 10_000}) is greater than the end timestamp ({T0 + 5_000})",
        id="start-timestamp-after-end-timestamp",
    ),
    pytest.param(
        dict(subscribe="TOPIC", startingTimestamp=str(T0 + 10**9)),
        f"no record at or after timestamp {T0 + 10**9}",
        id="start-timestamp-matches-nothing",
    ),
    pytest.param(
        dict(subscribe="TOPIC", startingOffsetsByTimestampStrategy="earliest"),
        "'startingOffsetsByTimestampStrategy' must be 'error' or 'latest'",
        id="bad-strategy",
    ),
]


@pytest.mark.parametrize(("options", "message"), ERROR_CASES)
def test_bad_reads_fail_like_kafka(spark, bootstrap, main, options, message):
    topic, _ = main
    options = {k: v.replace("TOPIC", topic) for k, v in options.items()}
    _, got = _errors(spark, bootstrap, **options)
    assert message.replace("TOPIC", topic) in got, got


def test_end_past_the_end_without_fail_on_data_loss_reads_what_there_is(spark, bootstrap, main):
    # KafkaDataConsumer: with failOnDataLoss=false the offsets that do not exist are skipped.
    topic, sent = main
    opts = {
        "subscribe": topic,
        "endingOffsets": json.dumps({topic: {"0": 100, "1": 5, "2": -1}}),
        "failOnDataLoss": "false",
        **FAST,
        "kafkaConsumer.pollTimeoutMs": "1000",
    }
    ref = _compare(spark, bootstrap, **opts)
    assert sorted((r[3], r[4]) for r in ref) == sorted(
        (s.partition, s.offset) for s in sent if s.partition != 1 or s.offset < 5
    )


def test_batches_larger_than_the_fetch_size_are_read_whole(spark, bootstrap):
    # kafka.max.partition.fetch.bytes far below one record batch: a broker may answer with the
    # batch cut at the limit; the reader asks again for more instead of looping or failing.
    topic = topic_name("jvm-big")
    create_topic(bootstrap, topic, 1)
    sent = produce(bootstrap, topic, [Rec(b"%04d" % i + b"x" * 1000) for i in range(300)])
    df = _read(spark, JVM, bootstrap, subscribe=topic, **{"kafka.max.partition.fetch.bytes": "64"})
    got = sorted((r.offset, bytes(r.value)) for r in df.select("offset", "value").collect())
    assert got == sorted((s.offset, s.value) for s in sent)
