"""A real single-member etcd on 127.0.0.1, run as a child process (tests, local clusters).

There is no systemd here, so etcd is started with explicit URLs on free loopback ports and
stopped by its PID. Its log goes to ``<data_dir>-etcd.log`` beside the data directory.

With ``tls`` (:class:`EtcdServerTls`) its client URL is https: etcd serves its certificate
(``--cert-file``/``--key-file``) and, with ``client_cert_auth``, accepts only clients whose
certificates chain to ``--trusted-ca-file`` (``--client-cert-auth``). The peer URL stays plain
http on loopback: a single member has no peers to talk to.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import shutil
import signal
import ssl
import subprocess
import time
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from stratalog.cluster.errors import ClusterError
from stratalog.loopback import free_port as _free_port

DEFAULT_BINARY = "/usr/bin/etcd"  # Debian's etcd-server package
QUOTA_BACKEND_BYTES = 256 * 1024 * 1024  # metadata only: fail loudly long before the disk fills


def find_etcd(binary: str | os.PathLike[str] | None = None) -> str:
    """The etcd binary to run: ``binary``, else $PATH's ``etcd``, else /usr/bin/etcd."""
    candidate = str(binary) if binary else shutil.which("etcd") or DEFAULT_BINARY
    if not (os.path.isfile(candidate) and os.access(candidate, os.X_OK)):
        raise ClusterError(
            f"etcd binary not found at {candidate!r}: install Debian's etcd-server package "
            "(apt-get install etcd-server) or pass the binary's path"
        )
    return candidate


@dataclass(frozen=True)
class EtcdServerTls:
    """PEM files of an etcd serving https. ``cert_file`` must allow client authentication as
    well as serving (``stratalog certs``' broker certificate does): etcd's own gRPC gateway, and
    our health check, present it as a client when ``client_cert_auth`` is on."""

    cert_file: Path
    key_file: Path
    trusted_ca_file: Path  # checks client certificates (and, here, the server's own)
    client_cert_auth: bool = True

    @classmethod
    def from_test_certificates(
        cls, files: dict[str, Path], client_cert_auth: bool = True
    ) -> EtcdServerTls:
        """From ``stratalog certs``' files (security/certs.py): the broker certificate, which
        names 127.0.0.1, and the test CA."""
        return cls(files["broker.crt"], files["broker.key"], files["ca.pem"], client_cert_auth)

    def client_context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.trusted_ca_file))
        ctx.load_cert_chain(str(self.cert_file), str(self.key_file))
        return ctx


class EtcdServer:
    """One etcd member in ``data_dir``; ``start()`` waits until it serves requests.

    Ports are picked on the first start and kept across restarts, so ``endpoint`` stays valid.
    """

    def __init__(
        self,
        data_dir: str | os.PathLike[str],
        *,
        binary: str | os.PathLike[str] | None = None,
        name: str = "stratalog-etcd",
        tls: EtcdServerTls | None = None,
    ) -> None:
        self.data_dir = Path(data_dir)
        self.name = name
        self.binary = find_etcd(binary)
        self.tls = tls
        self.log_path = self.data_dir.parent / f"{self.data_dir.name}-etcd.log"
        self.client_port = 0
        self.peer_port = 0
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        if not self.client_port:
            raise ClusterError("etcd has not been started")
        return f"{self.scheme}://127.0.0.1:{self.client_port}"

    @property
    def scheme(self) -> str:
        return "http" if self.tls is None else "https"

    @property
    def pid(self) -> int | None:
        return None if self.proc is None else self.proc.pid

    def start(self, timeout: float = 20) -> EtcdServer:
        if self.proc is not None:
            raise ClusterError(f"etcd is already running (pid {self.proc.pid})")
        fresh_ports = not self.client_port
        for attempt in range(3):
            if fresh_ports:
                self.client_port, self.peer_port = _free_port(), _free_port()
            self._spawn()
            try:
                self._wait_ready(timeout)
                return self
            except ClusterError:
                # Another process may have taken a port between our probe and etcd's bind.
                lost_race = self.proc is None and "address already in use" in self._log_tail()
                if not (fresh_ports and lost_race and attempt < 2):
                    raise
        raise AssertionError("unreachable")

    def _spawn(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        client = f"{self.scheme}://127.0.0.1:{self.client_port}"
        peer = f"http://127.0.0.1:{self.peer_port}"
        cmd = [
            self.binary,
            f"--name={self.name}",
            f"--data-dir={self.data_dir}",
            f"--listen-client-urls={client}",
            f"--advertise-client-urls={client}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster={self.name}={peer}",
            "--initial-cluster-state=new",  # ignored once the data dir holds a member
            f"--initial-cluster-token=stratalog-{uuid.uuid4().hex[:12]}",
            f"--quota-backend-bytes={QUOTA_BACKEND_BYTES}",
            "--logger=zap",
            "--log-outputs=stderr",
        ]
        if self.tls is not None:
            cmd += [
                f"--cert-file={self.tls.cert_file}",
                f"--key-file={self.tls.key_file}",
                f"--trusted-ca-file={self.tls.trusted_ca_file}",
            ]
            if self.tls.client_cert_auth:
                cmd.append("--client-cert-auth")
        # ETCD_* variables would override the flags above (etcd reads its config from them).
        env = {k: v for k, v in os.environ.items() if not k.startswith("ETCD_")}
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                env=env,
                start_new_session=True,  # a Ctrl-C in the terminal must not reach it
            )

    def _wait_ready(self, timeout: float) -> None:
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        url = f"{self.endpoint}/health"
        context = None if self.tls is None else self.tls.client_context()
        while True:
            code = self.proc.poll()
            if code is not None:
                self.proc = None
                raise ClusterError(
                    f"etcd exited with status {code} while starting; its log "
                    f"({self.log_path}) ends:\n{self._log_tail()}"
                )
            # /health answers true once there is a leader and a read goes through.
            with (
                contextlib.suppress(OSError, ValueError, http.client.HTTPException),
                urllib.request.urlopen(url, timeout=1, context=context) as r,
            ):
                if b'"true"' in r.read():
                    return
            if time.monotonic() > deadline:
                self.kill()
                raise ClusterError(
                    f"etcd did not become healthy at {self.endpoint} within {timeout:g} s; "
                    f"its log ({self.log_path}) ends:\n{self._log_tail()}"
                )
            time.sleep(0.05)

    def _log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def stop(self, timeout: float = 10) -> None:
        """SIGTERM (a paused etcd is continued so it can act on it), then SIGKILL."""
        if self.proc is None:
            return
        self._signal(signal.SIGTERM)
        self._signal(signal.SIGCONT)
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self._signal(signal.SIGKILL)
            self.proc.wait(timeout=10)
        self.proc = None

    def kill(self) -> None:
        """SIGKILL: a crash, as far as etcd's data directory is concerned."""
        if self.proc is None:
            return
        self._signal(signal.SIGKILL)
        self.proc.wait(timeout=10)
        self.proc = None

    def pause(self) -> None:
        """SIGSTOP: it keeps its sockets but answers nothing until ``resume()``. Returns once
        every thread of it has stopped: the signal is delivered asynchronously, and a request
        sent at once could still be answered (a fresh-clone run saw one)."""
        self._signal(signal.SIGSTOP)
        assert self.proc is not None
        deadline = time.monotonic() + 2.0
        while not _all_stopped(self.proc.pid) and time.monotonic() < deadline:
            time.sleep(0.001)

    def resume(self) -> None:
        self._signal(signal.SIGCONT)

    def _signal(self, sig: int) -> None:
        if self.proc is None:
            raise ClusterError("etcd is not running")
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.proc.pid, sig)

    def __enter__(self) -> EtcdServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def _all_stopped(pid: int) -> bool:
    """Whether every thread of ``pid`` is stopped (state T in /proc), or the process is gone."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:
        return True
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            continue
        if state not in ("T", "t"):
            return False
    return True
