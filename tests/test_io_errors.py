"""I/O errors under a running broker: the clients concerned get Kafka's error codes, every other
partition is served, and a transient error leaves no state behind.

One `stratalog serve` runs for the module on a failing FUSE mount
(stratalog.faults.failing_fs: a pass-through whose faults a control file switches; mounted with
direct_io, so every read reaches it as a read of an uncached block reaches a disk). Each case
switches a fault on, checks what real clients see (confluent-kafka for produce and consume,
Stratalog's wire client where the exact error code of a Fetch matters), switches it off and
checks the broker recovered:

* EIO on reads of one virtual log's segments: that log's partitions answer Fetch with
  KAFKA_STORAGE_ERROR, the others are consumed, the broker logs the file, and the same reads
  succeed once the error is gone;
* EIO (and ENOSPC) on writes to one virtual log: those produce requests get KAFKA_STORAGE_ERROR
  at once, the other logs take writes, the log takes writes again afterwards, and what was
  refused was never recorded (offsets dense, each acknowledged record once);
* a cold-tier segment file deleted: a Fetch of its range answers KAFKA_STORAGE_ERROR, the hot
  range and the other partitions are served;
* the whole mount read-only (EROFS on every change): produce answers KAFKA_STORAGE_ERROR, fetch
  goes on, /status and /metrics say the log dir is read-only, and it comes back online;
* EIO on fsync of one virtual log (last: it is permanent): that log acknowledges nothing more,
  even once fsyncs succeed again (never retried and believed), with an error naming it; the
  other logs go on.
"""

from __future__ import annotations

import json
import re
import shutil
import time
import urllib.request
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from stratalog.client.wire import WireClient
from stratalog.faults.failing_fs import FailingMount
from stratalog.storage.log_store import parse_state

from .conftest import BrokerProcess, create_topic

pytestmark = [
    pytest.mark.skipif(not Path("/dev/fuse").exists(), reason="no /dev/fuse: no FUSE mounts here"),
    pytest.mark.skipif(shutil.which("fusermount3") is None, reason="no fusermount3 (fuse3)"),
]

TOPIC = "io"
PARTITIONS = 8
COLD = "cold"
STORAGE_ERROR = 56  # KAFKA_STORAGE_ERROR
PER_PARTITION = 20


class Env:
    def __init__(self, root: Path, mount: FailingMount, broker: BrokerProcess) -> None:
        self.root = root
        self.mount = mount
        self.broker = broker
        self.admin = ""
        self.log_of: dict[int, str] = {}  # partition of TOPIC -> its virtual log
        self.sent: dict[int, list[bytes]] = {p: [] for p in range(PARTITIONS)}

    @property
    def backing(self) -> Path:
        return self.mount.backing

    def broker_log(self) -> str:
        return self.broker.log_path.read_text(errors="replace")

    def partitions_on(self, vlog: str) -> list[int]:
        return [p for p, v in self.log_of.items() if v == vlog]

    def status(self) -> dict:
        with urllib.request.urlopen(f"http://{self.admin}/status", timeout=10) as r:
            return json.loads(r.read())

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://{self.admin}/metrics", timeout=10) as r:
            return r.read().decode()


def _map_partitions(backing: Path, topic: str) -> dict[int, str]:
    """partition -> virtual log, from the broker's own files (meta/cluster.json: uids;
    logs/partition-state.json: each uid's log)."""
    uids = json.loads((backing / "meta" / "cluster.json").read_text())["topics"][topic]
    state = parse_state((backing / "logs" / "partition-state.json").read_bytes())
    return {p: state[str(uid)]["log"] for p, uid in enumerate(uids["partitions"])}


def _produce(
    bootstrap: str, topic: str, records: list[tuple[int, bytes]]
) -> tuple[dict[bytes, tuple[int, int]], dict[int, list[str]]]:
    """acks=all, no retries: value -> (partition, offset) for each acknowledged record, and
    partition -> error names of the refused ones."""
    p = Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "retries": 0,
            "linger.ms": 5,
            "message.timeout.ms": 15000,
        }
    )
    acked: dict[bytes, tuple[int, int]] = {}
    errors: dict[int, list[str]] = {}

    def done(err, msg) -> None:
        if err is None:
            acked[msg.value()] = (msg.partition(), msg.offset())
        else:
            errors.setdefault(msg.partition(), []).append(err.name())

    for part, value in records:
        p.produce(topic, value=value, partition=part, on_delivery=done)
    assert p.flush(30) == 0
    return acked, errors


def _fetch_codes(env: Env, offsets: dict[int, int], topic: str = TOPIC) -> dict[int, tuple]:
    """partition -> (error code, bytes of records) of one Fetch, read by the wire client."""
    c = WireClient(env.broker.bootstrap, timeout=20)
    try:
        got = c.fetch(topic, offsets, max_wait_ms=0)
        return {p: (d.error_code, len(d.records)) for p, d in got.items()}
    finally:
        c.close()


def _consume(
    bootstrap: str, parts: list[int], want: dict[int, int], timeout: float
) -> dict[int, list[tuple[int, bytes]]]:
    """Read ``parts`` of TOPIC from 0 until each has ``want[p]`` records or time is up."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "io", "enable.auto.commit": False})
    out: dict[int, list[tuple[int, bytes]]] = {p: [] for p in parts}
    try:
        c.assign([TopicPartition(TOPIC, p, 0) for p in parts])
        deadline = time.monotonic() + timeout
        while any(len(out[p]) < want[p] for p in parts) and time.monotonic() < deadline:
            for m in c.consume(1000, 0.2):
                if m.error() is None:
                    out[m.partition()].append((m.offset(), m.value()))
    finally:
        c.close()
    return out


def _wait_for(cond, what: str, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    root = tmp_path_factory.mktemp("ioerr")
    mount = FailingMount(root / "backing", root / "data", root / "faults.json")
    mount.start()
    broker = BrokerProcess(
        root / "data",
        settings={
            "admin.port": "0",
            "tiers.cold.path": str(root / "cold"),  # off the mount: its faults are deletions
            "tiers.hot.capacity": "0",
            "tiers.migrate.interval.ms": "100",
            "segment.bytes": "65536",
            "index.checkpoint.interval.ms": "500",
        },
    )
    try:
        broker.start()
        e = Env(root, mount, broker)
        # The cold topic first: its partition's log (uid 1) is the one whose segments migrate.
        create_topic(broker.bootstrap, COLD, 1, **{"local.retention.ms": "0"})
        create_topic(broker.bootstrap, TOPIC, PARTITIONS)
        e.log_of = _map_partitions(e.backing, TOPIC)
        e.cold_log = _map_partitions(e.backing, COLD)[0]
        cluster = json.loads((e.backing / "meta" / "cluster.json").read_text())
        e.cold_uid = cluster["topics"][COLD]["partitions"][0]
        records = [(p, b"a-%d-%03d" % (p, i)) for i in range(PER_PARTITION) for p in range(8)]
        acked, errors = _produce(broker.bootstrap, TOPIC, records)
        assert not errors and len(acked) == len(records)
        for p, v in records:
            e.sent[p].append(v)
        e.admin = _admin_address(broker)
        yield e
    finally:
        broker.kill()
        mount.stop()


def _admin_address(broker: BrokerProcess) -> str:
    from confluent_kafka.admin import AdminClient, ConfigResource

    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    md = admin.list_topics(timeout=10)
    res = ConfigResource("broker", str(next(iter(md.brokers))))
    return admin.describe_configs([res])[res].result(timeout=10)["admin.address"].value


@pytest.fixture(autouse=True)
def no_faults_after(env):
    """Every case leaves the mount passing everything through, and the broker alive."""
    try:
        yield
    finally:
        env.mount.clear()
    assert env.broker.proc is not None and env.broker.proc.poll() is None, "the broker died"


def _target(env: Env) -> str:
    """A virtual log holding partitions of TOPIC but not the cold topic's (whose segments
    migrate, so its TOPIC data may be cold)."""
    logs = sorted({v for v in env.log_of.values() if v != env.cold_log})
    return logs[0]


def test_a_read_error_fails_that_logs_partitions_only_and_passes(env):
    vlog = _target(env)
    hit = env.partitions_on(vlog)
    rest = [p for p in range(PARTITIONS) if p not in hit]
    assert hit and rest
    env.mount.set({"op": "read", "path": f"/logs/{vlog}/*.log", "errno": "EIO"})
    codes = _fetch_codes(env, dict.fromkeys(range(PARTITIONS), 0))
    assert {p: codes[p][0] for p in hit} == dict.fromkeys(hit, STORAGE_ERROR)
    assert all(codes[p][0] == 0 and codes[p][1] > 0 for p in rest), codes
    # A consumer of every partition gets all of the others' records meanwhile.
    want = {p: len(env.sent[p]) for p in range(PARTITIONS)}
    got = _consume(env.broker.bootstrap, list(range(PARTITIONS)), want, timeout=4)
    for p in rest:
        assert [v for _, v in got[p]] == env.sent[p][: len(got[p])] and len(got[p]) == want[p]
    assert all(got[p] == [] for p in hit), {p: len(got[p]) for p in hit}
    log = env.broker_log()
    assert f"/logs/{vlog}/" in log and "answered KAFKA_STORAGE_ERROR" in log
    assert f"{TOPIC}-{hit[0]}" in log
    # The error is gone: the same reads succeed, nothing was remembered.
    env.mount.clear()
    codes = _fetch_codes(env, dict.fromkeys(range(PARTITIONS), 0))
    assert all(codes[p][0] == 0 and codes[p][1] > 0 for p in range(PARTITIONS)), codes
    got = _consume(env.broker.bootstrap, hit, want, timeout=10)
    assert all([v for _, v in got[p]] == env.sent[p] for p in hit)


@pytest.mark.parametrize("err", ["EIO", "ENOSPC"])
def test_a_write_error_refuses_that_write_only_and_the_log_takes_the_next(env, err):
    vlog = _target(env)
    hit = env.partitions_on(vlog)
    rest = [p for p in range(PARTITIONS) if p not in hit]
    env.mount.set({"op": "write", "path": f"/logs/{vlog}/*.log", "errno": err})
    records = [(p, b"w-%s-%d-%03d" % (err.encode(), p, i)) for i in range(5) for p in range(8)]
    acked, errors = _produce(env.broker.bootstrap, TOPIC, records)
    assert set(errors) == set(hit), errors
    assert all(set(names) == {"KAFKA_STORAGE_ERROR"} for names in errors.values())
    assert {acked[v][0] for v in acked} == set(rest)
    for p, v in records:
        if v in acked:
            env.sent[p].append(v)
    assert f"virtual log {vlog}: write of" in env.broker_log()
    # The error stops: the same log takes writes again, with no restart.
    env.mount.clear()
    again = [(p, b"w2-%s-%d" % (err.encode(), p)) for p in hit]
    acked2, errors2 = _produce(env.broker.bootstrap, TOPIC, again)
    assert not errors2 and len(acked2) == len(again)
    for p, v in again:
        env.sent[p].append(v)
    # Nothing refused was recorded: every partition holds what was acknowledged, densely.
    want = {p: len(env.sent[p]) for p in range(PARTITIONS)}
    got = _consume(env.broker.bootstrap, list(range(PARTITIONS)), want, timeout=10)
    for p in range(PARTITIONS):
        assert [v for _, v in got[p]] == env.sent[p], p
        assert [o for o, _ in got[p]] == list(range(len(env.sent[p]))), p


def _set_topic_config(bootstrap: str, topic: str, name: str, value: str) -> None:
    from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource

    entry = ConfigEntry(name, value, incremental_operation=AlterConfigOpType.SET)
    res = ConfigResource("topic", topic, incremental_configs=[entry])
    admin = AdminClient({"bootstrap.servers": bootstrap})  # kept alive until the answer
    admin.incremental_alter_configs([res])[res].result(10)


def test_a_vanished_cold_segment_fails_its_range_only(env):
    # A hot segment migrates once every partition in it is past its local retention: the
    # cold topic's log also holds partitions of TOPIC (not the target log's).
    _set_topic_config(env.broker.bootstrap, TOPIC, "local.retention.ms", "0")
    acked: dict[bytes, tuple[int, int]] = {}
    for n in range(8):  # several appends: segments roll at 64 KiB
        values = [(0, b"c%d-%03d" % (n, i) + b"." * 400) for i in range(80)]
        done, errors = _produce(env.broker.bootstrap, COLD, values)
        assert not errors and len(done) == len(values)
        acked.update(done)
    cold_dir = env.root / "cold" / f"p{env.cold_uid}"
    # Migrated: in the partition's index (what /status counts), not only written (a file that
    # appears while the copy runs would be deleted before the switch, and the range read hot).
    _wait_for(lambda: env.status()["topics"][COLD]["cold"]["chunks"] > 0, "a migrated cold segment")
    # The oldest cold segment (offset 0 on) goes, as an object lost from the store.
    first = min(cold_dir.glob("*.log"), key=lambda f: int(f.name.split("-")[0]))
    assert int(first.name.split("-")[0]) == 0
    first.unlink()
    last = max(o for _, o in acked.values())  # the newest record: still hot
    # The index switch follows the manifest's write within one turn of the broker's loop.
    _wait_for(
        lambda: _fetch_codes(env, {0: 0}, topic=COLD)[0][0] == STORAGE_ERROR,
        "a fetch of the vanished range to fail with KAFKA_STORAGE_ERROR",
        timeout=10,
    )
    code, size = _fetch_codes(env, {0: last}, topic=COLD)[0]
    assert code == 0 and size > 0
    codes = _fetch_codes(env, dict.fromkeys(range(PARTITIONS), 0))
    assert all(c == 0 and n > 0 for c, n in codes.values()), codes
    log = env.broker_log()
    assert str(first) in log and f"{COLD}-0" in log


def test_a_read_only_file_system_refuses_produce_and_serves_fetch(env):
    env.mount.set({"op": "modify", "errno": "EROFS"})
    records = [(p, b"ro-%d" % p) for p in range(PARTITIONS)]
    acked, errors = _produce(env.broker.bootstrap, TOPIC, records)
    assert not acked and set(errors) == set(range(PARTITIONS))
    assert all(set(n) == {"KAFKA_STORAGE_ERROR"} for n in errors.values())
    codes = _fetch_codes(env, dict.fromkeys(range(PARTITIONS), 0))
    assert all(c == 0 and n > 0 for c, n in codes.values()), codes
    doc = env.status()["disk"]["log_dir"]
    assert doc["state"] == "read-only", doc
    # (Once, in a fresh clone under load, one of the four logs was not read-only, and it then
    # refused the next case's writes as a failed log would: the whole document is kept.)
    assert doc["logs"]["read-only"] == len({env.log_of[p] for p in range(PARTITIONS)}), doc
    assert all("Read-only file system" in x["error"] for x in doc["not_online"].values())
    metrics = env.metrics()
    assert "stratalog_log_dir_online 0.0" in metrics
    assert 'stratalog_logs{state="read-only"}' in metrics
    # Writable again: produce resumes by itself and the log dir is online.
    env.mount.clear()
    acked, errors = _produce(env.broker.bootstrap, TOPIC, records)
    assert not errors and len(acked) == PARTITIONS
    for p, v in records:
        env.sent[p].append(v)
    assert env.status()["disk"]["log_dir"]["state"] == "online"
    assert "stratalog_log_dir_online 1.0" in env.metrics()


def test_a_failed_fsync_stops_that_log_for_good_and_the_others_go_on(env):
    vlog = _target(env)
    hit = env.partitions_on(vlog)
    rest = [p for p in range(PARTITIONS) if p not in hit]
    env.mount.set({"op": "fsync", "path": f"/logs/{vlog}/*", "errno": "EIO"})
    records = [(p, b"f-%d" % p) for p in range(PARTITIONS)]
    acked, errors = _produce(env.broker.bootstrap, TOPIC, records)
    assert set(errors) == set(hit), errors
    assert {acked[v][0] for v in acked} == set(rest)
    # The fsyncs succeed again, but the log's pages may be gone: it stays stopped.
    env.mount.clear()
    acked, errors = _produce(env.broker.bootstrap, TOPIC, records)
    assert set(errors) == set(hit) and {acked[v][0] for v in acked} == set(rest)
    assert all(set(n) == {"KAFKA_STORAGE_ERROR"} for n in errors.values())
    # The group commit's fsync or a seal's (of a segment the write rolled) may meet it first.
    assert re.search(rf"virtual log {vlog}: fsync (of .*? )?failed", env.broker_log())
    doc = env.status()["disk"]["log_dir"]
    assert doc["state"] == "degraded" and doc["not_online"][vlog]["state"] == "failed", doc
    # What it had made durable is still read.
    codes = _fetch_codes(env, dict.fromkeys(range(PARTITIONS), 0))
    assert all(c == 0 and n > 0 for c, n in codes.values()), codes
