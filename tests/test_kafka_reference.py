"""The reference peer: a real Apache Kafka 4.4.0 broker, resolved from Maven Central by the project.

One broker serves the module. These tests are never skipped: without Java or Maven they fail with
the set-up error that says what to install.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer

from stratalog.peers.kafka import (
    KafkaBroker,
    KafkaSetupError,
    resolve_kafka,
    resolve_kafka_apps,
    run_tool,
)

from .conftest import KAFKA_TEST_JVM

pytestmark = pytest.mark.kafka

TOPIC = "reference-roundtrip"
N = 1000


def _records() -> list[tuple[bytes, bytes]]:
    return [(f"key-{i}".encode(), f"value-{i:04d}".encode()) for i in range(N)]


@pytest.fixture(scope="module")
def kafka() -> Iterator[KafkaBroker]:
    with KafkaBroker(jvm_options=KAFKA_TEST_JVM) as broker:
        yield broker


@pytest.fixture(scope="module")
def produced(kafka: KafkaBroker) -> list[tuple[bytes, bytes]]:
    """Creates TOPIC with kafka-topics and produces N records to it with confluent-kafka."""
    created = run_tool(
        "kafka-topics",
        "--bootstrap-server",
        kafka.bootstrap,
        "--create",
        "--topic",
        TOPIC,
        "--partitions",
        "1",
        "--replication-factor",
        "1",
    )
    assert created.returncode == 0, created.stderr
    assert f"Created topic {TOPIC}" in created.stdout

    records = _records()
    producer = Producer(
        {
            "bootstrap.servers": kafka.bootstrap,
            "acks": "all",
            "enable.idempotence": True,
            "linger.ms": 5,
        }
    )
    errors: list[object] = []

    def on_delivery(err: object, _msg: object) -> None:
        if err is not None:
            errors.append(err)

    for key, value in records:
        producer.produce(TOPIC, value=value, key=key, on_delivery=on_delivery)
    assert producer.flush(30) == 0
    assert errors == []
    return records


def test_broker_is_up(kafka: KafkaBroker) -> None:
    assert kafka.alive
    assert kafka.pid is not None and kafka.bootstrap.startswith("127.0.0.1:")
    assert kafka.log_dir is not None and kafka.log_dir.is_dir()


def test_topics_list_shows_topic(kafka: KafkaBroker, produced: list[tuple[bytes, bytes]]) -> None:
    listed = run_tool("kafka-topics", "--bootstrap-server", kafka.bootstrap, "--list")
    assert listed.returncode == 0, listed.stderr
    assert TOPIC in listed.stdout.split()


def test_confluent_consumer_reads_back_exactly(
    kafka: KafkaBroker, produced: list[tuple[bytes, bytes]]
) -> None:
    consumer = Consumer(
        {
            "bootstrap.servers": kafka.bootstrap,
            "group.id": "reference-check",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([TOPIC])
    got: list[tuple[bytes | None, bytes | None, int]] = []
    try:
        for _ in range(600):
            if len(got) >= N:
                break
            for msg in consumer.consume(num_messages=500, timeout=0.5):
                assert msg.error() is None, msg.error()
                got.append((msg.key(), msg.value(), msg.offset()))
    finally:
        consumer.close()
    assert [(k, v) for k, v, _ in got] == produced
    assert [offset for _, _, offset in got] == list(range(N))


def test_console_consumer_reads_back_exactly(
    kafka: KafkaBroker, produced: list[tuple[bytes, bytes]]
) -> None:
    result = run_tool(
        "kafka-console-consumer",
        "--bootstrap-server",
        kafka.bootstrap,
        "--topic",
        TOPIC,
        "--from-beginning",
        "--max-messages",
        str(N),
        "--timeout-ms",
        "60000",
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [v.decode() for _, v in produced]
    assert f"Processed a total of {N} messages" in result.stderr


@pytest.mark.parametrize("resolve", [resolve_kafka, resolve_kafka_apps])
def test_resolve_names_missing_maven(
    resolve: Callable[[Path], object], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A PATH with java (the real one) but no mvn, and a fresh cache that still needs resolving:
    # the reference broker and the applications of tests/apps/ fail loudly, never skip.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    java = shutil.which("java")
    assert java is not None, "`java` is not on PATH: run `make setup`"
    (bin_dir / "java").symlink_to(os.path.realpath(java))
    monkeypatch.setenv("PATH", str(bin_dir))
    cache = tmp_path / "cache"
    with pytest.raises(KafkaSetupError) as excinfo:
        resolve(cache)
    message = str(excinfo.value)
    assert "`mvn`" in message and "not on PATH" in message
    assert "make setup" in message and "apt-get install" in message and "maven" in message
    assert not (cache / ".complete").exists()


def test_stop_leaves_no_process(kafka: KafkaBroker) -> None:
    # Runs last in the module: stops the shared broker (the fixture's own stop is then a no-op).
    pid, log_dir = kafka.pid, kafka.log_dir
    assert pid is not None and log_dir is not None
    kafka.stop()
    assert kafka.pid is None and not kafka.alive
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    with pytest.raises(ProcessLookupError):
        os.killpg(pid, 0)  # nothing is left in the JVM's process group either
    assert not Path(f"/proc/{pid}").exists()
    assert not log_dir.exists()
    kafka.stop()  # idempotent
