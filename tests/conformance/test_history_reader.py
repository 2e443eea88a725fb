"""The catch-up's Arrow backlog reader (bench/history_reader.py) reads the same records from
Stratalog and from the reference Apache Kafka: raw batches of all its partitions per Fetch,
decoded as the Spark source decodes them."""

from __future__ import annotations

import struct

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from stratalog.bench.clients import ConsumerJob
from stratalog.bench.history_reader import ArrowHistoryReader

from .conftest import both

pytestmark = pytest.mark.kafka

PARTITIONS = 3
PER_PARTITION = 2_000


def _scenario(bootstrap: str, topic: str) -> list[tuple[int, int, dict[int, int]]]:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, PARTITIONS, 1)])[topic].result(timeout=30)
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "acks": "all"})
    for part in range(PARTITIONS):
        for i in range(PER_PARTITION):
            p.produce(topic, struct.pack(">ii", part, i) + bytes(100 + part), partition=part)
    assert p.flush(30) == 0
    out = []
    for index in range(2):  # two readers share the partitions, as the catch-up's do
        job = ConsumerJob(index=index, count=2, topics=[topic], partitions=PARTITIONS)
        reader = ArrowHistoryReader(bootstrap, job)
        records = nbytes = 0
        for _ in range(100):
            n, b = reader.consume(0.05)
            records += n
            nbytes += b
            if all(o >= PER_PARTITION for o in reader.offsets[topic].values()):
                break
        out.append((records, nbytes, dict(reader.offsets[topic])))
        reader.close()
    return out


def test_the_arrow_history_reader_reads_the_same_from_both(pair, name):
    strat, kafka = both(pair, _scenario, name)
    assert strat == kafka
    # Reader 0 has partitions 0 and 2, reader 1 partition 1; values of 108, 109 and 110 bytes.
    assert strat == [
        (2 * PER_PARTITION, PER_PARTITION * (108 + 110), {0: PER_PARTITION, 2: PER_PARTITION}),
        (PER_PARTITION, PER_PARTITION * 109, {1: PER_PARTITION}),
    ]
