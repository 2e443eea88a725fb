"""Three-broker targets for ``stratalog bench``: a Stratalog cluster (etcd and three ``stratalog
serve``, fsync on every replica before the ack) and a three-node Apache Kafka KRaft cluster.

Both are driven by the lab's own clients (:class:`~stratalog.bench.clients.KafkaClientFactory`)
and create every topic with replication factor 3 and ``min.insync.replicas=2``. Besides what a
single-node target does, a cluster target names its brokers, says which one leads a partition
and which are in sync, and kills, stops and restarts one by PID: the failover and rejoin cases
(``bench/failover.py``, ``bench/rejoin.py``) need nothing more. The processes themselves are the
fault harness's (``faults/targets.py``), so a restart here is the one the fault tests trust.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import time
from abc import abstractmethod
from pathlib import Path

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from stratalog.bench.targets import KafkaProtocolTarget, TargetUnavailable, process_cpu_s, register
from stratalog.bench.workload import TargetSpec, Workload
from stratalog.faults import targets as fault_targets
from stratalog.peers.kafka import KafkaSetupError

# librdkafka's lines about refused connections while a broker is down go nowhere.
_quiet = logging.getLogger("stratalog.bench.cluster")
_quiet.addHandler(logging.NullHandler())
_quiet.propagate = False

REPLICATION_FACTOR = 3
MIN_INSYNC = "2"


class ClusterTarget(KafkaProtocolTarget):
    """A cluster of three brokers on 127.0.0.1 behind one bootstrap list."""

    replication_factor = REPLICATION_FACTOR
    cluster: fault_targets.Target

    def topic_config(self) -> dict[str, str]:
        return {"min.insync.replicas": MIN_INSYNC, **self.spec.topic_config}

    @property
    def pid(self) -> int | None:
        return self.cluster.pid(self.brokers[0]) if hasattr(self, "cluster") else None

    def pids(self) -> list[int]:
        """Every process of the cluster that does the work of storing: brokers (and etcd)."""
        if not hasattr(self, "cluster"):
            return []
        names = [*self.brokers, *self._metadata_processes()]
        return [p for n in names if (p := self.cluster.pid(n))]

    def _metadata_processes(self) -> list[str]:
        return []

    def cpu_s(self) -> float:
        # A killed broker's CPU is lost from the sum: the cases that kill one take no CPU
        # figure across the kill.
        return sum(process_cpu_s(p) for p in self.pids())

    @property
    def brokers(self) -> list[str]:
        return self.cluster.brokers

    def node_id(self, name: str) -> int:
        nid = self.cluster.node_id(name)
        assert nid is not None, name
        return nid

    def admin(self) -> AdminClient:
        return AdminClient({"bootstrap.servers": self.bootstrap, "logger": _quiet})

    def leader(self, topic: str, partition: int = 0, timeout: float = 5) -> str | None:
        return self.cluster.leaders(topic, timeout).get(partition)

    def leader_id(self, admin: AdminClient, topic: str, partition: int) -> int | None:
        """The partition's leader as the metadata names it now (None: none, or no answer)."""
        try:
            md = admin.list_topics(topic, timeout=1)
        except KafkaException:
            return None
        t = md.topics.get(topic)
        pm = t.partitions.get(partition) if t is not None and t.error is None else None
        return pm.leader if pm is not None and pm.leader >= 0 else None

    def partition_state(
        self, admin: AdminClient, topic: str, timeout: float = 2
    ) -> tuple[set[int], dict[int, set[int]]] | None:
        """(broker ids the metadata lists, partition -> in-sync broker ids), or None when no
        broker answered."""
        try:
            md = admin.list_topics(topic, timeout=timeout)
        except KafkaException:
            return None
        t = md.topics.get(topic)
        if t is None or t.error is not None:
            return None
        return set(md.brokers), {p: set(pm.isrs) for p, pm in t.partitions.items()}

    def wait_in_sync(
        self, topic: str, node: int, want: bool = True, timeout: float = 120
    ) -> float | None:
        """Wait until ``node`` is (``want``) or is not in every partition's in-sync set;
        returns the seconds it took, None on timeout."""
        admin = self.admin()
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            st = self.partition_state(admin, topic)
            if st is not None and st[1] and all((node in isr) == want for isr in st[1].values()):
                return time.monotonic() - t0
            time.sleep(0.05)
        return None

    def wait_all_in_sync(self, topic: str, timeout: float = 60) -> None:
        """Until every broker is in every partition's in-sync set. A fresh Stratalog cluster
        fills the in-sync sets of its first topic's logs about a second after creating it (the
        replication links start then); stopping a primary before that would leave its log with
        no in-sync member to take over."""
        for b in self.brokers:
            if self.wait_in_sync(topic, self.node_id(b), True, timeout) is None:
                raise RuntimeError(f"{self.name}: {b} not in the in-sync sets of {topic}")

    def kill(self, name: str) -> None:
        self.cluster.kill(name)

    def restart(self, name: str, timeout: float = 180) -> None:
        self.cluster.restart(name, timeout=timeout)

    @abstractmethod
    def stop_broker(self, name: str) -> None:
        """A clean stop (SIGTERM): leadership handed over first, as in a rolling restart."""

    @abstractmethod
    def broker_data_dir(self, name: str) -> Path: ...

    def data_dirs(self) -> list[Path]:
        return [self.broker_data_dir(n) for n in self.brokers]

    def start(self) -> None:
        wd = self._mkworkdir()
        self.cluster = self._make(wd / "cluster")
        try:
            self.cluster.start()
        except KafkaSetupError as e:  # no Java or no Kafka jars here: skipped, not failed
            raise TargetUnavailable(f"{self.name}: {e}") from e
        self.bootstrap = self.cluster.bootstrap

    def stop(self) -> None:
        # Called once more by the runner after a failed start: stop what did start, once.
        cluster = getattr(self, "cluster", None)
        if cluster is not None:
            del self.cluster
            cluster.stop()
        self._rmworkdir()

    @abstractmethod
    def _make(self, root: Path) -> fault_targets.Target: ...


@register
class StratalogClusterTarget(ClusterTarget):
    """etcd and three ``stratalog serve`` (``LocalCluster``): virtual logs replicated by push,
    acknowledged once every in-sync replica fsynced. ``settings``: broker settings for all."""

    kind = "stratalog-cluster"
    cluster: fault_targets.StratalogTarget

    def __init__(self, spec: TargetSpec, workload: Workload) -> None:
        super().__init__(spec, workload)
        self.settings = {"fsync": workload.fsync, **{k: str(v) for k, v in spec.settings.items()}}

    def describe(self) -> str:
        return (
            f"Stratalog, 3 brokers + etcd (fsync={self.settings['fsync']} on every replica), "
            f"RF 3, min.insync.replicas={MIN_INSYNC}"
        )

    def version(self) -> str:
        from importlib.metadata import version

        return version("stratalog")

    def _make(self, root: Path) -> fault_targets.Target:
        # STRATALOG_BENCH_BROKER_LOG=INFO keeps the brokers' reasons (a failover's probe, its
        # election) in the run's logs/ for a trial worth explaining.
        level = os.environ.get("STRATALOG_BENCH_BROKER_LOG", "WARNING")
        return fault_targets.StratalogTarget(root, settings=self.settings, log_level=level)

    def _metadata_processes(self) -> list[str]:
        return ["etcd"]

    def stop(self) -> None:
        # With the brokers' log level raised, their logs outlive the work directory.
        cluster = getattr(self, "cluster", None)
        if cluster is not None and "STRATALOG_BENCH_BROKER_LOG" in os.environ:
            keep = Path("bench-broker-logs") / time.strftime("%Y%m%dT%H%M%S")
            keep.mkdir(parents=True, exist_ok=True)
            for f in cluster.logs():
                if f.exists():
                    shutil.copy2(f, keep / f.name)
            _quiet.warning("broker logs kept in %s", keep)
        super().stop()

    def stop_broker(self, name: str) -> None:
        b = self.cluster._need(name)
        self.cluster.cluster.stop_broker(b, signal.SIGTERM, timeout=60)

    def broker_data_dir(self, name: str) -> Path:
        return self.cluster._need(name).data_dir


@register
class KafkaClusterTarget(ClusterTarget):
    """Apache Kafka 4.4.0, three combined broker+controller JVMs (``KafkaCluster``), with the
    threads and JIT of the single-node ``kafka`` target. ``settings``: broker properties (plus
    ``heap``, default 1g); ``topic_config``: e.g. ``flush.messages = "1"``."""

    kind = "kafka-cluster"
    cluster: fault_targets.KafkaTarget

    def __init__(self, spec: TargetSpec, workload: Workload) -> None:
        super().__init__(spec, workload)
        props = {k: str(v) for k, v in spec.settings.items()}
        self.heap = props.pop("heap", "1g")
        # The fault harness trims threads and the JIT for a few hundred records/s; a throughput
        # benchmark gives Kafka what the single-node target gives it.
        self.props = {"num.network.threads": "3", "num.io.threads": "8", **props}

    def describe(self) -> str:
        cfg = ", ".join(f"{k}={v}" for k, v in self.spec.topic_config.items())
        durability = cfg or "default durability: page cache"
        return f"Apache Kafka, 3 KRaft nodes ({durability}), RF 3, min.insync.replicas={MIN_INSYNC}"

    def version(self) -> str:
        from stratalog.peers.kafka import KAFKA_VERSION

        return KAFKA_VERSION

    def _make(self, root: Path) -> fault_targets.Target:
        t = fault_targets.KafkaTarget(root, properties=self.props)
        t.cluster.heap = self.heap
        t.cluster.jvm_options = ["-XX:+ExitOnOutOfMemoryError"]
        return t

    def stop_broker(self, name: str) -> None:
        self.cluster.cluster.stop_node(self.cluster._node(name), timeout=60)

    def broker_data_dir(self, name: str) -> Path:
        return self.cluster._node(name).data_dir
