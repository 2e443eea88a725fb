"""Runs one workload against one target: the case.

A plain case starts the target, creates the topics, starts the producer and consumer processes,
releases them together, waits for the producers to finish and the consumers to catch up, then
merges what the processes measured and adds the server's CPU time (from ``/proc/<pid>/stat``).

Two kinds of workload build on it: a *sweep* runs the plain case once per combination of the
swept keys (KerA's 1..1,000 topics x layout), and a *catch-up* case measures produce latency at a
fixed rate twice, without and then with consumers draining a backlog that is not in the page
cache (BookKeeper's tail/backlog isolation).
"""

from __future__ import annotations

import contextlib
import itertools
import multiprocessing as mp
import os
import re
import statistics
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stratalog.bench import hist
from stratalog.bench.clients import (
    ConsumerJob,
    ProducerJob,
    consumer_main,
    drain,
    producer_main,
)
from stratalog.bench.targets import (
    StratalogTarget,
    Target,
    TargetUnavailable,
    make_target,
    process_cpu_s,
)
from stratalog.bench.workload import TargetSpec, Workload


def evict_page_cache(dirs: list[Path]) -> int:
    """Drop the files under ``dirs`` from the page cache (posix_fadvise DONTNEED after fsync), so
    a backlog is read from the device as it would be days after it was written. Returns bytes."""
    total = 0
    for d in dirs:
        for root, _dirs, files in os.walk(d):
            for name in files:
                path = os.path.join(root, name)
                try:
                    fd = os.open(path, os.O_RDONLY)
                except OSError:
                    continue
                try:
                    os.fsync(fd)  # dirty pages cannot be dropped
                    size = os.fstat(fd).st_size
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                    total += size
                except OSError:
                    pass
                finally:
                    os.close(fd)
    return total


@dataclass
class CaseResult:
    """What one workload measured on one target (one sweep point)."""

    workload: str
    target: str
    kind: str
    describe: str
    params: dict[str, Any] = field(default_factory=dict)
    ok: bool = True
    run: int = 1  # which of the ``--runs`` rounds
    error: str = ""
    records: int = 0
    bytes: int = 0
    seconds: float = 0.0
    records_per_s: float = 0.0
    mb_per_s: float = 0.0
    consumed: int = 0
    consume_mb_per_s: float = 0.0
    publish: dict[str, float] | None = None
    end_to_end: dict[str, float] | None = None
    server_cpu_s: float = 0.0
    server_cores: float = 0.0
    cpu_s_per_mb: float | None = None
    client_cpu_s: float = 0.0
    # The load generators' share of the machine (their own CPU, every thread of every process);
    # None where a peer's own tool generated the load.
    client_cores: float | None = None
    stored: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


Progress = Callable[[str, int, int, int], None]  # (label, produced, consumed, total)


def _no_progress(label: str, produced: int, consumed: int, total: int) -> None:
    pass


@dataclass
class LoadResult:
    """What the load processes of one phase measured."""

    producers: list[dict[str, Any]]
    consumers: list[dict[str, Any]]
    t_start: float
    t_end: float
    server_cpu_s: float

    @property
    def errors(self) -> list[str]:
        return [r["error"] for r in self.producers + self.consumers if r.get("error")]

    @property
    def acked(self) -> int:
        return sum(r.get("records", 0) for r in self.producers)

    @property
    def acked_bytes(self) -> int:
        return sum(r.get("bytes", 0) for r in self.producers)

    @property
    def produce_seconds(self) -> float:
        firsts = [r["t_first"] for r in self.producers if "t_first" in r]
        lasts = [r["t_last"] for r in self.producers if "t_last" in r]
        return max(lasts) - min(firsts) if firsts and lasts else 0.0

    @property
    def consumed(self) -> int:
        return sum(r.get("records", 0) for r in self.consumers)

    @property
    def consumed_bytes(self) -> int:
        return sum(r.get("bytes", 0) for r in self.consumers)

    @property
    def consume_seconds(self) -> float:
        firsts = [r["t_start"] for r in self.consumers if r.get("t_first")]
        lasts = [r["t_last"] for r in self.consumers if r.get("t_last")]
        return max(lasts) - min(firsts) if firsts and lasts else 0.0

    def publish_hist(self) -> dict[str, float] | None:
        return hist.summary(hist.merge([r.get("hist") for r in self.producers]))

    def e2e_hist(self) -> dict[str, float] | None:
        return hist.summary(hist.merge([r.get("hist") for r in self.consumers]))

    @property
    def client_cpu_s(self) -> float:
        return sum(r.get("cpu_s", 0.0) for r in self.producers + self.consumers)


def run_load(
    target: Target,
    producer_jobs: list[ProducerJob],
    consumer_jobs: list[ConsumerJob],
    *,
    label: str,
    progress: Progress = _no_progress,
    drain_timeout_s: float = 60.0,
    counted_consumers: int | None = None,
    sample: Callable[[float, int], None] | None = None,
    stop_when: Callable[[], bool] | None = None,
    expect: int | None = None,
) -> LoadResult:
    """Start the load processes, release them together, wait for the producers, then for the
    first ``counted_consumers`` consumers (default: all) to have read what was acknowledged;
    the others (backlog readers) run until then. ``stop_when``, asked while the producers run,
    stops them early when it turns true (a phase that lasts as long as something else).
    ``expect``: what the consumers must read, if not what the producers here acknowledged (a
    load of consumers alone, draining a topic filled before)."""
    ctx = mp.get_context("spawn")
    factory = target.client_factory()
    ready_q, result_q = ctx.Queue(), ctx.Queue()
    start_evt, stop_evt = ctx.Event(), ctx.Event()
    prod_progress = [ctx.Value("q", 0, lock=False) for _ in producer_jobs]
    cons_progress = [ctx.Value("q", 0, lock=False) for _ in consumer_jobs]
    procs = []
    for job, val in zip(producer_jobs, prod_progress, strict=True):
        procs.append(
            ctx.Process(
                target=producer_main,
                args=(factory, job, ready_q, start_evt, stop_evt, val, result_q),
                daemon=True,
            )
        )
    for job, val in zip(consumer_jobs, cons_progress, strict=True):
        procs.append(
            ctx.Process(
                target=consumer_main,
                args=(factory, job, ready_q, start_evt, stop_evt, val, result_q),
                daemon=True,
            )
        )
    total = sum(j.records for j in producer_jobs)
    counted = cons_progress[: counted_consumers if counted_consumers is not None else None]
    try:
        for p in procs:
            p.start()
        ready = drain(ready_q, len(procs), timeout=180)
        failed = [msg for _role, _i, msg in ready if msg]
        if len(ready) < len(procs) or failed:
            stop_evt.set()
            raise RuntimeError(
                f"{label}: load processes did not start: "
                + ("; ".join(failed) or f"{len(ready)}/{len(procs)} ready after 180 s")
            )
        cpu0 = target.cpu_s()
        t_start = time.time()
        start_evt.set()
        results: list[dict[str, Any]] = []
        # Producers finish by themselves (record count or max_duration_s).
        deadline = (
            time.monotonic() + max((j.max_duration_s for j in producer_jobs), default=0) + 180
        )
        while sum(1 for r in results if r["role"] == "producer") < len(producer_jobs):
            results += drain(result_q, 1, timeout=0.25)
            produced = sum(v.value for v in prod_progress)
            progress(label, produced, sum(v.value for v in counted), total)
            if sample is not None:
                sample(time.time(), produced)
            if stop_when is not None and not stop_evt.is_set() and stop_when():
                stop_evt.set()
            if time.monotonic() > deadline:
                stop_evt.set()
                raise RuntimeError(f"{label}: producers did not finish in time")
        acked = sum(r.get("records", 0) for r in results if r["role"] == "producer")
        if expect is not None:
            acked = total = expect
        if counted:
            drain_deadline = time.monotonic() + drain_timeout_s
            while time.monotonic() < drain_deadline:
                consumed = sum(v.value for v in counted)
                progress(label, total, consumed, total)
                if consumed >= acked:
                    break
                time.sleep(0.1)
        stop_evt.set()
        results += drain(result_q, len(procs) - len(results), timeout=120)
        t_end = time.time()
        cpu1 = target.cpu_s()
        progress(label, total, sum(v.value for v in counted), total)
    finally:
        stop_evt.set()
        start_evt.set()
        for p in procs:
            if p.pid is None:
                continue  # never started (interrupted while starting the others)
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
                p.join(timeout=10)
    return LoadResult(
        producers=[r for r in results if r["role"] == "producer"],
        consumers=[r for r in results if r["role"] == "consumer"],
        t_start=t_start,
        t_end=t_end,
        server_cpu_s=cpu1 - cpu0,
    )


def _split(total: int, n: int, i: int) -> int:
    return total // n + (1 if i < total % n else 0)


def producer_jobs(
    w: Workload, topics: list[str], rate: float | None, records: int
) -> list[ProducerJob]:
    jobs = []
    for i in range(w.producers):
        # Each producer writes every topic in turn: 1,000 topics means 1,000 streams per client.
        jobs.append(
            ProducerJob(
                index=i,
                topics=topics,
                partitions=w.partitions,
                record_size=w.record_size,
                records=_split(records, w.producers, i),
                rate=rate / w.producers if rate else None,
                acks=w.acks,
                compression=w.compression,
                linger_ms=w.linger_ms,
                batch_bytes=w.batch_bytes,
                sample_every=w.latency_sample_every,
                max_duration_s=w.max_duration_s,
                client=w.producer_client,
                transaction_records=w.transaction_records,
            )
        )
    return jobs


def consumer_jobs(
    n: int,
    topics: list[str],
    partitions: int,
    track: bool = True,
    max_s: float = 600.0,
    sample_every: int = 1,
) -> list[ConsumerJob]:
    return [
        ConsumerJob(
            index=i,
            count=n,
            topics=topics,
            partitions=partitions,
            track_latency=track,
            max_duration_s=max_s,
            sample_every=sample_every,
        )
        for i in range(n)
    ]


def backlog_reader_jobs(w: Workload, topics: list[str]) -> list[ConsumerJob]:
    """The catch-up's backlog readers: from the backlog's start, at the workload's pace, with
    its SCHED_IDLE choice and its librdkafka settings for them."""
    return [
        ConsumerJob(
            index=i,
            count=w.backlog_consumers,
            topics=topics,
            partitions=w.backlog_partitions,
            track_latency=False,
            max_duration_s=w.phase_duration_s * 2 + w.drain_timeout_s,
            group="backlog",
            max_bytes_per_s=w.backlog_read_mb_per_s * 1e6 / w.backlog_consumers,
            sched_idle=w.backlog_readers_idle,
            cpus=w.backlog_readers_cpus,
            client=w.backlog_readers_client,
            extra={
                # A paced reader keeps little in its client's queue, so the broker's reads
                # follow its pace rather than filling 64 MB ahead of it.
                **(
                    {"queued.max.messages.kbytes": 4096}
                    if w.backlog_read_mb_per_s and w.backlog_readers_client == "confluent-kafka"
                    else {}
                ),
                **w.backlog_readers_config,
            },
        )
        for i in range(w.backlog_consumers)
    ]


def topic_names(w: Workload, prefix: str = "") -> list[str]:
    return [f"bench-{w.name}{prefix}-{i}" for i in range(w.topics)]


def _result_from_load(
    w: Workload, target: Target, load: LoadResult, params: dict[str, Any]
) -> CaseResult:
    secs = load.produce_seconds
    res = CaseResult(
        workload=w.name,
        target=target.name,
        kind=target.kind,
        describe=target.describe(),
        params=params,
        records=load.acked,
        bytes=load.acked_bytes,
        seconds=secs,
        records_per_s=load.acked / secs if secs else 0.0,
        mb_per_s=load.acked_bytes / 1e6 / secs if secs else 0.0,
        consumed=load.consumed,
        publish=load.publish_hist(),
        end_to_end=load.e2e_hist(),
        server_cpu_s=load.server_cpu_s,
        client_cpu_s=load.client_cpu_s,
    )
    wall = load.t_end - load.t_start
    res.server_cores = load.server_cpu_s / wall if wall > 0 else 0.0
    res.client_cores = load.client_cpu_s / wall if wall > 0 else 0.0
    moved_mb = (load.acked_bytes + load.consumed_bytes) / 1e6
    res.cpu_s_per_mb = load.server_cpu_s / moved_mb if moved_mb else None
    csecs = load.consume_seconds
    res.consume_mb_per_s = load.consumed_bytes / 1e6 / csecs if csecs else 0.0
    lost = [r for r in load.producers if r.get("errors") or r.get("unacked")]
    if load.errors:
        res.ok, res.error = False, "; ".join(load.errors)[:500]
    elif lost:
        first = next((r["first_error"] for r in lost if r.get("first_error")), "unacknowledged")
        res.extra["failed_sends"] = sum(r.get("errors", 0) + r.get("unacked", 0) for r in lost)
        res.ok, res.error = False, f"{res.extra['failed_sends']} records not acknowledged: {first}"
    commits = [r["commit_hist"] for r in load.producers if r.get("commit_hist")]
    if commits:  # transactional producers: their transactions and commit_transaction's time
        res.extra["transactions"] = sum(r.get("transactions", 0) for r in load.producers)
        res.extra["commit"] = hist.summary(hist.merge(commits))
    if any(r.get("capped") for r in load.producers):
        res.extra["capped"] = True  # stopped at max_duration_s before the record count
    if w.consumers and load.consumed < load.acked:
        res.ok = False
        res.error = res.error or f"consumers read {load.consumed} of {load.acked} acked records"
    return res


class Runner:
    """Runs workloads on targets and keeps every case's result (later workloads may refer to
    earlier ones: workload c runs at a fraction of b's max rate)."""

    def __init__(self, progress: Progress = _no_progress, log: Callable[[str], None] = print):
        self.progress = progress
        self.log = log
        self.results: list[CaseResult] = []

    # -- entry ---------------------------------------------------------------------------------
    def run(
        self,
        w: Workload,
        names: set[str] | None = None,
        kinds: set[str] | None = None,
        runs: int = 1,
    ) -> list[CaseResult]:
        """Run the workload on its targets (or only on those with one of ``names`` or
        ``kinds``), ``runs`` times; each round runs every target once, so a drift of the
        machine's speed touches all of them alike."""
        out = []
        for i in range(runs):
            for spec in w.targets:
                if (
                    (names or kinds)
                    and spec.name not in (names or ())
                    and spec.kind not in (kinds or ())
                ):
                    continue
                cases = self.run_target(w, spec)
                for c in cases:
                    c.run = i + 1
                out += cases
        return out

    def run_target(self, w: Workload, spec: TargetSpec) -> list[CaseResult]:
        if w.kind == "sweep":
            keys = list(w.sweep)
            out = []
            seen: set[tuple] = set()
            for combo in itertools.product(*(w.sweep[k] for k in keys)):
                over = dict(zip(keys, combo, strict=True))
                # storage.layout means nothing to a peer: run it once per other key.
                if spec.kind != "stratalog" and "layout" in over:
                    over["layout"] = "n/a"
                key = tuple(sorted(over.items()))
                if key in seen:
                    continue
                seen.add(key)
                case_w = w.with_overrides(**{k: v for k, v in over.items() if v != "n/a"})
                out.append(self._guarded(case_w, spec, over))
            return out
        return [self._guarded(w, spec, {})]

    def _guarded(self, w: Workload, spec: TargetSpec, params: dict[str, Any]) -> CaseResult:
        try:
            target = make_target(spec, w)
        except TargetUnavailable as e:
            return self._record(self._failed(w, spec, params, f"not available: {e}"))
        try:
            target.start()
        except TargetUnavailable as e:
            target.stop()
            return self._record(self._failed(w, spec, params, f"not available: {e}"))
        except Exception as e:
            target.stop()
            return self._record(self._failed(w, spec, params, f"did not start: {e}"))
        except BaseException:  # Ctrl-C or SIGTERM while it started: stop what did start
            target.stop()
            raise
        try:
            if getattr(target, "role", spec.role) == "tool":
                res = self._tool_case(w, target, params)
            elif w.kind == "spark":
                res = self._spark_case(w, target, params)
            elif w.kind == "catchup":
                res = self._catchup_case(w, target, params)
            elif w.kind == "burst":
                res = self._burst_case(w, target, params)
            elif w.kind in ("failover", "rejoin"):
                res = self._cluster_case(w, target, params)
            elif w.kind == "compaction":
                from stratalog.bench.compaction_load import run_compaction

                res = run_compaction(w, target, params, self.progress)
            elif w.kind == "share":
                from stratalog.bench.share_load import run_share_group

                res = run_share_group(w, target, params, self.progress)
            elif w.kind == "auth-storm":
                from stratalog.bench.auth_storm import run_auth_storm

                res = run_auth_storm(w, target, params, self.progress)
            else:
                res = self._plain_case(w, target, params)
        except Exception as e:
            res = self._failed(w, spec, params, f"{type(e).__name__}: {e}")
            res.describe = target.describe()
        finally:
            target.stop()
        return self._record(res)

    def _record(self, res: CaseResult) -> CaseResult:
        self.results.append(res)
        what = f"{res.workload} {res.target}" + (f" {res.params}" if res.params else "")
        if res.ok:
            p99 = res.publish["p99"] if res.publish else float("nan")
            self.log(
                f"{what}: {res.records_per_s:,.0f} rec/s, {res.mb_per_s:,.1f} MB/s, "
                f"publish p99 {p99:.2f} ms, server {res.server_cores:.2f} cores"
                + (f", clients {res.client_cores:.2f}" if res.client_cores is not None else "")
            )
        else:
            self.log(f"{what}: FAILED: {res.error}")
        return res

    @staticmethod
    def _failed(w: Workload, spec: TargetSpec, params: dict[str, Any], error: str) -> CaseResult:
        return CaseResult(w.name, spec.name, spec.kind, spec.name, params, ok=False, error=error)

    # -- rates ---------------------------------------------------------------------------------
    def resolve_rate(self, w: Workload, spec: TargetSpec) -> float | None:
        """A fixed rate, or a fraction of the max rate another workload reached."""
        if not w.rate_from:
            return w.rate
        ref_target = spec.rate_reference or w.rate_reference or spec.name
        for r in reversed(self.results):
            if r.workload == w.rate_from and r.target == ref_target and r.ok and r.records_per_s:
                return r.records_per_s * w.rate_fraction
        raise RuntimeError(
            f"workload {w.name} runs at {w.rate_fraction:g} x the max rate of workload "
            f"{w.rate_from} on {ref_target}: run {w.rate_from} first (e.g. "
            f"'stratalog bench {w.rate_from} {w.name}')"
        )

    # -- cases ---------------------------------------------------------------------------------
    def _plain_case(self, w: Workload, target: Target, params: dict[str, Any]) -> CaseResult:
        rate = self.resolve_rate(w, target.spec)
        records = w.records or int((rate or 0) * w.duration_s)
        if not records:
            raise RuntimeError(f"workload {w.name}: set records, or a rate and duration_s")
        topics = topic_names(w)
        target.create_topics(topics, w.partitions)
        label = f"{w.name} · {target.name}" + "".join(f" {k}={v}" for k, v in params.items())
        before = broker_buckets(target)
        load = run_load(
            target,
            producer_jobs(w, topics, rate, records),
            consumer_jobs(w.consumers, topics, w.partitions, sample_every=w.latency_sample_every),
            label=label,
            progress=self.progress,
            drain_timeout_s=w.drain_timeout_s,
        )
        res = _result_from_load(w, target, load, params)
        if before:
            # The broker's share of the clients' publish p99, and the disk's share of that.
            p99 = broker_p99_since(target, before)
            res.extra["broker_produce_p99_ms"] = p99.get("produce")
            res.extra["fsync_p99_ms"] = p99.get("fsync")
            res.extra["gc_pause_p99_ms"] = p99.get("gc")
            res.extra["gc_pause_max_ms"] = p99.get("gc_max")
        if rate:
            res.extra["target_rate"] = rate
        res.stored = target.count_records(topics, w.partitions)
        if res.ok and res.stored is not None and res.stored < res.records:
            res.ok = False
            res.error = f"the server holds {res.stored} records, {res.records} were acknowledged"
        if hasattr(target, "tier_bytes") and target.tier_bytes().get("cold"):
            res.extra["tiers"] = target.tier_bytes()
        if w.perf_test and res.ok and target.kafka_protocol:
            res.extra["perf_test"] = producer_perf_test(w, target, res.records)
        if w.kcat_consume and res.ok and target.kafka_protocol:
            res.extra["kcat"] = kcat_consume(target.bootstrap, topics, res.records, w.record_size)
        return res

    def _tool_case(self, w: Workload, target: Target, params: dict[str, Any]) -> CaseResult:
        records = w.records or int((w.rate or 0) * w.duration_s)

        def cb(done: int) -> None:
            self.progress(f"{w.name} · {target.name}", done, 0, records)

        out = target.run_tool(w, cb)  # type: ignore[attr-defined]
        res = CaseResult(w.name, target.name, target.kind, target.describe(), params)
        res.records = int(out.get("records", 0))
        res.bytes = int(out.get("bytes", 0))
        res.seconds = float(out.get("seconds", 0.0))
        res.records_per_s = float(out.get("records_per_s", 0.0))
        res.mb_per_s = float(out.get("mb_per_s", 0.0))
        res.publish = out.get("publish")
        res.server_cpu_s = float(out.get("server_cpu_s", 0.0))
        if res.seconds:
            res.server_cores = res.server_cpu_s / res.seconds
        if res.bytes:
            res.cpu_s_per_mb = res.server_cpu_s / (res.bytes / 1e6)
        res.extra = {k: v for k, v in out.items() if k not in res.to_dict()}
        if not res.records or out.get("error"):
            res.ok, res.error = False, str(out.get("error") or "the tool reported nothing")
        return res

    def _spark_case(self, w: Workload, target: Target, params: dict[str, Any]) -> CaseResult:
        """Fill a topic, then read it into Spark with each format (spark_read.py)."""
        import json
        import statistics
        import sys

        topics = topic_names(w)
        target.create_topics(topics, w.partitions)
        fill = run_load(
            target,
            producer_jobs(w, topics, None, w.records),
            [],
            label=f"{w.name} · {target.name} · fill",
            progress=self.progress,
        )
        res = _result_from_load(w, target, fill, params)
        if not res.ok:
            return res
        self.progress(f"{w.name} · {target.name} · Spark reads", 0, 0, 0)
        columns = ["--all-columns"] if w.spark_all_columns else []
        cpu0 = process_cpu_s(target.pid)
        proc = subprocess.run(
            [sys.executable, "-m", "stratalog.bench.spark_read", "--bootstrap", target.bootstrap,
             "--topic", topics[0], "--runs", str(w.spark_runs),
             "--warmup", str(w.spark_warmup), *columns],
            capture_output=True, text=True, timeout=w.max_duration_s * 20 + 600, check=False,
        )  # fmt: skip
        if proc.returncode != 0:
            res.ok, res.error = False, "Spark reads failed: " + proc.stderr[-400:]
            return res
        runs = json.loads(proc.stdout.strip().splitlines()[-1])
        # A one-off job: each format's read as the only query of a fresh session (the session
        # above reads one format first, so its first read of the other is not a first).
        one_off: dict[str, dict[str, Any]] = {}
        for fmt in [f for f in runs if not w.spark_one_off or f in w.spark_one_off]:
            single = subprocess.run(
                [sys.executable, "-m", "stratalog.bench.spark_read", "--bootstrap",
                 target.bootstrap, "--topic", topics[0], "--runs", "1", "--warmup", "0",
                 "--formats", fmt, *columns],
                capture_output=True, text=True, timeout=w.max_duration_s * 4 + 600, check=False,
            )  # fmt: skip
            if single.returncode != 0:
                res.ok, res.error = False, f"Spark read ({fmt}) failed: " + single.stderr[-400:]
                return res
            one_off[fmt] = json.loads(single.stdout.strip().splitlines()[-1])[fmt]["runs"][0]
        res.server_cpu_s = process_cpu_s(target.pid) - cpu0
        spark: dict[str, Any] = {}
        for fmt, phases in runs.items():
            rs, warm = phases["runs"], phases["warmup"]
            single = [one_off[fmt]] if fmt in one_off else []
            complete = all(r["rows"] == res.records for r in [*rs, *warm, *single])
            spark[fmt] = {
                "rows_per_s": statistics.median(r["rows_per_s"] for r in rs),
                "mb_per_s": statistics.median(r["bytes"] / 1e6 / r["seconds"] for r in rs),
                "runs": rs,
                "warmup": warm,
                "first_rows_per_s": (warm or rs)[0]["rows_per_s"],
                "one_off": one_off.get(fmt),
                "complete": complete,
            }
            if not complete:
                res.ok = False
                got = [r["rows"] for r in [*warm, *rs, *single]]
                res.error = f"format({fmt}) read {got} of {res.records} rows"
        res.extra["spark"] = spark
        return res

    def _catchup_case(self, w: Workload, target: Target, params: dict[str, Any]) -> CaseResult:
        """Produce p99 at a fixed rate, alone and then with consumers draining a cold backlog."""
        rate = self.resolve_rate(w, target.spec)
        if not rate:
            raise RuntimeError(f"workload {w.name}: a catch-up case needs a fixed rate")
        backlog_topic = [f"bench-{w.name}-backlog"]
        target.create_topics(backlog_topic, w.backlog_partitions)
        # 1. The backlog, written as fast as the target takes it.
        n_backlog = max(1, w.backlog_bytes // w.record_size)
        fill_w = w.with_overrides(
            acks="1", latency_sample_every=1000, max_duration_s=max(w.max_duration_s, 1800)
        )
        fill = run_load(
            target,
            producer_jobs(
                fill_w.with_overrides(partitions=w.backlog_partitions),
                backlog_topic,
                None,
                n_backlog,
            ),
            [],
            label=f"{w.name} · {target.name} · backlog",
            progress=self.progress,
        )
        if fill.errors:
            raise RuntimeError("filling the backlog failed: " + "; ".join(fill.errors))
        # A tiered target first moves the backlog down to its cold tier (Pafka's migration).
        settled = target.settle() if hasattr(target, "settle") else 0.0
        phase_records = int(rate * w.phase_duration_s)
        # Alone and with readers alternate (A B A B ...): on a shared machine a p99 drifts from
        # one half-minute to the next by as much as the goal's 25%, so one pair of phases
        # cannot tell the readers' effect from the drift. The goal compares medians of the
        # phases' p99s, and the alone phases' own spread is reported as the noise floor.
        pairs = max(1, w.phase_pairs)
        per_phase: list[dict[str, Any]] = []
        loads: dict[str, list[LoadResult]] = {"alone": [], "with-backlog-readers": []}
        evicted = 0
        for k in range(pairs):
            for phase in ("alone", "with-backlog-readers"):
                # Each phase starts from a cold page cache (the backlog readers read from the
                # start again, from the disk), alone phases too, so both start alike.
                if w.backlog_cold:
                    evicted = max(evicted, evict_page_cache(target.data_dirs()))
                    time.sleep(1.0)
                load, p99 = self._catchup_phase(w, target, rate, phase, k, phase_records)
                loads[phase].append(load)
                row = _phase_row(w, phase, k, load, p99)
                per_phase.append(row)
        alone_rows = [r for r in per_phase if r["phase"] == "alone"]
        busy_rows = [r for r in per_phase if r["phase"] != "alone"]
        busy = loads["with-backlog-readers"][-1]
        res = _result_from_load(w, target, busy, params)
        res.records = sum(x.acked for x in loads["with-backlog-readers"])
        tail_read = sum(r["tail_read"] for r in busy_rows)
        res.consumed = tail_read
        errors = [e for x in loads["alone"] + loads["with-backlog-readers"] for e in x.errors]
        res.ok = not errors and all(r["tail_read"] >= r["acked"] for r in per_phase)
        if not res.ok:
            short = [r for r in per_phase if r["tail_read"] < r["acked"]]
            res.error = "; ".join(errors) or "; ".join(
                f"{r['phase']} {r['pair']}: tail consumers read {r['tail_read']} of {r['acked']}"
                for r in short
            )
        # Pooled histograms of each kind of phase, and the medians of the phases' p99s.
        p_alone = hist.summary(
            hist.merge([r.get("hist") for x in loads["alone"] for r in x.producers])
        )
        p_busy = hist.summary(
            hist.merge([r.get("hist") for x in loads["with-backlog-readers"] for r in x.producers])
        )
        res.publish = p_busy
        med_alone = _median([r["publish_p99_ms"] for r in alone_rows])
        med_busy = _median([r["publish_p99_ms"] for r in busy_rows])
        backlog_bytes = sum(r["backlog_read_bytes"] for r in busy_rows)
        backlog_secs = sum(r["backlog_read_s"] for r in busy_rows)
        alone_p99s = [r["publish_p99_ms"] for r in alone_rows if r["publish_p99_ms"]]
        res.extra.update(
            backlog_records=n_backlog,
            backlog_bytes_written=fill.acked_bytes,
            evicted_bytes=evicted,
            migration_wait_s=settled,
            backlog_read_bytes=backlog_bytes,
            backlog_read_mb_per_s=backlog_bytes / 1e6 / backlog_secs if backlog_secs else 0.0,
            target_rate=rate,
            phase_pairs=pairs,
            phases=per_phase,
            publish_alone=p_alone,
            publish_with_backlog=p_busy,
            publish_p99_alone_ms=med_alone,
            publish_p99_with_backlog_ms=med_busy,
            # How far apart the alone phases' own p99s lie (max / min - 1): the noise floor.
            alone_p99_spread=(max(alone_p99s) / min(alone_p99s) - 1)
            if len(alone_p99s) > 1
            else None,
            p99_increase=(med_busy / med_alone - 1.0) if med_alone and med_busy else None,
        )
        for what, key in (
            ("broker_produce_p99_ms", "broker_produce_p99"),
            ("fsync_p99_ms", "fsync_p99"),
            ("commit_p99_ms", "commit_p99"),
            ("loop_lag_p99_ms", "loop_lag_p99"),
        ):
            a = _median([r[what] for r in alone_rows if r.get(what) is not None])
            b = _median([r[what] for r in busy_rows if r.get(what) is not None])
            if a is not None and b is not None:
                res.extra[f"{key}_alone_ms"] = a
                res.extra[f"{key}_with_backlog_ms"] = b
        return res

    def _catchup_phase(
        self,
        w: Workload,
        target: Target,
        rate: float,
        phase: str,
        pair: int,
        records: int,
    ) -> tuple[LoadResult, dict[str, float | None]]:
        """One phase of the catch-up: the tail producers and consumers, plus the backlog
        readers (from the backlog's start) unless alone."""
        backlog_topic = [f"bench-{w.name}-backlog"]
        # Fresh tail topics per phase, so each phase's tail consumers read only its records.
        tail_topics = topic_names(w, f"-tail-{phase}-{pair}")
        target.create_topics(tail_topics, w.partitions)
        consumers = consumer_jobs(
            w.consumers, tail_topics, w.partitions, sample_every=w.latency_sample_every
        )
        if phase != "alone":
            consumers += backlog_reader_jobs(w, backlog_topic)
        tail_w = w.with_overrides(max_duration_s=w.phase_duration_s * 2 + 30)
        # The broker's own view of produce latency (Stratalog's request histogram): it tells
        # the broker's share of the clients' p99 from the clients' own scheduling; its fsync
        # histogram tells the disk's share (a group commit's fsync time).
        before = broker_buckets(target)
        load = run_load(
            target,
            producer_jobs(tail_w, tail_topics, rate, records),
            consumers,
            label=f"{w.name} · {target.name} · {phase} {pair + 1}",
            progress=self.progress,
            drain_timeout_s=w.drain_timeout_s,
            counted_consumers=w.consumers,
        )
        return load, (broker_p99_since(target, before) if before else {})

    def _cluster_case(self, w: Workload, target: Target, params: dict[str, Any]) -> CaseResult:
        """Failover trials or a rejoining replica's catch-up (bench/failover.py, rejoin.py)."""
        from stratalog.bench.cluster_targets import ClusterTarget
        from stratalog.bench.failover import run_failover
        from stratalog.bench.rejoin import run_rejoin

        if not isinstance(target, ClusterTarget):
            raise RuntimeError(f"workload {w.name} needs a cluster target, not {target.kind}")
        res = CaseResult(w.name, target.name, target.kind, target.describe(), params)
        if w.kind == "failover":
            out = run_failover(w, target, self.progress, self.log)
            load = out.pop("load")
            res.records = load.get("records", 0)
            res.bytes = load.get("bytes", 0)
            res.seconds = load.get("t_last", 0.0) - load.get("t_first", 0.0)
            if res.seconds > 0:
                res.records_per_s = res.records / res.seconds
                res.mb_per_s = res.bytes / 1e6 / res.seconds
            res.publish = hist.summary(hist.merge([load.get("hist")]))
            res.extra.update(out, failed_sends=load.get("errors", 0), target_rate=w.rate)
            if not out["recovered"]:
                res.ok, res.error = False, "no trial saw an acknowledgement after the kill"
        else:
            out = run_rejoin(w, target, self.progress, self.log)
            trials = out["trials"]
            rates = [t["mb_per_s"] for t in trials if t.get("mb_per_s")]
            disks = [t["disk"]["mb_per_s"] for t in trials]
            res.bytes = sum(t["bytes"] for t in trials)
            res.records = res.bytes // w.record_size
            res.extra.update(
                out,
                catch_up_mb_per_s=_median(rates),
                disk_read_mb_per_s=_median(disks),
                of_disk=_median([t["of_disk"] for t in trials if t.get("of_disk")]),
                catch_up_mb_per_s_from_restart=_median(
                    [t["mb_per_s_from_restart"] for t in trials if t.get("mb_per_s_from_restart")]
                ),
            )
            if len(rates) < len(trials):
                res.ok = False
                res.error = f"{len(trials) - len(rates)} of {len(trials)} rejoins did not finish"
        return res

    def _burst_case(self, w: Workload, target: Target, params: dict[str, Any]) -> CaseResult:
        """Pafka's burst: with the hot tier filled to just under its migration threshold, a
        burst faster than the cold tier's bandwidth is taken at hot-tier speed until the reserve
        (capacity - threshold) is used up, then at the cold tier's pace; afterwards migration
        drains the hot tier back to the threshold. The hot tier's usage is followed throughout."""
        rate = self.resolve_rate(w, target.spec)
        if not rate or not w.records:
            raise RuntimeError(f"workload {w.name}: a burst needs a fixed rate and records")
        topics = topic_names(w)
        target.create_topics(topics, w.partitions)
        plan = target.tier_plan() if isinstance(target, StratalogTarget) else None
        hot = target.hot_bytes if isinstance(target, StratalogTarget) else None
        prefill = max(1, w.prefill_bytes // w.record_size) if w.prefill_bytes else 0
        if prefill:
            fill = run_load(
                target,
                producer_jobs(
                    w.with_overrides(acks="1", latency_sample_every=1000),
                    topics,
                    None,
                    prefill,
                ),
                [],
                label=f"{w.name} · {target.name} · prefill",
                progress=self.progress,
            )
            if fill.errors:
                raise RuntimeError("the prefill failed: " + "; ".join(fill.errors))
            if hasattr(target, "settle"):
                target.settle()
        hot_before = hot() if hot else 0
        timeline: list[tuple[float, int, int]] = []  # (time, acknowledged bytes, hot bytes)
        last = [0.0]

        def sample(t: float, acked: int) -> None:
            if t - last[0] >= 0.2:
                last[0] = t
                timeline.append((t, acked * w.record_size, hot() if hot else 0))

        load = run_load(
            target,
            producer_jobs(w, topics, rate, w.records),
            [],
            label=f"{w.name} · {target.name}",
            progress=self.progress,
            sample=sample,
        )
        res = _result_from_load(w, target, load, params)
        res.extra["target_rate"] = rate
        t_end = max((r["t_last"] for r in load.producers if "t_last" in r), default=time.time())
        timeline.append((t_end, load.acked_bytes, hot() if hot else 0))
        # After the burst: follow the hot tier until migration has brought it back down.
        drained_at = None
        if plan and hot:
            floor = plan["threshold"] * plan["capacity"] + plan["segment_bytes"]
            deadline = time.monotonic() + w.drain_max_s
            while time.monotonic() < deadline:
                used = hot()
                timeline.append((time.time(), load.acked_bytes, used))
                if used <= floor:
                    drained_at = time.time()
                    break
                time.sleep(0.2)
        res.extra["burst"] = burst_analysis(
            timeline, load.t_start, t_end, drained_at, rate * w.record_size, plan, hot_before
        )
        res.stored = target.count_records(topics, w.partitions)
        expected = w.records + prefill
        if res.ok and res.stored is not None and res.stored < expected:
            res.ok = False
            res.error = f"the server holds {res.stored} records, {expected} were acknowledged"
        return res


def _median(xs: list[float]) -> float | None:
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def _phase_row(
    w: Workload, phase: str, pair: int, load: LoadResult, p99: dict[str, float | None]
) -> dict[str, Any]:
    """One catch-up phase in the results: its p99s and what its readers read."""
    # Results arrive in the order the processes finish: tell the readers apart by group.
    backlog = [r for r in load.consumers if r["group"] == "backlog"]
    pub = load.publish_hist()
    return {
        "phase": phase,
        "pair": pair,
        "acked": load.acked,
        "tail_read": sum(r.get("records", 0) for r in load.consumers if r["group"] == "tail"),
        "publish_p99_ms": pub["p99"] if pub else None,
        "publish_max_ms": pub["max"] if pub else None,
        "broker_produce_p99_ms": p99.get("produce"),
        "fsync_p99_ms": p99.get("fsync"),
        "commit_p99_ms": p99.get("commit"),
        "loop_lag_p99_ms": p99.get("loop_lag"),
        "broker_produce_max_ms": p99.get("produce_max"),
        "commit_max_ms": p99.get("commit_max"),
        "loop_lag_max_ms": p99.get("loop_lag_max"),
        "gc_max_ms": p99.get("gc_max"),
        "backlog_read_bytes": sum(r.get("bytes", 0) for r in backlog),
        "backlog_read_s": max(
            (r["t_last"] - r["t_start"] for r in backlog if r.get("t_last")), default=0.0
        ),
        "server_cores": load.server_cpu_s / (load.t_end - load.t_start)
        if load.t_end > load.t_start
        else 0.0,
        "client_cores": load.client_cpu_s / (load.t_end - load.t_start)
        if load.t_end > load.t_start
        else 0.0,
    }


def broker_buckets(target: Target) -> dict[str, dict[float, float]]:
    """Stratalog's own produce-request, group-commit fsync, group commit as the loop sees it,
    collector pause and event-loop lag histograms (cumulative buckets from /metrics); empty
    for other targets."""
    if not isinstance(target, StratalogTarget):
        return {}
    return {
        "produce": target.histogram_buckets("stratalog_request_seconds", api="produce"),
        "fsync": target.histogram_buckets("stratalog_fsync_seconds"),
        "commit": target.histogram_buckets("stratalog_group_commit_seconds"),
        "gc": target.histogram_buckets("stratalog_gc_pause_seconds"),
        "loop_lag": target.histogram_buckets("stratalog_event_loop_lag_seconds"),
    }


def broker_p99_since(target: Target, before: dict[str, dict[float, float]]) -> dict:
    """p99 in ms of each of broker_buckets' histograms over what was observed since ``before``."""
    out: dict[str, float | None] = {}
    for what, b in broker_buckets(target).items():
        q = hist.bucket_quantile(before.get(what, {}), b, 0.99)
        out[what] = q * 1000 if q is not None else None
        # The longest one too (its bucket's bound): a few stalls of hundreds of ms move the
        # clients' p99 while the broker's p99s, counted per request or per commit, hide them.
        top = hist.bucket_quantile(before.get(what, {}), b, 1.0)
        out[f"{what}_max"] = top * 1000 if top is not None else None
    return out


def burst_analysis(
    timeline: list[tuple[float, int, int]],
    t_start: float,
    t_end: float,
    drained_at: float | None,
    burst_bytes_per_s: float,
    plan: dict[str, float] | None,
    hot_before: int = 0,
) -> dict[str, Any]:
    """What the burst's timeline says, beside Pafka's estimates: the burst is absorbed at the
    offered rate for about reserve / (rate - cold bandwidth) seconds (reserve / rate if the
    cold tier took nothing meanwhile), and the hot tier drains back to the threshold in about
    (hot usage at the end - threshold) / cold bandwidth."""
    out: dict[str, Any] = {
        "offered_mb_per_s": burst_bytes_per_s / 1e6,
        "timeline": [
            {"t": round(t - t_start, 2), "acked_mb": a / 1e6, "hot_mb": h / 1e6}
            for t, a, h in timeline
        ],
    }
    if not plan or not timeline:
        return out
    cap, thr, cold = plan["capacity"], plan["threshold"], plan["cold_bytes_per_s"]
    seg = plan["segment_bytes"]
    during = [(t, a, h) for t, a, h in timeline if t <= t_end]
    reserve = max(0.0, cap - hot_before)
    full = next(((t, a) for t, a, h in during if h >= cap - seg), None)
    out.update(
        capacity_mb=cap / 1e6,
        threshold=thr,
        cold_mb_per_s=cold / 1e6,
        hot_at_start_mb=hot_before / 1e6,
        reserve_mb=reserve / 1e6,
        pafka_absorb_s=reserve / burst_bytes_per_s,
        expected_absorb_s=reserve / (burst_bytes_per_s - cold)
        if cold and burst_bytes_per_s > cold
        else None,
    )
    if full is not None:
        t_full, a_full = full
        out["absorb_s"] = t_full - t_start
        out["absorb_mb_per_s"] = a_full / 1e6 / (t_full - t_start) if t_full > t_start else None
        a_end = during[-1][1]
        if t_end - t_full > 1.0:
            out["after_full_mb_per_s"] = (a_end - a_full) / 1e6 / (t_end - t_full)
    hot_end = next((h for t, _a, h in timeline if t >= t_end), None)
    if hot_end is not None:
        out["hot_at_end_mb"] = hot_end / 1e6
        if cold:
            out["expected_drain_s"] = max(0.0, hot_end - thr * cap) / cold
    out["drain_s"] = drained_at - t_end if drained_at is not None else None
    return out


def kcat_consume(bootstrap: str, topics: list[str], records: int, record_size: int) -> dict:
    """Read the topics back with kcat twice: first as they are, then warm, from the page cache
    (the best case of a consumer). The two differ where appends skip the page cache
    (``storage.direct_io``): there the first read finds older chunks only on the disk."""
    import shutil

    kcat = shutil.which("kcat") or shutil.which("kafkacat")
    if kcat is None:
        return {"error": "kcat is not installed"}
    first = _kcat_read(kcat, bootstrap, topics, records, record_size)
    if "error" in first:
        return first
    out = _kcat_read(kcat, bootstrap, topics, records, record_size)
    if "error" not in out:
        out["first_read"] = first
    return out


def _kcat_read(
    kcat: str, bootstrap: str, topics: list[str], records: int, record_size: int
) -> dict[str, Any]:
    import subprocess

    total_records = 0
    t0 = time.perf_counter()
    for t in topics:
        proc = subprocess.run(
            [kcat, "-C", "-b", bootstrap, "-t", t, "-o", "beginning", "-e", "-q",
             "-f", "%o\n", "-X", "fetch.max.bytes=52428800"],
            capture_output=True, timeout=600, check=False,
        )  # fmt: skip
        if proc.returncode != 0:
            return {"error": proc.stderr.decode(errors="replace")[-300:]}
        total_records += proc.stdout.count(b"\n")
    secs = time.perf_counter() - t0
    out: dict[str, Any] = dict(
        records=total_records,
        seconds=secs,
        mb_per_s=total_records * record_size / 1e6 / secs if secs else 0.0,
        complete=total_records >= records,
    )
    with contextlib.suppress(Exception):
        out["records_per_s"] = total_records / secs
    return out


_PERF_SUMMARY = re.compile(
    r"^(?P<records>\d+) records sent, (?P<rps>[\d.]+) records/sec \((?P<mbps>[\d.]+) MB/sec\), "
    r"(?P<avg>[\d.]+) ms avg latency, (?P<max>[\d.]+) ms max latency, (?P<p50>\d+) ms 50th, "
    r"(?P<p95>\d+) ms 95th, (?P<p99>\d+) ms 99th, (?P<p999>\d+) ms 99\.9th\.$"
)


def producer_perf_test(w: Workload, target: Target, records: int) -> dict[str, Any]:
    """Kafka's own kafka-producer-perf-test (the Java client) as an independent load generator
    on a fresh topic of the same shape: the same records, acks, linger and batch size."""
    from stratalog.peers.kafka import KafkaSetupError, run_tool

    topic = f"bench-{w.name}-perf-test"
    target.create_topics([topic], w.partitions)
    acks = {"all": "-1"}.get(w.acks, w.acks)
    cpu0 = process_cpu_s(target.pid)
    t0 = time.perf_counter()
    try:
        proc = run_tool(
            "kafka-producer-perf-test",
            "--topic", topic,
            "--num-records", str(records),
            "--record-size", str(w.record_size),
            "--throughput", "-1",
            # One flag, many values: the tool keeps only the last --command-property flag.
            "--command-property",
            f"bootstrap.servers={target.bootstrap}",
            f"acks={acks}",
            f"linger.ms={int(w.linger_ms)}",
            f"batch.size={w.batch_bytes}",
            "buffer.memory=268435456",
            timeout=max(120.0, w.max_duration_s * 4),
            heap="1g",
        )  # fmt: skip
    except (KafkaSetupError, OSError, subprocess.TimeoutExpired) as e:
        return {"error": f"kafka-producer-perf-test: {e}"}
    secs = time.perf_counter() - t0
    found = [m for line in proc.stdout.splitlines() if (m := _PERF_SUMMARY.match(line.strip()))]
    if proc.returncode != 0 or not found:
        return {"error": (proc.stderr or proc.stdout)[-300:]}
    m = found[-1]
    return {
        "records": int(m["records"]),
        "records_per_s": float(m["rps"]),
        "mb_per_s": float(m["mbps"]) * 1.048576,  # the tool's MB is MiB
        "publish": {
            "mean": float(m["avg"]),
            "p50": float(m["p50"]),
            "p95": float(m["p95"]),
            "p99": float(m["p99"]),
            "p99.9": float(m["p999"]),
            "max": float(m["max"]),
        },
        "server_cpu_s": process_cpu_s(target.pid) - cpu0,
        "wall_s": secs,
    }
