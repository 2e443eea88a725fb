"""A cluster on this machine for trying things and for tests: one etcd and N brokers on
127.0.0.1, each its own process, started detached and stopped by PID.

``stratalog cluster up`` starts one and records the processes in ``<dir>/cluster-state.json``;
``stratalog cluster down`` reads that file and stops them (SIGTERM, then SIGKILL after a bound).

With ``etcd_certs`` (the files of ``stratalog certs``, security/certs.py) etcd serves https and
requires client certificates, and every broker reaches it with the test CA as its truststore
and the broker certificate as its keystore (``cluster.etcd.ssl.*``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from stratalog.cluster.errors import ClusterError
from stratalog.cluster.etcd_server import EtcdServer, EtcdServerTls
from stratalog.loopback import free_port as _free_port

STATE_FILE = "cluster-state.json"


@dataclass
class BrokerProc:
    node_id: int
    port: int
    data_dir: Path
    pid: int = 0
    settings: dict[str, str] = field(default_factory=dict)
    etcd_endpoint: str = ""  # where this broker reaches etcd (empty: the cluster's etcd)

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.data_dir.parent / f"{self.data_dir.name}.log"


class LocalCluster:
    """etcd plus ``brokers`` brokers under ``root``."""

    def __init__(
        self,
        root: Path,
        brokers: int = 3,
        settings: dict[str, str] | None = None,
        log_level: str = "WARNING",
        etcd_certs: dict[str, Path] | None = None,
    ) -> None:
        self.root = Path(root)
        self.log_level = log_level
        tls = None if etcd_certs is None else EtcdServerTls.from_test_certificates(etcd_certs)
        self.etcd = EtcdServer(self.root / "etcd", tls=tls)
        self.settings = dict(settings or {})
        if etcd_certs is not None:
            self.settings.setdefault(
                "cluster.etcd.ssl.truststore.location", str(etcd_certs["ca.pem"])
            )
            self.settings.setdefault(
                "cluster.etcd.ssl.keystore.location", str(etcd_certs["broker.pem"])
            )
        self.brokers = [
            BrokerProc(n, 0, self.root / f"broker-{n}", settings=self.settings)
            for n in range(1, brokers + 1)
        ]

    @property
    def bootstrap(self) -> str:
        return ",".join(b.bootstrap for b in self.brokers)

    def start(self, timeout: float = 60) -> LocalCluster:
        self.root.mkdir(parents=True, exist_ok=True)
        self.etcd.start()
        try:
            for b in self.brokers:
                self.start_broker(b, timeout=timeout)
        except BaseException:
            self.stop()
            raise
        self.save()
        return self

    def start_broker(self, b: BrokerProc, timeout: float = 60) -> None:
        """Start (or restart, on the same port and data directory) one broker."""
        if b.pid and not _wait_gone(b.pid, 1.0):  # (a kill -9 just sent takes a moment)
            # A second process would fail to bind and orphan the running one (its PID lost).
            raise ClusterError(f"broker {b.node_id} is still running (pid {b.pid})")
        fresh = not b.port
        for attempt in range(3):
            if fresh:
                b.port = _free_port()
            logged = b.log_path.stat().st_size if b.log_path.exists() else 0
            try:
                return self._start_process(b, timeout)
            except ClusterError:
                # A free port found is only free until another process binds it (the broker's
                # other listeners take theirs at start): lost that race, start again.
                with open(b.log_path, "rb") as f:
                    f.seek(logged)
                    raced = b"address already in use" in f.read()
                if not raced or attempt == 2:
                    raise

    def _start_process(self, b: BrokerProc, timeout: float) -> None:
        cmd = [
            sys.executable,
            "-m",
            "stratalog.cli",
            "serve",
            "--data-dir",
            str(b.data_dir),
            "--port",
            str(b.port),
            "--node-id",
            str(b.node_id),
            "--etcd",
            b.etcd_endpoint or self.etcd.endpoint,
            "--log-level",
            self.log_level,
        ]
        for k, v in b.settings.items():
            cmd += ["--set", f"{k}={v}"]
        ready = b.data_dir.parent / f"{b.data_dir.name}.ready"
        ready.unlink(missing_ok=True)
        with open(ready, "wb") as out, open(b.log_path, "ab") as err:
            proc = subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=err, start_new_session=True
            )
        b.pid = proc.pid
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if "ready at" in ready.read_text(errors="replace"):
                return
            if proc.poll() is not None:
                raise ClusterError(
                    f"broker {b.node_id} exited with {proc.returncode}: "
                    f"{b.log_path.read_text(errors='replace')[-2000:]}"
                )
            time.sleep(0.05)
        self.send_signal(b, signal.SIGKILL)
        raise ClusterError(f"broker {b.node_id} did not start within {timeout} s")

    def send_signal(self, b: BrokerProc, sig: int) -> None:
        if b.pid:
            try:
                os.kill(b.pid, sig)
            except ProcessLookupError:
                pass

    def stop_broker(self, b: BrokerProc, sig: int = signal.SIGTERM, timeout: float = 30) -> None:
        """Stop one broker by PID: ``sig``, then SIGKILL once ``timeout`` passed."""
        if not b.pid:
            return
        self.send_signal(b, sig)
        if not _wait_gone(b.pid, timeout):
            self.send_signal(b, signal.SIGKILL)
            _wait_gone(b.pid, 10)
        b.pid = 0

    def stop(self) -> None:
        for b in self.brokers:
            self.stop_broker(b)
        self.etcd.stop()

    # -- the state file, for `cluster down` from another process -------------------------------
    def save(self) -> None:
        state = {
            "etcd": {"pid": self.etcd.pid, "endpoint": self.etcd.endpoint},
            "brokers": [
                {"node_id": b.node_id, "port": b.port, "pid": b.pid, "data_dir": str(b.data_dir)}
                for b in self.brokers
            ],
        }
        (self.root / STATE_FILE).write_text(json.dumps(state, indent=1))


def _wait_gone(pid: int, timeout: float) -> bool:
    """Wait for ``pid`` to exit (reaping it if it is our child)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
            if done:
                return True
        except ChildProcessError:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)


def down(root: Path, timeout: float = 30) -> list[str]:
    """Stop what ``cluster up`` started under ``root``; returns what was stopped."""
    path = Path(root) / STATE_FILE
    if not path.exists():
        raise ClusterError(f"no cluster was started in {root} ({STATE_FILE} is missing)")
    state = json.loads(path.read_text())
    stopped = []
    for b in state["brokers"]:
        if _stop_pid(b["pid"], timeout):
            stopped.append(f"broker {b['node_id']} (pid {b['pid']})")
    if _stop_pid(state["etcd"]["pid"], timeout):
        stopped.append(f"etcd (pid {state['etcd']['pid']})")
    path.unlink()
    return stopped


def _stop_pid(pid: int | None, timeout: float) -> bool:
    if not pid:
        return False
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False  # gone already
    if b"stratalog" not in cmdline and b"etcd" not in cmdline:
        return False  # the pid was reused by something that is not ours
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return False
    if not _wait_gone(pid, timeout):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        _wait_gone(pid, 10)
    return True
