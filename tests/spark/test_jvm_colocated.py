"""Co-located reads in the JVM connector: format("stratalog")'s tasks read a partition whose
leader runs on their host from the leader's segment files (ColocatedPartition.java), and through
Fetch for what the files do not hold (the cold tier).

The oracle never trusts the code under test: the rows read with ``colocatedReads=true`` must be
those read with ``colocatedReads=false`` (every record through Fetch) and those a confluent-kafka
consumer reads, and the broker's own request counter (``stratalog_requests_total{api="fetch"}``
on its Prometheus endpoint) shows which path was taken: almost no Fetch with the files, at least
one per round trip without them.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Producer

from stratalog import Broker

from ..conftest import create_topic, fetch_requests, produce_keyed
from .conftest import collect_records, consume_all, sent_tuple

pytestmark = pytest.mark.spark

JVM = "stratalog"
# Small fetches, so that reading through Fetch takes many round trips (and reading from the
# files many local reads, each at most this much).
FETCH_BYTES = 16 * 1024


def _fetches(b: Broker) -> float:
    return fetch_requests(b.service.core.admin_address)


def _read(spark, b: Broker, topics: str, colocated: bool, **options: str) -> tuple[list, float]:
    """Every record of ``topics`` through format("stratalog"), sorted, and the Fetch requests
    the read cost the broker."""
    r = (
        spark.read.format(JVM)
        .option("kafka.bootstrap.servers", b.bootstrap)
        .option("subscribe", topics)
        .option("kafka.max.partition.fetch.bytes", str(FETCH_BYTES))
        .option("colocatedReads", str(colocated).lower())
    )
    for k, v in options.items():
        r = r.option(k, v)
    df = r.load()
    before = _fetches(b)
    rows = collect_records(df)
    return sorted(rows, key=repr), _fetches(b) - before


def _expected(bootstrap: str, *topics: str) -> list[tuple]:
    """What an independent consumer (confluent-kafka) reads, in row_tuple's shape."""
    return sorted((sent_tuple(s) for t in topics for s in consume_all(bootstrap, t)), key=repr)


def _log_bytes(b: Broker, topic: str) -> int:
    """The bytes of a topic's partitions, as DescribeLogDirs counts them."""

    def size() -> int:
        t = b.core.metadata.topics[topic]
        return sum(b.core.store.partitions[uid].size_bytes for uid in t.partitions)

    return b.call(size)


@pytest.fixture(scope="module")
def shared_log(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    """Two topics interleaved in one virtual log of many small segments: plain, lz4 and zstd
    batches and a committed transaction (a control batch in the files)."""
    config = {"storage.virtual_logs": 1, "segment.bytes": 64 * 1024, "admin.port": 0}
    with Broker(tmp_path_factory.mktemp("colocated") / "d", config=config) as b:
        create_topic(b.bootstrap, "a", 3)
        create_topic(b.bootstrap, "b", 1)
        produce_keyed(b.bootstrap, "a", 3, 6000)
        produce_keyed(b.bootstrap, "b", 1, 1000, **{"compression.type": "lz4"})
        tx = Producer({"bootstrap.servers": b.bootstrap, "transactional.id": "jvm-colocated"})
        tx.init_transactions(30)
        tx.begin_transaction()
        tx.produce("a", key=b"tx", value=b"in a transaction", partition=0)
        tx.commit_transaction(30)
        del tx
        # After the marker: consume_all stops at a partition's last record, not at a marker.
        produce_keyed(b.bootstrap, "a", 3, 600, **{"compression.type": "zstd"})
        segments = list((b.core.store.root / "v0").glob("*.log"))
        assert len(segments) > 8, segments
        yield b


def test_colocated_reads_equal_fetch_without_fetching(spark, shared_log: Broker) -> None:
    """Every partition of both topics, read from the files, is the same rows as read through
    Fetch and as a consumer reads them; the read from the files costs the broker (almost) no
    Fetch, the one through Fetch at least one per FETCH_BYTES of the log."""
    b = shared_log
    expected = _expected(b.bootstrap, "a", "b")
    assert len(expected) == 6000 + 1000 + 600 + 1
    fetched, fetch_count = _read(spark, b, "a,b", colocated=False)
    local, local_count = _read(spark, b, "a,b", colocated=True)
    assert fetched == expected
    assert local == expected
    round_trips = (_log_bytes(b, "a") + _log_bytes(b, "b")) // FETCH_BYTES
    assert round_trips > 30
    print(f"Fetch requests: {fetch_count} without the files, {local_count} with them")
    assert fetch_count >= round_trips, (fetch_count, round_trips)
    assert local_count <= 4, local_count  # a fallback per task at most


def test_ranges_starting_inside_batches_and_segments(spark, shared_log: Broker) -> None:
    """minPartitions cuts each partition into ranges that start in the middle of batches and of
    segments, and starting offsets skip the first records: the same rows both ways."""
    b = shared_log
    expected = [r for r in _expected(b.bootstrap, "a", "b") if r[2] >= 7]
    start = '{"a": {"0": 7, "1": 7, "2": 7}, "b": {"0": 7}}'
    options = {"minPartitions": "17", "startingOffsets": start}
    fetched, _ = _read(spark, b, "a,b", colocated=False, **options)
    local, local_count = _read(spark, b, "a,b", colocated=True, **options)
    assert fetched == expected
    assert local == expected
    assert local_count <= 17, local_count


def test_the_cold_tier_is_read_through_fetch(spark, tmp_path: Path) -> None:
    """Offsets migrated to the cold tier are not in the hot tier's files: the tasks fetch them
    (the broker counts the Fetch requests) and read the rest, the hot tier's, from the files;
    the rows are the same as through Fetch alone and as a consumer reads them. (The broker's
    settings are test_colocated_reads.py's, with a hot tier that keeps half of the data.)"""
    config = {
        "segment.bytes": 32 * 1024,
        "tiers.cold.path": str(tmp_path / "cold"),
        "tiers.hot.capacity": 300_000,
        "tiers.migrate.threshold": 0.5,
        "tiers.migrate.interval.ms": 100,
        "admin.port": 0,
    }
    with Broker(tmp_path / "d", config=config) as b:
        create_topic(b.bootstrap, "tiered", 1)
        produce_keyed(b.bootstrap, "tiered", 1, 3000)
        uid = b.call(lambda: b.core.metadata.topics["tiered"].partitions[0])
        deadline = time.monotonic() + 30
        while b.call(lambda: b.core.store.partitions[uid].cold_bytes) == 0:
            assert time.monotonic() < deadline, "nothing migrated"
            time.sleep(0.1)
        expected = _expected(b.bootstrap, "tiered")
        assert len(expected) == 3000
        local, local_count = _read(spark, b, "tiered", colocated=True)
        hot = b.call(lambda: b.core.store.partitions[uid].size_bytes)  # after: only less
        fetched, fetch_count = _read(spark, b, "tiered", colocated=False)
        assert local == expected
        assert fetched == expected
        print(f"Fetch requests: {fetch_count} without the files, {local_count} with them")
        assert local_count > 0  # the cold part, through Fetch
        assert hot >= 4 * FETCH_BYTES, hot
        # The hot part, from the files: at least its size in Fetch round trips fewer (but one
        # where the tiers meet).
        assert local_count <= fetch_count - (hot // FETCH_BYTES - 1), (local_count, fetch_count)


def test_a_bad_colocated_reads_option_names_it(spark, shared_log: Broker) -> None:
    with pytest.raises(Exception, match="option 'colocatedReads' must be 'true' or 'false'"):
        _read(spark, shared_log, "b", colocated=False, colocatedReads="sometimes")
