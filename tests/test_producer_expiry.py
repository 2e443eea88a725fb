"""Idempotent-producer state is forgotten after producer.id.expiration.ms without appends, as
in Kafka: the Spark sinks make a producer id per write task and target partition, so without
expiry the broker's memory would grow for as long as a streaming query runs."""

from __future__ import annotations

import time

from stratalog import Broker
from stratalog.client.wire import LATEST, WireClient
from stratalog.records import build_batch
from stratalog.spark.writer import derived_producer_id

from .conftest import create_topic


def _send(client: WireClient, producer_id: int, seq: int) -> int:
    raw = build_batch(
        [(b"k", b"v%d" % seq, int(time.time() * 1000))],
        producer_id=producer_id,
        producer_epoch=0,
        base_sequence=seq,
    )
    err, base = client.produce("expiry", {0: raw})[0]
    assert err == 0
    return base


def _end(client: WireClient) -> int:
    return client.list_offsets("expiry", [0], LATEST)[0][0]


def test_a_quiet_producer_is_forgotten_and_its_retry_appended_again(tmp_path):
    config = {"producer.id.expiration.ms": 600, "retention.check.interval.ms": 100}
    with Broker(tmp_path / "d", config=config) as b:
        create_topic(b.bootstrap, "expiry")
        quiet, busy = derived_producer_id("test", "quiet"), derived_producer_id("test", "busy")
        with WireClient(b.bootstrap) as c:
            assert _send(c, quiet, 0) == 0
            assert _send(c, quiet, 0) == 0  # a retry: answered with its offset, not appended
            assert _end(c) == 1
            assert _send(c, busy, 0) == 1
            for seq in range(1, 6):  # the busy one keeps appending past the expiry time
                time.sleep(0.25)
                _send(c, busy, seq)
            assert _end(c) == 7
            _send(c, busy, 5)  # still known: a duplicate
            assert _end(c) == 7
            assert _send(c, quiet, 0) == 7  # forgotten: the same batch is appended again
            assert _end(c) == 8
