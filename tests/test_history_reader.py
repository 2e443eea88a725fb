"""The catch-up's Arrow backlog reader (bench/history_reader.py) against a real broker: it reads
its share of the partitions from their start, every record exactly once, and says why it
fails."""

from __future__ import annotations

import struct

import pytest
from confluent_kafka import Producer

from stratalog.bench.clients import ConsumerJob, KafkaClientFactory, _consumer
from stratalog.bench.history_reader import ArrowHistoryReader
from stratalog.bench.load import backlog_reader_jobs
from stratalog.bench.workload import parse_workload
from stratalog.client.wire import WireError

from .conftest import create_topic

PARTITIONS = 4
PER_PARTITION = 3_000
SIZE = 200


def _fill(bootstrap: str, topic: str) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "acks": "all"})
    for part in range(PARTITIONS):
        for i in range(PER_PARTITION):
            # Each value names its partition and index, so the readers' bytes can be checked.
            p.produce(topic, struct.pack(">ii", part, i) + bytes(SIZE - 8), partition=part)
        p.flush(30)
    assert len(p) == 0


def test_two_readers_split_the_partitions_and_read_every_record_once(broker):
    create_topic(broker.bootstrap, "hist", PARTITIONS)
    _fill(broker.bootstrap, "hist")
    w = parse_workload(
        {
            "name": "x",
            "records": 1,
            "backlog_consumers": 2,
            "backlog_readers_client": "arrow",
            "backlog_readers_config": {"partition_fetch_bytes": 65536},
        }
    )
    jobs = backlog_reader_jobs(w, ["hist"])
    assert [j.client for j in jobs] == ["arrow", "arrow"]
    factory = KafkaClientFactory(broker.bootstrap)
    totals = []
    # The workload's jobs, over this topic's 4 partitions instead of its 16.
    for job in [ConsumerJob(**{**j.__dict__, "partitions": PARTITIONS}) for j in jobs]:
        reader = _consumer(factory, job)
        assert isinstance(reader, ArrowHistoryReader)
        assert reader.partition_bytes == 65536  # from backlog_readers_config
        records = nbytes = 0
        for _ in range(200):
            n, b = reader.consume(0.01)
            if not n and all(
                o >= PER_PARTITION for offs in reader.offsets.values() for o in offs.values()
            ):
                break
            records += n
            nbytes += b
        # Reader 0 has partitions 0 and 2, reader 1 has 1 and 3.
        assert sorted(reader.offsets["hist"]) == [job.index, job.index + 2]
        assert reader.offsets["hist"] == {job.index: PER_PARTITION, job.index + 2: PER_PARTITION}
        assert reader.consume(0.01) == (0, 0)  # at the end: nothing more
        reader.close()
        totals.append((records, nbytes))
    want = [2 * PER_PARTITION, 2 * PER_PARTITION]
    assert [r for r, _ in totals] == want
    assert [b for _, b in totals] == [n * SIZE for n in want]


def test_a_reader_of_an_unknown_topic_or_client_is_named(broker):
    job = ConsumerJob(index=0, count=1, topics=["no-such-topic"], partitions=1, client="arrow")
    with pytest.raises(WireError, match="no-such-topic/0: unknown_topic_or_partition"):
        ArrowHistoryReader(broker.bootstrap, job)
    with pytest.raises(ValueError, match=r"unknown consumer client 'x' \(confluent-kafka, arrow"):
        _consumer(KafkaClientFactory(broker.bootstrap), ConsumerJob(0, 1, ["t"], 1, client="x"))
