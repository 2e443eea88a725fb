"""Kafka's internal topic __consumer_offsets, observed the same way on both brokers.

Each test starts a Kafka and a Stratalog of its own, so that the full topic listing holds exactly
what the test made: the session's Kafka lowers offsets.topic.num.partitions to 1 for a quick
start, and earlier scenarios leave topics and groups behind. Kafka runs with its default of 50
offsets partitions, Stratalog with its default (also 50).
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaException, TopicCollection, TopicPartition
from confluent_kafka.admin import AdminClient
from kafka import KafkaConsumer

from stratalog import Broker
from stratalog.broker.group_records import decode_group_key, decode_group_value
from stratalog.broker.offset_records import decode_key, decode_value
from stratalog.broker.topic_config import TOPIC_SETTINGS
from stratalog.peers.kafka import KafkaBroker
from stratalog.records import build_batch

from ..conftest import KAFKA_TEST_JVM
from . import clients, wire
from .conftest import KAFKA_PROPERTIES, Pair, both, start_kafka
from .deliberate import check_deliberate

pytestmark = pytest.mark.kafka

OFFSETS = "__consumer_offsets"
KAFKA_DEFAULT_OFFSETS_PARTITIONS = 50
TRANSIENT = {"COORDINATOR_LOAD_IN_PROGRESS", "COORDINATOR_NOT_AVAILABLE", "NOT_COORDINATOR"}


@pytest.fixture
def fresh_pair(tmp_path: Path) -> Iterator[Pair]:
    """A new Kafka (offsets.topic.num.partitions at Kafka's default) and a new Stratalog."""
    props = {**KAFKA_PROPERTIES, "offsets.topic.num.partitions": KAFKA_DEFAULT_OFFSETS_PARTITIONS}
    kafka = start_kafka(lambda: KafkaBroker(props, jvm_options=KAFKA_TEST_JVM))
    try:
        with Broker(tmp_path / "data") as strat:
            yield Pair(strat, kafka)
    finally:
        kafka.stop()


def err(code: int) -> str:
    return str(wire.error_names(code)).upper()


def full_listing(bs: str) -> list[tuple[str, bool, int]]:
    """Metadata for all topics, internal ones included: (name, is_internal, partitions)."""
    md = wire.call(bs, 3, 12, topics=None, allow_auto_topic_creation=False,
                   include_topic_authorized_operations=False)  # fmt: skip
    assert all(t["error_code"] == 0 for t in md["topics"]), md
    return sorted((t["name"], t["is_internal"], len(t["partitions"])) for t in md["topics"])


def find_coordinator(bs: str, group: str) -> str:
    """As a client does before its first commit; Kafka creates the offsets topic meanwhile."""
    deadline = time.monotonic() + 30
    while True:
        r = wire.call(bs, 10, 6, key_type=0, coordinator_keys=[group])
        error = err(r["coordinators"][0]["error_code"])
        if error not in TRANSIENT or time.monotonic() > deadline:
            return error
        time.sleep(0.2)


def commit(bs: str, group: str, topic: str, offsets: dict[int, int], metadata: str | None):
    """A simple group's raw OffsetCommit (no membership): error names by partition. Retried, as
    by a client, while Kafka still loads the new coordinator (NOT_COORDINATOR at first)."""
    deadline = time.monotonic() + 30
    while True:
        r = wire.call(
            bs, 8, 8, group_id=group, generation_id_or_member_epoch=-1, member_id="",
            group_instance_id=None,
            topics=[{"name": topic, "partitions": [
                {"partition_index": p, "committed_offset": o, "committed_leader_epoch": -1,
                 "committed_metadata": metadata} for p, o in offsets.items()]}],
        )  # fmt: skip
        out = {p["partition_index"]: err(p["error_code"]) for p in r["topics"][0]["partitions"]}
        if not set(out.values()) & TRANSIENT or time.monotonic() > deadline:
            return out
        time.sleep(0.2)


def _kcat_listing(bs: str) -> list[tuple[str, int]]:
    out = clients._kcat(["-L", "-b", bs])
    return sorted(
        (m[1], int(m[2])) for m in re.finditer(r'topic "([^"]+)" with (\d+) partitions', out)
    )


def listing_around_first_commit(bs: str, name: str) -> dict[str, Any]:
    out: dict[str, Any] = {"before": full_listing(bs)}
    wire.create_topic(bs, name, 2)
    out["with-topic"] = full_listing(bs)
    out["coordinator"] = find_coordinator(bs, name)
    out["commit"] = commit(bs, name, name, {0: 3, 1: 5}, "m")
    out["after"] = full_listing(bs)
    named = wire.metadata(bs, OFFSETS)["topics"][0]
    out["named"] = (err(named["error_code"]), named["is_internal"], len(named["partitions"]))
    dtp = wire.call(bs, 75, 0, topics=[{"name": OFFSETS}], response_partition_limit=2000,
                    cursor=None)["topics"][0]  # fmt: skip
    out["describe-topic-partitions"] = (
        err(dtp["error_code"]),
        dtp["is_internal"],
        len(dtp["partitions"]),
    )
    admin = AdminClient({"bootstrap.servers": bs})
    md = admin.list_topics(timeout=10)
    out["admin-list-topics"] = sorted((n, len(t.partitions)) for n, t in md.topics.items())
    described = admin.describe_topics(TopicCollection([OFFSETS, name]))
    out["admin-describe-topics"] = sorted(
        (d.name, d.is_internal, len(d.partitions))
        for d in (f.result(timeout=10) for f in described.values())
    )
    out["kcat-L"] = _kcat_listing(bs)
    return out


def test_metadata_lists_offsets_topic_after_first_commit(fresh_pair, name):
    """The FULL topic listing, internal topics included, before and after a group's first
    commit; the offsets topic answered by name, by DescribeTopicPartitions, and as
    confluent-kafka's AdminClient and kcat -L show it."""
    strat, kafka = both(fresh_pair, listing_around_first_commit, name)
    assert strat == kafka, wire.differences(strat, kafka)
    assert kafka["before"] == []
    assert kafka["after"] == sorted(
        [(name, False, 2), (OFFSETS, True, KAFKA_DEFAULT_OFFSETS_PARTITIONS)]
    )
    assert kafka["admin-describe-topics"][0] == (OFFSETS, True, KAFKA_DEFAULT_OFFSETS_PARTITIONS)


PATTERN = "^__consumer_offs.*"


def _pattern_reader(bs: str, group: str, exclude_internal: bool) -> KafkaConsumer:
    c = KafkaConsumer(
        bootstrap_servers=bs,
        group_id=group,
        exclude_internal_topics=exclude_internal,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
    )
    c.subscribe(pattern=PATTERN)
    return c


def excluded_subscription(bs: str, group: str) -> list[str]:
    """What a pattern subscription matches with exclude.internal.topics at its default (true):
    the client drops topics Metadata flags internal."""
    c = _pattern_reader(bs, group, True)
    try:
        deadline = time.monotonic() + 3
        while not c.subscription() and time.monotonic() < deadline:
            c.poll(timeout_ms=200)
        return sorted(c.subscription() or ())
    finally:
        c.close()


def offsets_topic_records(bs: str, name: str) -> dict[str, Any]:
    """A group commits twice (confluent-kafka, then raw with metadata) and its topic is deleted;
    a kafka-python consumer with exclude.internal.topics=false subscribes to the offsets topic by
    pattern and decodes the group's records: partition of the offsets topic, group, topic,
    partition, and (offset, leader epoch, metadata), or None for a tombstone."""
    wire.create_topic(bs, name, 2)
    committer = Consumer({"bootstrap.servers": bs, "group.id": name, "enable.auto.commit": False})
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                committed = committer.commit(
                    offsets=[TopicPartition(name, 0, 3), TopicPartition(name, 1, 5)],
                    asynchronous=False,
                )
                break
            except KafkaException as e:
                # A new Kafka loads the coordinator after creating the topic: retry, as an
                # application does (librdkafka's synchronous commit does not).
                if e.args[0].name() not in TRANSIENT or time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        out: dict[str, Any] = {"commit": sorted((tp.partition, tp.offset) for tp in committed)}
    finally:
        committer.close()
    out["raw-commit"] = commit(bs, name, name, {0: 4}, "meta")
    out["excluded-subscription"] = excluded_subscription(bs, f"{name}-excluding")
    reader = _pattern_reader(bs, f"{name}-reader", False)
    records: list[tuple] = []
    versions: list[tuple[int, int | None]] = []  # (key type, value version) as written
    groups: list[tuple] = []  # the reader group's own metadata records (its membership)
    group_versions: list[int | None] = []

    def read(count: int) -> None:
        deadline = time.monotonic() + clients.TIMEOUT
        while len(records) < count and time.monotonic() < deadline:
            for tp, msgs in reader.poll(timeout_ms=200, max_records=1000).items():
                for m in msgs:
                    if decode_group_key(m.key) == f"{name}-reader":
                        groups.append((tp.partition, _group_fields(m.value)))
                        group_versions.append(None if m.value is None else _i16(m.value))
                    key = decode_key(m.key)
                    if key is None or key[0] != name:
                        continue  # other record types, the reader group's own records
                    value = decode_value(m.value)
                    fields = None if value is None else (value.offset, value.leader_epoch,
                                                         value.metadata)  # fmt: skip
                    records.append((tp.partition, *key, fields))
                    versions.append((_i16(m.key), None if m.value is None else _i16(m.value)))

    try:
        read(3)
        out["subscription"] = sorted(reader.subscription() or ())
        out["assigned-partitions"] = len(reader.assignment())
        out["records-after-commits"] = list(records)
        r = wire.call(bs, 20, 6, topics=[{"name": name, "topic_id": wire.ZERO_UUID}],
                      timeout=10000)  # fmt: skip
        out["delete-topic"] = err(r["responses"][0]["error_code"])
        read(5)
        out["records-after-delete"] = records[3:]
    finally:
        reader.close()
    out["versions"] = versions
    out["reader-group-records"] = groups
    out["group-versions"] = group_versions
    return out


def _group_fields(value: bytes | None) -> tuple | None:
    """A group metadata value as both brokers must agree on it: member ids are random, so the
    leader is told by its place among the members."""
    g = decode_group_value(value)
    if g is None:
        return None
    ids = [m.member_id for m in g.members]
    return (
        g.protocol_type, g.generation, g.protocol, ids.index(g.leader) if g.leader in ids else None,
        [(m.group_instance_id, m.client_id, m.client_host, m.rebalance_timeout_ms,
          m.session_timeout_ms, m.subscription, m.assignment) for m in g.members],
    )  # fmt: skip


def _i16(raw: bytes) -> int:
    return int.from_bytes(raw[:2], "big", signed=True)


def test_offsets_topic_records_decode_identically(fresh_pair, name):
    """Kafka's own record formats: the same group, topic, partition, offset, leader epoch and
    metadata in the same offsets-topic partition (Kafka's hash of the group), the same
    tombstones once the committed topic is deleted, and the same group metadata records of the
    reading group (its members, their subscriptions and assignments)."""
    strat, kafka = both(fresh_pair, offsets_topic_records, name)
    check_deliberate(
        "offsets.commit-value-version-3",
        strat.pop("versions"),
        kafka.pop("versions"),
        documented=[(1, 3)] * 3 + [(1, None)] * 2,
    )
    # The reader group's membership as records of the same version: the new group (empty),
    # then its first generation, member by member (the comparison below).
    assert strat.pop("group-versions") == kafka.pop("group-versions") == [3, 3]
    assert [g[1][:3] for g in kafka["reader-group-records"]] == [
        ("", 0, None),
        ("consumer", 1, "range"),
    ]
    assert strat == kafka, wire.differences(strat, kafka)
    assert kafka["excluded-subscription"] == []
    assert kafka["subscription"] == [OFFSETS]
    assert kafka["assigned-partitions"] == KAFKA_DEFAULT_OFFSETS_PARTITIONS
    assert [r[2:] for r in kafka["records-after-commits"]] == [
        (name, 0, (3, -1, "")),
        (name, 1, (5, -1, "")),
        (name, 0, (4, -1, "meta")),
    ]
    assert sorted(r[2:] for r in kafka["records-after-delete"]) == [
        (name, 0, None),
        (name, 1, None),
    ]


def _produce_results(r: dict[str, Any]) -> Any:
    if "outcome" in r:
        return r["outcome"]
    return sorted(
        (t["name"], p["index"], err(p["error_code"]), p["base_offset"], p["log_start_offset"])
        for t in r["responses"]
        for p in t["partition_responses"]
    )


def _produce(bs: str, acks: int, topics: dict[str, list[int]]) -> Any:
    batch = build_batch([(b"k", b"v", int(time.time() * 1000))])
    data = [
        {"name": t, "partition_data": [{"index": i, "records": batch} for i in parts]}
        for t, parts in topics.items()
    ]
    r = wire.call(bs, 0, 9, transactional_id=None, acks=acks, timeout=10000, topic_data=data)
    return _produce_results(r)


def _latest_offsets(bs: str) -> list[int]:
    return [
        wire.list_offset(bs, OFFSETS, p, -1)["offset"]
        for p in range(KAFKA_DEFAULT_OFFSETS_PARTITIONS)
    ]


def _committed(bs: str, group: str) -> Any:
    r = wire.call(bs, 9, 8, groups=[{"group_id": group, "topics": None}], require_stable=False)
    return [
        (t["name"], p["partition_index"], p["committed_offset"])
        for t in r["groups"][0]["topics"]
        for p in t["partitions"]
    ]


def internal_topic_rules(bs: str, name: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    named = wire.metadata(bs, OFFSETS)["topics"][0]
    out["named-before"] = (err(named["error_code"]), named["is_internal"], len(named["partitions"]))
    out["produce-before"] = _produce(bs, -1, {OFFSETS: [0]})
    wire.create_topic(bs, name, 1)
    out["coordinator"] = find_coordinator(bs, name)
    out["commit"] = commit(bs, name, name, {0: 7}, None)
    latest = _latest_offsets(bs)
    # A client may read the offsets topic but never write to it, whatever its acks.
    out["produce-acks-all"] = _produce(bs, -1, {OFFSETS: [0, KAFKA_DEFAULT_OFFSETS_PARTITIONS]})
    out["produce-acks-1"] = _produce(bs, 1, {OFFSETS: [1]})
    out["produce-acks-0"] = _produce(bs, 0, {OFFSETS: [2]})
    out["produce-mixed"] = _produce(bs, -1, {name: [0], OFFSETS: [3]})
    out["offsets-topic-unchanged"] = _latest_offsets(bs) == latest
    out["records-per-partition"] = latest
    res = wire.call(
        bs, 32, 4, include_synonyms=False, include_documentation=False,
        resources=[{"resource_type": 2, "resource_name": OFFSETS, "configuration_keys": None}],
    )["results"][0]  # fmt: skip
    out["configs"] = sorted(
        (c["name"], c["value"])
        for c in res["configs"]
        if c["config_source"] == 1 and c["name"] in TOPIC_SETTINGS
    )
    out["committed"] = _committed(bs, name)
    # Kafka lets the offsets topic be deleted: the committed offsets go with it, and the next
    # coordinator lookup creates it again.
    r = wire.call(bs, 20, 6, topics=[{"name": OFFSETS, "topic_id": wire.ZERO_UUID}],
                  timeout=10000)  # fmt: skip
    out["delete"] = err(r["responses"][0]["error_code"])
    # Kafka's group coordinator may answer from the deleted topic's partitions for a moment
    # (its commits still readable, the topic not listed yet, not created again by that lookup):
    # what is compared is where both settle, as a client looking up its coordinator again would
    # see it, the topic back and the commits gone, or what each shows after 30 s.
    deadline = time.monotonic() + 30
    while True:
        out["coordinator-again"] = find_coordinator(bs, name)
        listing = full_listing(bs)
        committed = _committed(bs, name)
        back = any(t[0] == OFFSETS for t in listing)
        if (back and not committed) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    out["listing-again"] = listing
    out["committed-after-delete"] = committed
    return out


def test_internal_topic_rules(fresh_pair, name):
    """Metadata names it internal before it exists; Produce to it is refused (the other topics of
    the request are appended); its configs; DeleteTopics deletes it, offsets included."""
    strat, kafka = both(fresh_pair, internal_topic_rules, name)
    assert strat == kafka, wire.differences(strat, kafka)
    assert kafka["named-before"] == ("UNKNOWN_TOPIC_OR_PARTITION", True, 0)
    assert kafka["produce-acks-all"][0][2] == "INVALID_TOPIC_EXCEPTION"
    assert kafka["produce-acks-0"] == "closed"
    assert kafka["offsets-topic-unchanged"] is True
    assert kafka["configs"] == [
        ("cleanup.policy", "compact"),
        ("compression.type", "producer"),
        ("segment.bytes", "104857600"),
    ]
    assert kafka["committed"] == [(name, 0, 7)]
    assert kafka["delete"] == "NONE"
    assert kafka["committed-after-delete"] == []
