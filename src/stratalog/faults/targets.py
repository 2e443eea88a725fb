"""Systems under test, behind one small interface the nemesis and the runner use.

A :class:`Target` is a cluster of processes on 127.0.0.1 with names: its brokers, and a
*coordinator* whose faults stand for losing the cluster's metadata service - etcd for
Stratalog, the active KRaft controller (the quorum leader, itself a broker in combined mode)
for Kafka. Every process fault goes to one PID; a restart reuses the process's ports and data.

Network faults (Stratalog only, with ``network=True``) cut links through fault proxies
(:mod:`stratalog.faults.proxy`): each broker reaches etcd through a proxy of its own (the
``etcd`` link), and advertises a proxy in front of its replication listener
(``cluster.advertised.replication.port``), through which every other broker reaches it (the
``replication`` link; cutting it also cuts that broker's connections to the others' proxies).
A kill -9 behind a proxy looks alive to a peer's probe (the proxy still accepts), so without
network faults there are no proxies and failover after a kill is as fast as it is in production.
"""

from __future__ import annotations

import logging
import shutil
import signal
import time
from abc import ABC, abstractmethod
from pathlib import Path

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from stratalog.cluster.errors import ClusterError
from stratalog.cluster.local_cluster import BrokerProc, LocalCluster
from stratalog.faults.proxy import FaultProxy, Mode, owner
from stratalog.loopback import free_port
from stratalog.peers.kafka_cluster import KafkaCluster, KafkaNode

LINKS = ("etcd", "replication")

# Admin clients' librdkafka lines (refused connections while a broker is down) go nowhere.
_quiet = logging.getLogger("stratalog.faults.admin")
_quiet.addHandler(logging.NullHandler())
_quiet.propagate = False


def admin_client(bootstrap: str) -> AdminClient:
    return AdminClient({"bootstrap.servers": bootstrap, "logger": _quiet})


class Target(ABC):
    kind: str = ""

    @abstractmethod
    def start(self) -> None: ...

    @abstractmethod
    def stop(self) -> None: ...

    @property
    @abstractmethod
    def bootstrap(self) -> str: ...

    @property
    @abstractmethod
    def brokers(self) -> list[str]:
        """The brokers' names, e.g. ``broker-1``."""

    @abstractmethod
    def node_id(self, name: str) -> int | None:
        """The Kafka node id of a broker (None for a process that is not a broker)."""

    @abstractmethod
    def coordinator(self) -> str | None:
        """The process whose faults stand for a metadata-service fault, now (None: none)."""

    @abstractmethod
    def pid(self, name: str) -> int | None: ...

    @abstractmethod
    def kill(self, name: str) -> None:
        """SIGKILL, and reap."""

    @abstractmethod
    def restart(self, name: str, timeout: float = 120) -> int:
        """Start a killed process again; blocks until it serves. Returns the attempts it took;
        raises when it did not come back within ``timeout``."""

    @abstractmethod
    def pause(self, name: str) -> None:
        """SIGSTOP."""

    @abstractmethod
    def resume(self, name: str) -> None:
        """SIGCONT."""

    def cut(self, name: str, link: str, mode: Mode = "blackhole") -> None:
        """Partition broker ``name``'s ``link`` (one of ``LINKS``) until :meth:`reconnect`;
        only a target run behind proxies has links to cut (the CLI refuses the rest)."""
        raise ValueError(f"{self.kind} runs without proxies: no link of {name} to cut")

    def reconnect(self, name: str, link: str) -> None:
        raise ValueError(f"{self.kind} runs without proxies: no link of {name} to reconnect")

    @abstractmethod
    def topic_configs(self) -> dict[str, str]:
        """The configs a test topic is created with (RF 3 is the caller's)."""

    @abstractmethod
    def logs(self) -> list[Path]:
        """Log files worth keeping with a run's results."""

    @abstractmethod
    def data_root(self) -> Path | None:
        """The directory holding every process's data (removed after a valid run)."""

    def controller(self, timeout: float = 5) -> str | None:
        """The broker the cluster's metadata names controller now (None on failure)."""
        admin = admin_client(self.bootstrap)  # held: the future fails once it is destroyed
        try:
            found = admin.describe_cluster(request_timeout=timeout).result(timeout=timeout)
            node = found.controller
        except KafkaException:
            return None
        names = {self.node_id(n): n for n in self.brokers}
        return names.get(node.id) if node is not None else None

    def leaders(self, topic: str, timeout: float = 5) -> dict[int, str]:
        """partition -> leader's name, as the cluster's metadata says now (empty on failure)."""
        admin = admin_client(self.bootstrap)
        try:
            md = admin.list_topics(topic, timeout=timeout)
        except KafkaException:
            return {}
        t = md.topics.get(topic)
        if t is None or t.error is not None:
            return {}
        names = {self.node_id(n): n for n in self.brokers}
        return {p: names[pm.leader] for p, pm in t.partitions.items() if pm.leader in names}


class StratalogTarget(Target):
    """A :class:`~stratalog.cluster.local_cluster.LocalCluster`: etcd and N ``stratalog
    serve`` processes."""

    kind = "stratalog"

    def __init__(
        self,
        root: Path,
        brokers: int = 3,
        settings: dict[str, str] | None = None,
        log_level: str = "WARNING",
        network: bool = False,
    ) -> None:
        self.cluster = LocalCluster(root, brokers=brokers, settings=settings, log_level=log_level)
        self.network = network
        self.etcd_proxies: dict[str, FaultProxy] = {}
        self.replication_proxies: dict[str, FaultProxy] = {}

    def start(self) -> None:
        if self.network:
            self._start_proxies()
        try:
            self.cluster.start()
        except BaseException:
            self._close_proxies()
            raise

    def _start_proxies(self) -> None:
        etcd = self.cluster.etcd

        def brokers_pids() -> dict[str, int | None]:
            return {n: self.pid(n) for n in self.brokers}

        for b in self.cluster.brokers:
            name = f"broker-{b.node_id}"
            # etcd's port is known once it has started: resolved per connection.
            to_etcd = FaultProxy(lambda: ("127.0.0.1", etcd.client_port), name=f"etcd<-{name}")
            listener = free_port()
            to_broker = FaultProxy(
                ("127.0.0.1", listener),
                name=f"replication->{name}",
                source=lambda peer: owner(peer, brokers_pids()),
            )
            self.etcd_proxies[name] = to_etcd.start()
            self.replication_proxies[name] = to_broker.start()
            b.etcd_endpoint = f"http://127.0.0.1:{to_etcd.port}"
            b.settings = {
                **b.settings,
                "cluster.replication.port": str(listener),
                "cluster.advertised.replication.port": str(to_broker.port),
            }

    def _close_proxies(self) -> None:
        for p in [*self.etcd_proxies.values(), *self.replication_proxies.values()]:
            p.close()

    def stop(self) -> None:
        for b in self.cluster.brokers:  # a paused broker cannot act on SIGTERM
            self.cluster.send_signal(b, signal.SIGCONT)
        if self.cluster.etcd.proc is not None:
            self.cluster.etcd.resume()
        for p in [*self.etcd_proxies.values(), *self.replication_proxies.values()]:
            p.heal()  # a clean stop hands its logs over through etcd and its peers
        try:
            self.cluster.stop()
        finally:
            self._close_proxies()

    def cut(self, name: str, link: str, mode: Mode = "blackhole") -> None:
        self._need(name)
        if link == "etcd":
            self.etcd_proxies[name].cut(mode)
        elif link == "replication":
            self.replication_proxies[name].cut(mode)  # nobody reaches it
            for other, p in self.replication_proxies.items():
                if other != name:
                    p.cut(mode, sources={name})  # it reaches nobody
        else:
            raise ValueError(f"unknown link {link!r}: {', '.join(LINKS)}")

    def reconnect(self, name: str, link: str) -> None:
        if link == "etcd":
            self.etcd_proxies[name].heal()
        else:
            for p in self.replication_proxies.values():
                p.heal()

    @property
    def bootstrap(self) -> str:
        return self.cluster.bootstrap

    @property
    def brokers(self) -> list[str]:
        return [f"broker-{b.node_id}" for b in self.cluster.brokers]

    def _broker(self, name: str) -> BrokerProc | None:
        return next((b for b in self.cluster.brokers if f"broker-{b.node_id}" == name), None)

    def node_id(self, name: str) -> int | None:
        b = self._broker(name)
        return b.node_id if b else None

    def coordinator(self) -> str | None:
        return "etcd"

    def pid(self, name: str) -> int | None:
        if name == "etcd":
            return self.cluster.etcd.pid
        b = self._broker(name)
        return (b.pid or None) if b else None

    def kill(self, name: str) -> None:
        if name == "etcd":
            self.cluster.etcd.kill()
        else:
            b = self._need(name)
            self.cluster.stop_broker(b, signal.SIGKILL, timeout=10)

    def restart(self, name: str, timeout: float = 120) -> int:
        deadline = time.monotonic() + timeout
        attempts = 0
        while True:
            attempts += 1
            try:
                if name == "etcd":
                    self.cluster.etcd.start()
                else:
                    # The old incarnation's lease outlives a kill -9 by up to its TTL, and the
                    # broker refuses to join while it does: try again until it has expired.
                    self.cluster.start_broker(self._need(name), timeout=60)
                return attempts
            except ClusterError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)

    def pause(self, name: str) -> None:
        if name == "etcd":
            self.cluster.etcd.pause()
        else:
            self.cluster.send_signal(self._need(name), signal.SIGSTOP)

    def resume(self, name: str) -> None:
        if name == "etcd":
            self.cluster.etcd.resume()
        else:
            self.cluster.send_signal(self._need(name), signal.SIGCONT)

    def _need(self, name: str) -> BrokerProc:
        b = self._broker(name)
        if b is None:
            raise KeyError(name)
        return b

    def topic_configs(self) -> dict[str, str]:
        return {"min.insync.replicas": "2"}

    def logs(self) -> list[Path]:
        return [b.log_path for b in self.cluster.brokers] + [self.cluster.etcd.log_path]

    def data_root(self) -> Path | None:
        return self.cluster.root


class KafkaTarget(Target):
    """A three-node Apache Kafka KRaft cluster (:class:`~stratalog.peers.kafka_cluster.
    KafkaCluster`), the baseline."""

    kind = "kafka"

    def __init__(
        self,
        root: Path,
        nodes: int = 3,
        properties: dict[str, str] | None = None,
        flush_messages: bool = False,
    ) -> None:
        self.cluster = KafkaCluster(root, nodes, properties)
        self.flush_messages = flush_messages

    def start(self) -> None:
        self.cluster.start()

    def stop(self) -> None:
        self.cluster.stop()

    @property
    def bootstrap(self) -> str:
        return self.cluster.bootstrap

    @property
    def brokers(self) -> list[str]:
        return [f"kafka-{n.node_id}" for n in self.cluster.nodes]

    def node_id(self, name: str) -> int | None:
        prefix, _, num = name.partition("-")
        return int(num) if prefix == "kafka" and num.isdigit() else None

    def _node(self, name: str) -> KafkaNode:
        nid = self.node_id(name)
        if nid is None:
            raise KeyError(name)
        return self.cluster.node(nid)

    def coordinator(self) -> str | None:
        leader = self.cluster.quorum_leader()
        return None if leader is None else f"kafka-{leader}"

    def pid(self, name: str) -> int | None:
        return self._node(name).pid

    def kill(self, name: str) -> None:
        self.cluster.kill(self._node(name))

    def restart(self, name: str, timeout: float = 120) -> int:
        self.cluster.start_node(self._node(name), timeout=timeout)
        return 1

    def pause(self, name: str) -> None:
        self.cluster.send_signal(self._node(name), signal.SIGSTOP)

    def resume(self, name: str) -> None:
        self.cluster.send_signal(self._node(name), signal.SIGCONT)

    def topic_configs(self) -> dict[str, str]:
        configs = {"min.insync.replicas": "2", "unclean.leader.election.enable": "false"}
        if self.flush_messages:
            configs["flush.messages"] = "1"
        return configs

    def logs(self) -> list[Path]:
        return [p for n in self.cluster.nodes for p in (n.server_log, n.console_log)]

    def data_root(self) -> Path | None:
        return self.cluster.root


def make_target(
    kind: str,
    root: Path,
    *,
    settings: dict[str, str] | None = None,
    flush_messages: bool = False,
    log_level: str = "WARNING",
    network: bool = False,
) -> Target:
    """``stratalog`` or ``kafka``, with its data under ``root`` (``log_level``: Stratalog's;
    ``network``: fault proxies in every broker's links, Stratalog only)."""
    if kind == "stratalog":
        return StratalogTarget(root, settings=settings, log_level=log_level, network=network)
    if network:
        raise ValueError(f"network faults are not available against {kind}")
    if kind == "kafka":
        return KafkaTarget(root, properties=settings, flush_messages=flush_messages)
    raise ValueError(f"unknown target {kind!r}: stratalog or kafka")


def remove_data(target: Target) -> None:
    root = target.data_root()
    if root is not None:
        shutil.rmtree(root, ignore_errors=True)
