"""Apache Kafka's own command-line tools, run unchanged against Stratalog.

Kafka's Java client is the reference client: every tool here (kafka-topics, kafka-console-producer
and -consumer, kafka-consumer-groups, kafka-configs, kafka-producer-perf-test and
kafka-consumer-perf-test) is the genuine article, resolved from Maven Central by
``stratalog.peers.kafka`` and pointed at one embedded Stratalog broker for the module. The tests
assert on what the tools print (the same text they print against Apache Kafka) and on the
broker's state, read back with confluent-kafka.

Each JVM start costs one to two seconds, so every tool run is there for a reason, and every run is
bounded by a timeout.
"""

from __future__ import annotations

import json
import re
import subprocess
import time

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource

from stratalog import Broker
from stratalog.broker.offset_records import OFFSETS_TOPIC, partition_for
from stratalog.peers.kafka import run_tool

from .conftest import create_topic

pytestmark = pytest.mark.kafka

TOOL_TIMEOUT = 60


def _tool(tool: str, *args: str, input: str | None = None) -> subprocess.CompletedProcess[str]:
    return run_tool(tool, *args, timeout=TOOL_TIMEOUT, input=input)


def _ok(result: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    assert result.returncode == 0, (
        f"{' '.join(result.args[-12:])}\nexit {result.returncode}\n"
        f"--- stdout ---\n{result.stdout}\n--- stderr ---\n{result.stderr}"
    )
    return result


def _admin(bootstrap: str) -> AdminClient:
    return AdminClient({"bootstrap.servers": bootstrap})


def _partition_count(bootstrap: str, topic: str) -> int | None:
    md = _admin(bootstrap).list_topics(timeout=10)
    t = md.topics.get(topic)
    return None if t is None or t.error is not None else len(t.partitions)


def _topic_configs(bootstrap: str, topic: str) -> dict[str, tuple[str | None, bool]]:
    """name -> (value, is_default) as the broker describes the topic to librdkafka."""
    res = ConfigResource(ConfigResource.Type.TOPIC, topic)
    admin = _admin(bootstrap)  # kept alive until the future resolves
    entries = admin.describe_configs([res])[res].result(timeout=10)
    return {name: (e.value, e.is_default) for name, e in entries.items()}


def _watermarks(bootstrap: str, topic: str) -> dict[int, tuple[int, int]]:
    n = _partition_count(bootstrap, topic)
    assert n is not None, f"topic {topic} does not exist"
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "tools-watermarks"})
    try:
        return {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10) for p in range(n)}
    finally:
        c.close()


def _committed(bootstrap: str, group: str, topic: str, partitions: int) -> dict[int, int]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        tps = c.committed([TopicPartition(topic, p) for p in range(partitions)], timeout=10)
        return {tp.partition: tp.offset for tp in tps}
    finally:
        c.close()


def _produce(bootstrap: str, topic: str, records: list[tuple[bytes, bytes]]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5})
    errors: list[object] = []

    def on_delivery(err: object, _msg: object) -> None:
        if err is not None:
            errors.append(err)

    for key, value in records:
        producer.produce(topic, value=value, key=key, on_delivery=on_delivery)
    assert producer.flush(30) == 0
    assert errors == []


def _read_all(bootstrap: str, topic: str, n: int) -> list[tuple[bytes | None, bytes | None, int]]:
    """The first n records of a one-partition topic, read with confluent-kafka."""
    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "tools-reader",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    c.assign([TopicPartition(topic, 0, 0)])
    got: list[tuple[bytes | None, bytes | None, int]] = []
    deadline = time.monotonic() + 30
    try:
        while len(got) < n and time.monotonic() < deadline:
            for msg in c.consume(num_messages=500, timeout=0.5):
                assert msg.error() is None, msg.error()
                got.append((msg.key(), msg.value(), msg.offset()))
    finally:
        c.close()
    return got


@pytest.fixture(scope="module")
def bootstrap(shared_broker: Broker) -> str:
    return shared_broker.bootstrap


# ----------------------------------------------------------------------------------------------
# kafka-topics
# ----------------------------------------------------------------------------------------------


def test_kafka_topics_lifecycle(bootstrap: str) -> None:
    topic = "tools-topics"
    bs = ("--bootstrap-server", bootstrap)

    created = _ok(
        _tool(
            "kafka-topics",
            *bs,
            "--create",
            "--topic",
            topic,
            "--partitions",
            "2",
            "--replication-factor",
            "1",
            "--config",
            "retention.ms=123456",
        )
    )
    assert created.stdout.strip() == f"Created topic {topic}."
    assert _partition_count(bootstrap, topic) == 2
    assert _topic_configs(bootstrap, topic)["retention.ms"] == ("123456", False)

    # Creating it again: Kafka's TopicExistsException, reported the way the tool always does.
    again = _tool("kafka-topics", *bs, "--create", "--topic", topic, "--partitions", "2")
    assert again.returncode != 0
    assert f"Error while executing topic command : Topic '{topic}' already exists." in (
        again.stdout
    )
    assert "org.apache.kafka.common.errors.TopicExistsException" in again.stderr

    _ok(_tool("kafka-topics", *bs, "--alter", "--topic", topic, "--partitions", "4"))
    assert _partition_count(bootstrap, topic) == 4

    described = _ok(_tool("kafka-topics", *bs, "--describe", "--topic", topic))
    md = _admin(bootstrap).list_topics(topic, timeout=10)
    leaders = {p.id: p.leader for p in md.topics[topic].partitions.values()}
    (node,) = set(leaders.values())
    assert node in md.brokers
    lines = described.stdout.strip().splitlines()
    header = dict(field.split(": ", 1) for field in lines[0].split("\t"))
    assert header["Topic"] == topic
    assert re.fullmatch(r"[A-Za-z0-9_-]{22}", header["TopicId"]), header
    assert header["TopicId"] != "AAAAAAAAAAAAAAAAAAAAAA"  # not the zero UUID
    assert header["PartitionCount"] == "4"
    assert header["ReplicationFactor"] == "1"
    assert "retention.ms=123456" in header["Configs"].split(",")
    rows = [line.strip() for line in lines[1:]]
    assert rows == [
        f"Topic: {topic}\tPartition: {p}\tLeader: {node}\tReplicas: {node}\tIsr: {node}"
        "\tElr: \tLastKnownElr:"
        for p in range(4)
    ]

    listed = _ok(_tool("kafka-topics", *bs, "--list"))
    assert topic in listed.stdout.split()
    assert set(listed.stdout.split()) == set(_admin(bootstrap).list_topics(timeout=10).topics)

    _ok(_tool("kafka-topics", *bs, "--delete", "--topic", topic))
    assert _partition_count(bootstrap, topic) is None
    assert topic not in _admin(bootstrap).list_topics(timeout=10).topics


def test_kafka_topics_alter_cannot_shrink(bootstrap: str) -> None:
    """--alter --partitions to fewer or as many partitions: Kafka's InvalidPartitionsException.

    The tool prints the broker's CreatePartitions error message; the expected text is Apache
    Kafka 4.4's (ReplicationControlManager), as the same runs against ``KafkaBroker`` print.
    """
    topic = "tools-topics-shrink"
    create_topic(bootstrap, topic, 2)
    alter = ("--bootstrap-server", bootstrap, "--alter", "--topic", topic, "--partitions")

    shrink = _tool("kafka-topics", *alter, "1")
    same = _tool("kafka-topics", *alter, "2")
    assert _partition_count(bootstrap, topic) == 2
    for result in (shrink, same):
        assert result.returncode != 0
        assert "org.apache.kafka.common.errors.InvalidPartitionsException" in result.stderr
    assert shrink.stdout == (
        f"Error while executing topic command : The topic {topic} currently has 2 "
        "partition(s); 1 would not be an increase.\n"
    )
    assert same.stdout == (
        "Error while executing topic command : Topic already has 2 partition(s).\n"
    )


# ----------------------------------------------------------------------------------------------
# kafka-console-producer / kafka-console-consumer
# ----------------------------------------------------------------------------------------------


def test_console_producer_then_consumer_round_trip(bootstrap: str) -> None:
    topic = "tools-console"
    n = 200
    create_topic(bootstrap, topic, 1)
    records = [(f"key-{i}", f"value {i:03d} ünïcödé ✓ {'x' * (i % 7)}") for i in range(n)]
    bs = ("--bootstrap-server", bootstrap)

    _ok(
        _tool(
            "kafka-console-producer",
            *bs,
            "--topic",
            topic,
            "--reader-property",
            "parse.key=true",
            "--reader-property",
            "key.separator=|",
            input="".join(f"{k}|{v}\n" for k, v in records),
        )
    )

    # The broker holds exactly these records, in order, at offsets 0..n-1.
    got = _read_all(bootstrap, topic, n)
    assert [(k, v) for k, v, _ in got] == [(k.encode(), v.encode()) for k, v in records]
    assert [o for _, _, o in got] == list(range(n))

    consumer_args = (*bs, "--topic", topic, "--from-beginning", "--max-messages", str(n))
    plain = _ok(_tool("kafka-console-consumer", *consumer_args, "--timeout-ms", "30000"))
    assert plain.stdout.splitlines() == [v for _, v in records]
    assert f"Processed a total of {n} messages" in plain.stderr

    keyed = _ok(
        _tool(
            "kafka-console-consumer",
            *consumer_args,
            "--timeout-ms",
            "30000",
            "--formatter-property",
            "print.key=true",
            "--formatter-property",
            "key.separator=|",
        )
    )
    assert keyed.stdout.splitlines() == [f"{k}|{v}" for k, v in records]
    assert f"Processed a total of {n} messages" in keyed.stderr


def _json_values(text: str) -> list[dict]:
    """The JSON objects a formatter printed (back to back: OffsetsMessageFormatter prints no
    line separator)."""
    decoder = json.JSONDecoder()
    out = []
    pos = text.find("{")
    while pos >= 0:
        obj, pos = decoder.raw_decode(text, pos)
        out.append(obj)
        pos = text.find("{", pos)
    return out


def test_console_consumer_decodes_the_offsets_topic_with_kafkas_formatter(bootstrap: str) -> None:
    """Committed offsets are records of __consumer_offsets in Kafka's own formats: Kafka's
    OffsetsMessageFormatter, in a Java consumer that does not exclude internal topics, reads
    them from the group's partition (Kafka's hash of the group id)."""
    topic, group = "tools-offsets", "tools-offsets-group"
    create_topic(bootstrap, topic, 2)
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        c.commit(
            offsets=[TopicPartition(topic, 0, 3), TopicPartition(topic, 1, 4)], asynchronous=False
        )
        c.commit(offsets=[TopicPartition(topic, 0, 5)], asynchronous=False)
    finally:
        c.close()
    out = _ok(
        _tool(
            "kafka-console-consumer",
            "--bootstrap-server",
            bootstrap,
            "--topic",
            OFFSETS_TOPIC,
            "--partition",
            str(partition_for(group, 50)),
            "--offset",
            "earliest",
            "--formatter",
            "org.apache.kafka.tools.consumer.OffsetsMessageFormatter",
            "--command-property",
            "exclude.internal.topics=false",
            "--max-messages",
            "3",
            "--timeout-ms",
            "30000",
        )
    )
    seen = []
    for r in _json_values(out.stdout):
        key, value = r["key"], r["value"]
        if key["data"]["group"] == group:
            k, v = key["data"], value["data"]
            seen.append((key["type"], k["topic"], k["partition"], value["version"], v["offset"],
                         v["leaderEpoch"]))  # fmt: skip
    # (key type, topic, partition, value version, offset, leader epoch)
    assert seen == [(1, topic, 0, 3, 3, -1), (1, topic, 1, 3, 4, -1), (1, topic, 0, 3, 5, -1)]
    assert "Processed a total of 3 messages" in out.stderr


# ----------------------------------------------------------------------------------------------
# kafka-consumer-groups
# ----------------------------------------------------------------------------------------------


def _group_rows(stdout: str, group: str) -> list[list[str]]:
    return [line.split() for line in stdout.splitlines() if line.split()[:1] == [group]]


def test_kafka_consumer_groups(bootstrap: str) -> None:
    topic, group, parts = "tools-groups", "tools-group", 3
    create_topic(bootstrap, topic, parts)
    first = [(f"k{i}".encode(), f"first-{i}".encode()) for i in range(30)]
    later = [(f"k{i}".encode(), f"later-{i}".encode()) for i in range(6)]
    bs = ("--bootstrap-server", bootstrap)
    _produce(bootstrap, topic, first)

    # A console consumer in the group reads everything and commits its position on close.
    consumed = _ok(
        _tool(
            "kafka-console-consumer",
            *bs,
            "--topic",
            topic,
            "--group",
            group,
            "--from-beginning",
            "--max-messages",
            str(len(first)),
            "--timeout-ms",
            "30000",
        )
    )
    assert sorted(consumed.stdout.splitlines()) == sorted(v.decode() for _, v in first)
    marks = _watermarks(bootstrap, topic)
    assert _committed(bootstrap, group, topic, parts) == {p: hi for p, (_, hi) in marks.items()}

    # More records arrive: the group now lags by exactly those.
    _produce(bootstrap, topic, later)
    committed = {p: hi for p, (_, hi) in marks.items()}
    ends = {p: hi for p, (_, hi) in _watermarks(bootstrap, topic).items()}
    assert sum(ends.values()) - sum(committed.values()) == len(later)

    listed = _ok(_tool("kafka-consumer-groups", *bs, "--list"))
    assert group in listed.stdout.split()

    described = _ok(_tool("kafka-consumer-groups", *bs, "--describe", "--group", group))
    header = next(line.split() for line in described.stdout.splitlines() if line.strip())
    assert header == [
        "GROUP",
        "TOPIC",
        "PARTITION",
        "CURRENT-OFFSET",
        "LOG-END-OFFSET",
        "LAG",
        "CONSUMER-ID",
        "HOST",
        "CLIENT-ID",
    ]
    rows = sorted(_group_rows(described.stdout, group), key=lambda r: int(r[2]))
    # No member holds the partitions, so CONSUMER-ID, HOST and CLIENT-ID are "-".
    lag = {p: ends[p] - committed[p] for p in range(parts)}
    assert rows == [
        [group, topic, *map(str, (p, committed[p], ends[p], lag[p])), "-", "-", "-"]
        for p in range(parts)
    ]
    assert f"Consumer group '{group}' has no active members." in described.stderr

    reset_args = (*bs, "--reset-offsets", "--group", group, "--topic", topic)
    earliest = _ok(_tool("kafka-consumer-groups", *reset_args, "--to-earliest", "--execute"))
    assert sorted(_group_rows(earliest.stdout, group), key=lambda r: int(r[2])) == [
        [group, topic, str(p), "0"] for p in range(parts)
    ]
    assert _committed(bootstrap, group, topic, parts) == {p: 0 for p in range(parts)}

    # Without --from-beginning the console consumer would start at the end (auto.offset.reset
    # =latest); it reads every record because the group's committed offsets are now 0.
    total = len(first) + len(later)
    reread = _ok(
        _tool(
            "kafka-console-consumer",
            *bs,
            "--topic",
            topic,
            "--group",
            group,
            "--max-messages",
            str(total),
            "--timeout-ms",
            "30000",
        )
    )
    assert sorted(reread.stdout.splitlines()) == sorted(v.decode() for _, v in first + later)
    assert _committed(bootstrap, group, topic, parts) == ends

    to_offset = _ok(_tool("kafka-consumer-groups", *reset_args, "--to-offset", "2", "--execute"))
    assert sorted(_group_rows(to_offset.stdout, group), key=lambda r: int(r[2])) == [
        [group, topic, str(p), "2"] for p in range(parts)
    ]
    assert _committed(bootstrap, group, topic, parts) == {p: 2 for p in range(parts)}


# ----------------------------------------------------------------------------------------------
# kafka-configs
# ----------------------------------------------------------------------------------------------


_CONFIG_LINE = re.compile(r"^\s+([\w.]+)=(\S*) sensitive=(true|false) synonyms=\{.*\}$")


def _dynamic_configs(stdout: str, topic: str) -> dict[str, str]:
    lines = stdout.splitlines()
    assert lines[0] == f"Dynamic configs for topic {topic} are:", stdout
    out = {}
    for line in lines[1:]:
        m = _CONFIG_LINE.match(line)
        assert m is not None, f"unexpected kafka-configs line {line!r}"
        assert m.group(3) == "false"
        out[m.group(1)] = m.group(2)
    return out


def test_kafka_configs(bootstrap: str) -> None:
    topic = "tools-configs"
    create_topic(bootstrap, topic, 1, **{"retention.ms": "123456"})
    entity = ("--bootstrap-server", bootstrap, "--entity-type", "topics", "--entity-name", topic)

    described = _ok(_tool("kafka-configs", *entity, "--describe"))
    assert _dynamic_configs(described.stdout, topic) == {"retention.ms": "123456"}

    altered = _ok(
        _tool(
            "kafka-configs",
            *entity,
            "--alter",
            "--add-config",
            "retention.ms=777777,retention.bytes=1048576",
        )
    )
    assert altered.stdout.strip() == f"Completed updating config for topic {topic}."
    configs = _topic_configs(bootstrap, topic)
    assert configs["retention.ms"] == ("777777", False)
    assert configs["retention.bytes"] == ("1048576", False)

    described = _ok(_tool("kafka-configs", *entity, "--describe"))
    assert _dynamic_configs(described.stdout, topic) == {
        "retention.ms": "777777",
        "retention.bytes": "1048576",
    }

    deleted = _ok(_tool("kafka-configs", *entity, "--alter", "--delete-config", "retention.ms"))
    assert deleted.stdout.strip() == f"Completed updating config for topic {topic}."
    configs = _topic_configs(bootstrap, topic)
    assert configs["retention.ms"][1] is True  # back to the broker default
    assert configs["retention.bytes"] == ("1048576", False)

    described = _ok(_tool("kafka-configs", *entity, "--describe"))
    assert _dynamic_configs(described.stdout, topic) == {"retention.bytes": "1048576"}


def test_kafka_configs_describe_shows_synonyms(bootstrap: str) -> None:
    """kafka-configs asks DescribeConfigs for synonyms and prints them; Kafka lists the topic
    override itself first, as ``DYNAMIC_TOPIC_CONFIG:name=value``."""
    topic = "tools-configs-synonyms"
    create_topic(bootstrap, topic, 1, **{"retention.ms": "123456"})
    described = _ok(
        _tool(
            "kafka-configs",
            "--bootstrap-server",
            bootstrap,
            "--entity-type",
            "topics",
            "--entity-name",
            topic,
            "--describe",
        )
    )
    lines = described.stdout.splitlines()
    assert lines[0] == f"Dynamic configs for topic {topic} are:"
    assert lines[1].startswith(
        "  retention.ms=123456 sensitive=false synonyms={DYNAMIC_TOPIC_CONFIG:retention.ms=123456"
    ), described.stdout


# ----------------------------------------------------------------------------------------------
# kafka-producer-perf-test / kafka-consumer-perf-test
# ----------------------------------------------------------------------------------------------


_PERF_SUMMARY = re.compile(
    r"^(\d+) records sent, [\d.]+ records/sec \([\d.]+ MB/sec\), [\d.]+ ms avg latency, "
    r"[\d.]+ ms max latency, \d+ ms 50th, \d+ ms 95th, \d+ ms 99th, \d+ ms 99\.9th\.$"
)


def test_perf_tools_round_trip(bootstrap: str) -> None:
    topic, n, size = "tools-perf", 50_000, 100
    create_topic(bootstrap, topic, 3)

    produced = _ok(
        _tool(
            "kafka-producer-perf-test",
            "--topic",
            topic,
            "--num-records",
            str(n),
            "--record-size",
            str(size),
            "--throughput",
            "-1",
            "--command-property",
            "acks=all",
            f"bootstrap.servers={bootstrap}",
        )
    )
    summaries = [m for line in produced.stdout.splitlines() if (m := _PERF_SUMMARY.match(line))]
    assert len(summaries) == 1, produced.stdout
    # The tool counts a record as sent only when its acks=all acknowledgement came back.
    assert int(summaries[0].group(1)) == n
    assert "Exception" not in produced.stderr, produced.stderr

    marks = _watermarks(bootstrap, topic)
    assert sum(hi - lo for lo, hi in marks.values()) == n

    consumed = _ok(
        _tool(
            "kafka-consumer-perf-test",
            "--bootstrap-server",
            bootstrap,
            "--topic",
            topic,
            "--num-records",
            str(n),
            "--timeout",
            "30000",
        )
    )
    lines = [line for line in consumed.stdout.splitlines() if "," in line]
    header = [h.strip() for h in lines[0].split(",")]
    assert header[0] == "start.time"
    stats = dict(zip(header, (v.strip() for v in lines[1].split(",")), strict=True))
    assert int(stats["data.consumed.in.nMsg"]) == n
    assert float(stats["data.consumed.in.MB"]) == pytest.approx(n * size / 2**20, abs=1e-3)
