"""History answers sent by the backlog sender process (fetch.backlog.sender=process): what it
sends is exactly what was produced, in order, from the page cache or the cold tier; it runs at
idle priority; a consumer that vanishes mid-answer or a sender killed with SIGKILL costs only
the answers in flight, never a record."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import struct
import time

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from stratalog import Broker
from stratalog.broker import metrics
from stratalog.client.wire import FETCH_V, WireClient
from stratalog.config import BrokerConfig, ConfigError
from stratalog.protocol import codec
from stratalog.storage.priority import LOW_IOPRIO, LOW_NICE, thread_priority
from stratalog.storage.throttle import PACE_SLACK_S, PACED_TURN_BYTES

from .conftest import create_topic
from .test_fetch_paths import _evict
from .test_tiers import cold_chunks, produce, tier_config, wait_for

PARTS = 4
N = 16_000
SENDER = {"cache.tail_bytes": 0, "fetch.backlog.sender": "process"}


def _fill(bootstrap: str, topic: str) -> dict[int, list[bytes]]:
    create_topic(bootstrap, topic, partitions=PARTS)
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "batch.size": 1_000_000})
    sent: dict[int, list[bytes]] = {i: [] for i in range(PARTS)}
    for i in range(N):
        v = b"%06d" % i + os.urandom(1000)
        sent[i % PARTS].append(v)
        p.produce(topic, value=v, partition=i % PARTS)
    assert p.flush(30) == 0
    return sent


def _read_all(bootstrap: str, topic: str, stop_at: int = 0, on_stop=None) -> dict:
    """Every partition from offset 0 with one consumer; (offset, value) per partition. With
    ``stop_at``, ``on_stop()`` runs once that many records have arrived."""
    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "sender",
            "socket.receive.buffer.bytes": 65536,  # the sender's socket fills mid-answer
            "max.partition.fetch.bytes": 262_144,
            "queued.max.messages.kbytes": 2048,  # little read ahead of the application
        }
    )
    c.assign([TopicPartition(topic, i, 0) for i in range(PARTS)])
    got: dict[int, list[tuple[int, bytes]]] = {i: [] for i in range(PARTS)}
    count = 0
    deadline = time.monotonic() + 60
    try:
        while count < N and time.monotonic() < deadline:
            for m in c.consume(1000, 0.5):
                if m.error() is None:
                    got[m.partition()].append((m.offset(), m.value()))
                    count += 1
            if on_stop is not None and count >= stop_at:
                on_stop()
                on_stop = None
    finally:
        c.close()
    return got


def _exactly(got: dict, sent: dict) -> None:
    for part, values in sent.items():
        rows = got[part]
        assert [o for o, _ in rows] == list(range(len(values))), f"partition {part}: offsets"
        assert [v for _, v in rows] == values, f"partition {part}: values"


def _files(pid: int) -> list[str]:
    """What the process's descriptors point at (sockets, segment files, pipes)."""
    out = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            out.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
        except OSError:
            pass  # closed meanwhile
    return out


def _settled(pid: int, timeout: float = 60) -> None:
    """Wait until the process is up: it holds its selector's epoll descriptor. Under the suite's
    load its start (imports and set-up) can outlast the fill, and a snapshot of its descriptors
    taken before would miss that one."""
    deadline = time.monotonic() + timeout
    while "anon_inode:[eventpoll]" not in _files(pid):
        assert time.monotonic() < deadline, f"the sender never came up: {_files(pid)}"
        time.sleep(0.05)


def _wait_closed(pid: int, before: list[str], timeout: float) -> None:
    """Wait until the process holds no more descriptors than ``before``; name the extra ones
    if it does not (the suite's load can slow a low-priority process for seconds)."""
    deadline = time.monotonic() + timeout
    while len(now := _files(pid)) > len(before):
        extra = sorted(set(now) - set(before)) or now
        assert time.monotonic() < deadline, f"the sender still holds {extra}"
        time.sleep(0.05)


@contextlib.contextmanager
def _history(tmp_path, topic: str, priority: str = "idle", **settings):
    """A broker with a sender process and a backlog in ``topic`` out of the page cache:
    (broker, values sent per partition, the sender, its pid)."""
    config = {**SENDER, "fetch.backlog.sender_priority": priority, **settings}
    with Broker(tmp_path / "d", config=config) as b:
        sent = _fill(b.bootstrap, topic)
        _evict(b.data_dir)  # every read is history from the disk
        sender = b.core.backlog_sender
        assert sender is not None and sender.proc is not None
        _settled(sender.proc.pid)
        yield b, sent, sender, sender.proc.pid


def test_history_is_sent_by_a_process_at_low_priority(tmp_path):
    # "low" (nice +10), not the default "idle": a SCHED_IDLE process gets next to no CPU while
    # the rest of the suite fills both cores, and this test waits for its bytes.
    with _history(tmp_path, "hist", "low") as (b, sent, sender, pid):
        idle_files = _files(pid)
        before = metrics.FETCH_SENDER_BYTES._value.get()
        loop_before = metrics.FETCH_SENDFILE_BYTES._value.get()
        _exactly(_read_all(b.bootstrap, "hist"), sent)
        by_sender = metrics.FETCH_SENDER_BYTES._value.get() - before
        by_loop = metrics.FETCH_SENDFILE_BYTES._value.get() - loop_before
        # All but the last reads (those reaching the high watermark: the tail's) went through
        # the process; the loop sent at most 1 MiB per partition.
        assert by_sender >= N * 1000 - PARTS * (1 << 20), (by_sender, by_loop)
        assert by_loop <= PARTS * (1 << 20) + 65536, by_loop
        nice, io = thread_priority(pid)
        assert nice == LOW_NICE and os.sched_getscheduler(pid) == os.SCHED_OTHER
        assert io is None or io == LOW_IOPRIO
        # The consumer's socket and every segment descriptor were closed again.
        _wait_closed(pid, idle_files, 30)
    assert sender.proc is None  # stopped with the broker


def test_a_fixed_budget_paces_the_sender_process(tmp_path):
    """With fetch.backlog.max_bytes_per_sec the process still sends history (at idle priority,
    off the loop) and keeps the budget itself: the bytes it sent took at least their time at
    that rate (the check is a lower bound, which a slow machine cannot break)."""
    rate = 4_000_000
    settings = {"fetch.backlog.max_bytes_per_sec": rate}
    with _history(tmp_path, "paced", "low", **settings) as (b, sent, sender, _pid):
        assert sender.rate == rate
        before = metrics.FETCH_SENDER_BYTES._value.get()
        t0 = time.monotonic()
        _exactly(_read_all(b.bootstrap, "paced"), sent)
        took = time.monotonic() - t0
        by_sender = metrics.FETCH_SENDER_BYTES._value.get() - before
        assert by_sender >= N * 1000 - PARTS * (1 << 20), by_sender
        # Each turn is scheduled after the bytes before it; only the first turn and the slack
        # may go ahead of the rate.
        ahead = PACED_TURN_BYTES + PACE_SLACK_S * rate
        assert took >= (by_sender - ahead) / rate, (took, by_sender)


def test_the_default_sender_runs_in_sched_idle_and_the_idle_io_class(tmp_path):
    with Broker(tmp_path / "d", config=SENDER) as b:
        sender = b.core.backlog_sender
        assert sender is not None and sender.proc is not None
        pid = sender.proc.pid
        wait_for(lambda: os.sched_getscheduler(pid) == os.SCHED_IDLE, 20, "SCHED_IDLE")
        wait_for(lambda: thread_priority(pid)[1] in (None, LOW_IOPRIO), 20, "idle I/O class")


def test_history_from_the_cold_tier_goes_through_the_sender(tmp_path):
    cfg = tier_config(
        tmp_path, **SENDER, **{"storage.virtual_logs": 1, "fetch.backlog.sender_priority": "low"}
    )
    with Broker(tmp_path / "d", config=cfg) as b:
        create_topic(b.bootstrap, "cold", partitions=3)
        values = [
            (i % 3, b"%05d" % i + os.urandom(300), 1_700_000_000_000 + i) for i in range(6000)
        ]
        produce(b.bootstrap, "cold", values)
        wait_for(lambda: cold_chunks(b, "cold") > 0, what="migration")
        before = metrics.FETCH_SENDER_BYTES._value.get()
        # Small fetches: every read but the last of a partition stops short of the tail.
        c = Consumer(
            {
                "bootstrap.servers": b.bootstrap,
                "group.id": "cold",
                "max.partition.fetch.bytes": 32768,
            }
        )
        c.assign([TopicPartition("cold", p, 0) for p in range(3)])
        got: dict[int, list] = {p: [] for p in range(3)}
        deadline = time.monotonic() + 60
        while sum(map(len, got.values())) < len(values) and time.monotonic() < deadline:
            for m in c.consume(1000, 0.5):
                if m.error() is None:
                    got[m.partition()].append((m.offset(), m.value()))
        c.close()
        for part in range(3):
            want = [v for p, v, _ in values if p == part]
            assert [v for _, v in got[part]] == want
            assert [o for o, _ in got[part]] == list(range(len(want)))
        # Most of it came from the cold tier's files through the process.
        assert metrics.FETCH_SENDER_BYTES._value.get() - before >= 6000 * 300 // 2


def _fetch_frame(wc: WireClient, topic: str) -> bytes:
    """A Fetch of every partition from 0, up to 16 MiB each, as raw bytes."""
    body = wc.fetch_request(topic, dict.fromkeys(range(PARTS), 0), partition_max_bytes=16 << 20)
    return codec.encode_request(1, FETCH_V, 7, "gone", body)


def test_a_consumer_that_vanishes_mid_answer_costs_nothing_else(tmp_path):
    # At the broker's priority: in SCHED_IDLE the process may wait for minutes while other
    # work fills both cores (the rest of the suite), which is the point of that class.
    with _history(tmp_path, "vanish", "normal") as (b, sent, sender, pid):
        idle_files = _files(pid)
        frame = _fetch_frame(WireClient(b.bootstrap), "vanish")
        for _ in range(3):
            s = socket.socket()
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            s.connect(("127.0.0.1", b.core.port))
            s.sendall(frame)
            assert len(s.recv(4)) == 4  # the answer started (~16 MB that nobody reads)
            # Reset, not a clean close: the sender's next write fails at once.
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            s.close()
        # The process is still serving, holds nothing of the vanished consumers, and the
        # next consumer gets everything.
        _wait_closed(pid, idle_files, 30)
        assert sender.alive and sender.proc.poll() is None
        _exactly(_read_all(b.bootstrap, "vanish"), sent)


def test_a_killed_sender_loses_nothing_and_the_loop_takes_over(tmp_path):
    with _history(tmp_path, "killed", "normal") as (b, sent, sender, pid):
        loop_before = metrics.FETCH_SENDFILE_BYTES._value.get()
        got = _read_all(b.bootstrap, "killed", 1, lambda: os.kill(pid, signal.SIGKILL))
        # The consumer's connection was closed under the answer in flight; it reconnected and
        # fetched again from where it was: every record once, offsets dense.
        _exactly(got, sent)
        assert not sender.alive
        assert metrics.FETCH_SENDFILE_BYTES._value.get() - loop_before >= N * 1000 // 2
        # The broker goes on taking writes.
        p = Producer({"bootstrap.servers": b.bootstrap})
        p.produce("killed", value=b"after", partition=0)
        assert p.flush(10) == 0


@pytest.mark.parametrize(
    ("name", "value"),
    [("fetch.backlog.sender", "thread"), ("fetch.backlog.sender_priority", "high")],
)
def test_bad_sender_settings_are_named(name: str, value: str):
    with pytest.raises(ConfigError, match=name.replace(".", r"\.")):
        BrokerConfig({name: value}, None)
