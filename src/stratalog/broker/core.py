"""The running broker: metadata, storage, groups and the background tasks that tend them.

``BrokerCore`` owns the state every API handler works on. It is started and stopped inside an
event loop; ``stratalog.Broker`` (embedded) and ``stratalog serve`` (CLI) both drive it.
"""

from __future__ import annotations

import asyncio
import logging
import resource
import time
import uuid
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

from stratalog import splits
from stratalog.broker import group_timers, metrics
from stratalog.broker.autoscaler import Autoscaler
from stratalog.broker.backlog_sender import BacklogSender
from stratalog.broker.consumer_groups import ConsumerGroups, TopicTable, clock_ms
from stratalog.broker.cpu_isolation import JournalThreads, broker_cpus, parse_cpus, pin_this_thread
from stratalog.broker.disk_guard import DiskGuard
from stratalog.broker.group_coordinator import GroupCoordinator
from stratalog.broker.group_records import GroupKey, GroupRecord
from stratalog.broker.offset_records import OFFSETS_TOPIC, OffsetRecordError, partition_for
from stratalog.broker.offset_store import OffsetStore
from stratalog.broker.quotas import ByteQuotas, QuotaStore, from_json, to_json
from stratalog.broker.refusals import Refusals
from stratalog.broker.share_groups import ShareGroups
from stratalog.broker.share_sessions import ShareSessions
from stratalog.broker.share_state import ShareStateStore
from stratalog.broker.share_state_records import SHARE_STATE_TOPIC
from stratalog.broker.stopping import BoundedStop
from stratalog.broker.topic_config import TopicConfigView
from stratalog.broker.txn_coordinator import TransactionCoordinator
from stratalog.broker.txn_records import TRANSACTION_STATE_TOPIC
from stratalog.cluster.etcd_tls import etcd_client_tls
from stratalog.cluster.metadata import (
    INTERNAL_TOPICS,
    MetadataError,
    MetadataStore,
    TopicMeta,
    is_internal,
)
from stratalog.config import BrokerConfig
from stratalog.security.acl_store import AclStore
from stratalog.security.authorizer import Authorizer, parse_super_users
from stratalog.security.credentials import CredentialStore, read_plain_users
from stratalog.security.listeners import Listener
from stratalog.storage.backlog_loader import BacklogLoader
from stratalog.storage.chunk_index import RUN_CACHE
from stratalog.storage.cleaner import Cleaner, CleanerSettings, CompactionPolicy
from stratalog.storage.direct_read import DirectReader
from stratalog.storage.journal import SLOWEST_SYNC, StorageFailure
from stratalog.storage.log_store import LogStore, RetentionPolicy, StorageConfig
from stratalog.storage.partition import PartitionLog
from stratalog.storage.priority import lower_this_thread
from stratalog.storage.segment import mkdir_durable
from stratalog.storage.throttle import ByteRate, FsyncGuidedRate
from stratalog.storage.tiering import Migrator, TierSettings

if TYPE_CHECKING:
    from stratalog.cluster.controller import Controller
    from stratalog.cluster.node import ClusterNode, ClusterTopic
    from stratalog.cluster.reassignment import Mover
    from stratalog.cluster.replication import Replicator

log = logging.getLogger(__name__)


def _raise_fd_limit() -> None:
    # The per-partition layout keeps two descriptors per partition open.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


# With appends through the page cache, fresh chunks are already in memory there and go out by
# sendfile without a copy; a cache of our own costs a copy per append and, in workload c, doubled
# the broker's produce p99 (docs/benchmarks.md). Direct appends leave nothing in the page cache.
DIRECT_IO_TAIL_CACHE = 512 * 1024 * 1024
LOOP_LAG_PROBE_S = 0.01  # the event-loop lag probe's timer (stratalog_event_loop_lag_seconds)
SLOT_REFRESH_S = 1.0  # read slots published again (leadership changes have no storage event)
# Kafka's topic configs of __consumer_offsets (DescribeConfigs shows the same).
OFFSETS_TOPIC_CONFIGS = {
    "cleanup.policy": "compact",
    "compression.type": "producer",
    "segment.bytes": "104857600",
}
# __transaction_state: the same (Kafka writes it uncompressed; Stratalog never recompresses).
TRANSACTION_STATE_TOPIC_CONFIGS = dict(OFFSETS_TOPIC_CONFIGS)
# __share_group_state: Kafka's share coordinator keeps it compacted and uncompressed too.
SHARE_STATE_TOPIC_CONFIGS = dict(OFFSETS_TOPIC_CONFIGS)
# Each internal topic's partitions setting and topic configs.
_INTERNAL_TOPIC_SETTINGS = {
    OFFSETS_TOPIC: ("offsets.topic.num.partitions", OFFSETS_TOPIC_CONFIGS),
    TRANSACTION_STATE_TOPIC: (
        "transaction.state.log.num.partitions",
        TRANSACTION_STATE_TOPIC_CONFIGS,
    ),
    SHARE_STATE_TOPIC: (
        "share.coordinator.state.topic.num.partitions",
        SHARE_STATE_TOPIC_CONFIGS,
    ),
}


def _read_slots_mode(config: BrokerConfig) -> int | None:
    """The slot files' mode (storage.read_slots.mode), None when slots are off."""
    if not config["storage.read_slots"]:
        return None
    mode = config["storage.read_slots.mode"].strip()
    if not mode:
        return 0o600 if config.authorizer_enabled else 0o644
    return int(mode, 8)


def tail_cache_bytes(config: BrokerConfig) -> int:
    size = config["cache.tail_bytes"]
    if size >= 0:
        return size
    return DIRECT_IO_TAIL_CACHE if config["storage.direct_io"] else 0


class BrokerCore:
    def __init__(self, data_dir: Path, config: BrokerConfig) -> None:
        self.data_dir = Path(data_dir)
        self.config = config
        self._warned_past_retention: set[str] = set()
        # Who may log in on SASL listeners (a PLAIN users file that cannot be read is a
        # ConfigError, raised before anything is started).
        self.credentials = CredentialStore(
            self.data_dir / "meta" / "scram-credentials.json",
            read_plain_users(config["sasl.plain.users.file"]),
        )
        # TLS to an https etcd: its files are checked now, before anything is started.
        self.etcd_tls = etcd_client_tls(config)
        # Authorization (authorizer.class.name): None when off, and then nothing is checked.
        self.authorizer: Authorizer | None = None
        if config.authorizer_enabled:
            self.authorizer = Authorizer(
                parse_super_users(config["super.users"]),
                config["allow.everyone.if.no.acl.found"],
            )
        self.acls = AclStore(self.data_dir / "meta" / "acls.json", self.authorizer)
        # Before any thread or process is started: they inherit the broker's CPUs.
        sender_cpus = parse_cpus(config["fetch.backlog.sender_cpus"])
        self._broker_cpus = broker_cpus(sender_cpus) if sender_cpus else frozenset()
        self._journal_threads = JournalThreads()
        if self._broker_cpus:
            pin_this_thread(self._broker_cpus, "the broker")
        self.node_id: int = config["node.id"]
        # Cluster mode (cluster.etcd set): this broker's membership, joined once listening.
        self.cluster: ClusterNode | None = None
        self.replicator: Replicator | None = None
        # Internal topics being created in etcd (cluster mode), by name.
        self._internal_creating: dict[str, asyncio.Future] = {}
        self.controller: Controller | None = None
        self.mover: Mover | None = None
        self.metadata = MetadataStore(self.data_dir)
        self.quotas = QuotaStore(self.data_dir)
        self.byte_quotas = ByteQuotas(self.quotas)
        self.offsets = OffsetStore(self.data_dir, self)
        self.txn = TransactionCoordinator(self)
        self.coordinator = GroupCoordinator(
            min_session_ms=config["group.min.session.timeout.ms"],
            max_session_ms=config["group.max.session.timeout.ms"],
            initial_rebalance_delay_ms=config["group.initial.rebalance.delay.ms"],
            empty_group_ms=config["offsets.retention.check.interval.ms"],
        )
        self.coordinator.persist = self._persist_group
        self.consumer_groups = ConsumerGroups(
            session_timeout_ms=config["group.consumer.session.timeout.ms"],
            heartbeat_interval_ms=config["group.consumer.heartbeat.interval.ms"],
        )
        self.consumer_group_timer: asyncio.TimerHandle | None = None  # group_timers.py
        self.group_writes: set[asyncio.Future] = set()  # records of expired members
        self._group_writes_pending: dict[str, asyncio.Future] = {}  # group -> its last write
        # Logs led here whose tail is not committed yet, with the primary that leads them.
        self._unsettled_logs: dict[str, object] = {}
        self.share_groups = ShareGroups(
            session_timeout_ms=config["group.share.session.timeout.ms"],
            heartbeat_interval_ms=config["group.share.heartbeat.interval.ms"],
            max_size=config["group.share.max.size"],
        )
        self.share_sessions = ShareSessions()
        self.share_state = ShareStateStore(self)  # __share_group_state (share_state.py)
        self.share_group_timer: asyncio.TimerHandle | None = None  # expiry (api/share_groups)
        self.share_waiters: list[asyncio.Future[None]] = []  # ShareFetches waiting for records
        RUN_CACHE.capacity = config["storage.index_cache_bytes"]
        self.store = LogStore(
            StorageConfig(
                self.data_dir,
                layout=config["storage.layout"],
                virtual_logs=config["storage.virtual_logs"],
                fsync=config.fsync_policy,
                group_commit_ms=config["group_commit_ms"],
                group_commit_bytes=config["group_commit_bytes"],
                segment_bytes=config["segment.bytes"],
                segment_ms=config["segment.ms"],
                tail_cache_bytes=tail_cache_bytes(config),
                io_threads=config["storage.io_threads"],
                fsync_via=config["storage.fsync_via"],
                direct_io=config["storage.direct_io"],
                direct_min_bytes=config["storage.direct_min_bytes"],
                verify_on_open=config["storage.verify_on_open"],
                hot_path=Path(config["tiers.hot.path"]) if config["tiers.hot.path"] else None,
                cold_location=config["tiers.cold.url"] or config["tiers.cold.path"] or None,
                cold_options=config.cold_options,
                cold_shared=config["tiers.cold.shared"],
                replicated=bool(config["cluster.etcd"]),
                read_slots_mode=_read_slots_mode(config),
            )
        )
        self.migrator = Migrator(
            self.store,
            TierSettings(
                hot_capacity=config["tiers.hot.capacity"],
                threshold=config["tiers.migrate.threshold"],
                max_bytes_per_sec=config["tiers.migrate.max_bytes_per_sec"],
                cold_bytes_per_sec=config["tiers.cold.max_bytes_per_sec"],
                threads=config["tiers.migrate.threads"],
                interval_ms=config["tiers.migrate.interval.ms"],
                promote=config["tiers.promote"],
                # The copy workers (nice +10, paced) keep every CPU, as without pinning: on
                # the broker's alone they would take the loop's core (e-slow-cold run13/run14).
                worker_cpus=self._broker_cpus | sender_cpus,
            ),
            self.local_retention,
        )
        self.autoscaler = Autoscaler(self)  # splits under load (broker/autoscaler.py)
        # Log compaction of cleanup.policy=compact topics (storage/cleaner.py), in a worker
        # process of its own with the same CPUs as migration's.
        self.cleaner = Cleaner(
            self.store,
            CleanerSettings(
                io_bytes_per_sec=config["log.cleaner.io.max.bytes.per.second"],
                max_keys=max(1, config["log.cleaner.dedupe.buffer.size"] // 128),
                segment_bytes=min(config["segment.bytes"], 64 << 20),
                backoff_ms=config["log.cleaner.backoff.ms"],
                cpus=self._broker_cpus | sender_cpus,
                sched_idle=config["log.cleaner.priority"] == "idle",
            ),
        )
        # Backlog reads (from segment files) share one budget, so catch-up consumers cannot
        # take the CPU and the disk the tail's producers need (BookKeeper's isolation).
        self.backlog_rate = ByteRate(config["fetch.backlog.max_bytes_per_sec"])
        # The same budget for sending those answers, kept at the reads' rate (fetch.py).
        self.backlog_send_rate = ByteRate(config["fetch.backlog.max_bytes_per_sec"])
        self.backlog_pacer: FsyncGuidedRate | None = None
        if config["fetch.backlog.fsync_target_ms"] > 0:
            self.backlog_pacer = FsyncGuidedRate(
                self.backlog_rate,
                target=config["fetch.backlog.fsync_target_ms"] / 1000,
                floor=config["fetch.backlog.min_bytes_per_sec"],
                ceiling=config["fetch.backlog.max_bytes_per_sec"] or 4_000_000_000,
                followers=(self.backlog_send_rate,),
            )
        metrics.BACKLOG_RATE.set(self.backlog_rate.rate)
        # The cleaner's worker reads and writes at a rate steered the same way, if asked.
        self.cleaner_pacer: FsyncGuidedRate | None = None
        if config["log.cleaner.fsync_target_ms"] > 0:
            self.cleaner_pacer = FsyncGuidedRate(
                self.cleaner.rate,
                target=config["log.cleaner.fsync_target_ms"] / 1000,
                floor=config["log.cleaner.min_bytes_per_sec"],
                ceiling=config["log.cleaner.io.max.bytes.per.second"] or 4_000_000_000,
            )
        metrics.CLEANER_RATE.set(self.cleaner.rate.rate)
        cache = self.store.tail_cache
        metrics.TAIL_CACHE_BYTES.set_function(lambda: cache.bytes)
        self.direct_reader = (
            DirectReader(
                config["fetch.read_ahead.bytes"],
                io_bytes=config["fetch.backlog.io_bytes"],
                io_depth=config["fetch.backlog.io_depth"],
            )
            if config["fetch.backlog.direct_reads"]
            else None
        )
        self.backlog_sender: BacklogSender | None = None
        if config["fetch.backlog.sender"] == "process":
            self.backlog_sender = BacklogSender(
                config["fetch.backlog.sender_priority"],
                config["fetch.backlog.io_bytes"],
                # A fixed budget is the process's to keep; a steered one stays with the loop.
                rate=0 if self.backlog_pacer is not None else self.backlog_rate.rate,
                cpus=sender_cpus,
            )
        self.backlog_loader = BacklogLoader(
            config["fetch.backlog.io_bytes"], config["fetch.backlog.io_depth"]
        )
        self.read_executor = ThreadPoolExecutor(
            config["storage.read_threads"],
            thread_name_prefix="stratalog-read",
            initializer=lower_this_thread if config["storage.read_priority"] == "low" else None,
        )
        self.meta_executor = ThreadPoolExecutor(1, thread_name_prefix="stratalog-meta")
        self.disk = DiskGuard(self.store.root, config["storage.min_free_bytes"])
        self.refusals = Refusals()  # idempotent batches refused unwritten (api/produce.py)
        self.host = config["host"]
        self.port = config["port"]
        # The inter-broker listener once bound (its advertised address is the broker's), and
        # every listener by name (broker/broker.py fills them in).
        self.listener: Listener | None = None
        self.listeners: dict[str, Listener] = {}
        self._tasks: list[asyncio.Task] = []
        self.admin_address = ""  # host:port of the HTTP admin endpoint, once listening
        self.started_at = time.time()

    # -- addresses -----------------------------------------------------------------------------
    @property
    def advertised_host(self) -> str:
        if self.listener is not None:
            return self.listener.endpoint[0]
        return self.config["advertised.host"] or self.host

    @property
    def advertised_port(self) -> int:
        if self.listener is not None:
            return self.listener.endpoint[1]
        return self.config["advertised.port"] or self.port

    def endpoint(self, conn) -> tuple[str, int]:
        """(host, port) this broker is known by to a client on ``conn``: the address of the
        listener it connected to, as Kafka answers."""
        listener = getattr(conn, "listener", None)
        if listener is not None:
            return listener.endpoint
        return self.advertised_host, self.advertised_port

    @staticmethod
    def broker_endpoint(info, conn) -> tuple[str, int]:
        """(host, port) of cluster member ``info`` (a BrokerInfo) for a client on ``conn``:
        its listener of the same name, else its registered address."""
        listener = getattr(conn, "listener", None)
        if listener is not None and listener.name in info.listeners:
            host, port = info.listeners[listener.name]
            return host, port
        return info.host, info.port

    # -- life cycle ----------------------------------------------------------------------------
    def open(self) -> None:
        _raise_fd_limit()
        mkdir_durable(self.data_dir)
        self.metadata.load()
        self.credentials.load()
        self.quotas.load()
        self.acls.load()
        triples = [
            (t.name, i, uid)
            for t in self.metadata.topics.values()
            for i, uid in enumerate(t.partitions)
        ]
        self.store.open(triples)
        self.offsets.load()  # reads the offsets topic: after the logs are recovered
        self.txn.load()  # and the transaction log
        self.share_state.load()  # and the share groups' state

    def start_background(self) -> None:
        if self._broker_cpus:
            # The journal threads of the write path's file systems commit what the group
            # commit's fsyncs wait for: they belong on the broker's CPUs (cpu_isolation.py).
            self._journal_threads.pin([self.store.root, self.data_dir], self._broker_cpus)
        self._tasks.append(asyncio.ensure_future(self._loop_lag_probe()))
        self._tasks.append(asyncio.ensure_future(self.disk.run()))
        self._tasks.append(asyncio.ensure_future(self._checkpoint_loop()))
        self._tasks.append(asyncio.ensure_future(self._retention_loop()))
        self._tasks.append(asyncio.ensure_future(self.autoscaler.run()))
        if self.store.slots is not None:
            self.store.slots.write_identity(
                {"cluster_id": self.metadata.cluster_id, "node_id": self.node_id}
            )
            self._tasks.append(asyncio.ensure_future(self._slot_refresh_loop()))
        if self.backlog_pacer is not None or self.cleaner_pacer is not None:
            self._tasks.append(asyncio.ensure_future(self._fsync_pacer_loop()))
        if self.backlog_sender is not None:
            self.backlog_sender.start()
        if self.store.cold is not None:
            self._tasks.append(asyncio.ensure_future(self.migrator.run()))
        if self.config["log.cleaner.enable"]:
            self._tasks.append(asyncio.ensure_future(self.cleaner.run(self.compaction_policies)))
        self._restore_groups()  # (their members' session timers need the running loop)
        self.txn.start()  # finishes the transactions found prepared, checks timeouts

    async def close(self, bound_s: float = 30.0) -> bool:
        """Stop everything, each step bounded (stopping.py); False if any was given up."""
        stop = BoundedStop(bound_s)
        if self.controller is not None:
            await stop.step("the controller", self.controller.close())
        if self.mover is not None:
            await stop.step("the reassignments", self.mover.close())
        if self.cluster is not None:
            self.cluster.leaving = True  # a peer may end its lease first: no new registration
        if self.replicator is not None:
            await stop.step("handing leadership over", self.replicator.hand_over())
            await stop.step("the replication links", self.replicator.close())
        if self.cluster is not None:
            await stop.step("leaving the cluster", self.cluster.leave())
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            try:
                await t
            except (asyncio.CancelledError, Exception):
                pass
        self._tasks.clear()
        if self.backlog_sender is not None:
            self.backlog_sender.close()
        self.migrator.close()
        self.cleaner.close()
        self.coordinator.shutdown()
        if self.consumer_group_timer is not None:
            self.consumer_group_timer.cancel()
        if self.share_group_timer is not None:
            self.share_group_timer.cancel()
        await stop.step("the transaction coordinator", self.txn.close())
        await stop.step("the offsets topic's last commits", self.offsets.close())
        await stop.step("the share groups' state", self.share_state.close())
        await stop.step("the logs' last fsyncs and clean-shutdown markers", self.store.close())
        await stop.blocking("the read threads", lambda: self.read_executor.shutdown(wait=True))
        await stop.blocking("the metadata thread", lambda: self.meta_executor.shutdown(wait=True))
        self._journal_threads.restore()
        return stop.complete

    def abandon(self) -> None:
        """Stop without flushing anything (tests of crash recovery in-process)."""
        for t in self._tasks:
            t.cancel()
        if self.backlog_sender is not None:
            self.backlog_sender.close()
        self.migrator.close()
        self.cleaner.close()
        self.coordinator.shutdown()
        if self.consumer_group_timer is not None:
            self.consumer_group_timer.cancel()
        if self.share_group_timer is not None:
            self.share_group_timer.cancel()
        self.txn.abandon()
        self.offsets.abandon()
        self.share_state.abandon()
        self.store.abandon()
        self.read_executor.shutdown(wait=False)
        self.meta_executor.shutdown(wait=False)
        self._journal_threads.restore()

    async def _loop_lag_probe(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            due = loop.time() + LOOP_LAG_PROBE_S
            await asyncio.sleep(LOOP_LAG_PROBE_S)
            metrics.LOOP_LAG_SECONDS.observe(max(0.0, loop.time() - due))

    async def _checkpoint_loop(self) -> None:
        interval = self.config["index.checkpoint.interval.ms"] / 1000
        while True:
            await asyncio.sleep(interval)
            try:
                await self.store.checkpoint()
            except Exception:
                log.exception("index checkpoint failed")

    async def _slot_refresh_loop(self) -> None:
        """Read slots again every second: leadership moves without a storage event."""
        slots = self.store.slots
        assert slots is not None
        while True:
            await asyncio.sleep(SLOT_REFRESH_S)
            slots.refresh(self.store.partitions.values())

    async def _fsync_pacer_loop(self) -> None:
        """Every 100 ms, the slowest group-commit fsync steers the rates of backlog reads and of
        the cleaner (each if configured): one reading of it for both."""
        SLOWEST_SYNC.take()  # what came before this broker's loop started does not count
        while True:
            await asyncio.sleep(0.1)
            slowest = SLOWEST_SYNC.take()
            if self.backlog_pacer is not None:
                metrics.BACKLOG_RATE.set(self.backlog_pacer.tick(slowest))
            if self.cleaner_pacer is not None:
                metrics.CLEANER_RATE.set(self.cleaner_pacer.tick(slowest))

    async def _retention_loop(self) -> None:
        interval = self.config["retention.check.interval.ms"] / 1000
        while True:
            await asyncio.sleep(interval)
            try:
                self.run_retention()
                self.expire_producers()
                self.apply_cluster_log_starts()  # (a replica that caught up moves further)
            except Exception:
                log.exception("retention failed")

    def expire_producers(self, now_ms: int | None = None) -> int:
        now = int(time.time() * 1000) if now_ms is None else now_ms
        after = self.config["producer.id.expiration.ms"]
        return sum(p.producers.expire(now, after) for p in self.store.partitions.values())

    def run_retention(self, now_ms: int | None = None) -> int:
        policies: dict[int, RetentionPolicy] = {}
        for t in self.metadata.topics.values():
            view = self.topic_config(t)
            if "delete" not in view.get("cleanup.policy").split(","):
                continue  # without the delete policy a topic keeps everything
            policy = RetentionPolicy(view.get_int("retention.ms"), view.get_int("retention.bytes"))
            for uid in t.partitions:
                policies[uid] = policy
        return self.store.apply_retention(policies, now_ms)

    def compaction_policies(self) -> dict[int, CompactionPolicy]:
        """uid -> compaction settings of every partition of a compacted topic. The internal
        topics are left out: they keep themselves short by rewriting (offset_store.py,
        txn_log.py)."""
        out: dict[int, CompactionPolicy] = {}
        for t in self.metadata.topics.values():
            if t.name in INTERNAL_TOPICS:
                continue
            view = self.topic_config(t)
            if "compact" not in view.policies():
                continue
            policy = CompactionPolicy(
                view.get_float("min.cleanable.dirty.ratio"),
                view.get_int("min.compaction.lag.ms"),
                view.get_int("max.compaction.lag.ms"),
                view.get_int("delete.retention.ms"),
            )
            for uid in t.partitions:
                out[uid] = policy
        return out

    def local_retention(self) -> dict[int, tuple[int, int]]:
        """uid -> (ms, bytes) data may stay hot (-1: no limit), from local.retention.* configs."""
        out = {}
        for t in self.metadata.topics.values():
            view = self.topic_config(t)
            ms = view.get_int("local.retention.ms")
            nbytes = view.get_int("local.retention.bytes")
            if ms == -2:
                ms = view.get_int("retention.ms")
            if nbytes == -2:
                nbytes = view.get_int("retention.bytes")
            for uid in t.partitions:
                out[uid] = (ms, nbytes)
        return out

    # -- cluster mode --------------------------------------------------------------------------
    async def join_cluster(self) -> None:
        """Join the cluster in ``cluster.etcd`` (once the listener's port is known); raises
        ClusterError when etcd cannot be reached, the node id is taken or the data directory
        belongs to another cluster."""
        # Imported here: the embedded single node loads no cluster code.
        from stratalog.cluster.controller import Controller
        from stratalog.cluster.node import ClusterNode
        from stratalog.cluster.reassignment import Mover
        from stratalog.cluster.replication import Replicator
        from stratalog.cluster.tiers import ClusterTiers

        endpoints = self.config.etcd_endpoints
        node = ClusterNode(
            endpoints,
            self.config["cluster.name"],
            self.node_id,
            self.advertised_host,
            self.advertised_port,
        )
        node.etcd_tls = self.etcd_tls
        node.listeners = {n: x.endpoint for n, x in self.listeners.items()}
        tls = None
        if self.config["cluster.replication.tls"]:
            from stratalog.security.tls import replication_contexts

            tls = replication_contexts(self.config)
        replicator = Replicator(node, self.store, self.config["replica.lag.time.max.ms"], tls)
        try:
            cid = await node.connect(None if self.metadata.fresh else self.metadata.cluster_id)
            if self.metadata.fresh:
                self.metadata.adopt_cluster(cid)
            bound = await replicator.start(self.host, self.config["cluster.replication.port"])
            node.replication_port = self.config["cluster.advertised.replication.port"] or bound
            node.on_topic = lambda name, t: self._cluster_topic(node, name, t)
            node.on_change = replicator.reconcile
            self.credentials.follow_cluster(node)  # SCRAM users are the cluster's, in etcd
            self.acls.follow_cluster(node)  # and so are the ACLs
            await node.register()
        except BaseException:
            await replicator.close()
            await node.leave()
            raise
        controller = Controller(node)
        mover = Mover(node, self.store, replicator)

        def changed() -> None:
            replicator.reconcile()
            controller.changed()
            mover.reconcile()

        node.on_change = changed
        # A broker that starts leading offsets partitions takes the commits replicated to it,
        # one that starts leading partitions of the transaction log coordinates their ids, and
        # one that starts leading any partition takes the log starts its leader moved.
        replicator.on_lead = self._took_lead
        node.on_log_start = self.apply_cluster_log_starts
        # Client quotas live in etcd: this broker's store follows them.
        node.on_quotas = lambda: self.quotas.replace(from_json(node.quotas), save=False)
        ClusterTiers(replicator, self.store, self.migrator)  # only primaries pick segments
        self.cluster = node
        self.replicator = replicator
        self.controller = controller
        self.mover = mover
        self.apply_cluster_log_starts()  # (what etcd held when this broker joined)
        self.quotas.replace(from_json(node.quotas), save=False)
        log.info("node %d joined cluster %s (%s)", self.node_id, cid, ", ".join(endpoints))

    def _took_lead(self, log_name: str, settled: bool) -> None:
        # Until what a new primary's log held is committed, its tail is not readable: groups
        # loaded from it may miss their last records (coordinator_error: LOAD_IN_PROGRESS).
        if settled:
            self._unsettled_logs.pop(log_name, None)
        elif self.replicator is not None:
            self._unsettled_logs[log_name] = self.replicator.primary_of(log_name)
        self._drop_groups_of(log_name)
        self.apply_cluster_log_starts()
        self.offsets.load()
        self._restore_groups()
        self.txn.load()
        self.share_state.load()

    def _offsets_partitions_in(self, log_name: str) -> set[int]:
        t = self.metadata.topics.get(OFFSETS_TOPIC)
        if t is None or self.cluster is None:
            return set()
        return {
            i
            for i in range(len(t.partitions))
            if (v := self.cluster.vlog_of(OFFSETS_TOPIC, i)) is not None and v.log_name == log_name
        }

    def _drop_groups_of(self, log_name: str) -> None:
        """This broker leads ``log_name`` anew: what it knew of the groups of the offsets
        partitions in it may be stale (another coordinator led them meanwhile); they are taken
        back from the records once the log's tail is committed."""
        parts = self._offsets_partitions_in(log_name)
        if not parts:
            return
        n = len(self.metadata.topics[OFFSETS_TOPIC].partitions)
        for gid in [g for g in self.consumer_groups.groups if partition_for(g, n) in parts]:
            self.consumer_groups.drop(gid)
        for gid in [g for g in self.share_groups.groups if partition_for(g, n) in parts]:
            self.share_groups.drop_membership(gid)
        for gid in [g for g in self.coordinator.groups if partition_for(g, n) in parts]:
            self.coordinator.unload(gid)

    def _restore_groups(self) -> None:
        """Take back the groups whose records the offsets partitions led here hold: classic
        groups' metadata, consumer-protocol and share groups' records (not yet for a partition
        whose tail is not committed: coordinator_error answers LOAD_IN_PROGRESS for it)."""
        t = self.metadata.topics.get(OFFSETS_TOPIC)
        n = len(t.partitions) if t is not None else 0
        loading = {i for i in range(n) if self.loading(OFFSETS_TOPIC, i)}
        classic = {g: r for g, r in self.offsets.group_records().items()
                   if partition_for(g, n) not in loading}  # fmt: skip
        modern = {k: v for k, v in self.offsets.modern_group_records().items()
                  if partition_for(k.group, n) not in loading}  # fmt: skip
        taken = self.coordinator.restore(classic)
        taken += self.consumer_groups.restore(modern, self.group_topics(), clock_ms())
        taken += self.share_groups.restore(modern, self.group_topics(), clock_ms())
        if taken:
            log.info("took back %d group(s) from %s", taken, OFFSETS_TOPIC)
        # Restored members expire if they never come back.
        group_timers.keep_expiring_consumer_groups(self)
        group_timers.keep_expiring_share_groups(self)

    def group_topics(self) -> TopicTable:
        """The topics as the group state machines see them."""
        return TopicTable(self.metadata.topics, is_internal)

    async def persist_group_records(self, group: str) -> None:
        """Write the records of a consumer-protocol or share group that changed (their
        ``changes``), before its member is answered, as Kafka's coordinator does. With no
        change, wait for the group's write in flight (what the answer tells may be its). Raises
        StorageFailure or OffsetRecordError if they were not written: they are written again
        with the group's next change."""
        consumer = self.consumer_groups.changes(group)
        share = self.share_groups.changes(group)
        if not consumer and not share:
            pending = self._group_writes_pending.get(group)
            if pending is not None:
                await asyncio.shield(pending)
            return
        write = asyncio.ensure_future(self._write_group_records(group, consumer + share))
        self._group_writes_pending[group] = write

        def done(f: asyncio.Future) -> None:
            if self._group_writes_pending.get(group) is f:
                del self._group_writes_pending[group]
            if f.cancelled() or f.exception() is not None:
                self.consumer_groups.unwritten(group, consumer)
                self.share_groups.unwritten(group, share)

        write.add_done_callback(done)
        await asyncio.shield(write)

    async def _persist_group(self, group: str, record: GroupRecord | None) -> None:
        """Write a classic group's metadata record (GroupCoordinator.persist). A failed write
        is logged: the members then rejoin after a restart, as before records were kept."""
        try:
            await self._write_group_records(group, [(GroupKey(group), record)])
        except (StorageFailure, OffsetRecordError) as e:
            log.warning("group %s: its metadata was not written: %s", group, e)
        except Exception:  # (never the group's SyncGroup answer: it is only not kept)
            log.exception("group %s: its metadata was not written", group)

    async def _write_group_records(self, group: str, entries: list) -> None:
        """Only the group's coordinator writes (StorageFailure if this broker no longer is)."""
        if self.cluster is not None:
            here = self.cluster_coordinator(group)
            if here is None or here[0] != self.node_id:
                raise StorageFailure(f"group {group}: this broker is not its coordinator")
        await self.offsets.write(entries)

    def _cluster_topic(self, node: ClusterNode, name: str, topic: ClusterTopic | None) -> None:
        """Mirror a topic change from etcd: metadata for every topic, storage for the
        partitions whose virtual log this broker replicates."""
        old = self.metadata.topics.get(name)
        if old is not None and (topic is None or old.topic_id != topic.topic_id):
            self.metadata.forget_topic(name)
            for uid in old.partitions:
                self.store.remove_partition(uid)
        if topic is None:
            return
        moved = [
            u
            for i, u in enumerate(old.partitions)
            if old.topic_id == topic.topic_id and i < len(topic.partitions)
            and topic.partitions[i] != u
        ] if old is not None else []  # fmt: skip
        self.metadata.put_topic(TopicMeta(name, topic.topic_id, topic.partitions, topic.configs))
        for uid in moved:  # reassigned: the partition lives on under its uid in another log
            self.store.remove_partition(uid)
        for i, (uid, vid) in enumerate(zip(topic.partitions, topic.vlogs, strict=True)):
            if uid not in self.store.partitions and node.hosts(vid):
                self.store.add_partition(name, i, uid, log_name=node.vlogs[vid].log_name)
            inherited = topic.inherited.get(i)
            p = self.store.partitions.get(uid)
            if inherited is not None and p is not None:  # a reassigned partition's old epochs
                p.inherited_end, p.inherited_epochs = inherited[0], list(inherited[1])
        if moved and name == OFFSETS_TOPIC:
            self.offsets.load()  # its partitions are other logs now
        self.apply_cluster_log_starts()  # (partitions added here take their log starts)
        if name == TRANSACTION_STATE_TOPIC:
            self.txn.load()
        elif name == SHARE_STATE_TOPIC:
            self.share_state.load()

    def leadership_epoch(self, topic: str, index: int) -> int:
        """The epoch of the partition's leadership (its virtual log's; 0 on a single node):
        a coordinator or share-partition leader reads its state again when it changes."""
        v = self.cluster.vlog_of(topic, index) if self.cluster is not None else None
        return v.epoch if v is not None else 0

    def loading(self, topic: str, index: int) -> bool:
        """Whether this broker just began leading ``topic``-``index`` and has not read all of
        it yet (a coordinator then answers COORDINATOR_LOAD_IN_PROGRESS, as Kafka's does)."""
        v = self.cluster.vlog_of(topic, index) if self.cluster is not None else None
        return v is not None and v.log_name in self._loading_logs()

    def _loading_logs(self) -> set[str]:
        """The logs led here whose tail is not committed yet (one whose primary was closed or
        replaced since is dropped: its settling will never be told)."""
        if self.replicator is not None:
            for name, primary in list(self._unsettled_logs.items()):
                if self.replicator.primary_of(name) is not primary:
                    del self._unsettled_logs[name]
        return set(self._unsettled_logs)

    def leader_error(self, topic: str, index: int) -> str | None:
        """Why this broker may not lead ``topic``-``index`` now (None: it may)."""
        if self.cluster is None:
            return None
        v = self.cluster.vlog_of(topic, index)
        if v is None:
            return "UNKNOWN_TOPIC_OR_PARTITION"
        if v.primary != self.node_id:
            return "NOT_LEADER_OR_FOLLOWER"
        if self.replicator is None or not self.replicator.leads(v.vid, v.epoch):
            return "NOT_LEADER_OR_FOLLOWER"  # not (yet, or any more) leading it at this epoch
        return None

    def in_sync_error(self, topic: str, index: int, min_insync: int) -> str | None:
        """NOT_ENOUGH_REPLICAS when fewer replicas than ``min_insync`` are in sync (acks=all)."""
        if self.cluster is None:
            return None
        v = self.cluster.vlog_of(topic, index)
        if v is not None and len(v.isr) < min_insync:
            return "NOT_ENOUGH_REPLICAS"
        return None

    # -- topics --------------------------------------------------------------------------------
    def note_past_retention(self, topic: str, records: int) -> None:
        """Records appended with timestamps already past their topic's retention.ms: counted,
        and said once per topic, since retention deletes them within moments of their
        acknowledgement and a historical load otherwise seems to vanish."""
        metrics.RECORDS_PAST_RETENTION.inc(records)
        if topic in self._warned_past_retention:
            return
        self._warned_past_retention.add(topic)
        log.warning(
            "topic %s: records arrive with timestamps older than its retention.ms (%d ms); "
            "retention deletes them within moments. For a historical load set retention.ms=-1 "
            "(or longer) on the topic, or message.timestamp.type=LogAppendTime",
            topic,
            self.topic_config(self.metadata.topics[topic]).get_int("retention.ms"),
        )

    def topic_config(self, topic: TopicMeta) -> TopicConfigView:
        return TopicConfigView(topic.configs, self.config)

    def partition(self, topic: str, index: int) -> PartitionLog | None:
        t = self.metadata.topics.get(topic)
        if t is None or not 0 <= index < len(t.partitions):
            return None
        return self.store.partitions.get(t.partitions[index])

    def create_topic(self, name: str, partitions: int, configs: dict[str, str]) -> TopicMeta:
        t = self.metadata.create_topic(name, partitions, configs)
        for i, uid in enumerate(t.partitions):
            self.store.add_partition(name, i, uid)
        log.info("created topic %s with %d partitions", name, partitions)
        return t

    def delete_topic(self, name: str) -> TopicMeta:
        t = self.metadata.delete_topic(name)
        for uid in t.partitions:
            self.store.remove_partition(uid)
        if name == OFFSETS_TOPIC:
            # Kafka lets the offsets topic be deleted; every committed offset goes with it.
            self.offsets.reset()
        elif name == TRANSACTION_STATE_TOPIC:
            self.txn.load()  # its transactional ids went with it
        elif name == SHARE_STATE_TOPIC:
            self.share_state.load()  # and here the share-partitions' durable state
        else:
            self.offsets.forget_topic(name)
        log.info("deleted topic %s", name)
        return t

    def alter_topic_configs(
        self, name: str, changes: dict[str, str | None]
    ) -> Awaitable[bool] | None:
        """Set (None: delete) topic config overrides. In a cluster they are changed in etcd,
        from where every broker takes them; the awaitable says whether the topic was still
        there."""
        if self.cluster is None:
            self.metadata.set_configs(name, changes)
            return None
        return self.cluster.set_topic_configs(name, self.metadata.topics[name].topic_id, changes)

    def splits(self, topic: TopicMeta) -> bool:
        """Whether ``topic`` grows by splits (stratalog.splits) rather than as Kafka's do."""
        return self.topic_config(topic).get(splits.AUTOSCALE_ENABLE) == "true"

    def check_split(self, topic: TopicMeta, total: int) -> str:
        """The history after splitting ``topic`` to ``total`` partitions; INVALID_PARTITIONS
        for a count that is not twice the current one."""
        try:
            return splits.next_history(
                topic.configs.get(splits.SPLIT_HISTORY), len(topic.partitions), total
            )
        except splits.SplitError as e:
            raise MetadataError("INVALID_PARTITIONS", str(e)) from None

    def add_partitions(self, name: str, total: int) -> None:
        """Grow ``name`` to ``total`` partitions on a single node: a split for a topic that
        splits, each child in its parent's virtual log so the log keeps the family's append
        order; new partitions placed as a new topic's otherwise."""
        t = self.metadata.topics[name]
        current = len(t.partitions)
        history = self.check_split(t, total) if self.splits(t) else None
        parents = [self.store.log_of(uid) for uid in t.partitions]
        configs = {splits.SPLIT_HISTORY: history} if history is not None else None
        new = self.metadata.add_partitions(name, total, configs)
        for i, uid in enumerate(new):
            log_name = parents[i] if history is not None else None
            self.store.add_partition(name, current + i, uid, log_name=log_name)
        if history is not None:
            log.info("split topic %s: %d partitions to %d (%s)", name, current, total, history)

    async def add_partitions_in_cluster(self, name: str, total: int) -> None:
        """The same through etcd (cluster/node.py); every broker takes it from its watch."""
        assert self.cluster is not None
        t = self.metadata.topics.get(name)
        split = t is not None and self.splits(t)
        try:
            await self.cluster.add_partitions(name, total, split=split)
        except KeyError:
            raise MetadataError(
                "UNKNOWN_TOPIC_OR_PARTITION", "This server does not host this topic-partition."
            ) from None
        except splits.SplitError as e:
            raise MetadataError("INVALID_PARTITIONS", str(e)) from None
        except ValueError as e:
            raise MetadataError("INVALID_REPLICATION_FACTOR", str(e)) from None
        if split:
            log.info("split topic %s to %d partitions", name, total)

    async def split(self, name: str) -> None:
        """Split every partition of ``name`` in two (the autoscaler's request)."""
        total = 2 * len(self.metadata.topics[name].partitions)
        if self.cluster is not None:
            await self.add_partitions_in_cluster(name, total)
        else:
            self.add_partitions(name, total)

    def auto_create(self, name: str) -> TopicMeta | None:
        """Create ``name`` if auto-creation is on; None when it is off or the name is invalid
        (or in cluster mode, where topics are created through CreateTopics only)."""
        if not self.config["auto.create.topics.enable"] or self.cluster is not None:
            return None
        if name == OFFSETS_TOPIC:
            return self.ensure_offsets_topic()  # as Kafka: with the offsets topic's settings
        if name in (TRANSACTION_STATE_TOPIC, SHARE_STATE_TOPIC):
            return self.ensure_internal_topic(name)
        try:
            return self.create_topic(name, self.config["num.partitions"], {})
        except MetadataError as e:
            if e.error == "TOPIC_ALREADY_EXISTS":
                return self.metadata.topics.get(name)
            return None

    def topic_by_id(self, topic_id: uuid.UUID) -> TopicMeta | None:
        return self.metadata.topic_by_id(topic_id)

    # -- the offsets topic (OffsetsHost) -------------------------------------------------------
    def partition_exists(self, topic: str, index: int) -> bool:
        t = self.metadata.topics.get(topic)
        return t is not None and 0 <= index < len(t.partitions)

    def cluster_coordinator(
        self, key: str, topic: str = OFFSETS_TOPIC, conn=None
    ) -> tuple[int, str, int] | None:
        """In a cluster: (node, host, port) of the broker leading the partition of ``topic``
        (the offsets topic for a group, the transaction log for a transactional id) that
        ``key`` belongs to, which coordinates it (None until the topic and a leader exist); the
        address of the listener ``conn`` came in on."""
        assert self.cluster is not None
        t = self.metadata.topics.get(topic)
        if t is None:
            return None
        v = self.cluster.vlog_of(topic, partition_for(key, len(t.partitions)))
        b = self.cluster.brokers.get(v.primary) if v is not None else None
        return (b.node_id, *self.broker_endpoint(b, conn)) if b is not None else None

    def _create_internal_topic_in_cluster(self, name: str) -> None:
        cluster = self.cluster
        assert cluster is not None
        creating = self._internal_creating.get(name)
        if creating is not None and not creating.done():
            return
        setting, configs = _INTERNAL_TOPIC_SETTINGS[name]
        partitions = self.config[setting]

        async def create() -> None:
            try:
                factor = min(3, len(await cluster.registered_brokers()))
                await cluster.create_topic(name, partitions, factor, dict(configs))
            except KeyError:
                pass  # another broker made it first
            except Exception as e:
                log.warning("cannot create %s: %s", name, e)

        self._internal_creating[name] = asyncio.ensure_future(create())

    def _create_offsets_topic_in_cluster(self) -> None:
        self._create_internal_topic_in_cluster(OFFSETS_TOPIC)

    def ensure_offsets_topic(self) -> TopicMeta:
        """__consumer_offsets, created at a group's first need (FindCoordinator, OffsetCommit)
        with Kafka's settings for it: offsets.topic.num.partitions, compact (here: kept short by
        the offset store, never by retention), uncompressed by the broker, 100 MiB segments."""
        t = self.metadata.topics.get(OFFSETS_TOPIC)
        if t is None and self.cluster is not None:
            self._create_offsets_topic_in_cluster()
            raise StorageFailure(f"{OFFSETS_TOPIC} is being created")
        if t is None:
            t = self.create_topic(
                OFFSETS_TOPIC,
                self.config["offsets.topic.num.partitions"],
                dict(OFFSETS_TOPIC_CONFIGS),
            )
        return t

    def offsets_partitions(self, create: bool) -> list[PartitionLog | None]:
        t = self.ensure_offsets_topic() if create else self.metadata.topics.get(OFFSETS_TOPIC)
        if t is None:
            return []
        # In a cluster only the partitions this broker replicates are here (None for others).
        return [self.store.partitions.get(uid) for uid in t.partitions]

    def delete_records(self, p: PartitionLog, before: int) -> None:
        self.store.delete_records(p.uid, before)

    # -- client quotas -------------------------------------------------------------------------
    def set_quotas(self, change: Callable[[dict], dict]) -> Awaitable[None] | None:
        """Apply ``change`` (quotas -> quotas) durably: here on a single node (None), through
        etcd in a cluster (the awaitable; every broker's store follows etcd)."""
        if self.cluster is None:
            self.quotas.replace(change(self.quotas.quotas), save=True)
            return None
        return self.cluster.update_quotas(lambda raw: to_json(change(from_json(raw))))

    # -- DeleteRecords -------------------------------------------------------------------------
    def move_log_starts(self, moves: dict[tuple[str, int], int]) -> Awaitable[None] | None:
        """Move the log starts of partitions this broker leads (DeleteRecords), durably, here
        and now. In a cluster, also returns the recording of the new starts in etcd, from where
        every replica of each partition applies them (``apply_cluster_log_starts``)."""
        by_uid: dict[int, int] = {}
        for (topic, index), start in moves.items():
            p = self.partition(topic, index)
            if p is not None:
                by_uid[p.uid] = start
        self.store.move_log_starts(by_uid)
        if self.cluster is None:
            return None
        by_topic: dict[str, dict[int, int]] = {}
        for topic, index in moves:
            p = self.partition(topic, index)
            if p is not None:
                by_topic.setdefault(topic, {})[index] = p.log_start_offset
        cluster = self.cluster
        return asyncio.gather(
            *(
                cluster.record_log_starts(topic, self.metadata.topics[topic].topic_id, starts)
                for topic, starts in by_topic.items()
            )
        )

    def apply_cluster_log_starts(self) -> None:
        """In a cluster: move the log starts of the partitions replicated here to where their
        leaders moved them (DeleteRecords, as etcd holds them). A replica that has not got the
        records up to there yet moves as far as it has them and further at a later call (at
        each change, with retention, and when it starts leading)."""
        if self.cluster is None:
            return
        by_uid: dict[int, int] = {}
        for (topic, index), (topic_id, start) in self.cluster.log_starts.items():
            t = self.metadata.topics.get(topic)
            if t is None or t.topic_id != topic_id or not 0 <= index < len(t.partitions):
                continue  # (a deleted topic's, or one not known here yet)
            p = self.store.partitions.get(t.partitions[index])
            if p is not None and p.log_start_offset < start:
                by_uid[p.uid] = start
        if by_uid:
            self.store.move_log_starts(by_uid, up_to="next_offset")

    # -- the transaction log (TxnLogHost) ------------------------------------------------------
    def ensure_txn_state_topic(self) -> TopicMeta:
        """__transaction_state, created at the first FindCoordinator for a transactional id
        with transaction.state.log.num.partitions partitions (Kafka's settings otherwise as the
        offsets topic's)."""
        return self.ensure_internal_topic(TRANSACTION_STATE_TOPIC)

    def ensure_internal_topic(self, name: str) -> TopicMeta:
        """A coordinator's state topic (__transaction_state, __share_group_state), created at
        its first need with its partitions setting; in a cluster through etcd (StorageFailure
        until it exists)."""
        t = self.metadata.topics.get(name)
        if t is None and self.cluster is not None:
            self._create_internal_topic_in_cluster(name)
            raise StorageFailure(f"{name} is being created")
        if t is None:
            setting, configs = _INTERNAL_TOPIC_SETTINGS[name]
            t = self.create_topic(name, self.config[setting], dict(configs))
        return t

    def internal_partitions(self, name: str, create: bool) -> list[PartitionLog | None]:
        """The partitions of internal topic ``name`` in order (None: one another broker of a
        cluster holds); creates the topic if ``create``, else [] when it does not exist."""
        t = self.ensure_internal_topic(name) if create else self.metadata.topics.get(name)
        if t is None:
            return []
        return [self.store.partitions.get(uid) for uid in t.partitions]

    def txn_state_partitions(self, create: bool) -> list[PartitionLog | None]:
        return self.internal_partitions(TRANSACTION_STATE_TOPIC, create)

    def share_state_partitions(self, create: bool) -> list[PartitionLog | None]:
        return self.internal_partitions(SHARE_STATE_TOPIC, create)
