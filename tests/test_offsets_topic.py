"""Committed offsets in the internal topic __consumer_offsets.

Kafka's record formats byte for byte (checked against the JSON schemas and against records
Kafka 4.4.0 wrote), the table rebuilt from the topic at start, the one-time migration of a
legacy ``meta/offsets.log``, the topic kept short without log compaction, tombstones for a
deleted topic, and a failed append answered as Kafka answers it.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition

from stratalog import Broker
from stratalog.broker import offset_store
from stratalog.broker.offset_records import (
    OFFSETS_TOPIC,
    CommittedOffset,
    decode_key,
    decode_value,
    encode_key,
    encode_value,
    java_string_hashcode,
    partition_for,
)
from stratalog.records import iter_records
from stratalog.storage.journal import StorageFailure

from .conformance import wire
from .conftest import create_topic

# -- record formats -------------------------------------------------------------------------------


def test_key_and_value_bytes_follow_kafkas_schemas():
    # OffsetCommitKey, record type 1: int16 1, group and topic (int16 length, UTF-8), int32.
    assert encode_key("g1", "t1", 0) == bytes.fromhex("0001 0002 6731 0002 7431 00000000")
    # OffsetCommitValue version 3: int16 3, int64 offset, int32 leader epoch, string metadata,
    # int64 commit timestamp.
    assert encode_value(CommittedOffset(5, 7, "m", 123)) == bytes.fromhex(
        "0003 0000000000000005 00000007 0001 6d 000000000000007b"
    )
    # A null metadata is written as "", as Kafka writes it (the field is not nullable).
    assert encode_value(CommittedOffset(5, -1, None, 123)) == bytes.fromhex(
        "0003 0000000000000005 ffffffff 0000 000000000000007b"
    )
    c = CommittedOffset(2**40, 3, "ünïcode", 1_700_000_000_000)
    assert decode_value(encode_value(c)) == c
    assert decode_key(encode_key("gröup", "t", 2**31 - 1)) == ("gröup", "t", 2**31 - 1)


def test_decodes_the_records_kafka_writes():
    # Written by Kafka 4.4.0: value version 4 (flexible: compact string, the topic id in a
    # tagged field), and a commit with a null metadata.
    assert decode_key(bytes.fromhex("0001000267310002743100000000")) == ("g1", "t1", 0)
    assert decode_value(
        bytes.fromhex(
            "0004000000000000000300000007026d000001a21f4c2d3e0100108aedfb14429f4e40bd35a25bf2a11cbc"
        )
    ) == CommittedOffset(3, 7, "m", 0x1A21F4C2D3E)
    assert decode_value(
        bytes.fromhex(
            "000400000000000000060000000701000001a21f4c2d320100108aedfb14429f4e40bd35a25bf2a11cbc"
        )
    ) == CommittedOffset(6, 7, "", 0x1A21F4C2D32)
    # Version 1 (with an expire timestamp) and the legacy key type 0.
    v1 = bytes.fromhex("0001 0000000000000009 0000 0000000000000001 0000000000000002")
    assert decode_value(v1) == CommittedOffset(9, -1, "", 1)
    assert decode_key(bytes.fromhex("0000 0001 67 0001 74 00000003")) == ("g", "t", 3)
    # Group metadata (type 2) is another record type; a tombstone has no value.
    assert decode_key(bytes.fromhex("0002 0002 6731")) is None
    assert decode_value(None) is None


def test_a_groups_partition_is_kafkas():
    assert java_string_hashcode("g1") == 3242
    assert java_string_hashcode("") == 0
    assert java_string_hashcode("\U0001f600") == 0xD83D * 31 + 0xDE00  # UTF-16 code units
    assert java_string_hashcode("polygenelubricants") == -(2**31)
    assert partition_for("polygenelubricants", 50) == 0  # Kafka's Utils.abs(MIN_VALUE) is 0
    assert partition_for("g1", 3) == 2  # where Kafka put g1's commits
    assert partition_for("g0", 5) == 1


# -- the broker -----------------------------------------------------------------------------------


def _commit(bootstrap: str, group: str, offsets: list[TopicPartition]) -> None:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        c.commit(offsets=offsets, asynchronous=False)
    finally:
        c.close()


def _committed(bootstrap: str, group: str, topic: str, partitions: int) -> dict[int, int]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        tps = c.committed([TopicPartition(topic, p) for p in range(partitions)], timeout=10)
        return {tp.partition: tp.offset for tp in tps}
    finally:
        c.close()


def _offsets_records(bootstrap: str) -> list[tuple[int, tuple, CommittedOffset | None]]:
    """Every offset commit record of the offsets topic: (partition, key, value)."""
    md = wire.metadata(bootstrap, OFFSETS_TOPIC)["topics"][0]
    out = []
    for p in range(len(md["partitions"])):
        for b in wire.stored_batches(bootstrap, OFFSETS_TOPIC, p):
            for rec in iter_records(b["bytes"]):
                out.append((p, decode_key(rec.key), decode_value(rec.value)))
    return out


def test_commits_are_records_of_the_offsets_topic_and_survive_a_restart(tmp_path):
    data = tmp_path / "data"
    with Broker(data, config={"offsets.topic.num.partitions": 7}) as b:
        create_topic(b.bootstrap, "t", 3)
        _commit(b.bootstrap, "grp", [TopicPartition("t", 0, 10), TopicPartition("t", 1, 20)])
        _commit(b.bootstrap, "grp", [TopicPartition("t", 0, 11)])
        records = _offsets_records(b.bootstrap)
        home = partition_for("grp", 7)
        assert [(p, k, c.offset) for p, k, c in records] == [
            (home, ("grp", "t", 0), 10),
            (home, ("grp", "t", 1), 20),
            (home, ("grp", "t", 0), 11),
        ]
        md = wire.metadata(b.bootstrap, OFFSETS_TOPIC)["topics"][0]
        assert md["is_internal"] and len(md["partitions"]) == 7
    assert not (data / "meta" / "offsets.log").exists()
    with Broker(data, config={"offsets.topic.num.partitions": 50}) as b:
        # The existing topic keeps its 7 partitions; the table is read back from it.
        assert len(wire.metadata(b.bootstrap, OFFSETS_TOPIC)["topics"][0]["partitions"]) == 7
        assert _committed(b.bootstrap, "grp", "t", 3) == {0: 11, 1: 20, 2: -1001}


def _legacy_line(g: str, t: str, p: int, offset: int | None) -> str:
    if offset is None:
        return json.dumps({"g": g, "t": t, "p": p, "d": 1}) + "\n"
    rec = {"g": g, "t": t, "p": p, "o": offset, "e": -1, "m": "", "ts": 1_700_000_000_000}
    return json.dumps(rec) + "\n"


def test_a_legacy_offsets_log_is_migrated_into_the_topic_once(tmp_path):
    data = tmp_path / "data"
    with Broker(data) as b:
        create_topic(b.bootstrap, "old", 2)
    # What a broker from before the offsets topic left: JSON lines, the last one torn.
    legacy = data / "meta" / "offsets.log"
    legacy.write_text(
        _legacy_line("g", "old", 0, 5)
        + _legacy_line("g", "old", 1, 6)
        + _legacy_line("g", "old", 0, 7)
        + _legacy_line("gone", "old", 0, 1)
        + _legacy_line("gone", "old", 0, None)
        + '{"g": "g", "t": "old", "p": 1, "o'
    )
    with Broker(data) as b:
        assert _committed(b.bootstrap, "g", "old", 2) == {0: 7, 1: 6}
        assert _committed(b.bootstrap, "gone", "old", 2) == {0: -1001, 1: -1001}
        migrated = _offsets_records(b.bootstrap)
        assert sorted((k, c.offset) for _p, k, c in migrated) == [
            (("g", "old", 0), 7),
            (("g", "old", 1), 6),
        ]
    assert not legacy.exists()
    assert (data / "meta" / "offsets.log.migrated").exists()
    with Broker(data) as b:
        assert _committed(b.bootstrap, "g", "old", 2) == {0: 7, 1: 6}
        assert _offsets_records(b.bootstrap) == migrated  # not migrated a second time


def test_the_topic_is_kept_short_without_compaction(tmp_path, monkeypatch):
    monkeypatch.setattr(offset_store, "COMPACT_SLACK", 20)
    data = tmp_path / "data"
    with Broker(data) as b:
        create_topic(b.bootstrap, "t", 2)
        c = Consumer({"bootstrap.servers": b.bootstrap, "group.id": "busy"})
        try:
            for i in range(120):
                c.commit(offsets=[TopicPartition("t", i % 2, i)], asynchronous=False)
        finally:
            c.close()
        home = partition_for("busy", 50)
        start = wire.list_offset(b.bootstrap, OFFSETS_TOPIC, home, -2)["offset"]
        end = wire.list_offset(b.bootstrap, OFFSETS_TOPIC, home, -1)["offset"]
        assert start > 0, "the log start never moved"
        assert end - start <= 30  # about twice the live keys plus the slack, not 120
        assert _committed(b.bootstrap, "busy", "t", 2) == {0: 118, 1: 119}
    with Broker(data) as b:
        assert _committed(b.bootstrap, "busy", "t", 2) == {0: 118, 1: 119}


def test_deleting_a_topic_writes_tombstones_for_its_offsets(tmp_path):
    data = tmp_path / "data"
    with Broker(data) as b:
        create_topic(b.bootstrap, "doomed", 2)
        create_topic(b.bootstrap, "kept", 1)
        offsets = [TopicPartition("doomed", 0, 1), TopicPartition("doomed", 1, 2)]
        _commit(b.bootstrap, "g", [*offsets, TopicPartition("kept", 0, 3)])
        r = wire.call(b.bootstrap, 20, 6, topics=[{"name": "doomed", "topic_id": wire.ZERO_UUID}],
                      timeout=10000)  # fmt: skip
        assert r["responses"][0]["error_code"] == 0
        # Written after the answer, as Kafka writes them.
        deadline = time.monotonic() + 10
        while not (tombstones := [k for _p, k, c in _offsets_records(b.bootstrap) if c is None]):
            assert time.monotonic() < deadline, "no tombstones"
            time.sleep(0.05)
        assert tombstones == [("g", "doomed", 0), ("g", "doomed", 1)]
    with Broker(data) as b:
        create_topic(b.bootstrap, "doomed", 2)  # the same name again starts without offsets
        assert _committed(b.bootstrap, "g", "doomed", 2) == {0: -1001, 1: -1001}
        assert _committed(b.bootstrap, "g", "kept", 1) == {0: 3}


def test_a_failed_append_is_answered_not_coordinator_and_changes_nothing(broker: Broker):
    create_topic(broker.bootstrap, "t", 1)
    _commit(broker.bootstrap, "g", [TopicPartition("t", 0, 5)])
    home = broker.core.offsets_partitions(False)[partition_for("g", 50)]
    broker.call(home.vlog.journal.fail, StorageFailure("injected: the disk is gone"))
    r = wire.call(
        broker.bootstrap, 8, 8, group_id="g", generation_id_or_member_epoch=-1, member_id="",
        group_instance_id=None,
        topics=[{"name": "t", "partitions": [{"partition_index": 0, "committed_offset": 6,
                                              "committed_leader_epoch": -1,
                                              "committed_metadata": ""}]}],
    )  # fmt: skip
    assert r["topics"][0]["partitions"][0]["error_code"] == 16  # NOT_COORDINATOR: retry
    assert broker.core.offsets.get("g", "t", 0).offset == 5


@pytest.mark.parametrize("layout", ["virtual", "per-partition"])
def test_find_coordinator_creates_the_topic(tmp_path: Path, layout: str):
    with Broker(tmp_path / "data", config={"storage.layout": layout}) as b:
        assert wire.metadata(b.bootstrap, OFFSETS_TOPIC)["topics"][0]["error_code"] == 3
        r = wire.call(b.bootstrap, 10, 6, key_type=0, coordinator_keys=["first"])
        assert r["coordinators"][0]["error_code"] == 0
        md = wire.metadata(b.bootstrap, OFFSETS_TOPIC)["topics"][0]
        assert (md["error_code"], md["is_internal"], len(md["partitions"])) == (0, True, 50)


@pytest.mark.parametrize("auto_create", [False, True])
def test_metadata_creates_the_topic_only_with_auto_create_as_kafka(tmp_path, auto_create):
    # Kafka: Metadata(allow_auto_topic_creation) for __consumer_offsets creates it, with the
    # offsets topic's partitions and configs, only when auto.create.topics.enable is on.
    config = {"auto.create.topics.enable": auto_create, "num.partitions": 3}
    with Broker(tmp_path / "data", config=config) as b:
        r = wire.call(b.bootstrap, 3, 12, topics=[{"name": OFFSETS_TOPIC, "topic_id": None}],
                      allow_auto_topic_creation=True,
                      include_topic_authorized_operations=False)  # fmt: skip
        t = r["topics"][0]
        if auto_create:
            assert (t["error_code"], t["is_internal"], len(t["partitions"])) == (0, True, 50)
            configs = b.core.metadata.topics[OFFSETS_TOPIC].configs
            assert configs["cleanup.policy"] == "compact"
        else:
            assert (t["error_code"], t["is_internal"], len(t["partitions"])) == (3, True, 0)
            assert OFFSETS_TOPIC not in b.core.metadata.topics
