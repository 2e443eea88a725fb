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

from . import wire
from .conftest import KAFKA_PROPERTIES, Pair, both, start_kafka, unique, warm_up

LOCK_MS = 2000
SHARE_SETTINGS = {"group.share.record.lock.duration.ms": LOCK_MS}
ACCEPT, RELEASE, REJECT = 1, 2, 3


@pytest.fixture(scope="module")
def share_pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    props = {**KAFKA_PROPERTIES, **{k: str(v) for k, v in SHARE_SETTINGS.items()}}
    kafka = start_kafka(lambda: KafkaBroker(props))
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


def _join(bs: str, group: str, member: str, topic: str) -> dict[str, Any]:
    return wire.call(bs, 76, 1, group_id=group, member_id=member, member_epoch=0,
                     subscribed_topic_names=[topic])  # fmt: skip


def _heartbeat(bs: str, group: str, member: str, epoch: int) -> dict[str, Any]:
    return wire.call(bs, 76, 1, group_id=group, member_id=member, member_epoch=epoch,
                     subscribed_topic_names=None)  # fmt: skip


def _acks(tid: uuid.UUID, acks: list[tuple[int, int, list[int]]]) -> list[dict[str, Any]]:
    return [{"topic_id": tid, "partitions": [{"partition_index": 0, "acknowledgement_batches": [
        {"first_offset": f, "last_offset": last, "acknowledge_types": types}
        for f, last, types in acks]}]}]  # fmt: skip


def _fetch(bs: str, group: str, member: str, epoch: int, tid: uuid.UUID, acks=(), wait=1000):
    return wire.call(bs, 78, 1, group_id=group, member_id=member, share_session_epoch=epoch,
                     max_wait=wait, min_bytes=1, max_records=500, batch_size=500,
                     topics=_acks(tid, list(acks)), forgotten_topics_data=[])  # fmt: skip


def _acknowledge(bs: str, group: str, member: str, epoch: int, tid: uuid.UUID, acks):
    return wire.call(bs, 79, 1, group_id=group, member_id=member, share_session_epoch=epoch,
                     topics=_acks(tid, list(acks)))  # fmt: skip


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


def _until_assigned(bs: str, group: str, member: str, epoch: int) -> int:
    """Heartbeat until the member has its partition (Kafka may assign after the join's answer);
    the member's epoch then."""
    deadline = time.monotonic() + 30
    while True:
        hb = _heartbeat(bs, group, member, epoch)
        assert hb["error_code"] == 0, hb
        epoch = hb["member_epoch"]
        described = wire.call(bs, 77, 1, group_ids=[group], include_authorized_operations=False)
        (m,) = [m for m in described["groups"][0]["members"] if m["member_id"] == member]
        if m["assignment"]["topic_partitions"] and m["member_epoch"] == epoch:
            return epoch
        assert time.monotonic() < deadline, described
        time.sleep(0.3)


def _offsets(bs: str, group: str) -> list[tuple[int, int, int]]:
    r = wire.call(bs, 90, 1, groups=[{"group_id": group, "topics": None}])
    return [
        (p["partition_index"], p["start_offset"], p["lag"])
        for t in r["groups"][0]["topics"]
        for p in t["partitions"]
    ]


def _batch(n: int) -> bytes:
    return build_batch([(None, f"v{i}".encode(), 1_700_000_000_000 + i) for i in range(n)])


def _wait_for_share_state(bs: str, group: str, member: str, epoch: int, tid) -> int:
    """Fetch (nothing there yet) until the share-partition exists: Kafka initializes it in the
    background after the first ShareFetch names it. The next session epoch."""
    deadline = time.monotonic() + 30
    while True:
        r = _fetch(bs, group, member, epoch, tid, wait=200)
        assert r["error_code"] == 0, r
        epoch += 1
        if _offsets(bs, group) == [(0, 0, 0)]:
            return epoch
        assert time.monotonic() < deadline, _offsets(bs, group)


# -- scenarios ---------------------------------------------------------------------------------
def acquire_acknowledge_redeliver(bs: str, name: str) -> dict[str, Any]:
    """One member: records acquired, some accepted, one released until the delivery limit
    archives it, one rejected; the start offset and lag as they move."""
    topic, group, member = name, f"{name}-g", member_id(name, "one")
    wire.create_topic(bs, topic, 1)
    tid = wire.topic_id(bs, topic)
    joined = _join(bs, group, member, topic)
    out: dict[str, Any] = {"join": joined["error_code"]}
    member_epoch = _until_assigned(bs, group, member, joined["member_epoch"])
    _fetch(bs, group, member, 0, tid, wait=200)  # opens the session, creates the share-partition
    epoch = _wait_for_share_state(bs, group, member, 1, tid)
    out["produce"] = wire.produce(bs, topic, 0, _batch(5))["error_code"]
    out["first"] = _fetched(_fetch(bs, group, member, epoch, tid))
    out["offsets after first"] = _offsets(bs, group)
    acks = [(0, 4, [ACCEPT, RELEASE, ACCEPT, REJECT, ACCEPT])]
    out["second"] = _fetched(_fetch(bs, group, member, epoch + 1, tid, acks))
    epoch += 2
    rounds = []
    for _ in range(6):
        r = _fetched(_fetch(bs, group, member, epoch, tid, [(1, 1, [RELEASE])], wait=300))
        rounds.append(r)
        epoch += 1
        if not any(p["acquired"] for p in r["partitions"]):
            break
    out["released until archived"] = rounds
    out["offsets at the end"] = _offsets(bs, group)
    out["accept again"] = _acknowledged(
        _acknowledge(bs, group, member, epoch, tid, [(0, 0, [ACCEPT])])
    )
    epoch += 1
    out["describe"] = _described(bs, group)
    out["leave"] = {
        k: v
        for k, v in _heartbeat(bs, group, member, -1).items()
        if k in ("error_code", "member_epoch")
    }
    out["member epoch"] = member_epoch > 0
    out["describe after leave"] = _described(bs, group)
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
    assert strat == kafka, wire.differences(strat, kafka)


def lock_expiry(bs: str, name: str) -> dict[str, Any]:
    """A member acquires and goes silent: once the lock runs out the records go to another
    member, delivered the second time."""
    topic, group = name, f"{name}-g"
    first, second = member_id(name, "first"), member_id(name, "second")
    wire.create_topic(bs, topic, 1)
    tid = wire.topic_id(bs, topic)
    _until_assigned(bs, group, first, _join(bs, group, first, topic)["member_epoch"])
    _fetch(bs, group, first, 0, tid, wait=200)
    epoch = _wait_for_share_state(bs, group, first, 1, tid)
    wire.produce(bs, topic, 0, _batch(3))
    out: dict[str, Any] = {"first": _fetched(_fetch(bs, group, first, epoch, tid))}
    acquired_at = time.monotonic()
    _until_assigned(bs, group, second, _join(bs, group, second, topic)["member_epoch"])
    got = _fetched(_fetch(bs, group, second, 0, tid, wait=200))
    out["second at once"] = got
    s_epoch = 1
    while not any(p["acquired"] for p in got["partitions"]):
        assert time.monotonic() - acquired_at < 30
        got = _fetched(_fetch(bs, group, second, s_epoch, tid, wait=500))
        s_epoch += 1
    out["second after the lock"] = got
    out["not before the lock ran out"] = time.monotonic() - acquired_at >= LOCK_MS / 1000 - 0.3
    out["late acknowledgement"] = _acknowledged(
        _acknowledge(bs, group, first, epoch + 1, tid, [(0, 2, [ACCEPT])])
    )
    return out


def test_lock_expiry(share_pair: Pair) -> None:
    strat, kafka = both(share_pair, lock_expiry, unique("cf-share-lock"))
    assert strat == kafka, wire.differences(strat, kafka)


def bad_requests(bs: str, name: str) -> dict[str, Any]:
    """Wrong epochs, unknown members and sessions, acknowledgements of records not acquired."""
    topic, group = name, f"{name}-g"
    wire.create_topic(bs, topic, 1)
    tid = wire.topic_id(bs, topic)
    errors: dict[str, Any] = {}
    m, stranger = member_id(name, "m"), member_id(name, "stranger")

    def hb(label: str, **values: Any) -> dict[str, Any]:
        fields = {"group_id": group, "member_id": m, "member_epoch": 0,
                  "subscribed_topic_names": [topic], **values}  # fmt: skip
        r = wire.call(bs, 76, 1, **fields)
        errors[label] = r["error_code"]
        return r

    hb("join without topics", subscribed_topic_names=None)
    hb("join with no topics", subscribed_topic_names=[])
    hb("epoch -5", member_epoch=-5)
    hb("empty group id", group_id="")
    hb("unknown member", member_id=stranger, member_epoch=1, subscribed_topic_names=None)
    hb("unknown member leaving", member_id=stranger, member_epoch=-1)
    epoch = _until_assigned(bs, group, m, hb("join")["member_epoch"])
    hb("epoch ahead", member_epoch=epoch + 5, subscribed_topic_names=None)
    hb("empty member id", member_id="", member_epoch=epoch, subscribed_topic_names=None)
    errors["consumer heartbeat on a share group"] = wire.call(
        bs, 68, 1, group_id=group, member_id=member_id(name, "c"), member_epoch=0,
        rebalance_timeout=30000, subscribed_topic_names=[topic], topic_partitions=[],
        server_assignor=None,
    )["error_code"]  # fmt: skip
    errors["fetch opening with acknowledgements"] = _fetched(
        _fetch(bs, group, m, 0, tid, [(0, 0, [ACCEPT])], wait=0)
    )
    errors["fetch without a session"] = _fetched(
        _fetch(bs, group, member_id(name, "nobody"), 3, tid, wait=0)
    )
    errors["acknowledge opening a session"] = _acknowledged(
        _acknowledge(bs, group, m, 0, tid, [(0, 0, [ACCEPT])])
    )
    _fetch(bs, group, m, 0, tid, wait=200)
    s_epoch = _wait_for_share_state(bs, group, m, 1, tid)
    errors["fetch with a wrong session epoch"] = _fetched(
        _fetch(bs, group, m, s_epoch + 7, tid, wait=0)
    )
    wire.produce(bs, topic, 0, _batch(2))
    errors["acknowledge before acquiring"] = _acknowledged(
        _acknowledge(bs, group, m, s_epoch, tid, [(0, 1, [ACCEPT])])
    )
    got = _fetched(_fetch(bs, group, m, s_epoch + 1, tid))
    errors["acquired"] = got
    errors["acknowledge beyond"] = _acknowledged(
        _acknowledge(bs, group, m, s_epoch + 2, tid, [(0, 5, [ACCEPT])])
    )
    errors["acknowledge with a bad type"] = _acknowledged(
        _acknowledge(bs, group, m, s_epoch + 3, tid, [(0, 0, [9])])
    )
    errors["acknowledge with too many types"] = _acknowledged(
        _acknowledge(bs, group, m, s_epoch + 4, tid, [(0, 0, [ACCEPT, ACCEPT])])
    )
    errors["another member acknowledging"] = _acknowledged(
        _acknowledge(bs, group, member_id(name, "other"), 0, tid, [(0, 0, [ACCEPT])])
    )
    return errors


def test_bad_requests(share_pair: Pair) -> None:
    strat, kafka = both(share_pair, bad_requests, unique("cf-share-bad"))
    assert strat == kafka, wire.differences(strat, kafka)


def _poll(c: ShareConsumer, timeout: float = 0.3) -> list:
    return [m for m in c.poll(timeout) if m.error() is None]


def librdkafka_share_consumers(bs: str, name: str) -> dict[str, Any]:
    """Two librdkafka share consumers on a 2-partition topic, started before the records (so
    that both brokers' ``latest`` start finds an empty topic): each record to one of them, all
    of them, once; one record released comes back with delivery count 2."""
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
    try:
        deadline = time.monotonic() + 60
        while _offsets(bs, group) != [(0, 0, 0), (1, 0, 0)]:
            for c in consumers:
                assert _poll(c) == []
            assert time.monotonic() < deadline, _offsets(bs, group)
        for p in range(2):
            wire.produce(bs, topic, p, _batch(20))
        seen: dict[tuple[int, int], list[tuple[int, int]]] = {}
        released = False
        deadline = time.monotonic() + 60
        while sum(len(v) for v in seen.values()) < 41 and time.monotonic() < deadline:
            for i, c in enumerate(consumers):
                for m in _poll(c):
                    seen.setdefault((m.partition(), m.offset()), []).append((i, m.delivery_count()))
                    release = not released and (m.partition(), m.offset()) == (1, 7)
                    released |= release
                    c.acknowledge(m, AcknowledgeType.RELEASE if release else AcknowledgeType.ACCEPT)
                c.commit_sync()
        out["records"] = sorted(seen)
        out["delivery counts"] = {f"{p}-{o}": [d for _, d in v] for (p, o), v in seen.items()
                                  if len(v) > 1}  # fmt: skip
        out["offsets"] = _offsets(bs, group)
    finally:
        for c in consumers:
            c.close()
    return out


def test_librdkafka_share_consumers(share_pair: Pair) -> None:
    strat, kafka = both(share_pair, librdkafka_share_consumers, unique("cf-share-rdk"))
    assert strat == kafka, wire.differences(strat, kafka)
    assert strat["records"] == [(p, o) for p in range(2) for o in range(20)]
    assert strat["delivery counts"] == {"1-7": [1, 2]}
