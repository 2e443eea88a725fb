"""Kafka Streams with exactly-once (``exactly_once_v2``) on Stratalog, killed with ``kill -9``.

The application is Kafka's own WordCountDemo (``org.apache.kafka:kafka-streams-examples``
4.3.1 from Maven Central, unchanged), configured through the properties file it accepts: it
splits lines of ``streams-plaintext-input`` into words, re-keys them by word (a repartition
topic), counts them in a state store (a compacted changelog topic) and writes every new count
to ``streams-wordcount-output``. With the record cache off, every input word yields exactly one
output record, so the output has a known shape that does not depend on timing: for each word
``w`` seen ``n`` times, its records in ``read_committed`` order are exactly ``1, 2, ..., n``. A
duplicate (a batch re-processed after the crash and committed twice) repeats a count; a loss
skips one; a state store restored wrongly restarts or jumps. The expected ``n`` per word comes
from the lines this test wrote, not from anything the broker says.

The input arrives in bursts while the application runs. Once some of the output is committed
and a transaction has written output that is not yet committed, the JVM is killed with SIGKILL
and started again with the same state directory (so the same transactional ids, which fence the
dead instance's transactions). The restarted instance restores its counts from the changelog,
resumes from the offsets its last transaction committed, and must end with the exact output.

The same run on the reference Apache Kafka gives the same output and the same internal topics
(``test_wordcount_same_on_kafka``).
"""

from __future__ import annotations

import random
import re
import struct
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

import pytest
from confluent_kafka import ConsumerGroupTopicPartitions, Producer
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic

from stratalog import Broker
from stratalog.peers.kafka import KafkaBroker

from ..conftest import KAFKA_TEST_JVM
from .conftest import (
    JavaApp,
    end_offsets,
    open_transaction_written,
    read_topic,
    start_offsets,
)

pytestmark = pytest.mark.kafka

WORDCOUNT = "org.apache.kafka.streams.examples.wordcount.WordCountDemo"
INPUT, OUTPUT = "streams-plaintext-input", "streams-wordcount-output"
APP_ID = "wordcount-eos"
REPARTITION = f"{APP_ID}-KSTREAM-AGGREGATE-STATE-STORE-0000000003-repartition"
CHANGELOG = f"{APP_ID}-KSTREAM-AGGREGATE-STATE-STORE-0000000003-changelog"
PARTITIONS = 3
LINES = 3000
CHUNK = 100  # lines per produce burst
PAUSE = 0.25  # seconds between bursts: about 8 s of input
KILL_AFTER = 1000  # committed output records before the kill
RUN_TIMEOUT = 90

STREAMS_CONFIG = {
    "application.id": APP_ID,
    "processing.guarantee": "exactly_once_v2",
    "num.stream.threads": "2",
    "commit.interval.ms": "1000",  # long transactions: a kill lands inside one
    "statestore.cache.max.bytes": "0",  # one output record per input word
    "repartition.purge.interval.ms": "1000",  # DeleteRecords on consumed repartition records
    # A killed member leaves the group when its session expires: keep the restart short.
    "consumer.session.timeout.ms": "6000",
    "consumer.heartbeat.interval.ms": "1000",
}


def input_lines(seed: int, count: int) -> list[str]:
    """Lines of 1-8 words from a 40-word vocabulary, mixed case and punctuation (the demo
    lower-cases and splits on ``\\W+``). No line starts with a separator."""
    rng = random.Random(seed)
    vocab = [f"w{i:02d}" for i in range(40)]
    seps = [" ", ", ", "; ", " - ", "  "]
    lines = []
    for _ in range(count):
        words = [rng.choice(vocab) for _ in range(rng.randint(1, 8))]
        words = [w.upper() if rng.random() < 0.2 else w for w in words]
        line = words[0] + "".join(rng.choice(seps) + w for w in words[1:])
        lines.append(line + rng.choice(["", ".", "!"]))
    return lines


def expected_counts(lines: list[str]) -> Counter[str]:
    return Counter(w for line in lines for w in re.split(r"\W+", line.lower()) if w)


@dataclass
class Outcome:
    sequences: dict[str, list[int]]  # word -> its counts in read_committed order
    uncommitted_records: int  # output records read_uncommitted (aborted ones included)
    killed_with_open_txn: bool  # some output partition had records past its LSO at the kill
    input_values: Counter[bytes]  # the input topic as read back
    group_offsets: dict[int, int]  # the application's committed input offsets
    input_ends: dict[int, int]
    internal_topics: dict[str, tuple[int, str]]  # name -> (partitions, cleanup.policy)
    repartition_starts: dict[int, int]  # log start offsets of the repartition topic
    changelog_firsts: dict[str, int]  # word -> the first count its changelog still holds


def _produce_slowly(
    bootstrap: str, lines: list[str], killed: threading.Event, failures: list[BaseException]
) -> None:
    """Two thirds of ``lines`` in timed bursts, or fewer if the kill comes first; the rest
    (bursts again) once the application was killed."""
    try:
        p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5})
        before_kill = len(lines) * 2 // 3
        for i in range(0, len(lines), CHUNK):
            if i >= before_kill and not killed.is_set():
                assert killed.wait(RUN_TIMEOUT), "never killed"
            for line in lines[i : i + CHUNK]:
                p.produce(INPUT, value=line.encode())
            p.poll(0)
            time.sleep(PAUSE)
        assert p.flush(30) == 0, "input not acknowledged"
    except BaseException as e:  # reported by the test thread
        failures.append(e)


def _internal_topics(admin: AdminClient) -> dict[str, tuple[int, str]]:
    topics = {
        name: len(t.partitions)
        for name, t in admin.list_topics(timeout=10).topics.items()
        if name.startswith(APP_ID + "-")
    }
    resources = [ConfigResource(ConfigResource.Type.TOPIC, name) for name in topics]
    configs = {
        r.name: f.result(timeout=10)["cleanup.policy"].value
        for r, f in admin.describe_configs(resources).items()
    }
    return {name: (n, configs[name]) for name, n in topics.items()}


def _properties(
    path: Path, bootstrap: str, state_dir: Path, extra: dict[str, str] | None = None
) -> Path:
    config = {"bootstrap.servers": bootstrap, "state.dir": str(state_dir)} | STREAMS_CONFIG
    config |= extra or {}
    path.write_text("".join(f"{k}={v}\n" for k, v in config.items()))
    return path


def run_wordcount(
    bootstrap: str, workdir: Path, lose_state: bool = False, extra: dict[str, str] | None = None
) -> Outcome:
    """The scenario: input arriving, WordCountDemo killed with SIGKILL mid-transaction and
    restarted, then everything read back. With ``lose_state`` the restart gets a new state
    directory: a new process id, so new transactional ids that fence nothing."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for f in admin.create_topics(
        [NewTopic(t, PARTITIONS, 1) for t in (INPUT, OUTPUT)], operation_timeout=10
    ).values():
        f.result(timeout=15)
    props = _properties(workdir / "wordcount.properties", bootstrap, workdir / "state", extra)
    lines = input_lines(28, LINES)
    total = sum(expected_counts(lines).values())

    failures: list[BaseException] = []
    killed = threading.Event()
    feeder = threading.Thread(target=_produce_slowly, args=(bootstrap, lines, killed, failures))
    app = JavaApp("streams", WORDCOUNT, str(props), log_dir=workdir)
    killed_with_open_txn = False
    try:
        app.start()
        app.wait_for_log("State transition from REBALANCING to RUNNING", RUN_TIMEOUT)
        feeder.start()
        deadline = time.monotonic() + RUN_TIMEOUT
        while True:  # until enough is committed and a transaction has written more
            assert app.alive, "WordCountDemo exited\n" + app.tail()
            assert time.monotonic() < deadline, "no output to kill in\n" + app.tail()
            lso = end_offsets(admin, OUTPUT, PARTITIONS, committed=True)
            if sum(lso.values()) >= KILL_AFTER and open_transaction_written(
                admin, OUTPUT, PARTITIONS
            ):
                # Frozen, it sends nothing more; a commit already on its way may still land,
                # so the transaction must still be open a moment later, else try again.
                app.freeze(True)
                time.sleep(0.3)
                if open_transaction_written(admin, OUTPUT, PARTITIONS):
                    break
                app.freeze(False)
            time.sleep(0.05)
        app.kill()  # SIGKILL: no shutdown hook, the open transactions are left hanging
        killed_with_open_txn = open_transaction_written(admin, OUTPUT, PARTITIONS)
        killed.set()
        if lose_state:  # the dead instance's transactions stay open until they time out
            state = workdir / "state-after-kill"
            props = _properties(
                workdir / "wordcount-after-kill.properties", bootstrap, state, extra
            )
            app = JavaApp("streams", WORDCOUNT, str(props), log_dir=workdir)
        app.start()  # same state.dir: same process id, same transactional ids
        feeder.join(timeout=RUN_TIMEOUT)
        assert not feeder.is_alive() and not failures, failures
        records = read_topic(bootstrap, OUTPUT, until=total, timeout=RUN_TIMEOUT, idle=3)
        assert app.alive, "WordCountDemo exited\n" + app.tail()
        uncommitted = read_topic(bootstrap, OUTPUT, committed=False, until=total, idle=1)
        group = admin.list_consumer_group_offsets(
            [ConsumerGroupTopicPartitions(APP_ID)], require_stable=True
        )[APP_ID].result(timeout=10)
    except BaseException:
        print(app.tail())
        raise
    finally:
        app.stop()
        killed.set()  # a failed run: the feeder ends too
        if feeder.is_alive():
            feeder.join(timeout=RUN_TIMEOUT)
    sequences: dict[str, list[int]] = defaultdict(list)
    for _, _, key, value in records:
        assert key is not None and value is not None
        sequences[key.decode()].append(struct.unpack(">q", value)[0])
    inputs = read_topic(bootstrap, INPUT, until=len(lines), idle=0.5)
    return Outcome(
        sequences=dict(sequences),
        uncommitted_records=len(uncommitted),
        killed_with_open_txn=killed_with_open_txn,
        input_values=Counter(v for _, _, _, v in inputs if v is not None),
        group_offsets={
            tp.partition: tp.offset for tp in group.topic_partitions if tp.topic == INPUT
        },
        input_ends=end_offsets(admin, INPUT, PARTITIONS, committed=False),
        internal_topics=_internal_topics(admin),
        repartition_starts=start_offsets(admin, REPARTITION, PARTITIONS),
        changelog_firsts=_first_counts(read_topic(bootstrap, CHANGELOG, committed=False)),
    )


def _first_counts(records: list[tuple[int, int, bytes | None, bytes | None]]) -> dict[str, int]:
    firsts: dict[str, int] = {}
    for _, _, key, value in records:
        if key is not None and value is not None:
            firsts.setdefault(key.decode(), struct.unpack(">q", value[-8:])[0])
    return firsts


def check_exactly_once(outcome: Outcome) -> None:
    """The oracle: computed from the input this test wrote, not from the broker."""
    lines = input_lines(28, LINES)
    # The input is what was sent, once: the counts below are then the ones to expect.
    assert outcome.input_values == Counter(line.encode() for line in lines)
    expected = expected_counts(lines)
    assert set(outcome.sequences) == set(expected)
    wrong = {
        w: (n, outcome.sequences[w][:3], outcome.sequences[w][-3:], len(outcome.sequences[w]))
        for w, n in expected.items()
        if outcome.sequences[w] != list(range(1, n + 1))
    }
    assert not wrong, f"words whose counts are not exactly 1..n once each: {wrong}"
    # The kill hit an open transaction whose records were written and then aborted: the
    # uncommitted view holds more than the committed one, which read_committed filtered.
    assert outcome.killed_with_open_txn
    assert outcome.uncommitted_records > sum(expected.values())
    # The last transaction committed the input offsets with the output.
    assert outcome.group_offsets == outcome.input_ends
    assert sum(outcome.input_ends.values()) == len(lines)
    # Streams purged the repartition records it had consumed (DeleteRecords).
    assert any(outcome.repartition_starts.values())


@pytest.fixture(scope="module")
def stratalog_outcome(tmp_path_factory: pytest.TempPathFactory) -> Outcome:
    base = tmp_path_factory.mktemp("streams-stratalog")
    with Broker(base / "data") as broker:
        return run_wordcount(broker.bootstrap, base)


def test_wordcount_exactly_once_after_kill9(stratalog_outcome: Outcome) -> None:
    check_exactly_once(stratalog_outcome)
    topics = stratalog_outcome.internal_topics
    assert topics == {CHANGELOG: (PARTITIONS, "compact"), REPARTITION: (PARTITIONS, "delete")}


def test_wordcount_exactly_once_after_kill9_and_lost_state(tmp_path: Path) -> None:
    """The restarted instance has lost its state directory: it restores everything from the
    changelog, and its new transactional ids fence nothing, so the dead instance's transactions
    stay open, holding back the last stable offsets of the output, changelog and repartition
    partitions, until the broker aborts them after their timeout (Streams' 10 s).

    The broker compacts the changelog meanwhile (small segments, a cleaner every 0.2 s, the
    changelog created by Streams with ``min.cleanable.dirty.ratio=0.01``): the restore reads a
    log cleaned over committed and aborted transactions, whose aborted counts must stay out."""
    settings = {"segment.bytes": "65536", "log.cleaner.backoff.ms": "200"}
    with Broker(tmp_path / "data", config=settings) as broker:
        outcome = run_wordcount(
            broker.bootstrap,
            tmp_path,
            lose_state=True,
            extra={"topic.min.cleanable.dirty.ratio": "0.01"},
        )
    check_exactly_once(outcome)
    # The cleaner ran: for some words the changelog no longer holds the first counts.
    assert any(first > 1 for first in outcome.changelog_firsts.values())


def test_wordcount_same_on_kafka(stratalog_outcome: Outcome, tmp_path: Path) -> None:
    with KafkaBroker(
        {"transaction.state.log.num.partitions": "3"}, jvm_options=KAFKA_TEST_JVM
    ) as kafka:
        outcome = run_wordcount(kafka.bootstrap, tmp_path)
    check_exactly_once(outcome)
    assert outcome.sequences == stratalog_outcome.sequences
    assert outcome.internal_topics == stratalog_outcome.internal_topics
    # (The input's split between partitions is the producer's choice; only its total compares.)
    assert sum(outcome.input_ends.values()) == sum(stratalog_outcome.input_ends.values())
