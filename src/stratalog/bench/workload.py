"""Workload files (TOML) for ``stratalog bench``, in the spirit of the OpenMessaging Benchmark.

A workload names what is measured (topics, partitions, record size, producers, consumers, rate,
records or duration, acks, compression, fsync policy, storage layout) and which targets it is
measured against. ``[profile.quick]`` (and ``[profile.full]``) override any top-level key, so
``--quick`` runs the same workloads with smaller sizes.

Example::

    name = "b"
    title = "16 partitions, 1 KiB records, 4 producers, 4 consumers, acks=all, fsync=always"
    topics = 1
    partitions = 16
    record_size = 1024
    producers = 4
    consumers = 4
    rate = "max"               # records/s over all producers, or "max"
    records = 2_000_000        # over all producers (or duration_s = 60 with a rate)
    acks = "all"
    fsync = "always"           # Stratalog's policy; Kafka's "fsync" target uses flush.messages=1

    [[target]]
    name = "stratalog"
    kind = "stratalog"

    [[target]]
    name = "kafka-fsync"
    kind = "kafka"
    topic_config = { "flush.messages" = "1" }

    [profile.quick]
    records = 100_000
"""

from __future__ import annotations

import copy
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

WORKLOAD_DIR = Path(__file__).resolve().parents[3] / "bench" / "workloads"

_TOP_LEVEL = {
    "name",
    "title",
    "description",
    "order",
    "topics",
    "partitions",
    "record_size",
    "producers",
    "consumers",
    "rate",
    "rate_from",
    "rate_fraction",
    "rate_reference",
    "records",
    "duration_s",
    "max_duration_s",
    "drain_timeout_s",
    "acks",
    "fsync",
    "layout",
    "compression",
    "linger_ms",
    "batch_bytes",
    "latency_sample_every",
    "sweep",
    "backlog_bytes",
    "backlog_partitions",
    "backlog_consumers",
    "phase_duration_s",
    "phase_pairs",
    "backlog_cold",
    "backlog_read_mb_per_s",
    "backlog_readers_idle",
    "backlog_readers_cpus",
    "backlog_readers_config",
    "backlog_readers_client",
    "kcat_consume",
    "perf_test",
    "spark_read",
    "spark_runs",
    "spark_warmup",
    "spark_all_columns",
    "spark_one_off",
    "spark_formats",
    "producer_client",
    "producer_config",
    "burst",
    "prefill_bytes",
    "drain_max_s",
    "failover_trials",
    "failover_timeout_s",
    "rejoin_bytes",
    "rejoin_trials",
    "transaction_records",
    "share_consumers",
    "compacted_bytes",
    "compacted_live_fraction",
    "compacted_partitions",
    "cleaning_max_s",
    "failed_logins",
    "failed_login_concurrency",
    "vars",
    "target",
    "profile",
}


# What backlog_readers_config may set for backlog_readers_client = "arrow"
# (bench/history_reader.py).
ARROW_READER_SETTINGS = ("fetch_bytes", "partition_fetch_bytes")


class WorkloadError(ValueError):
    """A workload file that cannot be used, with the reason."""


@dataclass
class TargetSpec:
    """One target of a workload: a kind (stratalog, kafka, nats, redis...) and its settings."""

    name: str
    kind: str
    settings: dict[str, Any] = field(default_factory=dict)  # broker/server settings
    topic_config: dict[str, str] = field(default_factory=dict)  # per-topic configs at creation
    role: str = "broker"  # "broker": driven by the harness's clients; "tool": its own generator
    # With a workload's rate_from: take the rate measured on this target instead of on this one
    # (the harness's ceiling runs at the rate Stratalog ran, so their latencies compare).
    rate_reference: str = ""

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TargetSpec:
        if "name" not in d or "kind" not in d:
            raise WorkloadError(f"a [[target]] needs name and kind: {d!r}")
        return cls(
            name=str(d["name"]),
            kind=str(d["kind"]),
            settings={str(k): v for k, v in dict(d.get("settings", {})).items()},
            topic_config={str(k): str(v) for k, v in dict(d.get("topic_config", {})).items()},
            role=str(d.get("role", "broker")),
            rate_reference=str(d.get("rate_reference", "")),
        )


@dataclass
class Workload:
    name: str
    title: str = ""
    description: str = ""
    order: int = 100
    topics: int = 1
    partitions: int = 1
    record_size: int = 1024
    producers: int = 1
    consumers: int = 0
    rate: float | None = None  # records/s over all producers; None = max
    rate_from: str = ""  # take the rate from this workload's max ...
    rate_fraction: float = 1.0  # ... times this fraction ...
    rate_reference: str = ""  # ... measured on this target
    records: int = 0  # over all producers; 0: rate x duration_s
    duration_s: float = 0.0
    max_duration_s: float = 120.0  # a case never produces for longer than this
    drain_timeout_s: float = 60.0  # consumers may lag the producers by this much at the end
    acks: str = "all"
    fsync: str = "always"
    layout: str = "virtual"
    compression: str = "none"
    linger_ms: float = 5.0
    batch_bytes: int = 1_000_000
    # "confluent-kafka" (librdkafka: one partition per Produce request) or "java" (Kafka's Java
    # client: every ready partition for a broker in one request).
    producer_client: str = "confluent-kafka"
    # librdkafka settings for the load's producers (confluent-kafka client), e.g. idempotence.
    producer_config: dict[str, Any] = field(default_factory=dict)
    latency_sample_every: int = 1
    sweep: dict[str, list[Any]] = field(default_factory=dict)
    backlog_bytes: int = 0
    backlog_partitions: int = 16
    backlog_consumers: int = 2
    phase_duration_s: float = 30.0
    phase_pairs: int = 1  # alone / with-readers phases alternate this many times
    # False: the backlog stays in the page cache (the readers' CPU and network cost alone,
    # without the disk): an experiment that tells the two apart.
    backlog_cold: bool = True
    # The backlog readers' own pace over all of them, MB/s (0: as fast as they can): the same
    # read load on every target, for comparing the brokers' isolation like for like.
    backlog_read_mb_per_s: float = 0.0
    # True: the backlog readers' client processes run in SCHED_IDLE, taking only CPU nobody
    # else wants: on a small machine this keeps their own decoding off the cores the broker
    # and the producers share, as if they ran on other hosts (the broker's work for them stays).
    backlog_readers_idle: bool = False
    # A Linux CPU list the backlog readers' processes run on (empty: anywhere): with the
    # broker's backlog sender on the same CPUs (fetch.backlog.sender_cpus), the readers' receive
    # work stays off the broker's cores, as it does when they run on other hosts.
    backlog_readers_cpus: str = ""
    # librdkafka settings for the backlog readers only, e.g. a bounded socket receive buffer:
    # on this project's kernel (no preemption inside a system call) one recv of a multi-MB
    # answer holds a core for a millisecond or more whatever the reader's priority.
    backlog_readers_config: dict[str, Any] = field(default_factory=dict)
    # The backlog readers' client: "confluent-kafka" (a Python object per record), or "arrow":
    # raw batches decoded into Arrow columns as the Spark source reads history, without a
    # Python object per record (bench/history_reader.py). Its settings, in
    # backlog_readers_config: fetch_bytes, partition_fetch_bytes.
    backlog_readers_client: str = "confluent-kafka"
    kcat_consume: bool = False
    perf_test: bool = False
    spark_read: bool = False  # fill the topic, then read it into Spark with both formats
    spark_runs: int = 3
    spark_warmup: int = 1  # untimed reads of each format first (the JVM's compiler warms up)
    spark_all_columns: bool = False  # the query touches every column, not only the values
    # The formats also timed as a one-off job (the only read of a fresh session, a JVM start
    # each); empty: every format read.
    spark_one_off: list[str] = field(default_factory=list)
    # The formats read, in the order each round reads them.
    spark_formats: list[str] = field(
        default_factory=lambda: ["stratalog", "stratalog-python", "kafka"]
    )
    # Pafka's burst case: fill to just under the migration threshold, then produce ``records``
    # at ``rate`` and follow the hot tier's usage until migration has drained it again.
    burst: bool = False
    prefill_bytes: int = 0
    drain_max_s: float = 300.0
    # Cluster targets only. Failover: under a steady acks=all load at ``rate``, kill -9 the
    # partition's leader this many times (restarting it and waiting for it to be in sync
    # between trials); a trial with no acknowledgement within the timeout counts as never.
    failover_trials: int = 0
    failover_timeout_s: float = 60.0
    # Rejoin: stop one broker, write this many bytes, restart it and time its catch-up until
    # it is in sync again, ``rejoin_trials`` times; beside it the disk's sequential read.
    rejoin_bytes: int = 0
    rejoin_trials: int = 1
    # Issue 28: > 0: transactional producers, committing every this many records.
    transaction_records: int = 0
    # Issue 28: > 0: the topic is filled, then this many share consumers of one share group
    # drain it (bench/share_load.py): records delivered per second, each acknowledged once.
    share_consumers: int = 0
    # Issue 28: produce p99 alone, while a compacted topic of this size is cleaned, and after
    # (bench/compaction_load.py): its records' keys repeat so that this share of them is live.
    compacted_bytes: int = 0
    compacted_live_fraction: float = 0.1
    compacted_partitions: int = 4
    cleaning_max_s: float = 600.0  # the cleaning phase ends when the cleaner is done, or then
    # Issue 29: failed SASL logins (wrong passwords, SCRAM and PLAIN) while a good client
    # produces at ``rate``, this many connections at a time (bench/auth_storm.py).
    failed_logins: int = 0
    failed_login_concurrency: int = 16
    # "{name}" in a Stratalog target's setting stands for vars[name], so a profile can resize a
    # target (a smaller hot tier for --quick) without repeating it.
    vars: dict[str, Any] = field(default_factory=dict)
    targets: list[TargetSpec] = field(default_factory=list)
    source: str = ""

    @property
    def total_records(self) -> int:
        if self.records:
            return int(self.records)
        if self.rate and self.duration_s:
            return int(self.rate * self.duration_s)
        raise WorkloadError(f"workload {self.name}: set records, or rate and duration_s")

    @property
    def kind(self) -> str:
        if self.compacted_bytes:
            return "compaction"
        if self.share_consumers:
            return "share"
        if self.failed_logins:
            return "auth-storm"
        if self.failover_trials:
            return "failover"
        if self.rejoin_bytes:
            return "rejoin"
        if self.spark_read:
            return "spark"
        if self.burst:
            return "burst"
        if self.backlog_bytes:
            return "catchup"
        if self.sweep:
            return "sweep"
        return "plain"

    def with_overrides(self, **kw: Any) -> Workload:
        w = copy.deepcopy(self)
        for k, v in kw.items():
            setattr(w, k, v)
        return w


def _coerce(name: str, d: dict[str, Any]) -> dict[str, Any]:
    out = dict(d)
    rate = out.get("rate")
    if rate is None or (isinstance(rate, str) and rate.lower() == "max"):
        out["rate"] = None
    elif isinstance(rate, int | float) and rate > 0:
        out["rate"] = float(rate)
    else:
        raise WorkloadError(f"workload {name}: rate must be a positive number or 'max'")
    if str(out.get("acks", "all")) not in {"0", "1", "all", "-1"}:
        raise WorkloadError(f"workload {name}: acks must be 0, 1 or all")
    out["acks"] = str(out.get("acks", "all"))
    for key in ("topics", "partitions", "record_size", "producers"):
        if int(out.get(key, 1)) < 1:
            raise WorkloadError(f"workload {name}: {key} must be >= 1")
    clients = out.get("sweep", {}).get("producer_client", [out.get("producer_client")])
    for c in clients:
        if c is not None and c not in ("confluent-kafka", "java"):
            raise WorkloadError(f"workload {name}: producer_client must be confluent-kafka or java")
    readers = out.get("backlog_readers_client", "confluent-kafka")
    if readers not in ("confluent-kafka", "arrow"):
        raise WorkloadError(
            f"workload {name}: backlog_readers_client must be confluent-kafka or arrow"
        )
    if readers == "arrow":
        # librdkafka settings would be ignored by the Arrow readers: say so rather than run.
        unknown = set(out.get("backlog_readers_config", {})) - set(ARROW_READER_SETTINGS)
        if unknown:
            raise WorkloadError(
                f"workload {name}: backlog_readers_config for the arrow readers takes "
                f"{' and '.join(ARROW_READER_SETTINGS)}, not {sorted(unknown)}"
            )
    if int(out.get("transaction_records", 0)) and out["acks"] not in ("all", "-1"):
        raise WorkloadError(f"workload {name}: a transactional producer needs acks=all")
    if int(out.get("record_size", 1024)) < 16:
        raise WorkloadError(f"workload {name}: record_size must be >= 16 (8-byte timestamp)")
    return out


def parse_workload(data: dict[str, Any], profile: str = "full", source: str = "") -> Workload:
    unknown = set(data) - _TOP_LEVEL
    name = str(data.get("name") or Path(source).stem or "workload")
    if unknown:
        raise WorkloadError(f"workload {name}: unknown keys {sorted(unknown)}")
    merged = {k: v for k, v in data.items() if k not in ("profile", "target")}
    over = dict(data.get("profile", {}).get(profile, {}))
    bad = set(over) - _TOP_LEVEL
    if bad:
        raise WorkloadError(f"workload {name}: unknown keys in [profile.{profile}]: {sorted(bad)}")
    merged.update(over)
    merged = _coerce(name, merged)
    targets = [TargetSpec.from_dict(t) for t in data.get("target", [])]
    if not targets:
        targets = [TargetSpec("stratalog", "stratalog")]
    merged["name"] = name
    w = Workload(**merged, targets=targets, source=source)
    if w.kind == "plain" and not w.records and not w.duration_s:
        # Known at load time, not after the targets have been started (an empty file, say).
        raise WorkloadError(f"workload {name}: set records, or duration_s with a rate")
    return w


def load_workload(path: str | Path, profile: str = "full") -> Workload:
    p = Path(path)
    try:
        data = tomllib.loads(p.read_text())
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise WorkloadError(f"cannot read workload {p}: {e}") from e
    return parse_workload(data, profile, str(p))


def find_workloads(names: list[str] | None, profile: str = "full") -> list[Workload]:
    """Workloads by file path or by name in bench/workloads/ (when ``names`` is empty, all but
    the cluster ones, which take an hour and a half and are named or run by `make
    bench-cluster`), ordered by their ``order`` key."""
    found: list[Workload] = []
    if not names:
        files = sorted(WORKLOAD_DIR.glob("*.toml"))
        if not files:
            raise WorkloadError(f"no workload files in {WORKLOAD_DIR}")
        found = [load_workload(f, profile) for f in files]
        found = [w for w in found if not any(t.kind.endswith("-cluster") for t in w.targets)]
    else:
        available = {}
        for f in sorted(WORKLOAD_DIR.glob("*.toml")):
            w = load_workload(f, profile)
            available[w.name] = w
            available[f.stem] = w
        for n in names:
            if Path(n).is_file():
                found.append(load_workload(n, profile))
            elif n in available:
                found.append(available[n])
            else:
                raise WorkloadError(f"no workload {n!r} (known: {sorted(set(available))})")
    return sorted(found, key=lambda w: (w.order, w.name))
