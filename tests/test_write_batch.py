"""One write per virtual log per Produce request (KerA: a virtual log batches many streams).

A Produce request carrying batches for 64 partitions (from kafka-python, which like Kafka's Java
client sends all of a broker's partitions in one request), which the virtual layout spreads over
4 virtual logs, must reach the disk as a few writes, not 64; per-partition logs still take one
each. Counted from the broker process's own ``/proc/<pid>/io`` (write system calls, responses
included: 74 in the virtual layout before the batching, 12 after), and every record must read
back in order.
"""

from __future__ import annotations

import pytest
from confluent_kafka import Consumer, TopicPartition
from kafka import KafkaProducer

from .conftest import BrokerProcess, create_topic

PARTITIONS = 64


def _write_calls(pid: int) -> int:
    with open(f"/proc/{pid}/io") as f:
        return int(next(line for line in f if line.startswith("syscw:")).split()[1])


def _one_request(bootstrap: str, topic: str) -> None:
    # kafka-python, like Kafka's Java client, puts every partition's batch for a broker into one
    # Produce request (librdkafka sends one partition per request); a long linger gathers them.
    p = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=500)
    for i in range(PARTITIONS):
        p.send(topic, b"v%d" % i, key=b"k", partition=i)
    p.flush(30)
    p.close()


@pytest.mark.parametrize(
    ("layout", "at_most", "at_least"), [("virtual", 16, 0), ("per-partition", None, 64)]
)
def test_a_request_is_written_once_per_virtual_log(tmp_path, layout, at_most, at_least):
    b = BrokerProcess(tmp_path / "data", settings={"storage.layout": layout}).start()
    try:
        create_topic(b.bootstrap, "wide", PARTITIONS)
        _one_request(b.bootstrap, "wide")  # warm-up: connections, metadata, first segments
        before = _write_calls(b.proc.pid)
        _one_request(b.bootstrap, "wide")
        writes = _write_calls(b.proc.pid) - before
        c = Consumer(
            {"bootstrap.servers": b.bootstrap, "group.id": "wb", "enable.auto.commit": False}
        )
        c.assign([TopicPartition("wide", i, 0) for i in range(PARTITIONS)])
        got: dict[int, list[bytes]] = {}
        while sum(map(len, got.values())) < 2 * PARTITIONS:
            m = c.poll(10)
            assert m is not None, got
            assert m.error() is None, m.error()
            got.setdefault(m.partition(), []).append(m.value())
        c.close()
    finally:
        b.kill()
    assert got == {i: [b"v%d" % i, b"v%d" % i] for i in range(PARTITIONS)}
    if at_most is not None:
        assert writes <= at_most, writes
    assert writes >= at_least, writes
