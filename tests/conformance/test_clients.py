"""The core compatibility list, with each client, on Stratalog and on Apache Kafka.

For kcat, confluent-kafka, aiokafka and kafka-python: produce + consume with keys, values, headers
and timestamps; compressed batches (gzip, snappy, lz4, zstd); a consumer group of two members,
committed offsets after commit and after a member restarts; the idempotent producer; ListOffsets
earliest, latest and by timestamp. Each scenario runs on both brokers and what the client saw
must be equal.
"""

from __future__ import annotations

import re
import signal
import subprocess
import threading
import time
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition

from stratalog.records import build_batch

from . import clients, wire
from .clients import CLIENTS, CODEC_IDS, CODECS, MEMBERS, Rec
from .conftest import both

pytestmark = pytest.mark.kafka


def _now_ms() -> int:
    return int(time.time() * 1000)


def _stamp_window(rows: list[tuple], start: int, end: int) -> list[tuple]:
    """Client- or broker-stamped timestamps are replaced by whether they fall in [start, end]."""
    out = []
    for row in rows:
        if row[0] == "EXTRA":
            out.append(row)
            continue
        ts = row[5]
        out.append((*row[:5], "in-window" if start <= ts <= end else ts, row[6]))
    return out


# -- produce + consume with keys, values, headers, timestamps -------------------------------------


def produce_consume(bs: str, client: str, topic: str, recs: list[Rec]) -> dict[str, Any]:
    assert wire.create_topic(bs, topic, 2) == 0
    start = _now_ms()
    acks = clients.PRODUCE[client](bs, topic, recs)
    rows = clients.CONSUME[client](bs, topic, 2, len(recs))
    end = _now_ms()
    if client == "kcat":
        rows = _stamp_window(rows, start, end)
    offsets = {p: clients.OFFSETS[client](bs, topic, p, (-2, -1)) for p in range(2)}
    return {"acks": acks, "records": rows, "offsets": offsets}


@pytest.mark.parametrize("client", CLIENTS)
def test_produce_consume(pair, name, client):
    recs = clients.records(40, 2, _now_ms() - 60_000, tag=client)
    strat, kafka = both(pair, produce_consume, client, name, recs)
    assert strat == kafka
    # The scenario itself is meaningful: every record came back once, in order, with its fields.
    sent = recs if client != "kcat" else clients.kcat_records(recs)
    for p in range(2):
        mine = [r for r in kafka["records"] if r[0] == p]
        want = [r for r in sent if r.partition == p]
        assert [row[1] for row in mine] == list(range(len(want)))
        assert [(row[2], row[3], row[4]) for row in mine] == [
            (r.key, r.value, r.headers) for r in want
        ]
        if client != "kcat":
            assert [row[5] for row in mine] == [r.timestamp for r in want]


def log_append_time(bs: str, topic: str, recs: list[Rec]) -> dict[str, Any]:
    assert wire.create_topic(bs, topic, 1, **{"message.timestamp.type": "LogAppendTime"}) == 0
    start = _now_ms()
    acks = clients.cf_produce(bs, topic, recs)
    rows = _stamp_window(clients.cf_consume(bs, topic, 1, len(recs)), start, _now_ms())
    batches = wire.stored_batches(bs, topic, 0)
    return {
        "acks": acks,
        "records": rows,
        "batch_timestamp_types": sorted({b["timestamp_type"] for b in batches}),
    }


def test_log_append_time_topic(pair, name):
    recs = [Rec(0, b"k", f"v{i}".encode(), (), _now_ms() - 3_600_000) for i in range(5)]
    strat, kafka = both(pair, log_append_time, name, recs)
    assert strat == kafka
    assert {r[5] for r in kafka["records"]} == {"in-window"}


# -- compression ----------------------------------------------------------------------------------


def compressed(bs: str, client: str, topic: str, recs: list[Rec]) -> dict[str, Any]:
    out = {}
    for codec in CODECS:
        t = f"{topic}-{codec}"
        assert wire.create_topic(bs, t, 1) == 0
        start = _now_ms()
        acks = clients.PRODUCE[client](
            bs, t, recs, **clients.produce_conf(client, compression=codec)
        )
        rows = clients.CONSUME[client](bs, t, 1, len(recs))
        if client == "kcat":
            rows = _stamp_window(rows, start, _now_ms())
        batches = wire.stored_batches(bs, t, 0)
        out[codec] = {
            "acks": acks,
            "records": rows,
            "stored_codecs": sorted({b["codec"] for b in batches}),
            "stored_records": sum(b["records"] for b in batches),
        }
    return out


@pytest.mark.parametrize("client", CLIENTS)
def test_compressed_batches(pair, name, client):
    recs = [
        Rec(0, f"k{i}".encode(), (f"value-{i}-" + "abc" * 40).encode(), (("h", b"1"),), None)
        for i in range(30)
    ]
    if client != "kcat":
        base = _now_ms() - 30_000
        recs = [Rec(r.partition, r.key, r.value, r.headers, base + i) for i, r in enumerate(recs)]
    strat, kafka = both(pair, compressed, client, name, recs)
    assert strat == kafka
    for codec in CODECS:
        assert kafka[codec]["stored_codecs"] == [CODEC_IDS[codec]]
        assert kafka[codec]["stored_records"] == len(recs)


# -- consumer group: two members, commit, a member restarts ---------------------------------------

ALL4 = frozenset(range(4))


def _drive(members, cond, reads: dict | None = None, timeout: float = 30, what: str = "") -> None:
    """Poll every member until cond() holds; reads[member] collects what that member consumed.

    kafka-python members poll in threads of their own: that client may sit inside poll() in a
    JoinGroup that completes only when the other member polls and rejoins too (against Kafka as
    well). The others are polled in turn from this thread (confluent-kafka's assignment() can
    wait on a poll() running in another thread).
    """
    deadline = time.monotonic() + timeout
    if not any(isinstance(m, clients.KpMember) for m in members):
        while not cond():
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            for m in members:
                got = m.poll()
                if reads is not None and m in reads:
                    reads[m].extend(got)
        return
    done = threading.Event()
    errors: list[BaseException] = []

    def run(m) -> None:
        try:
            while not done.is_set() and time.monotonic() < deadline:
                got = m.poll()
                if reads is not None and m in reads:
                    reads[m].extend(got)
        except BaseException as e:  # reported in the main thread
            errors.append(e)

    threads = [threading.Thread(target=run, args=(m,), daemon=True) for m in members]
    for t in threads:
        t.start()
    try:
        while not cond() and not errors:
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            time.sleep(0.02)
    finally:
        done.set()
        for t in threads:
            t.join(timeout=30)
    if errors:
        raise errors[0]


def _commit(live, m, offsets: dict[int, int]) -> None:
    """m commits offsets; a kafka-python member that finds a rebalance under way polls and
    retries (KpMember.commit), and the rebalance completes only if the others poll meanwhile."""
    others = [x for x in live if x is not m and isinstance(x, clients.KpMember)]
    if not isinstance(m, clients.KpMember) or not others:
        m.commit(offsets)
        return
    done = threading.Event()

    def run(x) -> None:
        while not done.is_set():
            x.poll()

    threads = [threading.Thread(target=run, args=(x,), daemon=True) for x in others]
    for t in threads:
        t.start()
    try:
        m.commit(offsets)
    finally:
        done.set()
        for t in threads:
            t.join(timeout=30)


def _split(a, b) -> bool:
    x, y = a.assignment(), b.assignment()
    return bool(x) and bool(y) and not x & y and x | y == ALL4


def _seed(
    bs: str, topic: str, partitions: int, per_partition: int, ts: int, first: int = 0
) -> None:
    for p in range(partitions):
        recs = [
            (f"k{p}-{i}".encode(), f"v{p}-{i}".encode(), ts + i)
            for i in range(first, first + per_partition)
        ]
        r = wire.produce(bs, topic, p, build_batch(recs))
        assert r["error_code"] == 0, r


def consumer_group(bs: str, client: str, topic: str, group: str, ts: int) -> dict[str, Any]:
    assert wire.create_topic(bs, topic, 4) == 0
    _seed(bs, topic, 4, 5, ts)
    member = MEMBERS[client]
    obs: dict[str, Any] = {}
    # Client ids order the generated member ids ("<client id>-<uuid>"), so the range assignor's
    # split is deterministic: the first member gets partitions 0-1, the second 2-3.
    a = member(bs, group, topic, "m1")
    live = [a]
    try:
        b = member(bs, group, topic, "m2")
        live.append(b)
        _drive(live, lambda: _split(a, b), what="two members to split four partitions")
        obs["split"] = [sorted(a.assignment()), sorted(b.assignment())]
        _commit(live, a, {p: p + 1 for p in a.assignment()})
        _commit(live, b, {p: p + 1 for p in b.assignment()})
        obs["committed"] = a.committed(range(4))

        b.close()
        live.remove(b)
        _drive(live, lambda: a.assignment() == ALL4, what="the remaining member to own all")
        obs["after_leave"] = sorted(a.assignment())

        c = member(bs, group, topic, "m3")  # the restarted second member
        live.append(c)
        reads: dict = {c: []}
        _drive(live, lambda: _split(a, c), reads, what="the restarted member to rejoin")
        obs["after_restart"] = [sorted(a.assignment()), sorted(c.assignment())]

        def caught_up() -> bool:
            return all(any(r == (p, 4) for r in reads[c]) for p in c.assignment())

        _drive(live, caught_up, reads, what="the restarted member to read its partitions")
        obs["restarted_member_read"] = sorted(set(reads[c]))
        _commit(live, c, {p: 5 for p in c.assignment()})
        obs["committed_after_restart"] = a.committed(range(4))
    finally:
        for m in reversed(live):
            m.close()
    return obs


@pytest.mark.parametrize("client", list(MEMBERS))
def test_consumer_group(pair, name, client):
    strat, kafka = both(pair, consumer_group, client, name, f"{name}-group", _now_ms() - 60_000)
    assert strat == kafka
    assert kafka["split"] == [[0, 1], [2, 3]]
    assert kafka["committed"] == {0: 1, 1: 2, 2: 3, 3: 4}
    assert kafka["restarted_member_read"] == [(2, 3), (2, 4), (3, 4)]


_ASSIGNED = re.compile(r"rebalanced \(memberid [^)]*\): assigned: (.*)$")


class _KcatMember:
    """kcat -G as a child process; its records (stdout) and assignments (stderr) are collected."""

    def __init__(self, bs: str, group: str, topic: str, client_id: str, *extra: str) -> None:
        self.proc = subprocess.Popen(
            [
                clients.KCAT, "-C", "-b", bs, "-G", group, topic, "-u",
                "-X", "auto.offset.reset=earliest",
                "-X", f"client.id={client_id}",
                "-X", f"session.timeout.ms={clients.GROUP_TIMING['session']}",
                "-X", f"heartbeat.interval.ms={clients.GROUP_TIMING['heartbeat']}",
                "-X", "partition.assignment.strategy=range",
                "-X", "auto.commit.interval.ms=100",
                "-f", "%p %o\n", *extra,
            ],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        self.records: list[tuple[int, int]] = []
        self.assigned: frozenset[int] | None = None
        self.stderr: list[str] = []
        self._threads = [
            threading.Thread(target=self._read_out, daemon=True),
            threading.Thread(target=self._read_err, daemon=True),
        ]
        for t in self._threads:
            t.start()

    def _read_out(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            p, o = line.split()
            self.records.append((int(p), int(o)))

    def _read_err(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.stderr.append(line)
            m = _ASSIGNED.search(line.strip())
            if m:
                self.assigned = frozenset(int(x) for x in re.findall(r"\[(\d+)\]", m.group(1)))

    def wait(self, timeout: float = 30) -> int:
        rc = self.proc.wait(timeout)
        for t in self._threads:
            t.join(5)
        return rc

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)  # kcat commits and leaves the group
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        for t in self._threads:
            t.join(5)


def kcat_consumer_group(bs: str, topic: str, group: str, ts: int) -> dict[str, Any]:
    assert wire.create_topic(bs, topic, 2) == 0
    _seed(bs, topic, 2, 3, ts)
    obs: dict[str, Any] = {}
    m1 = _KcatMember(bs, group, topic, "m1")
    m2 = _KcatMember(bs, group, topic, "m2")
    try:
        deadline = time.monotonic() + 30
        while not (m1.assigned == {0} and m2.assigned == {1} and
                   len(set(m1.records) | set(m2.records)) == 6):  # fmt: skip
            assert time.monotonic() < deadline, (m1.assigned, m2.assigned, m1.stderr, m2.stderr)
            time.sleep(0.05)
        obs["split"] = [sorted(m1.assigned), sorted(m2.assigned)]
        obs["read"] = sorted(set(m1.records) | set(m2.records))
        time.sleep(0.5)  # > auto.commit.interval.ms: positions are committed
    finally:
        m1.stop()
        m2.stop()
    c = Consumer({"bootstrap.servers": bs, "group.id": group})
    try:
        got = c.committed([TopicPartition(topic, p) for p in range(2)], timeout=10)
        obs["committed"] = {tp.partition: tp.offset for tp in got}
    finally:
        c.close()
    # A member restarts after more records arrived: it resumes at the committed offsets.
    _seed(bs, topic, 2, 2, ts, first=3)
    m3 = _KcatMember(bs, group, topic, "m3", "-e")
    try:
        assert m3.wait(30) == 0, m3.stderr
    finally:
        m3.stop()
    obs["restart_read"] = sorted(m3.records)
    return obs


def test_kcat_consumer_group(pair, name):
    strat, kafka = both(pair, kcat_consumer_group, name, f"{name}-group", _now_ms() - 60_000)
    assert strat == kafka
    assert kafka["split"] == [[0], [1]]
    assert kafka["committed"] == {0: 3, 1: 3}
    assert kafka["restart_read"] == [(0, 3), (0, 4), (1, 3), (1, 4)]


# -- idempotent producer --------------------------------------------------------------------------


def idempotent(bs: str, client: str, topic: str, recs: list[Rec]) -> dict[str, Any]:
    assert wire.create_topic(bs, topic, 2) == 0
    start = _now_ms()
    acks = clients.PRODUCE[client](bs, topic, recs, **clients.produce_conf(client, idempotent=True))
    rows = clients.CONSUME[client](bs, topic, 2, len(recs))
    if client == "kcat":
        rows = _stamp_window(rows, start, _now_ms())
    sequences: dict[int, list[tuple[int, int]]] = {}
    producers: dict[int, set] = {}
    for p in range(2):
        seq = []
        ids = set()
        for b in wire.stored_batches(bs, topic, p):
            ids.add((b["producer_id"] >= 0, b["producer_epoch"]))
            seq += [(b["base_offset"] + i, b["base_sequence"] + i) for i in range(b["records"])]
        sequences[p] = seq
        producers[p] = sorted(ids)
    return {"acks": acks, "records": rows, "sequences": sequences, "producers": producers}


@pytest.mark.parametrize("client", CLIENTS)
def test_idempotent_producer(pair, name, client):
    recs = clients.records(30, 2, None if client == "kcat" else _now_ms() - 60_000, tag="idem")
    if client == "kcat":  # one kcat run (one producer) per partition: no per-record headers
        recs = sorted((Rec(r.partition, r.key, r.value) for r in recs), key=lambda r: r.partition)
    strat, kafka = both(pair, idempotent, client, name, recs)
    assert strat == kafka
    for p in range(2):  # offset i carries sequence i: one producer, no gaps, no duplicates
        assert kafka["sequences"][p] == [(i, i) for i in range(15)]
        assert kafka["producers"][p] == [(True, 0)]


# -- ListOffsets: earliest, latest, by timestamp --------------------------------------------------


def _stamps(base: int) -> dict[int, list[list[int]]]:
    """Per partition, batches of record timestamps (out of order inside a batch, equal runs)."""
    return {
        0: [[base, base + 10, base + 5], [base + 20, base + 20, base + 30], [base + 25, base + 40]],
        1: [[base + 100], [base + 90, base + 110]],
    }


def list_offsets(bs: str, client: str, topic: str, base: int, queries: list[int]) -> dict:
    assert wire.create_topic(bs, topic, 2) == 0
    for p, batches in _stamps(base).items():
        n = 0
        for stamps in batches:
            recs = [(f"k{n + i}".encode(), b"v", ts) for i, ts in enumerate(stamps)]
            r = wire.produce(bs, topic, p, build_batch(recs))
            assert r["error_code"] == 0, r
            n += len(stamps)
    return {p: clients.OFFSETS[client](bs, topic, p, queries) for p in range(2)}


@pytest.mark.parametrize("client", CLIENTS)
def test_list_offsets(pair, name, client):
    base = _now_ms() - 120_000
    targets = [base - 1000, base, base + 5, base + 11, base + 20, base + 26, base + 40, base + 41]
    targets += [base + 95, base + 100, base + 111, base + 3_600_000]
    queries = [-2, -1, *targets]
    if client == "kcat":  # one process per query: a representative subset
        queries = [-2, -1, base - 1000, base + 11, base + 26, base + 95, base + 3_600_000]
    strat, kafka = both(pair, list_offsets, client, name, base, queries)
    assert strat == kafka
    if client == "confluent":
        assert kafka[0][base + 11] == 3 and kafka[0][base + 26] == 5
        assert kafka[1][base + 95] == 0 and kafka[0][base + 3_600_000] == -1
