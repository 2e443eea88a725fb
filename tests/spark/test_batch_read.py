"""Batch reads: spark.read.format("stratalog-python") returns exactly what confluent-kafka
produced."""

from __future__ import annotations

import json
import time

import pytest

from ..conftest import create_topic
from .conftest import Rec, collect_records, produce, sent_tuple, topic_name

pytestmark = pytest.mark.spark

# Explicit CreateTimes an hour ago: older ones would fall to the 7-day time retention.
T0 = (int(time.time()) - 3600) * 1000
PARTITIONS = 3
PER_PARTITION = 40


def _records(n_partitions: int, per_partition: int) -> list[Rec]:
    """Per partition: keys and null keys, an empty and a null (tombstone) value, binary bytes,
    headers on some records (repeated names, a null header value) and none on others."""
    out = []
    for p in range(n_partitions):
        for i in range(per_partition):
            key = None if i % 7 == 3 else f"p{p}-k{i:03d}".encode()
            if i % 11 == 5:
                value = None
            elif i % 13 == 6:
                value = b""
            else:
                value = f"p{p}-v{i:03d}-".encode() + bytes([i, 0, 255 - i])
            headers = None
            if i % 3 == 0:
                headers = (("idx", str(i).encode()),)
            if i % 6 == 0:
                headers = (("idx", str(i).encode()), ("idx", b"\x00\x01"), ("none", None))
            out.append(Rec(value, key=key, partition=p, timestamp=T0 + i * 10 + p, headers=headers))
    return out


@pytest.fixture(scope="module")
def produced(spark_broker):
    bootstrap = spark_broker.bootstrap
    topic = topic_name("batch")
    create_topic(bootstrap, topic, PARTITIONS)
    sent = produce(bootstrap, topic, _records(PARTITIONS, PER_PARTITION))
    return topic, sent


def _reader(spark, bootstrap, **options):
    r = spark.read.format("stratalog-python").option("kafka.bootstrap.servers", bootstrap)
    for k, v in options.items():
        r = r.option(k, v)
    return r.load()


def test_batch_read_equals_produced(spark, bootstrap, produced):
    topic, sent = produced
    df = _reader(spark, bootstrap, subscribe=topic, includeHeaders="true")
    assert [f.name for f in df.schema.fields] == [
        "key",
        "value",
        "topic",
        "partition",
        "offset",
        "timestamp",
        "timestampType",
        "headers",
    ]
    assert df.count() == len(sent) == PARTITIONS * PER_PARTITION
    rows = collect_records(df)
    assert len(rows) == len(set(rows))
    assert sorted(rows, key=repr) == sorted((sent_tuple(s) for s in sent), key=repr)
    # Spot checks that make the comparison's meaning explicit.
    by_pos = {(r[1], r[2]): r for r in rows}
    no_headers = [s for s in sent if s.headers is None]
    assert no_headers and all(by_pos[(s.partition, s.offset)][7] is None for s in no_headers)
    assert any(r[6] is None for r in rows) and any(r[5] is None for r in rows)
    assert {r[4] for r in rows} == {0}  # CreateTime
    for p in range(PARTITIONS):
        assert sorted(r[2] for r in rows if r[1] == p) == list(range(PER_PARTITION))


def test_batch_read_without_headers_option(spark, bootstrap, produced):
    topic, sent = produced
    df = _reader(spark, bootstrap, subscribe=topic)
    assert "headers" not in df.columns
    got = sorted(
        (r.partition, r.offset, None if r.value is None else bytes(r.value)) for r in df.collect()
    )
    assert got == sorted((s.partition, s.offset, s.value) for s in sent)


def test_starting_and_ending_offsets_json(spark, bootstrap, produced):
    topic, sent = produced
    starting = {topic: {"0": 5, "1": -2, "2": 30}}
    ending = {topic: {"0": 17, "1": 9, "2": -1}}
    df = _reader(
        spark,
        bootstrap,
        subscribe=topic,
        includeHeaders="true",
        startingOffsets=json.dumps(starting),
        endingOffsets=json.dumps(ending),
    )
    bounds = {0: (5, 17), 1: (0, 9), 2: (30, PER_PARTITION)}
    expected = sorted(
        (
            sent_tuple(s)
            for s in sent
            if bounds[s.partition][0] <= s.offset < bounds[s.partition][1]
        ),
        key=repr,
    )
    assert len(expected) == 12 + 9 + 10
    assert sorted(collect_records(df), key=repr) == expected


def test_min_partitions_splits_without_changing_the_result(spark, bootstrap, produced):
    topic, sent = produced
    plain = _reader(spark, bootstrap, subscribe=topic, includeHeaders="true")
    # Like Spark's Kafka source, minPartitions is a hint (ranges are split in proportion to
    # their size, rounded); with equal partitions and a multiple of their number it is exact.
    split = _reader(spark, bootstrap, subscribe=topic, includeHeaders="true", minPartitions="9")
    assert plain.rdd.getNumPartitions() == PARTITIONS
    assert split.rdd.getNumPartitions() >= 9
    rows = collect_records(split)
    assert len(rows) == len(sent)
    assert sorted(rows, key=repr) == sorted((sent_tuple(s) for s in sent), key=repr)


def test_subscribe_pattern(spark, bootstrap):
    prefix = topic_name("pat")
    a, b, other = f"{prefix}-a", f"{prefix}-b", f"x{prefix}-c"
    create_topic(bootstrap, a, 2)
    create_topic(bootstrap, b, 1)
    create_topic(bootstrap, other, 1)
    sent = produce(bootstrap, a, [Rec(f"a{i}".encode(), partition=i % 2) for i in range(6)])
    sent += produce(bootstrap, b, [Rec(f"b{i}".encode()) for i in range(4)])
    sent_other = produce(bootstrap, other, [Rec(b"also me")])
    # Anchored: only the two topics that start with the prefix.
    df = _reader(spark, bootstrap, subscribePattern=f"^{prefix}-.*", includeHeaders="true")
    assert sorted(collect_records(df), key=repr) == sorted((sent_tuple(s) for s in sent), key=repr)
    # Unanchored, the pattern is found anywhere in a name, as in Spark's Kafka source.
    df = _reader(spark, bootstrap, subscribePattern=f"{prefix}-.*", includeHeaders="true")
    assert sorted(collect_records(df), key=repr) == sorted(
        (sent_tuple(s) for s in sent + sent_other), key=repr
    )


def test_assign(spark, bootstrap, produced):
    topic, sent = produced
    df = _reader(spark, bootstrap, assign=json.dumps({topic: [0, 2]}), includeHeaders="true")
    expected = sorted((sent_tuple(s) for s in sent if s.partition in (0, 2)), key=repr)
    assert len(expected) == 2 * PER_PARTITION
    assert sorted(collect_records(df), key=repr) == expected
