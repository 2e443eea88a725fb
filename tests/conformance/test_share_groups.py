"""Share groups (KIP-932) against the reference Kafka.

A pair of brokers of its own: both lock acquired records for two seconds
(``group.share.record.lock.duration.ms``, Kafka's smallest allowed is one) so that a lock running
out is seen within a test; everything else is each one's default. Share-partitions are created by
the first ShareFetch after the group joined, on an empty topic, so both start at offset 0 whatever
``share.auto.offset.reset`` says (Kafka's default, ``latest``, is Stratalog's).

Compared: what each ShareFetch acquired (offset ranges and delivery counts), acknowledgement and
session errors, the group in ShareGroupDescribe, ListGroups and DescribeGroups, the start offset
and lag of DescribeShareGroupOffsets, and the records real share consumers (librdkafka's and
Kafka's Java one, through ``kafka-console-share-consumer``) see.
"""

from __future__ import annotations

import base64
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import AcknowledgeType, ShareConsumer

from stratalog import Broker
from stratalog.peers.kafka import KafkaBroker
from stratalog.records import build_batch

from ..conftest import KAFKA_TEST_JVM
from ..test_share_groups import JavaShareConsumer, close_share_consumer
from . import wire
from .conftest import KAFKA_PROPERTIES, Pair, both, start_kafka, unique, warm_up
from .deliberate import check_deliberate

LOCK_MS = 2000
SHARE_SETTINGS = {"group.share.record.lock.duration.ms": LOCK_MS}
ACCEPT, RELEASE, REJECT = 1, 2, 3


@pytest.fixture(scope="module")
def share_pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    props = {**KAFKA_PROPERTIES, **{k: str(v) for k, v in SHARE_SETTINGS.items()}}
    props["group.share.min.record.lock.duration.ms"] = "1000"  # Kafka's floor, 15 s by default
    kafka = start_kafka(lambda: KafkaBroker(props, jvm_options=KAFKA_TEST_JVM))
    try:
        data = tmp_path_factory.mktemp("stratalog-share") / "data"
        with Broker(data, config=dict(SHARE_SETTINGS)) as strat:
            warm_up(kafka.bootstrap)
            warm_up(strat.bootstrap)
            yield Pair(strat, kafka)
    finally:
        kafka.stop()


# -- the wire: one request per call ------------------------------------------------------------
def member_id(name: str, label: str) -> str:
    """A member id as Kafka's clients make them (a Uuid in URL-safe base64, which Kafka's
    ShareFetch parses), the same on both brokers for the same test."""
    raw = uuid.uuid5(uuid.NAMESPACE_URL, f"{name}/{label}").bytes
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


class Member:
    """A share-group member speaking the wire by hand, on a connection of its own (Kafka ties a
    share session to the connection that opened it)."""

    def __init__(self, bs: str, group: str, topic: str, mid: str) -> None:
        self.bs, self.group, self.topic, self.id = bs, group, topic, mid
        self.tid = wire.topic_id(bs, topic)
        self.conn = wire.Connection(bs)
        self.epoch = 0  # the member epoch
        self.session = 0  # the next share session epoch

    def heartbeat(self, epoch: int | None = None, **values: Any) -> dict[str, Any]:
        fields = {"group_id": self.group, "member_id": self.id,
                  "member_epoch": self.epoch if epoch is None else epoch,
                  "subscribed_topic_names": None, **values}  # fmt: skip
        r = wire.call(self.bs, 76, 1, **fields)
        if r["error_code"] == 0:
            self.epoch = r["member_epoch"]
        return r

    def join(self) -> dict[str, Any]:
        """Join, and heartbeat until the member has its partition (Kafka may assign after the
        join's answer); the join's answer."""
        joined = self.heartbeat(0, subscribed_topic_names=[self.topic])
        assert joined["error_code"] == 0, joined
        deadline = time.monotonic() + 30
        while True:
            d = wire.call(self.bs, 77, 1, group_ids=[self.group],
                          include_authorized_operations=False)  # fmt: skip
            (m,) = [m for m in d["groups"][0]["members"] if m["member_id"] == self.id]
            if m["assignment"]["topic_partitions"] and m["member_epoch"] == self.epoch:
                return joined
            assert time.monotonic() < deadline, d
            time.sleep(0.3)
            assert self.heartbeat()["error_code"] == 0

    def _topics(self, acks) -> list[dict[str, Any]]:
        return [{"topic_id": self.tid, "partitions": [{"partition_index": 0,
                 "acknowledgement_batches": [
                     {"first_offset": f, "last_offset": last, "acknowledge_types": types}
                     for f, last, types in acks]}]}]  # fmt: skip

    def _epoch(self, epoch: int | None) -> int:
        if epoch is not None:
            return epoch
        e, self.session = self.session, self.session + 1
        return e

    def fetch(self, acks=(), wait: int = 1000, epoch: int | None = None) -> dict[str, Any]:
        return _fetched(self.conn.call(78, 1, group_id=self.group, member_id=self.id,
                        share_session_epoch=self._epoch(epoch), max_wait=wait, min_bytes=1,
                        max_records=500, batch_size=500, topics=self._topics(acks),
                        forgotten_topics_data=[]))  # fmt: skip

    def acknowledge(self, acks, epoch: int | None = None) -> dict[str, Any]:
        return _acknowledged(self.conn.call(79, 1, group_id=self.group, member_id=self.id,
                             share_session_epoch=self._epoch(epoch),
                             topics=self._topics(acks)))  # fmt: skip

    def close(self) -> None:
        self.conn.close()


def _fetched(r: dict[str, Any]) -> dict[str, Any]:
    """A ShareFetch answer as compared: errors, and what partition 0 acquired."""
    parts = [p for t in r.get("responses", ()) for p in t["partitions"]]
    return {
        "error": r.get("error_code"),
        "lock_ms": r.get("acquisition_lock_timeout"),
        "partitions": [
            {
                "error": p["error_code"],
                "ack_error": p["acknowledge_error_code"],
                "acquired": [
                    (a["first_offset"], a["last_offset"], a["delivery_count"])
                    for a in p["acquired_records"]
                ],
            }
            for p in parts
        ],
    }


def _acknowledged(r: dict[str, Any]) -> dict[str, Any]:
    parts = [p["error_code"] for t in r.get("responses", ()) for p in t["partitions"]]
    return {"error": r.get("error_code"), "partitions": parts}


def _offsets(bs: str, group: str) -> list[tuple[int, int, int]]:
    r = wire.call(bs, 90, 1, groups=[{"group_id": group, "topics": None}])
    return [
        (p["partition_index"], p["start_offset"], p["lag"])
        for t in r["groups"][0]["topics"]
        for p in t["partitions"]
    ]


def _batch(n: int) -> bytes:
    now = int(time.time() * 1000)  # recent: an old timestamp is past retention at once in Kafka
    return build_batch([(None, f"v{i}".encode(), now + i) for i in range(n)])


def _settled_offsets(bs: str, group: str, want: list[tuple[int, int, int]], timeout=15.0):
    """DescribeShareGroupOffsets until it says ``want`` (Kafka writes share state in the
    background: its answers trail the acknowledgements a moment)."""
    deadline = time.monotonic() + timeout
    while (got := _offsets(bs, group)) != want and time.monotonic() < deadline:
        time.sleep(0.2)
    return got


# -- scenarios ---------------------------------------------------------------------------------
def _same(share_pair: Pair, scenario, prefix: str) -> Any:
    """Run ``scenario`` on both brokers; what both observed (the same)."""
    strat, kafka = both(share_pair, scenario, unique(prefix))
    assert strat == kafka, wire.differences(strat, kafka)
    return strat


def acquire_acknowledge_redeliver(bs: str, name: str) -> dict[str, Any]:
    """One member: records acquired, some accepted, one released until the delivery limit
    archives it, one rejected; the start offset and lag."""
    topic, group = name, f"{name}-g"
    wire.create_topic(bs, topic, 1)
    m = Member(bs, group, topic, member_id(name, "one"))
    try:
        out: dict[str, Any] = {"join": m.join()["error_code"], "member epoch": m.epoch > 0}
        out["opening fetch"] = m.fetch(wait=200)  # creates the share-partition, at offset 0
        out["offsets before records"] = _offsets(bs, group)
        out["produce"] = wire.produce(bs, topic, 0, _batch(5))["error_code"]
        out["first"] = m.fetch()
        out["offsets before acknowledgements"] = _offsets(bs, group)
        out["second"] = m.fetch([(0, 4, [ACCEPT, RELEASE, ACCEPT, REJECT, ACCEPT])])
        out["accept an accepted one"] = m.acknowledge([(2, 2, [ACCEPT])])
        rounds = []
        for _ in range(6):
            r = m.fetch([(1, 1, [RELEASE])], wait=300)
            rounds.append(r)
            if not any(p["acquired"] for p in r["partitions"]):
                break
        out["released until archived"] = rounds
        out["offsets at the end"] = _settled_offsets(bs, group, [(0, 5, 0)], timeout=3)
        out["acknowledge below the start"] = m.acknowledge([(0, 0, [ACCEPT])])
        out["describe"] = _described(bs, group)
        left = m.heartbeat(-1)
        out["leave"] = (left["error_code"], left["member_epoch"])
        out["describe after leave"] = _described(bs, group)
    finally:
        m.close()
    return out


def _described(bs: str, group: str) -> dict[str, Any]:
    d = wire.call(bs, 77, 1, group_ids=[group], include_authorized_operations=False)["groups"][0]
    listed = [
        g
        for g in wire.call(bs, 16, 5, states_filter=[], types_filter=["share"])["groups"]
        if g["group_id"] == group
    ]
    classic = wire.call(bs, 15, 5, groups=[group], include_authorized_operations=False)
    return {
        "error": d["error_code"],
        "state": d["group_state"],
        "assignor": d["assignor_name"],
        "members": sorted(
            (
                m["member_id"],
                m["client_id"],
                tuple(m["subscribed_topic_names"]),
                tuple(
                    (tp["topic_name"], tuple(tp["partitions"]))
                    for tp in m["assignment"]["topic_partitions"]
                ),
            )
            for m in d["members"]
        ),
        "listed": listed,
        "describe groups": wire.normalise(classic["groups"]),
    }


def test_acquire_acknowledge_redeliver(share_pair: Pair) -> None:
    name = unique("cf-share")
    strat, kafka = both(share_pair, acquire_acknowledge_redeliver, name)
    strat_end, kafka_end = strat.pop("offsets at the end"), kafka.pop("offsets at the end")
    assert strat == kafka, wire.differences(strat, kafka)
    # Every record done: the start offset past them all, nothing left to deliver.
    check_deliberate("share.start-offset-current", strat_end, kafka_end, documented=[(0, 5, 0)])


def lock_expiry(bs: str, name: str) -> dict[str, Any]:
    """A member acquires and goes silent: once the lock runs out the records go to another
    member, delivered the second time. Then a member whose connection closes: its records go
    to the other at once."""
    topic, group = name, f"{name}-g"
    wire.create_topic(bs, topic, 1)
    first = Member(bs, group, topic, member_id(name, "first"))
    second = Member(bs, group, topic, member_id(name, "second"))
    try:
        first.join()
        first.fetch(wait=200)
        wire.produce(bs, topic, 0, _batch(3))
        out: dict[str, Any] = {"first": first.fetch()}
        acquired_at = time.monotonic()
        second.join()
        got = second.fetch(wait=200)
        out["second at once"] = got
        while not any(p["acquired"] for p in got["partitions"]):
            assert time.monotonic() - acquired_at < 30
            got = second.fetch(wait=500)
        out["second after the lock"] = got
        out["not before the lock ran out"] = time.monotonic() - acquired_at >= LOCK_MS / 1000 - 0.3
        out["late acknowledgement"] = first.acknowledge([(0, 2, [ACCEPT])])
        out["second accepts"] = second.acknowledge([(0, 2, [ACCEPT])])
        wire.produce(bs, topic, 0, _batch(2))
        out["first again"] = first.fetch()
        first.close()
        closed_at = time.monotonic()
        time.sleep(0.5)  # (Kafka releases them at once, but does not wake a waiting fetch)
        out["second after the first's connection closed"] = second.fetch(wait=0)
        out["before the lock ran out"] = time.monotonic() - closed_at < LOCK_MS / 1000 - 0.3
    finally:
        first.close()
        second.close()
    return out


def test_lock_expiry(share_pair: Pair) -> None:
    _same(share_pair, lock_expiry, "cf-share-lock")


def bad_requests(bs: str, name: str) -> dict[str, Any]:
    """Wrong epochs, unknown members and sessions, acknowledgements of records not acquired."""
    topic, group = name, f"{name}-g"
    wire.create_topic(bs, topic, 1)
    m = Member(bs, group, topic, member_id(name, "m"))
    stranger = Member(bs, group, topic, member_id(name, "stranger"))
    errors: dict[str, Any] = {}
    try:

        def hb(label: str, who: Member = m, **values: Any) -> None:
            errors[label] = who.heartbeat(**values)["error_code"]

        hb("join without topics", epoch=0)
        hb("join with no topics", epoch=0, subscribed_topic_names=[])
        hb("epoch -5", epoch=-5)
        hb("empty group id", epoch=0, group_id="", subscribed_topic_names=[topic])
        hb("unknown group", who=stranger, epoch=1)
        hb("unknown member leaving", who=stranger, epoch=-1)
        m.join()
        hb("unknown member", who=stranger, epoch=1)
        hb("epoch ahead", epoch=m.epoch + 5)
        hb("empty member id", epoch=m.epoch, member_id="")
        errors["consumer heartbeat on a share group"] = wire.call(
            bs, 68, 1, group_id=group, member_id=member_id(name, "c"), member_epoch=0,
            rebalance_timeout=30000, subscribed_topic_names=[topic], topic_partitions=[],
            server_assignor=None,
        )["error_code"]  # fmt: skip
        errors["join group on a share group"] = wire.call(
            bs, 11, 5, group_id=group, session_timeout=10000, rebalance_timeout=10000,
            member_id="", group_instance_id=None, protocol_type="consumer",
            protocols=[{"name": "range", "metadata": b""}],
        )["error_code"]  # fmt: skip
        errors["fetch opening with acknowledgements"] = m.fetch([(0, 0, [ACCEPT])], epoch=0)
        errors["fetch without a session"] = stranger.fetch(wait=0, epoch=3)
        errors["acknowledge opening a session"] = m.acknowledge([(0, 0, [ACCEPT])], epoch=0)
        errors["opening fetch"] = m.fetch(wait=200)
        errors["fetch with a wrong session epoch"] = m.fetch(wait=0, epoch=m.session + 7)
        wire.produce(bs, topic, 0, _batch(2))
        errors["acquired"] = m.fetch()
        errors["acknowledge with a bad type"] = m.acknowledge([(0, 0, [9])])
        errors["acknowledge with too many types"] = m.acknowledge([(0, 0, [ACCEPT, ACCEPT])])
        errors["another member acknowledging"] = stranger.acknowledge([(0, 0, [ACCEPT])], epoch=0)
        errors["another member opening"] = stranger.fetch(wait=0)
        errors["another member acknowledging in its session"] = stranger.acknowledge(
            [(0, 0, [ACCEPT])]
        )
        errors["release"] = m.acknowledge([(1, 1, [RELEASE])])
        errors["accept a released one"] = m.acknowledge([(1, 1, [ACCEPT])])
    finally:
        m.close()
        stranger.close()
    return errors


def test_bad_requests(share_pair: Pair) -> None:
    strat, kafka = both(share_pair, bad_requests, unique("cf-share-bad"))
    assert strat == kafka, wire.differences(strat, kafka)
    assert kafka["unknown group"] == 69  # GROUP_ID_NOT_FOUND (the group's records outlive restarts)


def _poll(c: ShareConsumer, timeout: float = 0.3) -> list:
    return [m for m in c.poll(timeout) if m.error() is None]


def librdkafka_share_consumers(bs: str, name: str) -> dict[str, Any]:
    """Two librdkafka share consumers on a 2-partition topic: each record to one of them, all of
    them, once; one record released comes back with delivery count 2. Both brokers start a
    share-partition at its end when the first fetch comes (``latest``), so markers are produced
    until each partition delivered one; the records compared come after."""
    topic, group = name, f"{name}-g"
    wire.create_topic(bs, topic, 2)
    consumers = [
        ShareConsumer({"bootstrap.servers": bs, "group.id": group,
                       "share.acknowledgement.mode": "explicit"})
        for _ in range(2)
    ]  # fmt: skip
    for c in consumers:
        c.subscribe([topic])
    out: dict[str, Any] = {}
    seen: dict[tuple[int, str], list[int]] = {}
    released = False

    def poll_all() -> None:
        nonlocal released
        for c in consumers:
            for m in _poll(c):
                key = (m.partition(), m.value().decode())
                seen.setdefault(key, []).append(m.delivery_count())
                release = not released and key == (1, "v7")
                released |= release
                c.acknowledge(m, AcknowledgeType.RELEASE if release else AcknowledgeType.ACCEPT)
            c.commit_sync()

    try:
        deadline = time.monotonic() + 60
        while {p for p, v in seen if v == "marker"} != {0, 1}:
            assert time.monotonic() < deadline, seen
            for p in range(2):
                wire.produce(
                    bs, topic, p, build_batch([(None, b"marker", int(time.time() * 1000))])
                )
            poll_all()
        seen.clear()
        for p in range(2):
            wire.produce(bs, topic, p, _batch(20))
        deadline = time.monotonic() + 60
        while sum(len(v) for v in seen.values()) < 41 and time.monotonic() < deadline:
            poll_all()
        out["records"] = sorted(seen)
        out["delivery counts"] = {f"{p}-{v}": d for (p, v), d in seen.items() if d != [1]}
    finally:
        for c in consumers:
            close_share_consumer(c)
    return out


def test_librdkafka_share_consumers(share_pair: Pair) -> None:
    strat = _same(share_pair, librdkafka_share_consumers, "cf-share-rdk")
    assert strat["records"] == sorted((p, f"v{i}") for p in range(2) for i in range(20))
    assert strat["delivery counts"] == {"1-v7": [1, 2]}


def java_release_until_archived(bs: str, name: str) -> dict[str, Any]:
    """Kafka's Java share consumer (kafka-console-share-consumer --release) releases every record
    it gets: one record comes back until the delivery limit archives it."""
    topic, group = name, f"{name}-g"
    wire.create_topic(bs, topic, 1)
    # It exits once nothing came for 10 s (Kafka hands a new member its assignment at its
    # second heartbeat, five seconds after the first).
    c = JavaShareConsumer(bs, group, topic, "--release", "--timeout-ms", "10000")
    try:
        deadline = time.monotonic() + 60
        while True:
            d = wire.call(bs, 77, 1, group_ids=[group], include_authorized_operations=False)
            members = d["groups"][0]["members"]
            if members and members[0]["assignment"]["topic_partitions"]:
                break
            assert time.monotonic() < deadline and c.proc.poll() is None, d
            time.sleep(0.2)
        # Its first share fetch starts the share-partition at the end of the log: a record
        # produced before that is behind the start and never delivered. Nothing outside
        # shows that moment (DescribeShareGroupOffsets lists the partition at -1 before it
        # and after it, on both brokers, while the topic is empty); fixed waits lost the race
        # under load. So a record is produced every 3 s until one is delivered: only its
        # deliveries are compared, whatever offset it got.
        while not _offsets(bs, group):
            assert time.monotonic() < deadline and c.proc.poll() is None, "no share-partition"
            time.sleep(0.2)
        for _ in range(10):
            wire.produce(bs, topic, 0, _batch(1))
            wait = time.monotonic() + 3
            while not c.lines and time.monotonic() < wait:
                time.sleep(0.05)
            if c.lines:
                break
        c.proc.wait(60)
    finally:
        c.stop()
    offsets = {offset for _, offset, _, _ in c.records()}
    assert len(offsets) <= 1, f"more than one record delivered: {c.records()}"
    return {
        "records": [(p, count, value) for p, _, count, value in c.records()],
        "exit": c.proc.returncode,
    }


def test_java_release_until_archived(share_pair: Pair) -> None:
    strat = _same(share_pair, java_release_until_archived, "cf-share-java")
    assert strat["records"] == [(0, n, "v0") for n in range(1, 6)]
