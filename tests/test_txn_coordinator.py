"""The transaction coordinator's own state across restarts (in-process brokers, real clients).

* A transaction whose EndTxn was answered (PrepareCommit durable) but whose markers were never
  written (the marker writer held back, then the broker stopped) is finished by the next start:
  the coordinator reads PrepareCommit back from __transaction_state and writes the markers.
* The transaction log is kept short without log compaction: past its threshold a partition's
  live ids are rewritten and its log start moves, and the state reads back the same.
* A transactional id idle for transactional.id.expiration.ms is forgotten (a tombstone), also
  after a restart.
"""

from __future__ import annotations

import asyncio
import time

from confluent_kafka import Consumer, Producer, TopicPartition

from stratalog import Broker
from stratalog.broker import state_log, txn_coordinator
from stratalog.broker.txn_records import TRANSACTION_STATE_TOPIC, TxnState

from .conformance import wire
from .conftest import create_topic


def _read_committed(bs: str, topic: str, expect: int) -> list[bytes]:
    c = Consumer({"bootstrap.servers": bs, "group.id": f"r-{time.monotonic()}",
                  "isolation.level": "read_committed", "enable.auto.commit": False})  # fmt: skip
    c.assign([TopicPartition(topic, 0, 0), TopicPartition(topic, 1, 0)])
    out: list[bytes] = []
    deadline = time.monotonic() + 20
    while len(out) < expect and time.monotonic() < deadline:
        m = c.poll(0.2)
        if m is not None and m.error() is None:
            out.append(m.value())
    c.close()
    return sorted(out)


def test_a_prepared_commit_is_finished_by_the_next_start(tmp_path, monkeypatch):
    held = []

    async def never(core, producer_id, epoch, commit, coordinator_epoch, partitions):
        held.append(partitions)
        await asyncio.Event().wait()  # the markers never get written (until the stop)

    data = tmp_path / "data"
    with Broker(data) as b:
        create_topic(b.bootstrap, "prep", 2)
        p = Producer({"bootstrap.servers": b.bootstrap, "transactional.id": "prep-tx"})
        p.init_transactions(30)
        p.begin_transaction()
        for i in range(6):
            p.produce("prep", b"v%d" % i, partition=i % 2)
        p.flush(30)
        monkeypatch.setattr(txn_coordinator, "write_markers", never)
        p.commit_transaction(30)  # answered once PrepareCommit is durable
        assert held, "the coordinator never tried to write the markers"
        m = b.core.txn.txns["prep-tx"]
        assert m.state == TxnState.PREPARE_COMMIT
        assert _read_committed(b.bootstrap, "prep", 1) == []  # the LSO holds
    monkeypatch.undo()
    with Broker(data) as b:
        assert _read_committed(b.bootstrap, "prep", 6) == sorted(b"v%d" % i for i in range(6))
        deadline = time.monotonic() + 10
        while b.core.txn.txns["prep-tx"].state != TxnState.COMPLETE_COMMIT:
            assert time.monotonic() < deadline
            time.sleep(0.05)


def test_the_transaction_log_is_kept_short_and_reads_back(tmp_path, monkeypatch):
    monkeypatch.setattr(state_log, "COMPACT_SLACK", 5)
    data = tmp_path / "data"
    with Broker(data, config={"transaction.state.log.num.partitions": 1}) as b:
        wire.call(b.bootstrap, 10, 6, key_type=1, coordinator_keys=["a"])
        for _ in range(30):  # every InitProducerId writes the id's new epoch
            for tid in ("a", "b"):
                r = wire.call(b.bootstrap, 22, 4, transactional_id=tid, transaction_timeout=60000,
                              producer_id=-1, producer_epoch=-1)  # fmt: skip
                assert r["error_code"] == 0
        epochs = {t: b.core.txn.txns[t].producer_epoch for t in ("a", "b")}
        assert epochs == {"a": 29, "b": 29}
        p = b.core.partition(TRANSACTION_STATE_TOPIC, 0)
        deadline = time.monotonic() + 10
        while p.log_start_offset == 0:  # the rewrite runs in the background
            assert time.monotonic() < deadline, "the transaction log was never rewritten"
            time.sleep(0.05)
        assert p.high_watermark - p.log_start_offset < 30
    with Broker(data, config={"transaction.state.log.num.partitions": 1}) as b:
        assert {t: b.core.txn.txns[t].producer_epoch for t in ("a", "b")} == epochs
        r = wire.call(b.bootstrap, 22, 4, transactional_id="a", transaction_timeout=60000,
                      producer_id=-1, producer_epoch=-1)  # fmt: skip
        assert (r["error_code"], r["producer_epoch"]) == (0, 30)


def test_an_idle_transactional_id_expires(tmp_path):
    config = {
        "transactional.id.expiration.ms": 500,
        "transaction.abort.timed.out.transaction.cleanup.interval.ms": 100,
    }
    data = tmp_path / "data"
    with Broker(data, config=config) as b:
        wire.call(b.bootstrap, 10, 6, key_type=1, coordinator_keys=["idle"])
        r = wire.call(b.bootstrap, 22, 4, transactional_id="idle", transaction_timeout=60000,
                      producer_id=-1, producer_epoch=-1)  # fmt: skip
        assert r["error_code"] == 0
        deadline = time.monotonic() + 10
        while "idle" in b.core.txn.txns:
            assert time.monotonic() < deadline, "the idle id was never forgotten"
            time.sleep(0.05)
    with Broker(data, config=config) as b:
        assert "idle" not in b.core.txn.txns
        r = wire.call(b.bootstrap, 22, 4, transactional_id="idle", transaction_timeout=60000,
                      producer_id=-1, producer_epoch=-1)  # fmt: skip
        assert (r["error_code"], r["producer_epoch"]) == (0, 0)  # a new producer
