"""Time-range reads: startingTimestamp/endingTimestamp and startingOffsetsByTimestamp in batch
reads, ``stratalog.client.replay.replay_table`` and the ``stratalog replay`` command."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from datetime import UTC, datetime

import pytest

from stratalog.client.replay import replay_table

from ..conftest import create_topic
from .conftest import Rec, collect_records, produce, sent_tuple, topic_name

pytestmark = pytest.mark.spark

N = 30
STEP = 1000  # ms between consecutive records
T0 = (int(time.time()) - 3600) * 1000  # recent enough for the 7-day time retention


@pytest.fixture(scope="module")
def timed(spark_broker):
    """Record i has CreateTime T0 + i s and goes to partition i % 3: timestamps increase within
    every partition, and event-time order interleaves the partitions."""
    bootstrap = spark_broker.bootstrap
    topic = topic_name("timed")
    create_topic(bootstrap, topic, 3)
    recs = [
        Rec(
            f"value-{i:02d}".encode(),
            key=f"key-{i:02d}".encode(),
            partition=i % 3,
            timestamp=T0 + i * STEP,
        )
        for i in range(N)
    ]
    sent = produce(bootstrap, topic, recs)
    by_index = {int(s.value.split(b"-")[1]): s for s in sent}
    return topic, [by_index[i] for i in range(N)]


def _read(spark, bootstrap, topic, **options):
    r = (
        spark.read.format("stratalog-python")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("includeHeaders", "true")
    )
    for k, v in options.items():
        r = r.option(k, v)
    return r.load()


@pytest.mark.parametrize(("first", "stop"), [(7, 19), (0, N), (7, 8), (12, 12)])
def test_starting_and_ending_timestamp(spark, bootstrap, timed, first, stop):
    topic, sent = timed
    df = _read(
        spark,
        bootstrap,
        topic,
        startingTimestamp=str(T0 + first * STEP),
        endingTimestamp=str(T0 + stop * STEP),
    )
    expected = sorted((sent_tuple(s) for s in sent[first:stop]), key=repr)
    assert sorted(collect_records(df), key=repr) == expected


def test_starting_offsets_by_timestamp(spark, bootstrap, timed):
    topic, sent = timed
    starts = {0: T0 + 3 * STEP, 1: T0 + 10 * STEP + 1, 2: T0 - 60_000}
    df = _read(
        spark,
        bootstrap,
        topic,
        startingOffsetsByTimestamp=json.dumps({topic: {str(p): t for p, t in starts.items()}}),
    )
    # Per partition: from its first record at or after its timestamp, to the end.
    expected = sorted((sent_tuple(s) for s in sent if s.timestamp >= starts[s.partition]), key=repr)
    assert len(expected) == 9 + 6 + 10
    assert sorted(collect_records(df), key=repr) == expected


def test_replay_table_merges_partitions_in_event_time_order(spark, bootstrap, timed):
    topic, sent = timed
    start, end = T0 + 7 * STEP, T0 + 19 * STEP
    table = replay_table(bootstrap, topic, start, end)
    got = [
        (r["partition"], r["offset"], r["key"], r["value"], int(r["timestamp"].timestamp() * 1000))
        for r in table.to_pylist()
    ]
    expected = [(s.partition, s.offset, s.key, s.value, s.timestamp) for s in sent[7:19]]
    assert got == expected  # the same records, in event-time order across the 3 partitions
    # The same records as Spark's timestamp-bounded batch read.
    spark_rows = collect_records(
        _read(spark, bootstrap, topic, startingTimestamp=str(start), endingTimestamp=str(end))
    )
    assert sorted((r[1], r[2]) for r in spark_rows) == sorted((g[0], g[1]) for g in got)
    # ISO-8601 bounds (UTC) select the same range.
    iso = replay_table(
        bootstrap,
        topic,
        datetime.fromtimestamp(start / 1000, UTC).isoformat(),
        datetime.fromtimestamp(end / 1000, UTC).isoformat(),
    )
    assert iso.column("offset").to_pylist() == table.column("offset").to_pylist()
    assert iso.column("partition").to_pylist() == table.column("partition").to_pylist()


def test_replay_cli_prints_json_lines(bootstrap, timed):
    topic, sent = timed
    start = datetime.fromtimestamp((T0 + 7 * STEP) / 1000, UTC).isoformat()
    end = str(T0 + 19 * STEP)
    cmd = [sys.executable, "-m", "stratalog.cli", "replay", topic]
    proc = subprocess.run(
        [*cmd, "--from", start, "--to", end, "-b", bootstrap],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]
    assert [(d["partition"], d["offset"], d["key"], d["value"]) for d in lines] == [
        (s.partition, s.offset, s.key.decode(), s.value.decode()) for s in sent[7:19]
    ]
    stamps = [int(datetime.fromisoformat(d["timestamp"]).timestamp() * 1000) for d in lines]
    assert stamps == [s.timestamp for s in sent[7:19]]
