"""Real Kafka applications, unchanged from Maven Central, run against Stratalog as JVM processes.

Each application runs as its own JVM (``stratalog.peers.kafka.app_command``), started in a
session of its own so that a test can kill it by its PID (``kill -9`` is the point of some
tests) and always stops it, bounded in time. Its log4j2 output goes to a file in the test's
directory, shown when a test fails.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

from confluent_kafka import Consumer, IsolationLevel, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

from stratalog.bench.targets import stop_process
from stratalog.peers.kafka import app_command


class JavaApp:
    """One JVM running ``main`` from an application's classpath; killed or stopped by its PID."""

    def __init__(self, app: str, main: str, *args: str, log_dir: Path, heap: str = "256m"):
        self.app = app
        self.cmd = app_command(app, main, *args, log_dir=log_dir, heap=heap)
        self.log = log_dir / f"{app}.log"
        self.out = log_dir / f"{app}.out"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> JavaApp:
        assert self.proc is None or self.proc.poll() is not None, "already running"
        with open(self.out, "ab") as out:
            self.proc = subprocess.Popen(
                self.cmd,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return self

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self, sig: int = signal.SIGKILL, timeout: float = 30) -> int | None:
        """Send ``sig`` to the JVM (by PID) and wait for it; SIGKILL if it outlives ``timeout``.
        Returns its exit status (None if it was not started)."""
        if self.proc is None:
            return None
        stop_process(self.proc, timeout, sig)
        return self.proc.returncode

    def stop(self) -> int | None:
        """SIGTERM (the application's shutdown hook closes it cleanly), bounded."""
        return self.kill(signal.SIGTERM)

    def freeze(self, frozen: bool) -> None:
        """SIGSTOP (every thread at once: nothing more is sent) or SIGCONT."""
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGSTOP if frozen else signal.SIGCONT)

    def tail(self, lines: int = 80) -> str:
        parts = []
        for path in (self.out, self.log):
            with contextlib.suppress(OSError):
                text = path.read_text(errors="replace").splitlines()[-lines:]
                parts.append(f"--- {path.name} ---\n" + "\n".join(text))
        return "\n".join(parts)

    def wait_for_log(self, needle: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            with contextlib.suppress(OSError):
                if needle in self.log.read_text(errors="replace"):
                    return
            assert self.alive, f"{self.app} exited ({self.proc and self.proc.returncode})\n" + (
                self.tail()
            )
            assert time.monotonic() < deadline, f"no {needle!r} in {self.log}\n" + self.tail()
            time.sleep(0.2)


def read_topic(
    bootstrap: str,
    topic: str,
    *,
    committed: bool = True,
    until: int | None = None,
    timeout: float = 30,
    idle: float = 2.0,
) -> list[tuple[int, int, bytes | None, bytes | None]]:
    """Every record of ``topic`` from the start, as (partition, offset, key, value), read with
    ``read_committed`` (or ``read_uncommitted``) by a consumer with no group. Reads until
    ``until`` records arrived and nothing more came for ``idle`` seconds, or (``until`` None)
    until nothing came for ``idle`` seconds; fails at ``timeout``."""
    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "apps-reader",
            "enable.auto.commit": False,
            "isolation.level": "read_committed" if committed else "read_uncommitted",
            "enable.partition.eof": False,
        }
    )
    try:
        md = c.list_topics(topic, timeout=10).topics[topic]
        assert md.error is None, md.error
        c.assign([TopicPartition(topic, p, 0) for p in md.partitions])
        records: list[tuple[int, int, bytes | None, bytes | None]] = []
        deadline = time.monotonic() + timeout
        last = time.monotonic()
        while True:
            now = time.monotonic()
            done = until is None or len(records) >= until
            if done and now - last >= idle:
                return records
            assert now < deadline, (
                f"{topic}: {len(records)} records after {timeout:.0f}s, expected {until}"
            )
            msg = c.poll(0.2)
            if msg is None:
                continue
            assert msg.error() is None, msg.error()
            records.append((msg.partition(), msg.offset(), msg.key(), msg.value()))
            last = time.monotonic()
    finally:
        c.close()


def _list_offsets(
    admin: AdminClient, topic: str, partitions: int, spec: OffsetSpec, level: IsolationLevel
) -> dict[int, int]:
    req = {TopicPartition(topic, p): spec for p in range(partitions)}
    res = admin.list_offsets(req, isolation_level=level, request_timeout=10)
    return {tp.partition: f.result().offset for tp, f in res.items()}


def end_offsets(
    admin: AdminClient, topic: str, partitions: int, *, committed: bool
) -> dict[int, int]:
    """Each partition's last stable offset (``committed``) or high watermark."""
    level = IsolationLevel.READ_COMMITTED if committed else IsolationLevel.READ_UNCOMMITTED
    return _list_offsets(admin, topic, partitions, OffsetSpec.latest(), level)


def start_offsets(admin: AdminClient, topic: str, partitions: int) -> dict[int, int]:
    """Each partition's log start offset."""
    return _list_offsets(
        admin, topic, partitions, OffsetSpec.earliest(), IsolationLevel.READ_UNCOMMITTED
    )


def open_transaction_written(admin: AdminClient, topic: str, partitions: int) -> bool:
    """Whether some partition of ``topic`` holds records past its last stable offset: a
    transaction is open and has written to it."""
    lso = end_offsets(admin, topic, partitions, committed=True)
    hwm = end_offsets(admin, topic, partitions, committed=False)
    return any(hwm[p] > lso[p] for p in lso)
