"""The two clusters MirrorMaker 2 mirrors between in ``bench/mirror.py`` (two ``stratalog serve``
processes or two Apache Kafka brokers), and MirrorMaker 2 itself."""

from __future__ import annotations

import contextlib
import re
import struct
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from stratalog.bench.targets import start_serve, stop_process

MB = 1_000_000
RECORD = 1024
TOPIC = "mirror"
MIRRORED = f"source.{TOPIC}"
PARTITIONS = 4
MIRROR_MAKER = "org.apache.kafka.connect.mirror.MirrorMaker"
PAIRS = ("stratalog", "kafka")
DEFAULTS = {"records": 200_000, "runs": 3, "rate": 2000, "seconds": 20.0, "warmup": 20.0}
QUICK = {"records": 20_000, "runs": 1, "rate": 1000, "seconds": 5.0, "warmup": 2.0}
COPY_TIMEOUT = 120.0  # the copy takes 15-35 s here; past this the run is recorded as failed
_STAMP = struct.Struct(">d")


# --------------------------------------------------------------------------------------------
# The clusters
# --------------------------------------------------------------------------------------------


def _log_lines(path: Path, keep: Callable[[str], bool]) -> list[str]:
    with contextlib.suppress(OSError):
        return [line[:400] for line in path.read_text(errors="replace").splitlines() if keep(line)]
    return []


class _StratalogCluster:
    """``stratalog serve`` as a process of its own on loopback: its defaults, and ``settings``
    (``--set key=value``)."""

    def __init__(self, workdir: Path, settings: dict[str, str]) -> None:
        self.workdir = workdir
        self.settings = settings
        self.proc: subprocess.Popen | None = None
        self.bootstrap = ""

    def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "stratalog.cli", "serve"]
        cmd += ["--data-dir", str(self.workdir / "data"), "--port", "0", "--log-level", "WARNING"]
        for k, v in self.settings.items():
            cmd += ["--set", f"{k}={v}"]
        self.proc, self.bootstrap = start_serve(cmd, self.workdir / "broker.log")

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        stop_process(proc, timeout=60)

    def warnings(self) -> list[str]:
        """The broker's log (WARNING and up)."""
        return _log_lines(self.workdir / "broker.log", bool)


class _KafkaCluster:
    """One Apache Kafka 4.4.0 KRaft node, as the bench's ``kafka`` target starts it."""

    def __init__(self) -> None:
        from stratalog.peers.kafka import KafkaBroker

        props = {"num.network.threads": "3", "num.io.threads": "8"}
        self.broker = KafkaBroker(props, heap="1g", startup_timeout=180)
        self.bootstrap = ""

    def start(self) -> None:
        self.broker.start()
        self.bootstrap = self.broker.bootstrap

    @property
    def pid(self) -> int | None:
        return self.broker.pid

    def stop(self) -> None:
        self.broker.stop()

    def warnings(self) -> list[str]:
        """The broker's WARN and ERROR lines (read before :meth:`stop` removes its directory),
        but the one every new KRaft node logs ("Performing controller activation")."""
        if self.broker.log_dir is None:
            return []

        def keep(line: str) -> bool:
            return ("] WARN " in line or "] ERROR " in line) and "controller activation" not in line

        return _log_lines(self.broker.server_log, keep)


def _cluster(
    pair: str, workdir: Path, settings: dict[str, str]
) -> _StratalogCluster | _KafkaCluster:
    if pair == "stratalog":
        return _StratalogCluster(workdir, settings)
    return _KafkaCluster()


def _describe(pair: str, settings: dict[str, str]) -> str:
    if pair == "kafka":
        return "two Apache Kafka 4.4.0 KRaft nodes, defaults (page cache)"
    shown = "".join(f", {k}={v}" for k, v in settings.items())
    return f"two `stratalog serve`, defaults (fsync=always){shown}"


# --------------------------------------------------------------------------------------------
# MirrorMaker 2
# --------------------------------------------------------------------------------------------


def _mm2_properties(path: Path, source: str, target: str) -> Path:
    one = "replication.factor"
    lines = [
        "clusters = source, target",
        f"source.bootstrap.servers = {source}",
        f"target.bootstrap.servers = {target}",
        "source->target.enabled = true",
        f"source->target.topics = {TOPIC}",
        "target->source.enabled = false",
        f"{one} = 1",
        *(
            f"{t}.{one} = 1"
            for t in ("checkpoints.topic", "heartbeats.topic", "offset-syncs.topic")
        ),
        *(f"{s}.storage.{one} = 1" for s in ("offset", "status", "config")),
        "sync.topic.acls.enabled = false",
        "tasks.max = 2",
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


class _MirrorMaker:
    """MirrorMaker 2's JVM (dedicated mode, driving the target), stopped by its PID."""

    def __init__(self, workdir: Path, source: str, target: str) -> None:
        from stratalog.peers.kafka import app_command

        props = _mm2_properties(workdir / "mm2.properties", source, target)
        self.log = workdir / "connect.log"
        self.cmd = app_command(
            "connect", MIRROR_MAKER, str(props), "--clusters", "target", log_dir=workdir, heap="1g"
        )
        self.out = workdir / "connect.out"
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        with open(self.out, "ab") as out:
            self.proc = subprocess.Popen(
                self.cmd,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        stop_process(proc, timeout=60)

    def tail(self, lines: int = 40) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        return ""

    def warnings(self) -> list[str]:
        """MirrorMaker's WARN and ERROR lines, without their times and with ids masked."""
        out = []
        with contextlib.suppress(OSError):
            for line in self.log.read_text(errors="replace").splitlines():
                m = re.match(r"\[[^]]*\] (WARN|ERROR) (.*)", line)
                if m:
                    text = re.sub(r"[0-9a-f]{8}-[0-9a-f-]{27}", "<id>", m[2])
                    out.append(f"{m[1]} {text[:300]}")
        return out


# --------------------------------------------------------------------------------------------
# The phases
# --------------------------------------------------------------------------------------------
