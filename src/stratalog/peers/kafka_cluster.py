"""A three-node Apache Kafka 4.4.0 KRaft cluster on 127.0.0.1: the fault harness's baseline.

Each node is one JVM in combined mode (``process.roles=broker,controller``) and a voter of a
static controller quorum (``controller.quorum.voters``), so three JVMs make a cluster that
survives the loss of any one node, with the same jars as :class:`~stratalog.peers.kafka.
KafkaBroker` (:func:`~stratalog.peers.kafka.resolve_kafka`). A node keeps its ports and its log
directory across :meth:`KafkaCluster.kill` and :meth:`KafkaCluster.start_node`, so a restart
recovers its own log the way a crashed broker does; every signal goes to one PID.

Durability defaults are the safe ones a baseline needs: replication factor 3 for every internal
topic, ``min.insync.replicas=2``, ``unclean.leader.election.enable=false``.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from stratalog.peers.kafka import (
    BROKER_MAIN,
    KafkaSetupError,
    _free_port,
    _java,
    _jvm_base,
    _log4j2_config,
    _port_open,
    _random_cluster_id,
    _tail,
    resolve_kafka,
)


@dataclass
class KafkaNode:
    """One combined broker+controller JVM of a :class:`KafkaCluster`."""

    node_id: int
    port: int
    controller_port: int
    dir: Path
    proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def config(self) -> Path:
        return self.dir / "server.properties"

    @property
    def server_log(self) -> Path:
        return self.dir / "kafka.log"

    @property
    def console_log(self) -> Path:
        return self.dir / "console.log"

    @property
    def data_dir(self) -> Path:
        return self.dir / "data"


def _cluster_brokers(bootstrap: str, timeout: float) -> set[int]:
    """The node ids a metadata round trip through ``bootstrap`` lists (empty on failure)."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
    try:
        md = admin.list_topics(timeout=timeout)
    except KafkaException:
        return set()
    return set(md.brokers)


def _with_jvm_options(base: list[str], options: list[str]) -> list[str]:
    """``base`` (java, its options, -cp, classpath) with ``options`` before the classpath."""
    cp = base.index("-cp")
    return [*base[:cp], *options, *base[cp:]]


# Three JVMs share two cores here: the client compiler alone starts (and restarts after a
# kill -9) a node in about half the time, and a broker at a few hundred records/s never needs C2.
JVM_OPTIONS = ["-XX:TieredStopAtLevel=1", "-XX:+ExitOnOutOfMemoryError"]


class KafkaCluster:
    """``nodes`` combined-mode Kafka nodes on free loopback ports under ``root``.

    ``root`` defaults to a temporary directory, removed on :meth:`stop` unless ``keep``.
    ``properties`` override :attr:`DEFAULTS` on every node. Use as a context manager or call
    :meth:`start` / :meth:`stop`; the cluster is also stopped at interpreter exit.
    """

    DEFAULTS: Mapping[str, str] = {
        "offsets.topic.replication.factor": "3",
        "offsets.topic.num.partitions": "3",
        "transaction.state.log.replication.factor": "3",
        "transaction.state.log.min.isr": "2",
        "share.coordinator.state.topic.replication.factor": "3",
        "share.coordinator.state.topic.min.isr": "2",
        "default.replication.factor": "3",
        "min.insync.replicas": "2",
        "unclean.leader.election.enable": "false",
        "group.initial.rebalance.delay.ms": "0",
        "auto.create.topics.enable": "false",
        "num.partitions": "1",
        # Few threads: three JVMs share two cores with the brokers' clients.
        "num.network.threads": "2",
        "num.io.threads": "2",
        "num.replica.fetchers": "1",
        "background.threads": "2",
        "log.cleaner.enable": "false",
    }

    def __init__(
        self,
        root: Path | None = None,
        nodes: int = 3,
        properties: Mapping[str, object] | None = None,
        *,
        heap: str = "384m",
        keep: bool = False,
        startup_timeout: float = 180,
        cache_dir: Path | None = None,
        jvm_options: list[str] | None = None,
    ) -> None:
        self.root = Path(root) if root is not None else None
        self.jvm_options = list(JVM_OPTIONS if jvm_options is None else jvm_options)
        self.count = nodes
        self.properties = {k: str(v) for k, v in (properties or {}).items()}
        self.heap = heap
        self.keep = keep if root is None else True  # a directory we were given is never removed
        self.startup_timeout = startup_timeout
        self.cache_dir = cache_dir
        self.cluster_id = ""
        self.nodes: list[KafkaNode] = []
        self._bases: dict[int, list[str]] = {}

    @property
    def bootstrap(self) -> str:
        return ",".join(n.bootstrap for n in self.nodes)

    def _properties(self, node: KafkaNode) -> dict[str, str]:
        voters = ",".join(f"{n.node_id}@127.0.0.1:{n.controller_port}" for n in self.nodes)
        props = {
            "process.roles": "broker,controller",
            "node.id": str(node.node_id),
            "controller.quorum.voters": voters,
            "listeners": (
                f"PLAINTEXT://127.0.0.1:{node.port},CONTROLLER://127.0.0.1:{node.controller_port}"
            ),
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{node.port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "log.dirs": str(node.data_dir),
            **self.DEFAULTS,
        }
        props.update(self.properties)
        return props

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> KafkaCluster:
        libs = resolve_kafka(self.cache_dir)
        if self.root is None:
            self.root = Path(tempfile.mkdtemp(prefix="stratalog-kafka-cluster-"))
        self.root.mkdir(parents=True, exist_ok=True)
        ports: set[int] = set()

        def port() -> int:
            while (p := _free_port()) in ports:
                pass
            ports.add(p)
            return p

        self.nodes = [
            KafkaNode(i, port(), port(), self.root / f"node-{i}") for i in range(1, self.count + 1)
        ]
        self.cluster_id = _random_cluster_id()
        log_configs = {}
        for n in self.nodes:
            n.dir.mkdir(parents=True, exist_ok=True)
            n.config.write_text("".join(f"{k}={v}\n" for k, v in self._properties(n).items()))
            log_configs[n.node_id] = _log4j2_config(n.dir / "log4j2.properties", n.server_log)
        java = _java()
        classpath = str(libs / "*")
        # One log4j2 config per node: each JVM logs to its own file.
        self._bases = {
            n.node_id: _with_jvm_options(
                _jvm_base(java, self.heap, log_configs[n.node_id], classpath), self.jvm_options
            )
            for n in self.nodes
        }
        atexit.register(self.stop)
        try:
            self._format()
            for n in self.nodes:
                self._spawn(n)
            self._wait(self.nodes, self.startup_timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _format(self) -> None:
        """kafka-storage format every node's directory, the JVMs in parallel."""
        procs = [
            (
                n,
                subprocess.Popen(
                    [
                        *self._bases[n.node_id],
                        "kafka.tools.StorageTool",
                        "format",
                        "--ignore-formatted",
                        "--cluster-id",
                        self.cluster_id,
                        "--config",
                        str(n.config),
                    ],
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                ),
            )
            for n in self.nodes
        ]
        for n, p in procs:
            out, _ = p.communicate(timeout=180)
            if p.returncode != 0:
                raise KafkaSetupError(
                    f"kafka-storage format failed for node {n.node_id} (exit {p.returncode}):\n"
                    + out.decode(errors="replace")
                )

    def _spawn(self, n: KafkaNode) -> None:
        with open(n.console_log, "ab") as console:
            n.proc = subprocess.Popen(
                [*self._bases[n.node_id], f"-Dkafka.logs.dir={n.dir}", BROKER_MAIN, str(n.config)],
                stdin=subprocess.DEVNULL,
                stdout=console,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def _wait(self, nodes: list[KafkaNode], timeout: float) -> None:
        """Until every node in ``nodes`` listens and the cluster's metadata lists it."""
        deadline = time.monotonic() + timeout
        want = {n.node_id for n in nodes}
        while True:
            for n in nodes:
                if n.proc is not None and n.proc.poll() is not None:
                    raise KafkaSetupError(
                        f"Kafka node {n.node_id} exited with status {n.proc.returncode} while "
                        f"starting.\n{self._log_tails(n)}"
                    )
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise KafkaSetupError(
                    f"Kafka nodes {sorted(want)} were not ready within {timeout:.0f}s.\n"
                    + "\n".join(self._log_tails(n) for n in nodes)
                )
            if all(_port_open(n.port) for n in nodes):
                listed = set()
                for n in nodes:
                    listed |= _cluster_brokers(n.bootstrap, min(5, remaining))
                if want <= listed:
                    return
            time.sleep(0.3)

    def start_node(self, n: KafkaNode, timeout: float = 120) -> None:
        """Start (or restart, on the same ports and log directory) one node; waits until the
        cluster lists it again."""
        if n.alive:
            return
        self._spawn(n)
        self._wait([n], timeout)

    def send_signal(self, n: KafkaNode, sig: int) -> None:
        if n.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(n.proc.pid, sig)

    def kill(self, n: KafkaNode) -> None:
        """SIGKILL (a crash) and reap."""
        proc, n.proc = n.proc, None
        if proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)

    def stop_node(self, n: KafkaNode, timeout: float = 30) -> None:
        """SIGTERM (after SIGCONT, in case it is paused), then SIGKILL once ``timeout`` passed."""
        proc = n.proc
        if proc is None:
            return
        self.send_signal(n, signal.SIGTERM)
        self.send_signal(n, signal.SIGCONT)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pass
        self.kill(n)

    def quorum_leader(self) -> int | None:
        """The KRaft quorum's leader (the active controller) as the nodes last wrote it in
        ``__cluster_metadata-0/quorum-state``: the entry with the highest epoch."""
        best: tuple[int, int] | None = None
        for n in self.nodes:
            path = n.data_dir / "__cluster_metadata-0" / "quorum-state"
            try:
                state = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            leader, epoch = state.get("leaderId", -1), state.get("leaderEpoch", -1)
            if leader is not None and leader >= 0 and (best is None or epoch > best[1]):
                best = (leader, epoch)
        return best[0] if best else None

    def node(self, node_id: int) -> KafkaNode:
        return next(n for n in self.nodes if n.node_id == node_id)

    def _log_tails(self, n: KafkaNode) -> str:
        parts = []
        for path in (n.console_log, n.server_log):
            tail = _tail(path, 30)
            if tail:
                parts.append(f"--- {path} (tail) ---\n{tail}")
        return "\n".join(parts) or f"(node {n.node_id} wrote no log output)"

    def stop(self) -> None:
        atexit.unregister(self.stop)
        for n in self.nodes:
            self.send_signal(n, signal.SIGCONT)
            self.send_signal(n, signal.SIGTERM)
        for n in self.nodes:
            self.stop_node(n, timeout=20)
        if self.root is not None and not self.keep:
            shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> KafkaCluster:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
