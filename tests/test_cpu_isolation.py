"""fetch.backlog.sender_cpus: the backlog sender process on CPUs of its own and the broker's
threads on the others, in a real `stratalog serve` and its real sender process; history read
through it is exactly what was produced; bad lists are named."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from stratalog.broker.cpu_isolation import CpuListError, format_cpus, journal_threads, parse_cpus
from stratalog.config import BrokerConfig, ConfigError

from .conftest import BrokerProcess, create_topic, scrape_metrics

ALLOWED = sorted(os.sched_getaffinity(0))
N = 12_000  # records of 1 KB over two partitions: several fetches of history each


@pytest.mark.parametrize(
    ("text", "cpus"),
    [("", set()), ("1", {1}), ("0,2", {0, 2}), ("2-4", {2, 3, 4}), (" 0, 3-4 ", {0, 3, 4})],
)
def test_cpu_lists_read_as_linux_writes_them(text, cpus):
    assert parse_cpus(text) == cpus


@pytest.mark.parametrize("text", ["x", "1-", "3-1", "-2", ",", "1.5"])
def test_a_malformed_cpu_list_is_named(text):
    with pytest.raises(CpuListError):
        parse_cpus(text)


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("one", "is not a CPU number"),
        ("4096", "is not one this process may run on"),
        (format_cpus(frozenset(ALLOWED)), "the broker needs at least one of its own"),
    ],
)
def test_bad_sender_cpus_are_config_errors(value, says):
    with pytest.raises(ConfigError, match=r"fetch\.backlog\.sender_cpus=.*" + says):
        BrokerConfig({"fetch.backlog.sender": "process", "fetch.backlog.sender_cpus": value})


def test_sender_cpus_need_the_sender_process():
    with pytest.raises(ConfigError, match=r"set fetch\.backlog\.sender=process"):
        BrokerConfig({"fetch.backlog.sender_cpus": str(ALLOWED[-1])})


def test_serve_names_a_cpu_it_cannot_use():
    out = subprocess.run(
        [sys.executable, "-m", "stratalog.cli", "serve", "--data-dir", "/nonexistent-unused",
         "--set", "fetch.backlog.sender=process", "--set", "fetch.backlog.sender_cpus=4096"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode != 0
    assert "fetch.backlog.sender_cpus='4096'" in out.stderr
    assert "CPU 4096 is not one this process may run on" in out.stderr


def _cpus_of(pid: int) -> dict[str, set[int]]:
    """Each thread's allowed CPUs, by thread id and name."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                name = f.read().strip()
            out[f"{tid}:{name}"] = os.sched_getaffinity(int(tid))
        except (OSError, ProcessLookupError):
            pass  # ended meanwhile
    return out


def _sent_by_sender(admin: str) -> float:
    return sum(s.value for s in scrape_metrics(admin, "stratalog_fetch_sender_bytes_total"))


def _children(pid: int) -> list[int]:
    found = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    return [int(p) for p in found.split()]


@pytest.mark.skipif(len(ALLOWED) < 2, reason="needs two CPUs")
def test_the_sender_and_the_broker_run_on_their_own_cpus(tmp_path):
    sender_cpu = {ALLOWED[-1]}
    broker_cpus = set(ALLOWED) - sender_cpu
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        admin_port = s.getsockname()[1]
    settings = {
        "admin.port": str(admin_port),
        "cache.tail_bytes": "0",
        "fetch.backlog.sender": "process",
        "fetch.backlog.sender_priority": "low",  # SCHED_IDLE would starve under the suite
        "fetch.backlog.sender_cpus": str(ALLOWED[-1]),
        "storage.fsync_via": "auto",
        "tiers.cold.path": str(tmp_path / "cold"),  # and so migration's copy workers
    }
    bp = BrokerProcess(tmp_path / "data", settings=settings).start()
    try:
        create_topic(bp.bootstrap, "pinned", 2)
        p = Producer({"bootstrap.servers": bp.bootstrap, "acks": "all", "linger.ms": 5})
        sent = {0: [], 1: []}
        for i in range(N):
            v = b"%05d" % i + os.urandom(1000)
            sent[i % 2].append(v)
            p.produce("pinned", value=v, partition=i % 2)
        assert p.flush(30) == 0
        # Every thread the broker has now (the event loop, its helpers, the ring's kernel
        # workers) keeps off the sender's CPU; the sender process keeps to it.
        threads = _cpus_of(bp.proc.pid)
        assert len(threads) > 3, threads
        assert all(c == broker_cpus for c in threads.values()), threads
        children = {c: Path(f"/proc/{c}/cmdline").read_bytes() for c in _children(bp.proc.pid)}
        senders = [c for c, cmd in children.items() if b"backlog_sender_process" in cmd]
        assert len(senders) == 1
        # Migration's copy workers (nice +10) keep every CPU: on the broker's alone they would
        # compete with the event loop.
        workers = [c for c, cmd in children.items() if b"spawn_main" in cmd]
        assert workers, children
        for w in workers:
            deadline = time.monotonic() + 30
            while any(c != set(ALLOWED) for c in _cpus_of(w).values()):
                assert time.monotonic() < deadline, _cpus_of(w)
                time.sleep(0.05)
        deadline = time.monotonic() + 30
        while any(c != sender_cpu for c in _cpus_of(senders[0]).values()):
            assert time.monotonic() < deadline, _cpus_of(senders[0])
            time.sleep(0.05)
        # History (the tail cache is off) through the pinned sender is what was produced.
        admin = f"127.0.0.1:{admin_port}"
        before = _sent_by_sender(admin)
        c = Consumer({"bootstrap.servers": bp.bootstrap, "group.id": "pin"})
        c.assign([TopicPartition("pinned", i, 0) for i in (0, 1)])
        got: dict[int, list[bytes]] = {0: [], 1: []}
        deadline = time.monotonic() + 60
        while sum(map(len, got.values())) < N and time.monotonic() < deadline:
            for m in c.consume(1000, 0.5):
                assert m.error() is None, m.error()
                assert m.offset() == len(got[m.partition()])
                got[m.partition()].append(m.value())
        c.close()
        assert got == sent
        # All but the last fetch of each partition (at the tail: the loop's) went through it.
        assert _sent_by_sender(admin) - before >= N * 1000 - 2 * (1 << 20)
    finally:
        bp.kill()


@pytest.fixture
def ext4_mount(tmp_path):
    """A small ext4 file system with a journal on a loop device (root only), unmounted after."""
    if os.geteuid() != 0:
        pytest.skip("mounting a loop device needs root")
    image, mnt = tmp_path / "fs.img", tmp_path / "mnt"
    mnt.mkdir()
    with open(image, "wb") as f:
        f.truncate(64 << 20)
    subprocess.run(["mkfs.ext4", "-q", "-F", str(image)], check=True, timeout=60)
    mounted = subprocess.run(
        ["mount", "-o", "loop", str(image), str(mnt)], capture_output=True, text=True, timeout=60
    )
    if mounted.returncode != 0:
        pytest.skip(f"no loop device here: {mounted.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], timeout=60)


@pytest.mark.skipif(len(ALLOWED) < 2, reason="needs two CPUs")
def test_the_write_paths_journal_thread_joins_the_broker_while_it_runs(ext4_mount):
    threads = journal_threads([ext4_mount])
    assert len(threads) == 1, threads  # the loop device's jbd2 thread
    (pid,) = threads
    assert os.sched_getaffinity(pid) == set(ALLOWED)
    settings = {
        "fetch.backlog.sender": "process",
        "fetch.backlog.sender_priority": "low",
        "fetch.backlog.sender_cpus": str(ALLOWED[-1]),
    }
    bp = BrokerProcess(ext4_mount / "data", settings=settings).start()
    try:
        create_topic(bp.bootstrap, "journaled", 1)
        assert os.sched_getaffinity(pid) == set(ALLOWED[:-1])
        p = Producer({"bootstrap.servers": bp.bootstrap, "acks": "all"})
        for i in range(100):
            p.produce("journaled", value=b"%d" % i)
        assert p.flush(30) == 0
    finally:
        bp.stop()
    assert os.sched_getaffinity(pid) == set(ALLOWED)  # given back at a clean stop
