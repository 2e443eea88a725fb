"""Compacted topics against Apache Kafka: the observable end state.

A Kafka and a Stratalog of this module's own, both cleaning eagerly (``log.cleaner.backoff.ms``
200 ms, ``min.cleanable.dirty.ratio`` 0.01; Kafka's active segment rolls by the topic's
``segment.ms``, Stratalog's by the broker's). The same keyed records, tombstones
and a null-key record go to both; once each key appears once, a consumer from the beginning
reads the same (offset, key, value) rows from both: each key's latest value at its original
offset, the tombstone kept (``delete.retention.ms`` a day), the null-key record refused alike.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from stratalog import Broker
from stratalog.peers.kafka import KafkaBroker

from ..conftest import KAFKA_TEST_JVM
from . import wire
from .conftest import KAFKA_PROPERTIES, Pair, both, start_kafka, warm_up

KEYS = 20


@pytest.fixture(scope="module")
def cleaning_pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    kafka = start_kafka(
        lambda: KafkaBroker(
            {**KAFKA_PROPERTIES, "log.cleaner.backoff.ms": "200"}, jvm_options=KAFKA_TEST_JVM
        )
    )
    try:
        config = {"log.cleaner.backoff.ms": 200, "segment.ms": 300}
        with Broker(tmp_path_factory.mktemp("stratalog") / "data", config=config) as strat:
            warm_up(kafka.bootstrap)
            warm_up(strat.bootstrap)
            yield Pair(strat, kafka)
    finally:
        kafka.stop()


def _produce(bs: str, topic: str, rows: list[tuple[bytes | None, bytes | None]]) -> list:
    p = Producer({"bootstrap.servers": bs, "linger.ms": 5, "message.timeout.ms": 20000})
    results: list = []

    def done(err, msg):
        results.append((msg.key(), msg.offset()) if err is None else (msg.key(), err.name()))

    for key, value in rows:
        if key is None:
            p.flush(20)  # a batch of its own: Kafka refuses the whole batch
        p.produce(topic, key=key, value=value, partition=0, on_delivery=done)
        if key is None:
            p.flush(20)
    assert p.flush(30) == 0
    return results


def _read(bs: str, topic: str) -> list[tuple[int, bytes, bytes | None]]:
    c = Consumer(
        {"bootstrap.servers": bs, "group.id": "cf-compaction", "enable.auto.commit": False}
    )
    rows: list[tuple[int, bytes, bytes | None]] = []
    try:
        lo, hi = c.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
        c.assign([TopicPartition(topic, 0, lo)])
        deadline = time.monotonic() + 20
        while (not rows or rows[-1][0] < hi - 1) and time.monotonic() < deadline:
            rows += [
                (m.offset(), m.key(), m.value()) for m in c.consume(500, 0.3) if m.error() is None
            ]
    finally:
        c.close()
    return rows


def compacted_scenario(bs: str, topic: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    out["create"] = wire.create_topic(
        bs,
        topic,
        1,
        **{"cleanup.policy": "compact", "min.cleanable.dirty.ratio": "0.01", "segment.ms": "300"},
    )
    rows: list[tuple[bytes | None, bytes | None]] = [
        (b"k%02d" % k, b"round %d of k%02d " % (r, k) + b"x" * 80)
        for r in range(8)
        for k in range(KEYS)
    ]
    rows += [(b"k03", None), (None, b"no key"), (b"k07", b"last")]
    out["produced"] = _produce(bs, topic, rows)
    time.sleep(0.5)
    # Records of keys of their own after the workload, twice, 0.5 s apart: both brokers roll
    # their active segment at an append 300 ms after the segment began (the topic's segment.ms
    # for Kafka, the broker's for Stratalog, whose segments are shared by partitions).
    _produce(bs, topic, [(b"f%03d" % i, b"y" * 120) for i in range(100)])
    time.sleep(0.5)
    _produce(bs, topic, [(b"g", b"z")])
    deadline = time.monotonic() + 90
    while True:
        got = _read(bs, topic)
        if sum(1 for _o, k, _v in got if k.startswith(b"k")) == KEYS:
            break
        assert time.monotonic() < deadline, f"{bs}: never compacted"
        time.sleep(0.5)
    out["rows"] = got
    return out


def test_compacted_topic_end_state(cleaning_pair, name):
    strat, kafka = both(cleaning_pair, compacted_scenario, name)
    assert strat == kafka, wire.differences(strat, kafka)
    assert kafka["create"] == 0
    assert (None, "INVALID_RECORD") in kafka["produced"]
    latest = {k: (o, v) for o, k, v in kafka["rows"]}
    assert latest[b"k03"][1] is None and latest[b"k07"][1] == b"last"
