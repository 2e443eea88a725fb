"""Dynamic partitioning (stratalog.splits): splits on request and under load, the order marks
Fetch answers a split child's batches with, and a family read that keeps each key's order.

The oracles are outside the code under test: the order of acknowledged writes (each sent only
after the one before was acknowledged, so the log holds them in that order), what Kafka's own
clients (confluent-kafka, the Java console consumer) read, and the per-key sequence numbers a
writer put in its values.
"""

from __future__ import annotations

import random
import time

import pytest
from confluent_kafka import Consumer, KafkaException, TopicPartition
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewPartitions,
)

from stratalog.client.family_reader import Member, child_end, read_family
from stratalog.client.replay import replay_table
from stratalog.client.wire import WireClient
from stratalog.peers.kafka import run_tool
from stratalog.records import build_batch

from .conftest import create_topic

SPLITTABLE = {"partition.autoscale.enable": "true"}


def _history(bootstrap: str, topic: str) -> tuple[str, bool]:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    res = ConfigResource(ConfigResource.Type.TOPIC, topic)
    entry = admin.describe_configs([res])[res].result(timeout=15)["partition.split.history"]
    return entry.value, entry.is_read_only


def _split(bootstrap: str, topic: str, total: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_partitions([NewPartitions(topic, total)])[topic].result(timeout=15)


def _append(client: WireClient, topic: str, partition: int, records: list[tuple]) -> int:
    now = int(time.time() * 1000)
    batch = build_batch([(k, v, now) for k, v, _ in records])
    ((err, base),) = client.produce(topic, {partition: batch}).values()
    assert err == 0
    return base


def test_a_split_on_request_doubles_the_partitions_and_keeps_a_history(broker):
    bs = broker.bootstrap
    create_topic(bs, "grow", 2, **SPLITTABLE)
    assert _history(bs, "grow") == ("", True)
    # Only doubling is a split; a history is the broker's to write.
    with pytest.raises(KafkaException, match="double"):
        _split(bs, "grow", 3)
    _split(bs, "grow", 4)
    assert _history(bs, "grow") == ("2,4", True)
    _split(bs, "grow", 8)
    assert _history(bs, "grow") == ("2,4,8", True)
    admin = AdminClient({"bootstrap.servers": bs})
    res = ConfigResource(
        ConfigResource.Type.TOPIC,
        "grow",
        incremental_configs=[
            ConfigEntry("partition.split.history", "2",
                        incremental_operation=AlterConfigOpType.SET)
        ],
    )  # fmt: skip
    with pytest.raises(KafkaException, match="read-only"):
        admin.incremental_alter_configs([res])[res].result(timeout=15)
    md = admin.list_topics("grow", timeout=15).topics["grow"]
    assert sorted(md.partitions) == list(range(8))
    # A topic without autoscaling grows as Kafka's do, by any count and with no history.
    create_topic(bs, "plain", 2)
    _split(bs, "plain", 3)
    assert _history(bs, "plain") == ("", True)


def test_fetch_marks_each_child_batch_with_its_parents_offset(broker):
    """Writes acknowledged one at a time land in the log in that order: a child batch's mark
    is the number of parent records acknowledged before it. The parent's batches carry none,
    and Kafka's clients read the child as any partition."""
    bs = broker.bootstrap
    create_topic(bs, "marks", 2, **SPLITTABLE)
    rng = random.Random(7)
    values: dict[int, list[bytes]] = {0: [], 1: [], 2: [], 3: []}
    expected: list[tuple[int, int]] = []
    with WireClient(bs) as client:
        for i in range(20):
            v = [(b"k", b"before-%d-%d" % (i, j), 0) for j in range(rng.randint(1, 3))]
            _append(client, "marks", i % 2, v)
            values[i % 2] += [x[1] for x in v]
        _split(bs, "marks", 4)
        client.metadata(["marks"])
        for i in range(60):
            p = rng.choice([0, 2, 2, 1, 3])
            v = [(b"k", b"after-%d-%d" % (i, j), 0) for j in range(rng.randint(1, 3))]
            base = _append(client, "marks", p, v)
            if p == 2:
                expected.append((base, len(values[0])))
            values[p] += [x[1] for x in v]
        got = client.fetch("marks", {0: 0, 2: 0}, max_bytes=1 << 20, partition_max_bytes=1 << 20)
        # A read of the parent cut at x (a rate limit): the child's read ends before its first
        # batch appended after the parent's offset x.
        end = len(values[2])
        for x in (0, 10, len(values[0]) // 2, len(values[0])):
            cut = next((b for b, w in expected if w > x), end)
            assert child_end(client, "marks", 2, 0, end, x) == cut
    assert got[2].order == expected
    assert got[0].order is None

    for p in (0, 2):
        c = Consumer(
            {"bootstrap.servers": bs, "group.id": f"plain-{p}", "enable.auto.commit": False}
        )
        c.assign([TopicPartition("marks", p, 0)])
        read: list[bytes] = []
        deadline = time.monotonic() + 30
        while len(read) < len(values[p]) and time.monotonic() < deadline:
            read += [m.value() for m in c.consume(100, 1.0) if m.error() is None]
        c.close()
        assert read == values[p]
    java = run_tool(
        "kafka-console-consumer", "--bootstrap-server", bs, "--topic", "marks",
        "--partition", "2", "--offset", "earliest", "--max-messages", str(len(values[2])),
        "--timeout-ms", "30000",
    )  # fmt: skip
    assert java.returncode == 0, java.stderr
    assert java.stdout.splitlines() == [v.decode() for v in values[2]]


def _seqs(batches, key: bytes) -> list[int]:
    out = []
    for b in batches:
        d = b.to_pydict()
        out += [
            int(v.split(b":")[1]) for k, v in zip(d["key"], d["value"], strict=True) if k == key
        ]
    return out


def test_a_family_read_keeps_a_keys_order_across_the_split(broker):
    """A writer that has not learned of the split keeps sending a moved key to the parent while
    the parent is behind in a read; then sends it to the child. The family read returns the
    key's records in the order they were written; read partition by partition they are not."""
    bs = broker.bootstrap
    create_topic(bs, "family", 1, **SPLITTABLE)
    seq = 0

    def write(client, partition: int, n: int, key: bytes = b"moved") -> None:
        nonlocal seq
        recs = [(key, b"%s:%d" % (key, seq + i), 0) for i in range(n)]
        seq += n
        _append(client, "family", partition, recs)

    with WireClient(bs) as client:
        for _ in range(30):
            write(client, 0, 5)
            _append(client, "family", 0, [(b"other", b"other:0", 0)] * 3)
        _split(bs, "family", 2)
        client.metadata(["family"])
        for _ in range(20):  # the stale writer: still the parent
            write(client, 0, 5)
        for _ in range(20):  # it learned of the split
            write(client, 1, 5)
            _append(client, "family", 0, [(b"other", b"other:0", 0)] * 3)
        ends = {p: off for p, (off, _) in client.list_offsets("family", [0, 1], -1).items()}
        members = [Member(0, 0, ends[0]), Member(1, 0, ends[1], parent=0)]
        # Small fetches: the reader meets the child's batches long before the parent's end.
        batches = list(read_family(client, "family", members, fetch_bytes=2048))
        assert _seqs(batches, b"moved") == list(range(seq))
        rows = sum(b.num_rows for b in batches)
        assert rows == ends[0] + ends[1]
        # Read side by side without the marks (as two Kafka consumers would), the key's order
        # breaks: the check above can fail.
        unmarked = [members[0], Member(1, 0, ends[1])]
        naive = list(read_family(client, "family", unmarked, fetch_bytes=2048))
        assert sorted(_seqs(naive, b"moved")) == list(range(seq))
        assert _seqs(naive, b"moved") != list(range(seq))
    # A time-range replay reads the families the same way.
    table = replay_table(bs, "family", 0, int(time.time() * 1000) + 1000)
    assert table.num_rows == ends[0] + ends[1]
    assert "_rank" not in table.column_names
    assert _seqs(table.to_batches(), b"moved") == list(range(seq))


def test_marks_of_a_child_in_the_cold_tier_keep_the_order(tmp_path):
    """Migration keeps each partition's chunks apart; a cold child batch is marked by its
    virtual log segment, never below its true mark (the parent's offset when it was
    acknowledged), and a family read over both tiers still puts each child record after every
    parent record acknowledged before it."""
    from stratalog import Broker

    from .test_tiers import cold_chunks, tier_config, wait_for

    with Broker(tmp_path / "data", config=tier_config(tmp_path)) as b:
        bs = b.bootstrap
        create_topic(bs, "coldsplit", 1, **SPLITTABLE, **{"retention.ms": "-1"})
        written: list[tuple[int, list[bytes]]] = []
        true_marks: dict[int, int] = {}
        parent_end = 0
        with WireClient(bs) as client:

            def write(p: int, i: int) -> None:
                nonlocal parent_end
                vs = [(b"k", b"%d-%d:" % (p, i) + b"." * 300, 0) for _ in range(3)]
                base = _append(client, "coldsplit", p, vs)
                written.append((p, [v for _, v, _ in vs]))
                if p == 1:
                    true_marks[base] = parent_end
                else:
                    parent_end += 3

            for i in range(40):
                write(0, i)
            _split(bs, "coldsplit", 2)
            client.metadata(["coldsplit"])
            for i in range(1000, 1400):  # (values unique: after the 40 before)
                write((0, 1, 1)[i % 3], i)
            wait_for(lambda: b.core.migrator.hot_usage() <= 100_000, what="migration")
            assert cold_chunks(b, "coldsplit") > 0
            child = b.core.partition("coldsplit", 1)
            assert len(child.cold) > 0, "none of the child's chunks went cold"
            marks: dict[int, int] = {}
            at = 0
            for _ in range(len(true_marks)):  # (each fetch moves on, or the loop ends)
                got = client.fetch("coldsplit", {1: at}, max_bytes=64 << 10)[1]
                if not got.order:
                    break
                marks.update(got.order)
                at = max(marks) + 3
            assert marks.keys() == true_marks.keys()
            assert all(marks[o] >= w for o, w in true_marks.items())
            assert any(marks[o] > w for o, w in true_marks.items())  # the cold ones: coarser
            ends = {p: o for p, (o, _) in client.list_offsets("coldsplit", [0, 1], -1).items()}
            members = [Member(0, 0, ends[0]), Member(1, 0, ends[1], parent=0)]
            batches = list(read_family(client, "coldsplit", members, fetch_bytes=4096))
    values = [v for rb in batches for v in rb.column("value").to_pylist()]
    assert sorted(values) == sorted(v for _, vs in written for v in vs)
    at = {v: i for i, v in enumerate(values)}
    parent: list[bytes] = []
    for p, vs in written:
        if p == 0:
            parent += vs
        else:
            assert all(at[v] > at[w] for v in vs for w in parent)


def test_a_split_survives_kill9_with_its_marks(broker_process):
    """After kill -9 and a restart: the history, the children and their marks are as they were
    (every write acknowledged before the kill, acks=all)."""
    bs = broker_process.start().bootstrap
    create_topic(bs, "kept", 1, **SPLITTABLE)
    expected: list[tuple[int, int]] = []
    parent_end = 0
    with WireClient(bs) as client:
        for i in range(10):
            _append(client, "kept", 0, [(b"k", b"a%d" % i, 0)] * 2)
            parent_end += 2
        _split(bs, "kept", 2)
        client.metadata(["kept"])
        for i in range(30):
            p = (0, 1, 1)[i % 3]
            base = _append(client, "kept", p, [(b"k", b"b%d" % i, 0)] * 2)
            if p == 1:
                expected.append((base, parent_end))
            else:
                parent_end += 2
    broker_process.kill()
    bs = broker_process.start().bootstrap
    assert _history(bs, "kept") == ("1,2", True)
    with WireClient(bs) as client:
        got = client.fetch("kept", {0: 0, 1: 0}, max_bytes=1 << 20, partition_max_bytes=1 << 20)
    assert got[1].order == expected
    assert got[0].order is None
