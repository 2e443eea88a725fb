"""A benchmark producer stopped at its time cap counts as acknowledged only the records the
broker acknowledged: the broker's own count (its partitions' offsets) is the oracle.

The load's producers time every ``sample_every``-th record only; at the cap they purge what is
still queued. The purged records without a delivery callback once passed for acknowledged, so a
capped run reported more records than the broker held (docs/benchmarks.md)."""

from __future__ import annotations

import os
import signal
import threading
from types import SimpleNamespace

import pytest
from confluent_kafka import Consumer, TopicPartition

from stratalog.bench.clients import KafkaClientFactory, ProducerJob, _produce

from .conftest import BrokerProcess, create_topic

pytestmark = pytest.mark.timeout(180)


def _held(bootstrap: str, topic: str, partitions: int) -> int:
    """Records the broker holds in ``topic``: its partitions' end offsets (from 0)."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "held", "log_level": 3})
    try:
        ends = [
            c.get_watermark_offsets(TopicPartition(topic, p), timeout=30) for p in range(partitions)
        ]
        return sum(hi - lo for lo, hi in ends)
    finally:
        c.close()


def test_a_capped_producer_counts_only_what_the_broker_acknowledged(
    broker_process: BrokerProcess,
):
    bp = broker_process
    bp.settings["fsync"] = "always"
    bp.start()
    assert bp.proc is not None
    pid = bp.proc.pid
    create_topic(bp.bootstrap, "capped", 4)
    job = ProducerJob(
        index=0,
        topics=["capped"],
        partitions=4,
        record_size=1024,
        records=1_000_000,  # more than the producer sends in its cap
        rate=None,
        sample_every=4,
        max_duration_s=0.5,
    )
    client = KafkaClientFactory(bp.bootstrap).producer(job)
    # Connected to the partitions' leader first (else nothing would be in flight at the cap).
    create_topic(bp.bootstrap, "warm", 1)
    client.p.produce("warm", b"x")  # type: ignore[attr-defined]
    assert client.p.flush(30) == 0  # type: ignore[attr-defined]
    # The broker answers nothing until after the cap: what the producer queued by then is
    # purged, what it had sent is acknowledged afterwards.
    os.kill(pid, signal.SIGSTOP)
    resume = threading.Timer(1.5, os.kill, (pid, signal.SIGCONT))
    resume.start()
    try:
        r = _produce(client, job, threading.Event(), SimpleNamespace(value=0))
    finally:
        resume.cancel()
        os.kill(pid, signal.SIGCONT)
    client.close()
    assert r["capped"] and not r["errors"] and not r["unacked"]
    assert r["purged"] > 0 and r["records"] > 0
    # Every record is either acknowledged or purged, and the broker holds the acknowledged.
    assert r["records"] + r["purged"] == r["sent"]
    assert _held(bp.bootstrap, "capped", 4) == r["records"]
