"""Transactions (KIP-98), on both brokers: the same transactional producers and the same raw
requests must get the same answers from Stratalog and Apache Kafka.

* A confluent-kafka transactional producer: a transaction over two partitions with its consumer
  offsets (send_offsets_to_transaction) committed, one aborted, one committed after it; read back
  by read_committed and read_uncommitted consumers, the committed offsets, and the batches as
  stored (control batches where Kafka has them).
* Zombie fencing: a second producer with the same transactional.id fences the first.
* kafka-python and aiokafka transactional producers.
* The protocol walked by hand: InitProducerId (v0, v3, v5), FindCoordinator for a transaction,
  AddPartitionsToTxn, transactional Produce, Fetch and ListOffsets with both isolation levels
  (last stable offset, aborted transactions), EndTxn and its retries.
* Bad input: unknown transactional ids, wrong producer ids and epochs (by request version),
  missing topics and partitions, transactional batches without a transactional id or outside
  the transaction, a transaction timeout above the maximum.
* ``kafka-transactions.sh`` list, describe and describe-producers.

Producer ids differ between the brokers (Stratalog gives transactional producers ids from 2^61),
so answers show them as "P" (and "Q" for a second producer).
"""

from __future__ import annotations

import itertools
import time
import uuid
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from kio.schema.errors import ErrorCode

from stratalog.records import build_batch

from . import clients, wire
from .conftest import both

pytestmark = pytest.mark.kafka

TRANSIENT = {
    "COORDINATOR_LOAD_IN_PROGRESS",
    "COORDINATOR_NOT_AVAILABLE",
    "NOT_COORDINATOR",
    "CONCURRENT_TRANSACTIONS",
}


def err(code: int) -> str:
    return ErrorCode(code).name.upper()


def check(strat: Any, kafka: Any) -> None:
    assert strat == kafka, wire.differences(strat, kafka)


def _now_ms() -> int:
    return int(time.time() * 1000)


def _retry(call, error_of, timeout: float = 30) -> Any:
    """``call()`` again while its answer is a transient coordinator error."""
    deadline = time.monotonic() + timeout
    while True:
        r = call()
        if error_of(r) not in TRANSIENT or time.monotonic() > deadline:
            return r
        time.sleep(0.1)


# -- raw requests --------------------------------------------------------------------------------


def find_coordinator(bs: str, txid: str) -> str:
    r = _retry(
        lambda: wire.call(bs, 10, 6, key_type=1, coordinator_keys=[txid]),
        lambda r: err(r["coordinators"][0]["error_code"]),
    )
    return err(r["coordinators"][0]["error_code"])


def init_pid(
    bs: str, txid: str, *, v: int = 5, timeout: int = 60000, pid: int = -1, epoch: int = -1
) -> dict[str, Any]:
    def call() -> dict[str, Any]:
        return wire.call(bs, 22, v, transactional_id=txid, transaction_timeout=timeout,
                         producer_id=pid, producer_epoch=epoch)  # fmt: skip

    return _retry(call, lambda r: err(r["error_code"]))


def add_partitions(
    bs: str, txid: str, pid: int, epoch: int, tps: list[tuple[str, int]], v: int = 3
) -> dict[tuple[str, int], str]:
    by_topic: dict[str, list[int]] = {}
    for t, i in tps:
        by_topic.setdefault(t, []).append(i)
    r = wire.call(
        bs, 24, v,
        v3_and_below_transactional_id=txid, v3_and_below_producer_id=pid,
        v3_and_below_producer_epoch=epoch,
        v3_and_below_topics=[{"name": t, "partitions": ix} for t, ix in by_topic.items()],
    )  # fmt: skip
    return {
        f"{t['name']}/{p['partition_index']}": err(p["partition_error_code"])
        for t in r["results_by_topic_v3_and_below"]
        for p in t["results_by_partition"]
    }


def end_txn(bs: str, txid: str, pid: int, epoch: int, commit: bool, v: int = 3) -> str:
    r = wire.call(bs, 26, v, transactional_id=txid, producer_id=pid, producer_epoch=epoch,
                  committed=commit)  # fmt: skip
    return err(r["error_code"])


def add_offsets(bs: str, txid: str, pid: int, epoch: int, group: str, v: int = 3) -> str:
    r = wire.call(bs, 25, v, transactional_id=txid, producer_id=pid, producer_epoch=epoch,
                  group_id=group)  # fmt: skip
    return err(r["error_code"])


def txn_offset_commit(
    bs: str, txid: str, pid: int, epoch: int, group: str, topic: str, offset: int, v: int = 3
) -> str:
    r = wire.call(
        bs, 28, v, transactional_id=txid, group_id=group, producer_id=pid, producer_epoch=epoch,
        generation_id=-1, member_id="", group_instance_id=None,
        topics=[{"name": topic, "partitions": [{"partition_index": 0, "committed_offset": offset,
                 "committed_leader_epoch": -1, "committed_metadata": ""}]}],
    )  # fmt: skip
    return err(r["topics"][0]["partitions"][0]["error_code"])


def txn_batch(pid: int, epoch: int, seq: int, n: int, ts: int, *, tag: str = "v") -> bytes:
    records = [(None, f"{tag}{i}".encode(), ts + i) for i in range(n)]
    return build_batch(
        records, producer_id=pid, producer_epoch=epoch, base_sequence=seq, transactional=True
    )


def fetch(bs: str, topic: str, partition: int, offset: int, isolation: int) -> dict[str, Any]:
    r = wire.call(
        bs, 1, 12,
        replica_id=-1, max_wait=50, min_bytes=1, max_bytes=16 << 20, isolation_level=isolation,
        session_id=0, session_epoch=-1,
        topics=[{"topic": topic, "partitions": [{
            "partition": partition, "current_leader_epoch": -1, "fetch_offset": offset,
            "last_fetched_epoch": -1, "log_start_offset": -1, "partition_max_bytes": 8 << 20}]}],
        forgotten_topics_data=[], rack_id="",
    )  # fmt: skip
    return r["responses"][0]["partitions"][0]


def fetched(bs: str, topic: str, partition: int, isolation: int, pids: dict[int, str]):
    """What a consumer of one isolation level sees from offset 0: watermarks, the batches
    (offsets, transactional and control bits, producer as a name) and the aborted list."""
    p = fetch(bs, topic, partition, 0, isolation)
    batches = [
        (b["base_offset"], b["records"], b["transactional"], b["control"],
         pids.get(b["producer_id"], b["producer_id"]))
        for b in wire.parse_batches(p["records"])
    ]  # fmt: skip
    aborted = p["aborted_transactions"]
    return {
        "error": err(p["error_code"]),
        "high_watermark": p["high_watermark"],
        "last_stable_offset": p["last_stable_offset"],
        "batches": batches,
        "aborted": None
        if aborted is None
        else [(pids.get(a["producer_id"], "?"), a["first_offset"]) for a in aborted],
    }


def list_latest(bs: str, topic: str, partition: int, isolation: int) -> int:
    r = wire.call(
        bs, 2, 7, replica_id=-1, isolation_level=isolation,
        topics=[{"name": topic, "partitions": [
            {"partition_index": partition, "current_leader_epoch": -1, "timestamp": -1}]}],
    )  # fmt: skip
    return r["topics"][0]["partitions"][0]["offset"]


def wait_stable(bs: str, topic: str, partition: int) -> None:
    """Until the last stable offset reaches the high watermark (markers are written after
    EndTxn is answered)."""
    deadline = time.monotonic() + 30
    while True:
        p = fetch(bs, topic, partition, 0, 0)
        if p["last_stable_offset"] == p["high_watermark"]:
            return
        assert time.monotonic() < deadline, f"{topic}/{partition} never became stable: {p}"
        time.sleep(0.05)


def protocol_walk(bs: str, topic: str, ts: int) -> dict[str, Any]:
    assert wire.create_topic(bs, topic, 2) == 0
    txid = f"{topic}-tx"
    out: dict[str, Any] = {"find_coordinator": find_coordinator(bs, txid)}
    r = init_pid(bs, txid)
    pid, epoch = r["producer_id"], r["producer_epoch"]
    pids = {pid: "P"}
    out["init"] = (err(r["error_code"]), epoch)
    tps = [(topic, 0), (topic, 1)]
    out["add"] = add_partitions(bs, txid, pid, epoch, tps)
    out["add-again"] = add_partitions(bs, txid, pid, epoch, tps[:1])
    for i in (0, 1):
        r = wire.produce(bs, topic, i, txn_batch(pid, epoch, 0, 3, ts), transactional_id=txid)
        out[f"produce-{i}"] = (err(r["error_code"]), r["base_offset"])
    out["open/committed"] = fetched(bs, topic, 0, 1, pids)
    out["open/uncommitted"] = fetched(bs, topic, 0, 0, pids)
    out["open/latest"] = (list_latest(bs, topic, 0, 0), list_latest(bs, topic, 0, 1))
    out["abort"] = end_txn(bs, txid, pid, epoch, commit=False)
    wait_stable(bs, topic, 0)
    out["aborted/committed"] = fetched(bs, topic, 0, 1, pids)
    out["aborted/latest"] = (list_latest(bs, topic, 0, 0), list_latest(bs, topic, 0, 1))
    # Until the coordinator has finished the abort (its markers on both partitions): before,
    # either broker answers CONCURRENT_TRANSACTIONS, and a loaded machine slows one of them.
    out["abort-again"] = _retry(lambda: end_txn(bs, txid, pid, epoch, commit=False), str)
    out["commit-after-abort"] = _retry(lambda: end_txn(bs, txid, pid, epoch, commit=True), str)
    # The next transaction: sequences go on in the same epoch.
    out["add-2"] = _retry(
        lambda: add_partitions(bs, txid, pid, epoch, tps[:1]), lambda r: r[f"{topic}/0"]
    )
    r = wire.produce(bs, topic, 0, txn_batch(pid, epoch, 3, 2, ts, tag="w"), transactional_id=txid)
    out["produce-2"] = (err(r["error_code"]), r["base_offset"])
    out["commit"] = end_txn(bs, txid, pid, epoch, commit=True)
    wait_stable(bs, topic, 0)
    out["committed/committed"] = fetched(bs, topic, 0, 1, pids)
    out["committed/uncommitted"] = fetched(bs, topic, 0, 0, pids)
    out["partition-1/committed"] = fetched(bs, topic, 1, 1, pids)
    out["commit-again"] = end_txn(bs, txid, pid, epoch, commit=True)
    out["abort-after-commit"] = end_txn(bs, txid, pid, epoch, commit=False)
    # A new InitProducerId bumps the epoch; the old one is fenced.
    r = init_pid(bs, txid)
    out["re-init"] = (err(r["error_code"]), r["producer_id"] == pid, r["producer_epoch"])
    out["end-old-epoch-v1"] = end_txn(bs, txid, pid, epoch, commit=True, v=1)
    out["end-old-epoch-v3"] = end_txn(bs, txid, pid, epoch, commit=True, v=3)
    out["add-old-epoch-v1"] = add_partitions(bs, txid, pid, epoch, tps[:1], v=1)
    out["add-old-epoch-v3"] = add_partitions(bs, txid, pid, epoch, tps[:1], v=3)
    return out


def test_protocol_walk(pair, name):
    strat, kafka = both(pair, protocol_walk, name, _now_ms())
    check(strat, kafka)
    assert kafka["aborted/committed"]["aborted"] == [("P", 0)]
    assert kafka["open/committed"]["last_stable_offset"] == 0


def init_versions(bs: str, txid: str) -> list[tuple[str, int]]:
    out = []
    for v in (0, 3, 5):
        find_coordinator(bs, f"{txid}-v{v}")
        r = init_pid(bs, f"{txid}-v{v}", v=v)
        out.append((err(r["error_code"]), r["producer_epoch"]))
        r = init_pid(bs, f"{txid}-v{v}", v=v)
        out.append((err(r["error_code"]), r["producer_epoch"]))
    return out


def test_init_producer_id_with_transactional_id(pair, name):
    strat, kafka = both(pair, init_versions, name)
    check(strat, kafka)
    assert kafka == [("NONE", 0), ("NONE", 1)] * 3


def find_transaction_coordinator(bs: str, txid: str) -> list[str]:
    first = find_coordinator(bs, txid)
    r3 = wire.call(bs, 10, 3, key=txid, key_type=1)
    return [first, err(r3["error_code"])]


def test_find_transaction_coordinator(pair, name):
    strat, kafka = both(pair, find_transaction_coordinator, name)
    check(strat, kafka)
    assert kafka == ["NONE", "NONE"]


def bad_input(bs: str, topic: str, ts: int) -> dict[str, Any]:
    assert wire.create_topic(bs, topic, 1) == 0
    txid = f"{topic}-tx"
    unknown = f"{topic}-unknown"
    out: dict[str, Any] = {}
    find_coordinator(bs, txid)
    r = init_pid(bs, txid)
    pid, epoch = r["producer_id"], r["producer_epoch"]
    out["init-timeout-too-long"] = err(init_pid(bs, f"{txid}-2", timeout=900001)["error_code"])
    out["init-timeout-max"] = err(init_pid(bs, f"{txid}-3", timeout=900000)["error_code"])
    for v in (0, 3):
        out[f"end-unknown-id-v{v}"] = end_txn(bs, unknown, pid, epoch, True, v=v)
    out["end-empty"] = end_txn(bs, txid, pid, epoch, True)
    out["end-wrong-pid"] = end_txn(bs, txid, pid + 1, epoch, True)
    out["end-wrong-epoch-v1"] = end_txn(bs, txid, pid, epoch + 1, True, v=1)
    out["end-wrong-epoch-v3"] = end_txn(bs, txid, pid, epoch + 1, True, v=3)
    out["add-unknown-id"] = add_partitions(bs, unknown, pid, epoch, [(topic, 0)])
    out["add-missing-topic"] = add_partitions(
        bs, txid, pid, epoch, [(topic, 0), (f"{topic}-missing", 0)]
    )
    out["add-missing-partition"] = add_partitions(bs, txid, pid, epoch, [(topic, 0), (topic, 4)])
    out["add-wrong-pid"] = add_partitions(bs, txid, pid + 1, epoch, [(topic, 0)])
    out["offsets-unknown-id"] = add_offsets(bs, unknown, pid, epoch, f"{topic}-g")
    out["offsets-wrong-epoch-v1"] = add_offsets(bs, txid, pid, epoch + 1, f"{topic}-g", v=1)
    out["offsets-wrong-epoch-v3"] = add_offsets(bs, txid, pid, epoch + 1, f"{topic}-g", v=3)
    # Transactional batches: without a transactional id, before the partition was added.
    r = wire.produce(bs, topic, 0, txn_batch(pid, epoch, 0, 1, ts))
    out["produce-without-transactional-id"] = err(r["error_code"])
    r = _retry(
        lambda: wire.produce(bs, topic, 0, txn_batch(pid, epoch, 0, 1, ts), transactional_id=txid),
        lambda r: err(r["error_code"]),
    )
    out["produce-partition-not-added"] = err(r["error_code"])
    r = wire.produce(bs, topic, 0, txn_batch(pid, epoch, 0, 1, ts), transactional_id=unknown)
    out["produce-unknown-transactional-id"] = err(r["error_code"])
    out["latest"] = list_latest(bs, topic, 0, 0)
    return out


def test_bad_input(pair, name):
    strat, kafka = both(pair, bad_input, name, _now_ms())
    check(strat, kafka)
    assert kafka["end-unknown-id-v3"] == "INVALID_PRODUCER_ID_MAPPING"
    assert kafka["add-missing-topic"][f"{name}-missing/0"] == "UNKNOWN_TOPIC_OR_PARTITION"


def offset_fetch(bs: str, group: str, topic: str, stable: bool) -> tuple[str, int]:
    r = wire.call(bs, 9, 7, group_id=group, require_stable=stable,
                  topics=[{"name": topic, "partition_indexes": [0]}])  # fmt: skip
    p = r["topics"][0]["partitions"][0]
    return err(p["error_code"]), p["committed_offset"]


def list_by_time(bs: str, topic: str, ts: int, isolation: int) -> int:
    r = wire.call(
        bs, 2, 7, replica_id=-1, isolation_level=isolation,
        topics=[{"name": topic, "partitions": [
            {"partition_index": 0, "current_leader_epoch": -1, "timestamp": ts}]}],
    )  # fmt: skip
    return r["topics"][0]["partitions"][0]["offset"]


def offsets_walk(bs: str, topic: str, ts: int) -> dict[str, Any]:
    """TxnOffsetCommit: invisible (or unstable, with require_stable) until the commit, dropped
    at an abort; ListOffsets by time below the last stable offset only."""
    assert wire.create_topic(bs, topic, 1) == 0
    txid, group = f"{topic}-tx", f"{topic}-g"
    find_coordinator(bs, txid)
    r = init_pid(bs, txid)
    pid, epoch = r["producer_id"], r["producer_epoch"]
    out: dict[str, Any] = {}
    for outcome, offset in (("abort", 5), ("commit", 8)):
        out[f"{outcome}/add-offsets"] = _retry(
            lambda: add_offsets(bs, txid, pid, epoch, group), lambda e: e
        )
        out[f"{outcome}/add"] = add_partitions(bs, txid, pid, epoch, [(topic, 0)])
        seq = 0 if outcome == "abort" else 1
        r = wire.produce(bs, topic, 0, txn_batch(pid, epoch, seq, 1, ts), transactional_id=txid)
        out[f"{outcome}/produce"] = err(r["error_code"])
        out[f"{outcome}/commit-offsets"] = txn_offset_commit(bs, txid, pid, epoch, group, topic,
                                                             offset)  # fmt: skip
        out[f"{outcome}/open/fetch"] = offset_fetch(bs, group, topic, False)
        out[f"{outcome}/open/fetch-stable"] = offset_fetch(bs, group, topic, True)
        out[f"{outcome}/open/by-time"] = (list_by_time(bs, topic, ts, 0),
                                          list_by_time(bs, topic, ts, 1))  # fmt: skip
        out[f"{outcome}/end"] = end_txn(bs, txid, pid, epoch, commit=outcome == "commit")
        wait_stable(bs, topic, 0)
        deadline = time.monotonic() + 30
        while offset_fetch(bs, group, topic, True)[0] != "NONE":  # the offsets' marker
            assert time.monotonic() < deadline
            time.sleep(0.05)
        out[f"{outcome}/done/fetch"] = offset_fetch(bs, group, topic, True)
    out["offsets-wrong-epoch"] = txn_offset_commit(bs, txid, pid, epoch + 1, group, topic, 9)
    out["offsets-unknown-id"] = txn_offset_commit(bs, f"{txid}-x", pid, epoch, group, topic, 9)
    # Against the group (KIP-447), in a transaction aborted afterwards.
    out["groups/add-offsets"] = _retry(
        lambda: add_offsets(bs, txid, pid, epoch, group), lambda e: e
    )

    def as_member(g: str, generation: int, member: str) -> str:
        r = wire.call(
            bs, 28, 3, transactional_id=txid, group_id=g, producer_id=pid, producer_epoch=epoch,
            generation_id=generation, member_id=member, group_instance_id=None,
            topics=[{"name": topic, "partitions": [{"partition_index": 0, "committed_offset": 3,
                     "committed_leader_epoch": -1, "committed_metadata": ""}]}],
        )  # fmt: skip
        return err(r["topics"][0]["partitions"][0]["error_code"])

    fresh = f"{group}-fresh"
    out["groups/new-group-with-generation"] = as_member(fresh, 5, "nobody")
    out["groups/new-group-without-generation"] = as_member(fresh, -1, "nobody")
    out["groups/then-with-generation"] = as_member(fresh, 3, "")
    out["groups/unknown-member"] = as_member(group, 2, "nobody")
    out["groups/offsets-partition-not-added"] = as_member(f"{group}-other", -1, "")
    out["groups/end"] = end_txn(bs, txid, pid, epoch, commit=False)
    return out


def test_transactional_offset_commits(pair, name):
    strat, kafka = both(pair, offsets_walk, name, _now_ms())
    check(strat, kafka)
    assert kafka["abort/done/fetch"] == ("NONE", -1)
    assert kafka["commit/done/fetch"] == ("NONE", 8)


# -- clients ---------------------------------------------------------------------------------------


def _read(bs: str, topic: str, partitions: int, level: str, expect: int) -> list[tuple]:
    """(partition, offset, value) a consumer of ``level`` reads from the start, sorted; it reads
    until ``expect`` records came and a little after, so that extra ones would show."""
    c = Consumer({"bootstrap.servers": bs, "group.id": f"read-{uuid.uuid4().hex[:6]}",
                  "isolation.level": level, "enable.auto.commit": False})  # fmt: skip
    c.assign([TopicPartition(topic, i, 0) for i in range(partitions)])
    out: list[tuple] = []
    deadline = time.monotonic() + 30
    quiet_until = None
    try:
        while time.monotonic() < deadline:
            m = c.poll(0.1)
            if m is not None and m.error() is None:
                out.append((m.partition(), m.offset(), m.value()))
            if len(out) >= expect:
                quiet_until = quiet_until or time.monotonic() + 1.0
                if time.monotonic() > quiet_until:
                    break
    finally:
        c.close()
    return sorted(out)


def confluent_transactions(bs: str, topic: str) -> dict[str, Any]:
    assert wire.create_topic(bs, topic, 2) == 0
    source = f"{topic}-in"
    assert wire.create_topic(bs, source, 1) == 0
    group = f"{topic}-g"
    p = Producer({"bootstrap.servers": bs, "transactional.id": f"{topic}-tx",
                  "transaction.timeout.ms": 20000})  # fmt: skip
    p.init_transactions(30)
    # 1: two partitions and the consumer's offsets, committed.
    consumer = Consumer({"bootstrap.servers": bs, "group.id": group, "enable.auto.commit": False})
    p.begin_transaction()
    for i in range(6):
        p.produce(topic, f"c{i}".encode(), partition=i % 2)
    p.send_offsets_to_transaction(
        [TopicPartition(source, 0, 42)], consumer.consumer_group_metadata(), 30
    )
    p.commit_transaction(30)
    # 2: aborted, with offsets that must not count.
    p.begin_transaction()
    for i in range(4):
        p.produce(topic, f"a{i}".encode(), partition=i % 2)
    p.send_offsets_to_transaction(
        [TopicPartition(source, 0, 99)], consumer.consumer_group_metadata(), 30
    )
    p.flush(30)
    p.abort_transaction(30)
    # 3: one partition, committed.
    p.begin_transaction()
    p.produce(topic, b"last", partition=1)
    p.commit_transaction(30)
    committed = consumer.committed([TopicPartition(source, 0)], timeout=10)
    consumer.close()
    return {
        "read_committed": _read(bs, topic, 2, "read_committed", 7),
        "read_uncommitted": _read(bs, topic, 2, "read_uncommitted", 11),
        "committed_offset": committed[0].offset,
        "stored": {
            i: [
                (b["base_offset"], b["records"], b["transactional"], b["control"])
                for b in wire.stored_batches(bs, topic, i)
            ]
            for i in (0, 1)
        },
    }


def test_confluent_kafka_transactions(pair, name):
    strat, kafka = both(pair, confluent_transactions, name)
    check(strat, kafka)
    assert kafka["committed_offset"] == 42
    assert [v for _p, _o, v in kafka["read_committed"]] == [
        b"c0",
        b"c2",
        b"c4",
        b"c1",
        b"c3",
        b"c5",
        b"last",
    ]


def zombie_fencing(bs: str, topic: str) -> dict[str, Any]:
    assert wire.create_topic(bs, topic, 1) == 0
    conf = {"bootstrap.servers": bs, "transactional.id": f"{topic}-tx",
            "transaction.timeout.ms": 20000}  # fmt: skip
    first = Producer(conf)
    first.init_transactions(30)
    first.begin_transaction()
    first.produce(topic, b"zombie", partition=0)
    first.flush(30)
    second = Producer(conf)
    second.init_transactions(30)  # aborts the first's transaction, fences it
    out: dict[str, Any] = {}
    try:
        first.produce(topic, b"zombie-2", partition=0)
        first.commit_transaction(30)
        out["first"] = "committed"
    except KafkaException as e:
        out["first"] = (e.args[0].name(), e.args[0].fatal())
    second.begin_transaction()
    second.produce(topic, b"survivor", partition=0)
    second.commit_transaction(30)
    out["read_committed"] = [r[2] for r in _read(bs, topic, 1, "read_committed", 1)]
    return out


def test_zombie_fencing(pair, name):
    strat, kafka = both(pair, zombie_fencing, name)
    check(strat, kafka)
    assert kafka["read_committed"] == [b"survivor"]


def kafka_python_transactions(bs: str, topic: str) -> dict[str, Any]:
    from kafka import KafkaProducer

    assert wire.create_topic(bs, topic, 2) == 0
    p = KafkaProducer(bootstrap_servers=bs, transactional_id=f"{topic}-tx")
    try:
        p.init_transactions()
        p.begin_transaction()
        for i in range(4):
            p.send(topic, f"c{i}".encode(), partition=i % 2)
        p.commit_transaction()
        p.begin_transaction()
        for i in range(2):
            p.send(topic, f"a{i}".encode(), partition=i % 2)
        p.flush()
        p.abort_transaction()
    finally:
        p.close()
    return {
        "read_committed": _read(bs, topic, 2, "read_committed", 4),
        "read_uncommitted": _read(bs, topic, 2, "read_uncommitted", 6),
    }


def test_kafka_python_transactions(pair, name):
    strat, kafka = both(pair, kafka_python_transactions, name)
    check(strat, kafka)
    assert len(kafka["read_committed"]) == 4


def aiokafka_transactions(bs: str, topic: str) -> dict[str, Any]:
    from aiokafka import AIOKafkaProducer

    assert wire.create_topic(bs, topic, 2) == 0

    async def run() -> None:
        p = AIOKafkaProducer(bootstrap_servers=bs, transactional_id=f"{topic}-tx")
        await p.start()
        try:
            async with p.transaction():
                for i in range(4):
                    await p.send(topic, f"c{i}".encode(), partition=i % 2)
            await p.begin_transaction()
            for i in range(2):
                await p.send(topic, f"a{i}".encode(), partition=i % 2)
            await p.abort_transaction()
        finally:
            await p.stop()

    loop = clients.AioLoop()
    try:
        loop.run(run())
    finally:
        loop.close()
    return {
        "read_committed": _read(bs, topic, 2, "read_committed", 4),
        "read_uncommitted": _read(bs, topic, 2, "read_uncommitted", 6),
    }


def test_aiokafka_transactions(pair, name):
    strat, kafka = both(pair, aiokafka_transactions, name)
    check(strat, kafka)
    assert len(kafka["read_committed"]) == 4


# -- kafka-transactions.sh ------------------------------------------------------------------------


def _table(out: str) -> list[dict[str, str]]:
    """A kafka-transactions table (tab-separated, a header line) as rows of named cells."""
    lines = [line for line in out.splitlines() if line.strip()]
    if not lines:
        return []
    names = [c.strip() for c in lines[0].split("\t") if c.strip()]
    return [
        dict(zip(names, (c.strip() for c in line.split("\t")), strict=False)) for line in lines[1:]
    ]


def _tool(bs: str, *args: str) -> list[dict[str, str]]:
    from stratalog.peers.kafka import run_tool

    r = run_tool("kafka-transactions", "--bootstrap-server", bs, *args, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    return _table(r.stdout)


def transactions_tool(bs: str, topic: str) -> dict[str, Any]:
    assert wire.create_topic(bs, topic, 2) == 0
    txid = f"{topic}-tx"
    p = Producer({"bootstrap.servers": bs, "transactional.id": txid,
                  "transaction.timeout.ms": 60000})  # fmt: skip
    p.init_transactions(30)
    p.begin_transaction()
    for i in range(3):
        p.produce(topic, f"v{i}".encode(), partition=i % 2)
    p.flush(30)
    out: dict[str, Any] = {}

    def listed() -> list[tuple[str, str]]:
        return [(r["TransactionalId"], r["TransactionState"])
                for r in _tool(bs, "list") if r["TransactionalId"] == txid]  # fmt: skip

    def described() -> list[dict[str, Any]]:
        return [
            {"epoch": r["ProducerEpoch"], "state": r["TransactionState"],
             "timeout": r["TransactionTimeoutMs"],
             "partitions": sorted(r["TopicPartitions"].split(",")) if r["TopicPartitions"] else []}
            for r in _tool(bs, "describe", "--transactional-id", txid)
        ]  # fmt: skip

    def producers(partition: int) -> list[dict[str, str]]:
        return [
            {k: r[k] for k in ("ProducerEpoch", "LatestCoordinatorEpoch", "LastSequence",
                               "CurrentTransactionStartOffset")}
            for r in _tool(bs, "describe-producers", "--topic", topic, "--partition",
                           str(partition))
        ]  # fmt: skip

    out["ongoing/list"] = listed()
    out["ongoing/describe"] = described()
    out["ongoing/producers"] = producers(0)
    p.abort_transaction(30)
    deadline = time.monotonic() + 30
    while True:  # (raw ListTransactions: a tool run per poll would take seconds each)
        r = wire.call(bs, 66, 1, state_filters=["CompleteAbort"], producer_id_filters=[],
                      duration_filter=-1)  # fmt: skip
        if any(t["transactional_id"] == txid for t in r["transaction_states"]):
            break
        assert time.monotonic() < deadline, "the abort never completed"
        time.sleep(0.1)
    out["aborted/list"] = listed()
    out["aborted/producers"] = producers(0)
    return out


def test_kafka_transactions_tool(pair, name):
    strat, kafka = both(pair, transactions_tool, name)
    check(strat, kafka)
    assert kafka["ongoing/list"] == [(f"{name}-tx", "Ongoing")]
    assert kafka["ongoing/describe"][0]["partitions"] == [f"{name}-0", f"{name}-1"]


def java_transactions(bs: str, topic: str) -> dict[str, Any]:
    """Kafka's Java producer (kafka-producer-perf-test with a transactional id: a transaction
    every 100 ms), then a read_committed consumer."""
    from stratalog.peers.kafka import run_tool

    assert wire.create_topic(bs, topic, 3) == 0
    r = run_tool(
        "kafka-producer-perf-test", "--topic", topic, "--num-records", "5000",
        "--record-size", "100", "--throughput", "-1", "--transactional-id", f"{topic}-tx",
        "--transaction-duration-ms", "100", "--command-property", f"bootstrap.servers={bs}",
        timeout=100,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    rows = _read(bs, topic, 3, "read_committed", 5000)
    return {"read_committed": len(rows), "per_partition_dense": _dense(rows)}


def _dense(rows: list[tuple]) -> bool:
    """Whether each partition's offsets only skip control batches (one offset each)."""
    by: dict[int, list[int]] = {}
    for partition, offset, _v in rows:
        by.setdefault(partition, []).append(offset)
    return all(b - a in (1, 2) for offsets in by.values() for a, b in itertools.pairwise(offsets))


def test_java_transactional_producer(pair, name):
    strat, kafka = both(pair, java_transactions, name)
    check(strat, kafka)
    assert kafka == {"read_committed": 5000, "per_partition_dense": True}
