"""Share groups (KIP-932) with real clients against `stratalog serve`.

librdkafka's share consumer (confluent-kafka's ``ShareConsumer``) and Kafka's Java
``KafkaShareConsumer`` (through Kafka's own ``kafka-console-share-consumer``), plus
``kafka-share-groups``, on one broker process on loopback. The broker locks acquired records for
three seconds (``group.share.record.lock.duration.ms``; Kafka's default is thirty) so that a lock
running out is seen within a test, tells members to heartbeat every second, and starts new
share-partitions at the log start (``share.auto.offset.reset=earliest``) so records produced
before the consumers came are theirs.
"""

from __future__ import annotations

import re
import subprocess
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import AcknowledgeType, Producer, ShareConsumer

from stratalog.peers.kafka import run_tool, tool_command

from .conformance import wire
from .conftest import BrokerProcess, create_topic

LOCK_MS = 3000
DELIVERY_LIMIT = 5
SETTINGS = {
    "group.share.record.lock.duration.ms": str(LOCK_MS),
    "group.share.heartbeat.interval.ms": "1000",
    "group.share.session.timeout.ms": "10000",
    "share.auto.offset.reset": "earliest",
}


@pytest.fixture(scope="module")
def bootstrap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    bp = BrokerProcess(Path(tmp_path_factory.mktemp("share")) / "data", settings=SETTINGS)
    bp.start()
    try:
        yield bp.bootstrap
    finally:
        bp.stop()


def _produce(bootstrap: str, topic: str, partitions: int, start: int, n: int) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 0})
    for i in range(start, start + n):
        p.produce(topic, value=f"r{i}".encode(), partition=i % partitions)
    assert p.flush(30) == 0


def close_share_consumer(c: ShareConsumer, seconds: float = 30.0) -> None:
    """Close a librdkafka share consumer, waiting at most ``seconds``. Its close once blocked for
    good inside librdkafka (rd_kafka_share_consumer_close waiting on its queue, 14 minutes in a
    cluster test), where pytest-timeout's signal cannot reach it (a handler runs between Python
    bytecodes only) and the whole suite waited; the close runs on a thread of its own instead,
    and one still blocked is left behind (it ends with the test process)."""
    t = threading.Thread(target=c.close, name="share-consumer-close", daemon=True)
    t.start()
    t.join(seconds)
    if t.is_alive():
        warnings.warn(f"a share consumer's close did not return in {seconds:.0f} s", stacklevel=2)


def _share_consumer(bootstrap: str, group: str, topic: str, explicit: bool = False):
    c = ShareConsumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "share.acknowledgement.mode": "explicit" if explicit else "implicit",
        }
    )
    c.subscribe([topic])
    return c


def _records(c, timeout: float = 0.5) -> list:
    return [m for m in c.poll(timeout) if m.error() is None]


def _members(bootstrap: str, group: str) -> list[dict]:
    r = wire.call(bootstrap, 77, 1, group_ids=[group], include_authorized_operations=False)
    return r["groups"][0]["members"]


def _wait_for_members(bootstrap: str, group: str, n: int, consumers: list) -> None:
    """Poll every consumer until the group has ``n`` members, each with partitions."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        for c in consumers:
            assert _records(c, 0.2) == []  # nothing produced yet
        members = _members(bootstrap, group)
        if len(members) == n and all(m["assignment"]["topic_partitions"] for m in members):
            return
    raise AssertionError(f"{group}: members {_members(bootstrap, group)}")


def test_librdkafka_consumers_get_disjoint_records_and_all_of_them(bootstrap: str) -> None:
    topic, group, n = "share-rdk-all", "share-rdk-all-g", 600
    create_topic(bootstrap, topic, 2)
    consumers = [_share_consumer(bootstrap, group, topic) for _ in range(3)]
    try:
        _wait_for_members(bootstrap, group, 3, consumers)
        seen: dict[tuple[int, int], int] = {}
        counts = [0, 0, 0]
        for round_ in range(6):
            _produce(bootstrap, topic, 2, round_ * 100, 100)
            for i, c in enumerate(consumers):
                for m in _records(c, 0.3):
                    key = (m.partition(), m.offset())
                    assert key not in seen, f"{key} delivered to consumer {seen[key]} and {i}"
                    assert m.delivery_count() == 1
                    seen[key] = i
                    counts[i] += 1
        deadline = time.monotonic() + 30
        while len(seen) < n and time.monotonic() < deadline:
            for i, c in enumerate(consumers):
                for m in _records(c, 0.3):
                    key = (m.partition(), m.offset())
                    assert key not in seen, f"{key} delivered to consumer {seen[key]} and {i}"
                    seen[key] = i
                    counts[i] += 1
        assert sorted(seen) == [(p, o) for p in range(2) for o in range(n // 2)]
        assert sum(1 for c in counts if c) >= 2, counts  # two partitions: two consumers at least
    finally:
        for c in consumers:
            close_share_consumer(c)


def test_librdkafka_release_redelivers_and_the_delivery_limit_archives(bootstrap: str) -> None:
    topic, group = "share-rdk-release", "share-rdk-release-g"
    create_topic(bootstrap, topic, 1)
    _produce(bootstrap, topic, 1, 0, 3)
    c = _share_consumer(bootstrap, group, topic, explicit=True)
    deliveries: list[tuple[int, int]] = []  # (offset, delivery count)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            for m in _records(c):
                deliveries.append((m.offset(), m.delivery_count()))
                # Offset 1 is always released: it comes back until the limit archives it.
                release = m.offset() == 1
                c.acknowledge(m, AcknowledgeType.RELEASE if release else AcknowledgeType.ACCEPT)
            c.commit_sync()
            if (1, DELIVERY_LIMIT) in deliveries and len(deliveries) >= DELIVERY_LIMIT + 2:
                break
        _produce(bootstrap, topic, 1, 3, 1)
        later = []
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and not later:
            for m in _records(c):
                later.append((m.offset(), m.delivery_count()))
                c.acknowledge(m)
            c.commit_sync()
    finally:
        close_share_consumer(c)
    assert sorted(deliveries) == [(0, 1), *((1, n) for n in range(1, DELIVERY_LIMIT + 1)), (2, 1)]
    assert later == [(3, 1)]  # offset 1 archived: never again
    offsets = wire.call(bootstrap, 90, 1, groups=[{"group_id": group, "topics": None}])
    (part,) = offsets["groups"][0]["topics"][0]["partitions"]
    assert part["start_offset"] == 4 and part["lag"] == 0


def _acquire_and_hang(conn: wire.Connection, group: str, topic: str) -> list[dict]:
    """A member that joins, fetches, and is never heard of again while its connection stays
    open (a consumer that hung: a closed connection would release its records at once); the
    records it acquired."""
    tid = wire.topic_id(conn.bootstrap, topic)
    hb = conn.call(76, 1, group_id=group, member_id="hung", member_epoch=0,
                   subscribed_topic_names=[topic])  # fmt: skip
    assert hb["error_code"] == 0
    fetched = conn.call(78, 1, group_id=group, member_id="hung", share_session_epoch=0,
                        max_wait=2000, min_bytes=1, max_records=500, batch_size=500,
                        forgotten_topics_data=[],
                        topics=[{"topic_id": tid, "partitions": [
                            {"partition_index": 0, "acknowledgement_batches": []}]}])  # fmt: skip
    assert fetched["error_code"] == 0
    return fetched["responses"][0]["partitions"][0]["acquired_records"]


def test_records_of_a_consumer_that_hung_go_to_another_after_the_lock(bootstrap: str) -> None:
    topic, group = "share-rdk-hung", "share-rdk-hung-g"
    create_topic(bootstrap, topic, 1)
    _produce(bootstrap, topic, 1, 0, 10)
    with wire.Connection(bootstrap) as hung:
        assert _acquire_and_hang(hung, group, topic) == [
            {"first_offset": 0, "last_offset": 9, "delivery_count": 1}
        ]
        acquired = time.monotonic()
        c = _share_consumer(bootstrap, group, topic)
        got: dict[int, int] = {}
        try:
            deadline = time.monotonic() + 30
            while len(got) < 10 and time.monotonic() < deadline:
                for m in _records(c):
                    assert m.offset() not in got
                    got[m.offset()] = m.delivery_count()
                    if len(got) == 1:
                        waited = time.monotonic() - acquired
        finally:
            close_share_consumer(c)
    assert got == {o: 2 for o in range(10)}
    assert waited >= LOCK_MS / 1000 - 0.5  # not before the lock ran out


# -- Kafka's Java share consumer (kafka-console-share-consumer) ------------------------------------
FORMAT = [
    "--formatter-property", "print.partition=true",
    "--formatter-property", "print.offset=true",
    "--formatter-property", "print.delivery=true",
]  # fmt: skip
_LINE = re.compile(r"Partition:(\d+)\s+Offset:(\d+)\s+Delivery:(\d+)\s+(\S+)")


class JavaShareConsumer:
    """kafka-console-share-consumer in the background; its records as they are printed."""

    def __init__(self, bootstrap: str, group: str, topic: str, *extra: str) -> None:
        cmd = tool_command(
            "kafka-console-share-consumer",
            "--bootstrap-server", bootstrap, "--topic", topic, "--group", group,
            *FORMAT, *extra,
        )  # fmt: skip
        self.proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.endswith("\n"):  # (a line cut short by a kill is not a record printed)
                self.lines.append(line.rstrip("\n"))

    def records(self) -> list[tuple[int, int, int, str]]:
        """(partition, offset, delivery count, value) of each record printed so far."""
        out = []
        for line in list(self.lines):
            m = _LINE.search(line)
            assert m, f"unexpected output: {line!r}"
            out.append((int(m[1]), int(m[2]), int(m[3]), m[4]))
        return out

    def stop(self, kill: bool = False) -> None:
        if self.proc.poll() is None:
            (self.proc.kill if kill else self.proc.terminate)()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        self._reader.join(10)


def _wait(cond, what: str, timeout: float = 60, step: float = 0.2) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, what
        time.sleep(step)


def _java_members(bootstrap: str, group: str, n: int, consumers: list[JavaShareConsumer]):
    def ready() -> bool:
        for c in consumers:
            assert c.proc.poll() is None, c.proc.stderr.read() if c.proc.stderr else ""
        members = _members(bootstrap, group)
        parts = [
            (tp["topic_name"], p)
            for m in members
            for tp in m["assignment"]["topic_partitions"]
            for p in tp["partitions"]
        ]
        # Settled: every member at its target, no partition assigned twice.
        return (
            len(members) == n
            and all(m["assignment"]["topic_partitions"] for m in members)
            and len(parts) == len(set(parts))
        )

    _wait(ready, f"{n} members in {group}, settled")
    # A share fetch sent before a member moved to its new assignment may still name the
    # partitions it had; the next one (after at most the client's 500 ms wait) does not.
    time.sleep(2)


def test_java_share_consumers_get_disjoint_records_and_all_of_them(bootstrap: str) -> None:
    topic, group, n = "share-java-all", "share-java-all-g", 400
    create_topic(bootstrap, topic, 2)
    consumers = [JavaShareConsumer(bootstrap, group, topic) for _ in range(2)]
    try:
        _java_members(bootstrap, group, 2, consumers)
        _produce(bootstrap, topic, 2, 0, n)
        _wait(lambda: sum(len(c.lines) for c in consumers) >= n, "all records consumed")
        time.sleep(1)  # nothing more may come
    finally:
        for c in consumers:
            c.stop()
    got = [r for c in consumers for r in c.records()]
    assert sorted((p, o) for p, o, _, _ in got) == [(p, o) for p in range(2) for o in range(n // 2)]
    assert {d for _, _, d, _ in got} == {1}
    assert all(c.records() for c in consumers)  # one partition each (simple assignor)


def test_java_release_redelivers_until_the_delivery_limit(bootstrap: str) -> None:
    topic, group = "share-java-release", "share-java-release-g"
    create_topic(bootstrap, topic, 1)
    _produce(bootstrap, topic, 1, 0, 1)
    c = JavaShareConsumer(bootstrap, group, topic, "--release", "--timeout-ms", "8000")
    try:
        c.proc.wait(60)
    finally:
        c.stop()
    assert c.records() == [(0, 0, n, "r0") for n in range(1, DELIVERY_LIMIT + 1)]
    offsets = wire.call(bootstrap, 90, 1, groups=[{"group_id": group, "topics": None}])
    (part,) = offsets["groups"][0]["topics"][0]["partitions"]
    assert part["start_offset"] == 1  # archived after the fifth delivery


def test_java_consumer_killed_holding_records(bootstrap: str) -> None:
    """A share consumer killed (SIGKILL) with records acquired and not acknowledged: another
    consumer gets them, delivered the second time (its connection closing releases them). Five
    records per fetch (``max.poll.records``, which Stratalog's acquisition keeps to) and many
    records, so the consumer is killed long before it could have acknowledged them all: it always
    holds the batch it fetched last."""
    topic, group, n = "share-java-killed", "share-java-killed-g", 2000
    create_topic(bootstrap, topic, 1)
    _produce(bootstrap, topic, 1, 0, n)
    first = JavaShareConsumer(bootstrap, group, topic, "--command-property", "max.poll.records=5")
    try:
        _wait(lambda: first.lines, "the first consumer got records", step=0.01)
    finally:
        first.stop(kill=True)
    second = JavaShareConsumer(bootstrap, group, topic)
    try:
        _wait(lambda: len({o for _, o, _, _ in first.records() + second.records()}) >= n,
              "every record consumed")  # fmt: skip
        time.sleep(1)  # nothing more may come
    finally:
        second.stop()
    firsts = {o for _, o, _, _ in first.records()}
    seconds = [(o, d) for _, o, d, _ in second.records()]
    assert 0 < len(firsts) < n
    assert sorted(firsts | {o for o, _ in seconds}) == list(range(n))
    assert len(seconds) == len({o for o, _ in seconds})  # the second got each once
    redelivered = {o for o, d in seconds if d > 1}
    assert redelivered and {d for _, d in seconds} == {1, 2}
    # What the first printed and the second got again is what the first held, unacknowledged.
    assert redelivered >= {o for o, _ in seconds} & firsts


def test_kafka_share_groups_tool(bootstrap: str) -> None:
    topic, group = "share-tool", "share-tool-g"
    create_topic(bootstrap, topic, 1)
    _produce(bootstrap, topic, 1, 0, 10)
    c = _share_consumer(bootstrap, group, topic)
    try:
        got = 0
        deadline = time.monotonic() + 30
        while got < 10 and time.monotonic() < deadline:
            got += len(_records(c))
        _records(c, 1.0)  # acknowledges the last ones (implicit mode)
        listed = run_tool("kafka-share-groups", "--bootstrap-server", bootstrap, "--list")
        assert listed.returncode == 0, listed.stderr
        assert group in listed.stdout.split()
        described = run_tool(
            "kafka-share-groups", "--bootstrap-server", bootstrap, "--describe", "--group", group
        )
        assert described.returncode == 0, described.stderr
        # GROUP TOPIC PARTITION START-OFFSET LAG: every record done.
        row = next(line.split() for line in described.stdout.splitlines() if topic in line)
        assert row == [group, topic, "0", "10", "0"], described.stdout
        members = run_tool(
            "kafka-share-groups", "--bootstrap-server", bootstrap, "--describe", "--group", group,
            "--members",
        )  # fmt: skip
        assert members.returncode == 0, members.stderr
        assert topic in members.stdout
        state = run_tool(
            "kafka-share-groups", "--bootstrap-server", bootstrap, "--describe", "--group", group,
            "--state",
        )  # fmt: skip
        assert state.returncode == 0, state.stderr
        assert state.stdout.split()[-2:] == ["Stable", "1"], state.stdout  # state, members
    finally:
        close_share_consumer(c)


def test_a_restart_keeps_share_group_state(tmp_path: Path) -> None:
    """Membership lives in memory, the share-partitions' state in ``__share_group_state``
    (docs/architecture.md, "Share groups"): after a restart the consumer rejoins by itself and
    gets only the records produced since, not the ones it acknowledged before (the kill -9
    case is ``test_share_state.py``)."""
    topic, group = "share-restart", "share-restart-g"
    bp = BrokerProcess(tmp_path / "data", settings=SETTINGS)
    bp.start()
    c = None
    try:
        create_topic(bp.bootstrap, topic, 1)
        _produce(bp.bootstrap, topic, 1, 0, 5)
        c = _share_consumer(bp.bootstrap, group, topic)
        got: list[tuple[int, int]] = []
        deadline = time.monotonic() + 30
        while len(got) < 5 and time.monotonic() < deadline:
            got += [(m.offset(), m.delivery_count()) for m in _records(c)]
        _records(c, 1.0)  # acknowledges them (implicit mode)
        assert got == [(o, 1) for o in range(5)]
        bp.stop()
        bp.start()  # the same port: the consumer reconnects
        _produce(bp.bootstrap, topic, 1, 5, 2)
        again: list[tuple[int, int]] = []
        deadline = time.monotonic() + 60
        while len(again) < 2 and time.monotonic() < deadline:
            again += [(m.offset(), m.delivery_count()) for m in _records(c)]
        again += [(m.offset(), m.delivery_count()) for m in _records(c, 1.0)]
        assert again == [(5, 1), (6, 1)]
        assert [m["member_id"] for m in _members(bp.bootstrap, group)]  # it rejoined
    finally:
        if c is not None:
            close_share_consumer(c)
        bp.stop()
