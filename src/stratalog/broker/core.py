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
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from stratalog.broker import metrics
from stratalog.broker.backlog_sender import BacklogSender
from stratalog.broker.cpu_isolation import JournalThreads, broker_cpus, parse_cpus, pin_this_thread
from stratalog.broker.group_coordinator import GroupCoordinator
from stratalog.broker.offset_records import OFFSETS_TOPIC
from stratalog.broker.offset_store import OffsetStore
from stratalog.broker.topic_config import TopicConfigView
from stratalog.cluster.metadata import MetadataError, MetadataStore, TopicMeta
from stratalog.config import BrokerConfig
from stratalog.storage.backlog_loader import BacklogLoader
from stratalog.storage.direct_read import DirectReader
from stratalog.storage.journal import SLOWEST_SYNC
from stratalog.storage.log_store import LogStore, RetentionPolicy, StorageConfig
from stratalog.storage.partition import PartitionLog
from stratalog.storage.priority import lower_this_thread
from stratalog.storage.throttle import ByteRate, FsyncGuidedRate
from stratalog.storage.tiering import Migrator, TierSettings

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
# Kafka's topic configs of __consumer_offsets (DescribeConfigs shows the same).
OFFSETS_TOPIC_CONFIGS = {
    "cleanup.policy": "compact",
    "compression.type": "producer",
    "segment.bytes": "104857600",
}


def tail_cache_bytes(config: BrokerConfig) -> int:
    size = config["cache.tail_bytes"]
    if size >= 0:
        return size
    return DIRECT_IO_TAIL_CACHE if config["storage.direct_io"] else 0


class BrokerCore:
    def __init__(self, data_dir: Path, config: BrokerConfig) -> None:
        self.data_dir = Path(data_dir)
        self.config = config
        # Before any thread or process is started: they inherit the broker's CPUs.
        sender_cpus = parse_cpus(config["fetch.backlog.sender_cpus"])
        self._broker_cpus = broker_cpus(sender_cpus) if sender_cpus else frozenset()
        self._journal_threads = JournalThreads()
        if self._broker_cpus:
            pin_this_thread(self._broker_cpus, "the broker")
        self.node_id: int = config["node.id"]
        self.metadata = MetadataStore(self.data_dir)
        self.offsets = OffsetStore(self.data_dir, self)
        self.coordinator = GroupCoordinator(
            min_session_ms=config["group.min.session.timeout.ms"],
            max_session_ms=config["group.max.session.timeout.ms"],
            initial_rebalance_delay_ms=config["group.initial.rebalance.delay.ms"],
        )
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
                hot_path=Path(config["tiers.hot.path"]) if config["tiers.hot.path"] else None,
                cold_location=config["tiers.cold.url"] or config["tiers.cold.path"] or None,
                cold_options=config.cold_options,
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
        self.host = config["host"]
        self.port = config["port"]
        self._tasks: list[asyncio.Task] = []
        self.admin_address = ""  # host:port of the HTTP admin endpoint, once listening
        self.started_at = time.time()

    # -- addresses -----------------------------------------------------------------------------
    @property
    def advertised_host(self) -> str:
        return self.config["advertised.host"] or self.host

    @property
    def advertised_port(self) -> int:
        return self.config["advertised.port"] or self.port

    # -- life cycle ----------------------------------------------------------------------------
    def open(self) -> None:
        _raise_fd_limit()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.metadata.load()
        triples = [
            (t.name, i, uid)
            for t in self.metadata.topics.values()
            for i, uid in enumerate(t.partitions)
        ]
        self.store.open(triples)
        self.offsets.load()  # reads the offsets topic: after the logs are recovered

    def start_background(self) -> None:
        if self._broker_cpus:
            # The journal threads of the write path's file systems commit what the group
            # commit's fsyncs wait for: they belong on the broker's CPUs (cpu_isolation.py).
            self._journal_threads.pin([self.store.root, self.data_dir], self._broker_cpus)
        self._tasks.append(asyncio.ensure_future(self._loop_lag_probe()))
        self._tasks.append(asyncio.ensure_future(self._checkpoint_loop()))
        self._tasks.append(asyncio.ensure_future(self._retention_loop()))
        if self.backlog_pacer is not None:
            self._tasks.append(asyncio.ensure_future(self._backlog_pacer_loop()))
        if self.backlog_sender is not None:
            self.backlog_sender.start()
        if self.store.cold is not None:
            self._tasks.append(asyncio.ensure_future(self.migrator.run()))

    async def close(self) -> None:
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
        self.coordinator.shutdown()
        await self.offsets.close()
        await self.store.close()
        self.read_executor.shutdown(wait=True)
        self.meta_executor.shutdown(wait=True)
        self._journal_threads.restore()

    def abandon(self) -> None:
        """Stop without flushing anything (tests of crash recovery in-process)."""
        for t in self._tasks:
            t.cancel()
        if self.backlog_sender is not None:
            self.backlog_sender.close()
        self.migrator.close()
        self.coordinator.shutdown()
        self.offsets.abandon()
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

    async def _backlog_pacer_loop(self) -> None:
        assert self.backlog_pacer is not None
        SLOWEST_SYNC.take()  # what came before this broker's loop started does not count
        while True:
            await asyncio.sleep(0.1)
            metrics.BACKLOG_RATE.set(self.backlog_pacer.tick(SLOWEST_SYNC.take()))

    async def _retention_loop(self) -> None:
        interval = self.config["retention.check.interval.ms"] / 1000
        while True:
            await asyncio.sleep(interval)
            try:
                self.run_retention()
                self.expire_producers()
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

    # -- topics --------------------------------------------------------------------------------
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
        else:
            self.offsets.forget_topic(name)
        log.info("deleted topic %s", name)
        return t

    def add_partitions(self, name: str, total: int) -> None:
        new = self.metadata.add_partitions(name, total)
        t = self.metadata.topics[name]
        first = len(t.partitions) - len(new)
        for i, uid in enumerate(new):
            self.store.add_partition(name, first + i, uid)

    def auto_create(self, name: str) -> TopicMeta | None:
        """Create ``name`` if auto-creation is on; None when it is off or the name is invalid."""
        if not self.config["auto.create.topics.enable"]:
            return None
        if name == OFFSETS_TOPIC:
            return self.ensure_offsets_topic()  # as Kafka: with the offsets topic's settings
        try:
            return self.create_topic(name, self.config["num.partitions"], {})
        except MetadataError as e:
            if e.error == "TOPIC_ALREADY_EXISTS":
                return self.metadata.topics.get(name)
            return None

    def topic_by_id(self, topic_id: uuid.UUID) -> TopicMeta | None:
        return self.metadata.topic_by_id(topic_id)

    # -- the offsets topic (OffsetsHost) -------------------------------------------------------
    def ensure_offsets_topic(self) -> TopicMeta:
        """__consumer_offsets, created at a group's first need (FindCoordinator, OffsetCommit)
        with Kafka's settings for it: offsets.topic.num.partitions, compact (here: kept short by
        the offset store, never by retention), uncompressed by the broker, 100 MiB segments."""
        t = self.metadata.topics.get(OFFSETS_TOPIC)
        if t is None:
            t = self.create_topic(
                OFFSETS_TOPIC,
                self.config["offsets.topic.num.partitions"],
                dict(OFFSETS_TOPIC_CONFIGS),
            )
        return t

    def offsets_partitions(self, create: bool) -> list[PartitionLog]:
        t = self.ensure_offsets_topic() if create else self.metadata.topics.get(OFFSETS_TOPIC)
        if t is None:
            return []
        return [self.store.partitions[uid] for uid in t.partitions]

    def delete_records(self, p: PartitionLog, before: int) -> None:
        self.store.delete_records(p.uid, before)
