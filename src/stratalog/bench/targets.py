"""What a benchmark runs against: a :class:`Target` starts a server, creates topics, and hands out a
picklable client factory for the load processes.

To add a peer, subclass :class:`Target` (in ``stratalog/bench/peers_<name>.py``), give it a
``kind`` and register it with :func:`register`; a workload then names it with
``[[target]] kind = "<kind>"``. Everything else (processes, histograms, CPU accounting, reports)
is shared.

Targets here: ``stratalog`` (``stratalog serve`` as a child process, settings from the workload)
and ``kafka`` (Apache Kafka 4.4.0 KRaft through :class:`stratalog.peers.kafka.KafkaBroker`;
per-topic ``topic_config`` such as ``flush.messages=1``); NATS JetStream and Redis Streams are in
``peers_nats.py`` and ``peers_redis.py``.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from abc import ABC, abstractmethod
from pathlib import Path
from typing import ClassVar

from stratalog.bench.clients import ClientFactory, KafkaClientFactory
from stratalog.bench.workload import TargetSpec, Workload
from stratalog.loopback import free_port


class TargetUnavailable(RuntimeError):
    """The target cannot run on this machine (a missing binary...): reported, then skipped."""


def wait_port(port: int, timeout: float, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"server exited with status {proc.returncode} while starting")
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.settimeout(0.5)
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listened on 127.0.0.1:{port} within {timeout:.0f}s")


def stop_process(
    proc: subprocess.Popen | None, timeout: float = 30, sig: int = signal.SIGTERM
) -> None:
    """Send ``sig`` (SIGTERM by default) to the process (by PID), wait, then SIGKILL."""
    if proc is None or proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(proc.pid, sig)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


_CLK_TCK = os.sysconf("SC_CLK_TCK")


def process_cpu_s(pid: int | None) -> float:
    """User + system CPU seconds of a process, its reaped children and its live descendants
    (a broker's worker processes: the TLS offload process, the backlog sender, the cleaner);
    0 when gone."""
    if pid is None:
        return 0.0
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return 0.0
    fields = stat[stat.rindex(")") + 2 :].split()
    # utime, stime, cutime, cstime are fields 14..17 of stat(5); fields[] starts at field 3.
    own = sum(int(x) for x in fields[11:15]) / _CLK_TCK
    return own + sum(process_cpu_s(child) for child in _children(pid))


def _children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out += [int(c) for c in f.read().split()]
        except OSError:
            pass
    return out


def start_serve(cmd: list[str], log_path: Path) -> tuple[subprocess.Popen, str]:
    """Start ``stratalog serve`` (``cmd``), its log appended to ``log_path``; the process and
    the bootstrap address its "ready at" line gives (an error, the process stopped, if none)."""
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=log, stdin=subprocess.DEVNULL,
            start_new_session=True,
        )  # fmt: skip
    assert proc.stdout is not None
    line = proc.stdout.readline().decode()
    if "ready at" not in line:
        stop_process(proc, timeout=60)
        proc.stdout.close()
        raise RuntimeError(f"stratalog serve did not start: {line!r}")
    return proc, line.strip().rsplit(" ", 1)[1]


class Target(ABC):
    """A server under test. Subclasses set ``kind`` and implement the abstract methods."""

    kind: ClassVar[str] = ""
    #: False for targets that speak no Kafka protocol (no kcat / Kafka tools against them).
    kafka_protocol: ClassVar[bool] = False

    def __init__(self, spec: TargetSpec, workload: Workload) -> None:
        self.spec = spec
        self.workload = workload
        self.workdir: Path | None = None

    @property
    def name(self) -> str:
        return self.spec.name

    def describe(self) -> str:
        """One line: what runs and with which durability settings."""
        return self.name

    @abstractmethod
    def start(self) -> None: ...

    @abstractmethod
    def stop(self) -> None: ...

    @property
    @abstractmethod
    def pid(self) -> int | None:
        """The server's process, for CPU accounting."""

    @abstractmethod
    def create_topics(self, names: list[str], partitions: int) -> None: ...

    @abstractmethod
    def client_factory(self) -> ClientFactory: ...

    def cpu_s(self) -> float:
        """CPU seconds the server has used so far (every process of it, for a cluster)."""
        return process_cpu_s(self.pid)

    def data_dirs(self) -> list[Path]:
        """Directories holding the stored records (for dropping them from the page cache)."""
        return []

    def count_records(self, topics: list[str], partitions: int) -> int | None:
        """Records stored in these topics, asked of the server (None if it cannot say)."""
        return None

    def version(self) -> str:
        return ""

    def _mkworkdir(self) -> Path:
        self.workdir = Path(tempfile.mkdtemp(prefix=f"stratalog-bench-{self.kind}-"))
        return self.workdir

    def _rmworkdir(self) -> None:
        if self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = None


_REGISTRY: dict[str, type[Target]] = {}


def register(cls: type[Target]) -> type[Target]:
    _REGISTRY[cls.kind] = cls
    return cls


def make_target(spec: TargetSpec, workload: Workload) -> Target:
    _load_peers()
    if spec.kind not in _REGISTRY:
        raise TargetUnavailable(f"unknown target kind {spec.kind!r} (known: {sorted(_REGISTRY)})")
    return _REGISTRY[spec.kind](spec, workload)


def _load_peers() -> None:
    """Import ``stratalog.bench.peers_*`` so their targets register themselves."""
    import importlib
    import pkgutil

    import stratalog.bench as pkg

    for mod in pkgutil.iter_modules(pkg.__path__):
        if mod.name.startswith("peers_") or mod.name in ("cluster_targets", "secure_targets"):
            importlib.import_module(f"stratalog.bench.{mod.name}")


# ------------------------------------------------------------------------------------------------
# Kafka-protocol targets
# ------------------------------------------------------------------------------------------------


class KafkaProtocolTarget(Target):
    """Topics through the Kafka Admin API, clients through confluent-kafka."""

    kafka_protocol = True
    bootstrap = ""
    replication_factor = 1

    def topic_config(self) -> dict[str, str]:
        return dict(self.spec.topic_config)

    def create_topics(
        self, names: list[str], partitions: int, config: dict[str, str] | None = None
    ) -> None:
        """Create the topics with the target's topic_config, or with ``config`` if given."""
        from confluent_kafka.admin import AdminClient, NewTopic

        admin = AdminClient({"bootstrap.servers": self.bootstrap, "log_level": 3})
        cfg = self.topic_config() if config is None else config
        for i in range(0, len(names), 200):
            chunk = names[i : i + 200]
            futures = admin.create_topics(
                [NewTopic(n, partitions, self.replication_factor, config=cfg) for n in chunk],
                request_timeout=120,
            )
            for n, f in futures.items():
                try:
                    f.result(timeout=180)
                except Exception as e:
                    raise RuntimeError(f"{self.name}: cannot create topic {n}: {e}") from e
        # Wait until every partition has a leader in the metadata.
        deadline = time.monotonic() + 120
        want = set(names)
        while True:
            md = admin.list_topics(timeout=30)
            ready = {
                t
                for t, tm in md.topics.items()
                if t in want
                and tm.error is None
                and len(tm.partitions) == partitions
                and all(p.leader >= 0 for p in tm.partitions.values())
            }
            if ready == want:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name}: {len(want - ready)} topics have no leader")
            time.sleep(0.2)

    def client_factory(self) -> ClientFactory:
        return KafkaClientFactory(self.bootstrap)

    def count_records(self, topics: list[str], partitions: int) -> int | None:
        from confluent_kafka import Consumer, TopicPartition

        c = Consumer(
            {"bootstrap.servers": self.bootstrap, "group.id": "bench-count", "log_level": 3}
        )
        try:
            total = 0
            for t in topics:
                for p in range(partitions):
                    lo, hi = c.get_watermark_offsets(TopicPartition(t, p), timeout=30)
                    total += hi - lo
            return total
        finally:
            c.close()


@register
class StratalogTarget(KafkaProtocolTarget):
    """``stratalog serve`` as a child process on a free port with a temporary data directory.

    Settings: the workload's ``fsync`` and ``layout`` (as ``fsync`` and ``storage.layout``),
    then the target's ``settings`` table (any broker setting of docs/configuration.md;
    ``{workdir}`` in a value stands for the target's temporary directory, ``{fastdir}`` for a
    temporary directory under the workload's ``vars["fast_root"]`` (a second, faster device for
    the hot tier, as Pafka's PMem), ``{name}`` for the workload's ``vars[name]``).
    """

    kind = "stratalog"

    def __init__(self, spec: TargetSpec, workload: Workload) -> None:
        super().__init__(spec, workload)
        self.proc: subprocess.Popen | None = None
        self.settings: dict[str, str] = {
            "fsync": workload.fsync,
            "storage.layout": workload.layout,
            "admin.port": "{admin_port}",  # a free port, chosen at start: /metrics is read
        }
        self.admin = ""
        self.fastdir: Path | None = None
        known = workload.vars

        def fill(v: object) -> str:
            # "{name}" is the workload's vars[name]; "{workdir}" is filled in at start.
            return re.sub(r"\{(\w+)\}", lambda m: str(known.get(m[1], m[0])), str(v))

        self.settings.update({k: fill(v) for k, v in spec.settings.items()})

    def describe(self) -> str:
        keys = (
            "fsync",
            "storage.layout",
            "group_commit_ms",
            "tiers.hot.capacity",
            "tiers.hot.path",
            "fetch.backlog.max_bytes_per_sec",
            "fetch.backlog.fsync_target_ms",
            "storage.read_priority",
        )
        shown = ", ".join(f"{k}={self.settings[k]}" for k in keys if k in self.settings)
        return f"Stratalog ({shown})"

    def version(self) -> str:
        from importlib.metadata import version

        return version("stratalog")

    def start(self) -> None:
        if any("{fastdir}" in v for v in self.settings.values()):
            self.fastdir = self._mkfastdir()
        wd = self._mkworkdir()
        cmd = [
            sys.executable,
            "-m",
            "stratalog.cli",
            "serve",
            "--data-dir",
            str(wd / "data"),
            "--port",
            "0",
            "--log-level",
            "WARNING",
        ]
        admin_port = free_port()
        self.admin = f"127.0.0.1:{admin_port}"
        for k, v in self.settings.items():
            # "{workdir}" in a value is this target's temporary directory (a cold tier's path).
            v = v.replace("{workdir}", str(wd)).replace("{admin_port}", str(admin_port))
            v = v.replace("{fastdir}", str(self.fastdir))
            cmd += ["--set", f"{k}={v}"]
        self.log_path = wd / "broker.log"
        self.proc, self.bootstrap = start_serve(cmd, self.log_path)

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        stop_process(proc, timeout=60)
        if proc is not None and proc.stdout is not None:
            proc.stdout.close()
        self._rmworkdir()
        if self.fastdir is not None:
            shutil.rmtree(self.fastdir, ignore_errors=True)
            self.fastdir = None

    def _mkfastdir(self) -> Path:
        root = self.workload.vars.get("fast_root")
        if not root or not Path(str(root)).is_dir():
            raise RuntimeError(
                f"target {self.name}: '{{fastdir}}' needs the workload's vars.fast_root to name "
                f"an existing directory on the fast device (got {root!r}); "
                "bench/fast-device up makes one"
            )
        return Path(tempfile.mkdtemp(prefix=f"stratalog-bench-{self.name}-", dir=str(root)))

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def histogram_buckets(self, name: str, **labels: str) -> dict[float, float]:
        """One of the broker's own histograms (cumulative counts by upper bound, seconds),
        read from its /metrics endpoint; empty if it cannot be read."""
        from prometheus_client.parser import text_string_to_metric_families

        try:
            with urllib.request.urlopen(f"http://{self.admin}/metrics", timeout=5) as r:
                text = r.read().decode()
        except OSError:
            return {}
        out: dict[float, float] = {}
        for family in text_string_to_metric_families(text):
            if family.name != name:
                continue
            for s in family.samples:
                if s.name.endswith("_bucket") and all(
                    s.labels.get(k) == v for k, v in labels.items()
                ):
                    out[float(s.labels["le"])] = s.value
        return out

    def tier_plan(self) -> dict[str, float] | None:
        """The hot tier's capacity, threshold, segment size and the cold tier's write budget,
        from the settings; None without a capped hot tier."""
        capacity = int(self.settings.get("tiers.hot.capacity", 0))
        if not capacity:
            return None
        return {
            "capacity": capacity,
            "threshold": float(self.settings.get("tiers.migrate.threshold", 0.5)),
            "segment_bytes": int(self.settings.get("segment.bytes", 128 << 20)),
            "cold_bytes_per_s": int(self.settings.get("tiers.cold.max_bytes_per_sec", 0)),
        }

    def hot_bytes(self) -> int:
        """Bytes of segment files in the hot tier (what the migrator counts against capacity)."""
        if self.workdir is None:
            return 0
        total = 0
        for f in (self.workdir / "data" / "logs").rglob("*.log"):
            with contextlib.suppress(FileNotFoundError):  # migrated away while we looked
                total += f.stat().st_size
        return total

    def settle(self, timeout: float = 600) -> float:
        """With a capped hot tier, wait until migration has brought the hot tier's files under
        the threshold (plus two segments) and stopped; returns the seconds waited."""
        plan = self.tier_plan()
        if plan is None or self.workdir is None:
            return 0.0
        capacity, threshold = plan["capacity"], plan["threshold"]
        slack = 2 * plan["segment_bytes"]
        t0 = time.monotonic()
        last, still = -1, 0
        while time.monotonic() - t0 < timeout:
            used = self.hot_bytes()
            # Under the threshold and no longer shrinking for 3 s: the migrator is done.
            still = still + 1 if used == last else 0
            if used <= capacity * threshold + slack and still >= 6:
                break
            last = used
            time.sleep(0.5)
        return time.monotonic() - t0

    def tier_bytes(self) -> dict[str, int]:
        """Bytes of segment files in the hot tier and in a cold tier kept in the work dir."""
        if self.workdir is None:
            return {}

        def du(d: Path) -> int:
            return sum(f.stat().st_size for f in d.rglob("*") if f.is_file()) if d.exists() else 0

        return {"hot": du(self.workdir / "data" / "logs"), "cold": du(self.workdir / "cold")}

    def data_dirs(self) -> list[Path]:
        # The whole work directory (the data directory and a cold tier kept beside it) and a hot
        # tier on the fast device.
        return [d for d in (self.workdir, self.fastdir) if d is not None]


@register
class KafkaTarget(KafkaProtocolTarget):
    """Apache Kafka 4.4.0 (KRaft, one node) through :class:`KafkaBroker`.

    ``settings``: extra broker properties (plus ``heap``, default 1g); ``topic_config``: configs
    set on every topic at creation, e.g. ``flush.messages = "1"`` for Stratalog's durability.
    """

    kind = "kafka"

    def __init__(self, spec: TargetSpec, workload: Workload) -> None:
        super().__init__(spec, workload)
        self.broker = None
        props = dict(spec.settings)
        self.heap = str(props.pop("heap", "1g"))
        self.props = {k: str(v) for k, v in props.items()}

    def describe(self) -> str:
        # Topic configs, and broker settings that change durability (log.flush.*).
        shown = {**{k: v for k, v in self.props.items() if "flush" in k}, **self.spec.topic_config}
        if shown:
            return "Apache Kafka (" + ", ".join(f"{k}={v}" for k, v in shown.items()) + ")"
        return "Apache Kafka (default durability: page cache)"

    def version(self) -> str:
        from stratalog.peers.kafka import KAFKA_VERSION

        return KAFKA_VERSION

    def start(self) -> None:

        self._start_broker({"num.network.threads": "3", "num.io.threads": "8", **self.props})

    def _start_broker(self, props: dict[str, str], listeners: dict[str, str] | None = None) -> None:
        """Start the broker with these properties (and listeners beside PLAINTEXT)."""
        from stratalog.peers.kafka import KafkaBroker, KafkaSetupError

        self.broker = KafkaBroker(props, heap=self.heap, startup_timeout=180, listeners=listeners)
        try:
            self.broker.start()
        except KafkaSetupError as e:
            self.broker = None
            raise TargetUnavailable(str(e)) from e
        self.bootstrap = self.broker.bootstrap

    def stop(self) -> None:
        if self.broker is not None:
            self.broker.stop()
            self.broker = None

    @property
    def pid(self) -> int | None:
        return self.broker.pid if self.broker is not None else None

    def data_dirs(self) -> list[Path]:
        if self.broker is None or self.broker.log_dir is None:
            return []
        return [self.broker.log_dir / "data"]
