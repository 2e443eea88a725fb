"""Shared fixtures: real brokers on loopback, started in-process or as `stratalog serve`."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from stratalog import Broker

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Broker]:
    """A fresh embedded broker (own thread and event loop) on a free port."""
    with Broker(tmp_path / "data") as b:
        yield b


@pytest.fixture(scope="module")
def shared_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    """One embedded broker for a whole test module (tests use their own topics)."""
    with Broker(tmp_path_factory.mktemp("data")) as b:
        yield b


def create_topic(bootstrap: str, name: str, partitions: int = 1, **configs: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    fs = admin.create_topics([NewTopic(name, partitions, 1, config=configs)])
    fs[name].result(timeout=15)


class BrokerProcess:
    """`stratalog serve` as a child process, killed by PID (SIGTERM or SIGKILL)."""

    def __init__(self, data_dir: Path, port: int = 0, settings: dict[str, str] | None = None):
        self.data_dir = data_dir
        self.port = port
        self.settings = dict(settings or {})
        self.proc: subprocess.Popen | None = None
        self.bootstrap = ""
        self.log_path = data_dir.parent / f"{data_dir.name}-broker.log"

    def start(self, timeout: float = 30) -> BrokerProcess:
        cmd = [
            sys.executable,
            "-m",
            "stratalog.cli",
            "serve",
            "--data-dir",
            str(self.data_dir),
            "--port",
            str(self.port),
            "--log-level",
            "WARNING",
        ]
        for k, v in self.settings.items():
            cmd += ["--set", f"{k}={v}"]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                cmd, stdout=subprocess.PIPE, stderr=log, start_new_session=True
            )
        deadline = time.monotonic() + timeout
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().decode()
        if "ready at" not in line or time.monotonic() > deadline:
            self.kill()
            raise RuntimeError(f"broker did not start: {line!r}\n{self.log_path.read_text()}")
        self.bootstrap = line.strip().rsplit(" ", 1)[1]
        # Later restarts reuse the port so clients' bootstrap addresses stay valid.
        self.port = int(self.bootstrap.rsplit(":", 1)[1])
        return self

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc is None:
            return
        try:
            os.kill(self.proc.pid, sig)
        except ProcessLookupError:
            pass
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)
        if self.proc.stdout:
            self.proc.stdout.close()
        self.proc = None

    def stop(self) -> None:
        self.kill(signal.SIGTERM)


@pytest.fixture
def broker_process(tmp_path: Path) -> Iterator[BrokerProcess]:
    bp = BrokerProcess(tmp_path / "data")
    try:
        yield bp
    finally:
        bp.kill()
