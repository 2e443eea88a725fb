"""Reading a partition into Arrow batches over many Fetch requests (``read_partition``).

The reader receives every Fetch response into one buffer that the client reuses, so a record
kept from an earlier response must not be a view of it. A real broker serves records produced
by confluent-kafka; a small fetch size makes the read take hundreds of responses of different
sizes (the buffer grows when a batch is larger than the fetch size, which Kafka returns whole).
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from confluent_kafka import Producer

from stratalog.client import arrow_reader
from stratalog.client.arrow_reader import read_partition
from stratalog.client.wire import WireClient
from tests.conftest import create_topic


def _produce(bootstrap: str, topic: str, records: list[tuple[bytes | None, bytes]]) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "acks": "all"})
    errors: list = []
    for key, value in records:
        p.produce(topic, value, key, partition=0, on_delivery=lambda e, m: e and errors.append(e))
    assert p.flush(30) == 0
    assert not errors


@pytest.mark.parametrize("native", [True, False], ids=["native", "general"])
def test_a_read_over_hundreds_of_fetches_returns_every_record(broker, native, monkeypatch):
    if not native:
        monkeypatch.setattr(arrow_reader, "_native", None)
    topic = f"reader-{native}"
    create_topic(broker.bootstrap, topic)
    # Values from 1 byte to 20 KiB: some batches are larger than the 4 KiB fetch size.
    records = [
        (None if i % 7 == 0 else b"k%d" % i, bytes([i % 251]) * (1 + (i * 37) % 20_000))
        for i in range(3_000)
    ]
    _produce(broker.bootstrap, topic, records)

    with WireClient(broker.bootstrap) as client:
        batches = list(
            read_partition(client, topic, 0, 10, 2_990, rows_per_batch=100, fetch_bytes=4096)
        )
    rows = [r for b in batches for r in b.to_pylist()]
    assert [r["offset"] for r in rows] == list(range(10, 2_990))
    assert [(r["key"], r["value"]) for r in rows] == records[10:2_990]
    assert {r["topic"] for r in rows} == {topic} and {r["partition"] for r in rows} == {0}


def test_the_receive_buffer_is_reused_only_when_asked(broker):
    topic = "reader-buffer"
    create_topic(broker.bootstrap, topic)
    _produce(broker.bootstrap, topic, [(b"k", b"v" * 100)] * 50)
    with WireClient(broker.bootstrap) as client:
        a = client.fetch(topic, {0: 0}, reuse_buffer=True)[0].records
        b = client.fetch(topic, {0: 10}, reuse_buffer=True)[0].records
        assert a.obj is b.obj  # one buffer, overwritten by the second answer
        c = client.fetch(topic, {0: 0})[0].records
        d = client.fetch(topic, {0: 0})[0].records
        assert c.obj is not d.obj and c.obj is not b.obj
        assert bytes(c) == bytes(d)


def test_a_spark_worker_heap_is_frozen_once():
    """worker_gc.freeze_once freezes what exists at the first read and never again (freezing at
    every task would pin each task's leftovers)."""
    code = (
        "import gc\n"
        "from stratalog.spark import worker_gc\n"
        "assert gc.get_freeze_count() == 0\n"
        "worker_gc.freeze_once()\n"
        "first = gc.get_freeze_count()\n"
        "junk = [[i] for i in range(10_000)]\n"
        "worker_gc.freeze_once()\n"
        "print(first, gc.get_freeze_count())\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    first, second = map(int, out.stdout.split())
    assert first > 1_000  # the modules, classes and functions alive at the first read
    assert second == first
