"""Transactions across crashes: `kill -9` of the broker and of the producer mid-transaction.

A real `stratalog serve` process and real confluent-kafka transactional producers. Afterwards a
committed transaction is whole, an aborted one (or one left open, which the coordinator aborts
once it times out) is invisible to read_committed consumers and fenced, and none is
half-visible. The coordinator's state comes back from __transaction_state and every partition's
transaction index from its log. A tiered variant migrates the transactional data to the cold
tier before the restart.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

from stratalog.client.wire import WireClient

from .conftest import BrokerProcess, create_topic

TIMEOUT_MS = 4000  # the producers' transaction.timeout.ms: an open transaction aborts after it
SETTINGS = {
    "fsync": "always",
    "transaction.abort.timed.out.transaction.cleanup.interval.ms": "300",
}


def _producer(bs: str, txid: str) -> Producer:
    p = Producer({"bootstrap.servers": bs, "transactional.id": txid,
                  "transaction.timeout.ms": TIMEOUT_MS})  # fmt: skip
    p.init_transactions(30)
    return p


def _read(bs: str, topic: str, partitions: int, level: str) -> list[tuple[int, bytes]]:
    """(partition, value) of every record a consumer of ``level`` reads up to the end it sees
    (the last stable offset for read_committed), in partition order."""
    c = Consumer({"bootstrap.servers": bs, "group.id": f"r-{uuid.uuid4().hex[:6]}",
                  "isolation.level": level, "enable.auto.commit": False,
                  "enable.partition.eof": True})  # fmt: skip
    out: list[tuple[int, bytes]] = []
    try:
        c.assign([TopicPartition(topic, i, 0) for i in range(partitions)])
        eof: set[int] = set()
        deadline = time.monotonic() + 30
        while len(eof) < partitions:
            assert time.monotonic() < deadline, f"read {level} did not finish: {out}"
            m = c.poll(0.2)
            if m is None:
                continue
            if m.error() is not None:
                eof.add(m.partition())
                continue
            out.append((m.partition(), m.value()))
    finally:
        c.close()
    return sorted(out, key=lambda r: r[0])


def _stable(bs: str, topic: str, partitions: int) -> bool:
    """Whether every partition's last stable offset reached its high watermark."""
    with WireClient(bs) as c:
        latest = c.list_offsets(topic, list(range(partitions)), -1)
    committed_end = _latest_committed(bs, topic, partitions)
    return all(committed_end[i] == latest[i][0] for i in range(partitions))


def _latest_committed(bs: str, topic: str, partitions: int) -> dict[int, int]:
    from tests.conformance import wire

    r = wire.call(
        bs, 2, 7, replica_id=-1, isolation_level=1,
        topics=[{"name": topic, "partitions": [
            {"partition_index": i, "current_leader_epoch": -1, "timestamp": -1}
            for i in range(partitions)]}],
    )  # fmt: skip
    return {p["partition_index"]: p["offset"] for p in r["topics"][0]["partitions"]}


def _wait_stable(bs: str, topic: str, partitions: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not _stable(bs, topic, partitions):
        assert time.monotonic() < deadline, "the open transaction was never aborted"
        time.sleep(0.2)


def _values(rows: list[tuple[int, bytes]]) -> list[bytes]:
    return [v for _p, v in rows]


@pytest.mark.parametrize("tiered", [False, True], ids=["hot", "tiered"])
def test_broker_killed_mid_transaction(tmp_path: Path, tiered: bool):
    settings = dict(SETTINGS)
    if tiered:
        settings.update({
            "tiers.cold.path": str(tmp_path / "cold"), "tiers.migrate.interval.ms": "100",
            "local.retention.ms": "1", "segment.bytes": "20000",
        })  # fmt: skip
    b = BrokerProcess(tmp_path / "data", settings=settings).start()
    PAD = b"." * (2000 if tiered else 100)
    try:
        topic = "txn-crash"
        create_topic(b.bootstrap, topic, 2)
        p = _producer(b.bootstrap, "crash-tx")
        # A: committed. B: aborted. C: committed, the broker killed right after the answer (its
        # markers may not be complete). D: open when the broker dies.
        for tag, end in (("A", p.commit_transaction), ("B", p.abort_transaction)):
            p.begin_transaction()
            for i in range(20):
                p.produce(topic, f"{tag}{i}".encode() + PAD, partition=i % 2)
            p.flush(30)
            end(30)
        # C and D also commit a consumer's offsets (send_offsets_to_transaction): C's count,
        # D's never do.
        create_topic(b.bootstrap, "txn-source", 1)
        group = Consumer({"bootstrap.servers": b.bootstrap, "group.id": "crash-group"})
        meta = group.consumer_group_metadata()
        p.begin_transaction()
        for i in range(20):
            p.produce(topic, f"C{i}".encode() + PAD, partition=i % 2)
        p.send_offsets_to_transaction([TopicPartition("txn-source", 0, 7)], meta, 30)
        p.commit_transaction(30)
        p.begin_transaction()
        for i in range(20):
            p.produce(topic, f"D{i}".encode() + PAD, partition=i % 2)
        p.send_offsets_to_transaction([TopicPartition("txn-source", 0, 9)], meta, 30)
        p.flush(30)
        group.close()
        if tiered:
            time.sleep(2)  # local.retention.ms=1: sealed segments move to the cold tier
        b.kill(signal.SIGKILL)
        b.start()
        if tiered:
            assert list((tmp_path / "cold").glob("p*/*.log")), "nothing was migrated"
        # D is open until its timeout aborts it (its producer is gone for the coordinator).
        _wait_stable(b.bootstrap, topic, 2)
        committed = _values(_read(b.bootstrap, topic, 2, "read_committed"))
        want = [f"{t}{i}".encode() + PAD for t in "AC" for i in range(20)]
        assert sorted(committed) == sorted(want), "committed transactions must be whole"
        everything = _values(_read(b.bootstrap, topic, 2, "read_uncommitted"))
        assert len(everything) == 80  # A, B, C and D, each once
        c = Consumer({"bootstrap.servers": b.bootstrap, "group.id": "crash-group"})
        try:
            (got,) = c.committed([TopicPartition("txn-source", 0)], timeout=30)
        finally:
            c.close()
        assert got.offset == 7  # C's offsets, not the aborted D's
        # The old producer was fenced by the abort at a bumped epoch.
        with pytest.raises(KafkaException):
            p.produce(topic, b"zombie", partition=0)
            p.commit_transaction(30)
        # A new producer with the same id carries on.
        q = _producer(b.bootstrap, "crash-tx")
        q.begin_transaction()
        q.produce(topic, b"E", partition=0)
        q.commit_transaction(30)
        _wait_stable(b.bootstrap, topic, 2)
        assert _values(_read(b.bootstrap, topic, 2, "read_committed")).count(b"E") == 1
        # And once more after a clean restart: the same answers.
        b.stop()
        b.start()
        assert sorted(_values(_read(b.bootstrap, topic, 2, "read_committed"))) == sorted(
            [*want, b"E"]
        )
    finally:
        b.kill()


PRODUCER = textwrap.dedent(
    """
    import sys, time
    from confluent_kafka import Producer
    bs, topic, timeout = sys.argv[1], sys.argv[2], int(sys.argv[3])
    p = Producer({"bootstrap.servers": bs, "transactional.id": "gone-tx",
                  "transaction.timeout.ms": timeout})
    p.init_transactions(30)
    p.begin_transaction()
    for i in range(10):
        p.produce(topic, f"committed-{i}".encode(), partition=i % 2)
    p.commit_transaction(30)
    p.begin_transaction()
    for i in range(10):
        p.produce(topic, f"lost-{i}".encode(), partition=i % 2)
    p.flush(30)
    print("ready", flush=True)
    time.sleep(600)
    """
)


def test_producer_killed_mid_transaction(tmp_path: Path):
    b = BrokerProcess(tmp_path / "data", settings=SETTINGS).start()
    try:
        topic = "txn-gone"
        create_topic(b.bootstrap, topic, 2)
        proc = subprocess.Popen(
            [sys.executable, "-c", PRODUCER, b.bootstrap, topic, str(TIMEOUT_MS)],
            stdout=subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        )
        try:
            assert proc.stdout is not None
            assert proc.stdout.readline().strip() == b"ready"
            open_at = _latest_committed(b.bootstrap, topic, 2)
            assert not _stable(b.bootstrap, topic, 2)  # the open transaction holds the LSO
        finally:
            proc.kill()
            proc.wait(10)
        started = time.monotonic()
        _wait_stable(b.bootstrap, topic, 2)
        # Aborted by the coordinator once transaction.timeout.ms passed, not before.
        assert time.monotonic() - started < TIMEOUT_MS / 1000 + 10
        committed = _values(_read(b.bootstrap, topic, 2, "read_committed"))
        assert sorted(committed) == sorted(b"committed-%d" % i for i in range(10))
        assert len(_read(b.bootstrap, topic, 2, "read_uncommitted")) == 20
        assert _latest_committed(b.bootstrap, topic, 2) != open_at  # past the abort markers
        # The aborted transaction stays invisible after a crash of the broker too.
        b.kill(signal.SIGKILL)
        b.start()
        assert sorted(_values(_read(b.bootstrap, topic, 2, "read_committed"))) == sorted(committed)
    finally:
        b.kill()
