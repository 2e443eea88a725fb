"""The consumer group protocol (KIP-848) with real clients against `stratalog serve`.

librdkafka (confluent-kafka, ``group.protocol=consumer``) and Kafka's Java consumer (its
command-line tools with ``group.protocol=consumer``) on one broker process on loopback. The
broker tells members to heartbeat every second (``group.consumer.heartbeat.interval.ms``; Kafka's
default is five) so that hand-overs, which take a heartbeat of the old owner and one of the new,
settle within a test, and removes members silent for four seconds.
"""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, ConsumerGroupState, ConsumerGroupType, Producer
from confluent_kafka.admin import AdminClient, NewPartitions

from stratalog.peers.kafka import run_tool

from .conformance import wire
from .conftest import BrokerProcess, create_topic

HEARTBEAT_MS = 1000
SESSION_MS = 4000
SETTLE_S = 30


@pytest.fixture(scope="module")
def bootstrap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    data = Path(tmp_path_factory.mktemp("kip848")) / "data"
    settings = {
        "group.consumer.heartbeat.interval.ms": str(HEARTBEAT_MS),
        "group.consumer.session.timeout.ms": str(SESSION_MS),
    }
    bp = BrokerProcess(data, settings=settings)
    bp.start()
    try:
        yield bp.bootstrap
    finally:
        bp.stop()


def _consumer(bootstrap: str, group: str, topic: str, name: str) -> Consumer:
    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "group.protocol": "consumer",
            "client.id": name,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    c.subscribe([topic])
    return c


def _produce(bootstrap: str, topic: str, partitions: int, start: int, n: int) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
    for i in range(start, start + n):
        p.produce(topic, value=f"r{i}".encode(), partition=i % partitions)
    assert p.flush(30) == 0


class Work:
    """What the consumers of a group read and committed. A record read again after its offset
    was committed would be committed work done twice: ``poll`` fails the test on it."""

    def __init__(self) -> None:
        self.seen: dict[tuple[int, int], str] = {}  # (partition, offset) -> first reader
        self.committed: dict[int, int] = {}  # partition -> next offset, as committed

    def poll(self, consumers: dict[str, Consumer]) -> None:
        for name, c in consumers.items():
            msgs = c.consume(num_messages=100, timeout=0.1)
            for m in msgs:
                assert m.error() is None, m.error()
                p, o = m.partition(), m.offset()
                assert o >= self.committed.get(p, 0), (
                    f"{name} read partition {p} offset {o}, already committed up to "
                    f"{self.committed[p]}"
                )
                self.seen.setdefault((p, o), name)
            if msgs:
                for tp in c.commit(asynchronous=False):
                    assert tp.error is None, tp.error
                    self.committed[tp.partition] = max(
                        self.committed.get(tp.partition, 0), tp.offset
                    )

    def until(
        self,
        consumers: dict[str, Consumer],
        total: int,
        partitions: int,
        sizes: set[int] | None = None,
    ) -> None:
        """Poll until ``total`` records were read and the members' assignments are disjoint,
        cover every partition and leave nobody without one (and, given ``sizes``, hold that
        many each: an incremental hand-over passes through uneven ones, 3+2+1 on the way to
        2+2+2, for as long as revocations take on a loaded machine)."""
        deadline = time.monotonic() + SETTLE_S
        while True:
            self.poll(consumers)
            owned = {n: {tp.partition for tp in c.assignment()} for n, c in consumers.items()}
            flat = [p for ps in owned.values() for p in ps]
            settled = sorted(flat) == list(range(partitions)) and all(owned.values())
            if sizes is not None:
                settled = settled and {len(ps) for ps in owned.values()} == sizes
            if len(self.seen) >= total and settled:
                return
            assert time.monotonic() < deadline, (len(self.seen), total, owned)


def _describe(bootstrap: str, group: str):
    admin = AdminClient({"bootstrap.servers": bootstrap})
    return admin.describe_consumer_groups([group])[group].result(timeout=15)


def test_members_share_hand_over_and_resume(bootstrap: str) -> None:
    topic, group, parts = "kip848-share", "kip848-share-g", 6
    create_topic(bootstrap, topic, parts)
    work = Work()
    members = {n: _consumer(bootstrap, group, topic, n) for n in ("c1", "c2")}
    try:
        _produce(bootstrap, topic, parts, 0, 300)
        work.until(members, 300, parts)
        d = _describe(bootstrap, group)
        assert d.type == ConsumerGroupType.CONSUMER and d.state == ConsumerGroupState.STABLE
        assert d.partition_assignor == "uniform" and len(d.members) == 2
        assert {len(m.assignment.topic_partitions) for m in d.members} == {3}

        # A third member joins: it gets partitions of its own, none read twice once committed.
        members["c3"] = _consumer(bootstrap, group, topic, "c3")
        _produce(bootstrap, topic, parts, 300, 300)
        work.until(members, 600, parts, sizes={2})
        assert {len(c.assignment()) for c in members.values()} == {2}

        # One leaves: the others take its partitions over from its commits.
        members.pop("c1").close()
        _produce(bootstrap, topic, parts, 600, 300)
        work.until(members, 900, parts)
        assert len(_describe(bootstrap, group).members) == 2
        assert len(work.seen) == 900
    finally:
        for c in members.values():
            c.close()

    # Every member gone: the group is empty, its commits kept; a new member resumes from them.
    d = _describe(bootstrap, group)
    assert d.state == ConsumerGroupState.EMPTY and d.members == []
    assert work.committed == {p: 150 for p in range(parts)}
    _produce(bootstrap, topic, parts, 900, 60)
    late = Work()
    late.committed = dict(work.committed)
    again = {"c4": _consumer(bootstrap, group, topic, "c4")}
    try:
        late.until(again, 60, parts)
        assert sorted(o for _p, o in late.seen) == sorted([150] * 6 + [*range(151, 160)] * 6)
    finally:
        again["c4"].close()


def test_listed_as_a_consumer_group(bootstrap: str) -> None:
    topic, group = "kip848-list", "kip848-list-g"
    create_topic(bootstrap, topic, 2)
    c = _consumer(bootstrap, group, topic, "lister")
    try:
        deadline = time.monotonic() + SETTLE_S
        while len(c.assignment()) < 2:
            c.poll(0.1)
            assert time.monotonic() < deadline
        admin = AdminClient({"bootstrap.servers": bootstrap})
        listed = admin.list_consumer_groups(types={ConsumerGroupType.CONSUMER}).result(timeout=15)
        mine = [g for g in listed.valid if g.group_id == group]
        assert len(mine) == 1 and mine[0].type == ConsumerGroupType.CONSUMER
        assert mine[0].state == ConsumerGroupState.STABLE
        classic = admin.list_consumer_groups(types={ConsumerGroupType.CLASSIC}).result(timeout=15)
        assert group not in {g.group_id for g in classic.valid}
    finally:
        c.close()


def _tool(tool: str, *args: str) -> subprocess.CompletedProcess[str]:
    r = run_tool(tool, *args, timeout=120)
    assert r.returncode == 0, f"{tool} {args}\n{r.stdout}\n{r.stderr}"
    return r


@pytest.mark.kafka
def test_java_consumer_and_kafka_consumer_groups(bootstrap: str) -> None:
    topic, group, parts = "kip848-java", "kip848-java-g", 3
    create_topic(bootstrap, topic, parts)
    _produce(bootstrap, topic, parts, 0, 30)
    bs = ("--bootstrap-server", bootstrap)
    # Kafka's Java consumer in the consumer protocol reads everything and commits on close.
    out = _tool(
        "kafka-console-consumer", *bs, "--topic", topic, "--group", group, "--from-beginning",
        "--max-messages", "30", "--timeout-ms", "60000",
        "--consumer-property", "group.protocol=consumer",
    )  # fmt: skip
    # (Kafka 4.4 also prints that --consumer-property is deprecated for --command-property.)
    records = [line for line in out.stdout.split() if re.fullmatch(r"r\d+", line)]
    assert sorted(records) == sorted(f"r{i}" for i in range(30))

    offsets = _tool("kafka-consumer-groups", *bs, "--describe", "--group", group)
    assert "has no active members" in offsets.stdout + offsets.stderr
    rows = [line.split() for line in offsets.stdout.splitlines() if line.startswith(group)]
    assert sorted((r[1], r[2], r[3], r[4], r[5]) for r in rows) == [
        (topic, str(p), "10", "10", "0") for p in range(parts)
    ]

    # A live librdkafka member: the Java admin describes it through ConsumerGroupDescribe.
    c = _consumer(bootstrap, group, topic, "live-member")
    try:
        deadline = time.monotonic() + SETTLE_S
        while len(c.assignment()) < parts:
            c.poll(0.1)
            assert time.monotonic() < deadline
        state = _tool("kafka-consumer-groups", *bs, "--describe", "--state", "--group", group)
        row = next(line.split() for line in state.stdout.splitlines() if line.startswith(group))
        assert row[-3:] == ["uniform", "Stable", "1"]
        verbose = _tool(
            "kafka-consumer-groups", *bs, "--describe", "--members", "--verbose", "--group", group
        )
        row = next(line.split() for line in verbose.stdout.splitlines() if line.startswith(group))
        # ... CLIENT-ID #PARTITIONS CURRENT-EPOCH CURRENT-ASSIGNMENT TARGET-EPOCH TARGET-ASSIGNMENT
        assert row[3:5] == ["live-member", "3"]
        assert row[6] == row[8] == f"{topic}:0,1,2" and row[5] == row[7]
        listed = _tool("kafka-consumer-groups", *bs, "--list", "--type")
        assert [group, "Consumer"] in [line.split() for line in listed.stdout.splitlines()]
    finally:
        c.close()


def test_transactional_offsets_of_a_consumer_protocol_member(bootstrap: str) -> None:
    """Read-process-write: the consumer's group metadata (member id and epoch) goes with the
    offsets in TxnOffsetCommit, and they are committed with the transaction."""
    src, out, group = "kip848-txn-in", "kip848-txn-out", "kip848-txn-g"
    create_topic(bootstrap, src, 2)
    create_topic(bootstrap, out, 1)
    _produce(bootstrap, src, 2, 0, 20)
    c = _consumer(bootstrap, group, src, "txn-member")
    p = Producer({"bootstrap.servers": bootstrap, "transactional.id": "kip848-txn"})
    try:
        p.init_transactions(30)
        got = []
        deadline = time.monotonic() + SETTLE_S
        while len(got) < 20:
            got += [m for m in c.consume(num_messages=100, timeout=0.2) if m.error() is None]
            assert time.monotonic() < deadline, len(got)
        p.begin_transaction()
        for m in got:
            p.produce(out, value=m.value())
        positions = c.position(c.assignment())
        p.send_offsets_to_transaction(positions, c.consumer_group_metadata(), 30)
        p.commit_transaction(30)
        committed = c.committed(c.assignment(), timeout=15)
        assert sorted((tp.partition, tp.offset) for tp in committed) == [(0, 10), (1, 10)]
    finally:
        c.close()


def _wait_owned(c: Consumer, want: set[tuple[str, int]]) -> None:
    deadline = time.monotonic() + SETTLE_S
    while {(tp.topic, tp.partition) for tp in c.assignment()} != want:
        c.poll(0.1)
        assert time.monotonic() < deadline, (c.assignment(), want)


def test_regex_subscription_and_new_partitions_are_picked_up(bootstrap: str) -> None:
    create_topic(bootstrap, "kip848-re-a", 1)
    create_topic(bootstrap, "kip848-re-b", 2)
    create_topic(bootstrap, "kip848-other", 1)
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "kip848-re-g",
                  "group.protocol": "consumer", "auto.offset.reset": "earliest"})  # fmt: skip
    c.subscribe(["^kip848-re-.*"])
    try:
        _wait_owned(c, {("kip848-re-a", 0), ("kip848-re-b", 0), ("kip848-re-b", 1)})
        raw = wire.call(bootstrap, 69, 1, group_ids=["kip848-re-g"],
                        include_authorized_operations=False)["groups"][0]  # fmt: skip
        # librdkafka hands the broker the expression; the broker resolved it.
        assert raw["members"][0]["subscribed_topic_regex"] == "(^kip848-re-.*)"
        assert raw["members"][0]["subscribed_topic_names"] == []
        # A new matching topic and a grown one join the assignment; the other topic never does.
        create_topic(bootstrap, "kip848-re-c", 1)
        admin = AdminClient({"bootstrap.servers": bootstrap})
        admin.create_partitions([NewPartitions("kip848-re-a", 2)])["kip848-re-a"].result(15)
        _wait_owned(
            c,
            {("kip848-re-a", 0), ("kip848-re-a", 1), ("kip848-re-b", 0), ("kip848-re-b", 1),
             ("kip848-re-c", 0)},
        )  # fmt: skip
    finally:
        c.close()


def test_a_silent_member_is_removed_and_its_partitions_reassigned(bootstrap: str) -> None:
    topic, group = "kip848-silent", "kip848-silent-g"
    create_topic(bootstrap, topic, 2)
    # A member that joins (taking both partitions) and never heartbeats again.
    silent = wire.call(bootstrap, 68, 1, group_id=group, member_id="silent", member_epoch=0,
                       rebalance_timeout=60000, subscribed_topic_names=[topic],
                       topic_partitions=[])  # fmt: skip
    assert silent["error_code"] == 0 and silent["assignment"]["topic_partitions"], silent
    joined = time.monotonic()
    c = _consumer(bootstrap, group, topic, "alive")
    try:
        _wait_owned(c, {(topic, 0), (topic, 1)})
        # Only once the session timeout removed the silent member (it never revoked).
        assert time.monotonic() - joined >= SESSION_MS / 1000 - 0.5
        members = [m.member_id for m in _describe(bootstrap, group).members]
        assert "silent" not in members and len(members) == 1
    finally:
        c.close()


def test_members_rejoin_after_a_restart(broker_process: BrokerProcess) -> None:
    """Membership is not persisted: after a restart the broker does not know the group, the
    member is told UNKNOWN_MEMBER_ID, rejoins and resumes from its committed offsets."""
    broker_process.settings = {"group.consumer.heartbeat.interval.ms": str(HEARTBEAT_MS)}
    bs = broker_process.start().bootstrap
    topic, group = "kip848-restart", "kip848-restart-g"
    create_topic(bs, topic, 2)
    _produce(bs, topic, 2, 0, 20)
    work = Work()
    members = {"m": _consumer(bs, group, topic, "m")}
    try:
        work.until(members, 20, 2)
        broker_process.stop()
        broker_process.start()
        _produce(bs, topic, 2, 20, 20)
        work.until(members, 40, 2)  # nothing committed read again (Work checks)
        d = _describe(bs, group)
        assert d.state == ConsumerGroupState.STABLE and len(d.members) == 1
    finally:
        members["m"].close()
    assert work.committed == {0: 20, 1: 20}
