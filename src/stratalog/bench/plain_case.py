"""The plain case: the workload's producers (at a rate, or as fast as the target takes them) and
consumers in one phase, by the harness's clients or (``run_tool``) by a peer's own load tool."""

from __future__ import annotations

from typing import Any

from stratalog.bench.broker_histograms import broker_buckets, broker_p99_since
from stratalog.bench.independent_clients import kcat_consume, producer_perf_test
from stratalog.bench.load import Progress, consumer_jobs, producer_jobs, run_load, topic_names
from stratalog.bench.results import CaseResult, result_from_load
from stratalog.bench.targets import Target
from stratalog.bench.workload import Workload


def run_plain(
    w: Workload, target: Target, params: dict[str, Any], progress: Progress, *, rate: float | None
) -> CaseResult:
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
        progress=progress,
        drain_timeout_s=w.drain_timeout_s,
    )
    res = result_from_load(w, target, load, params)
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


def run_tool(w: Workload, target: Target, params: dict[str, Any], progress: Progress) -> CaseResult:
    records = w.records or int((w.rate or 0) * w.duration_s)

    def cb(done: int) -> None:
        progress(f"{w.name} · {target.name}", done, 0, records)

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
