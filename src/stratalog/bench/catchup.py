"""The catch-up case (workload e and its experiments): produce latency at a fixed rate, alone and
with consumers draining a backlog that is not in the page cache (BookKeeper's tail/backlog
isolation), in alternating phases."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from stratalog.bench import hist
from stratalog.bench.broker_histograms import broker_buckets, broker_p99_since
from stratalog.bench.load import (
    LoadResult,
    Progress,
    backlog_reader_jobs,
    consumer_jobs,
    producer_jobs,
    run_load,
    topic_names,
)
from stratalog.bench.results import CaseResult, median_of, result_from_load
from stratalog.bench.targets import Target
from stratalog.bench.workload import Workload


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


def run_catchup(
    w: Workload, target: Target, params: dict[str, Any], progress: Progress, *, rate: float | None
) -> CaseResult:
    """Produce p99 at a fixed rate, alone and then with consumers draining a cold backlog."""
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
        progress=progress,
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
            load, p99 = _catchup_phase(w, target, rate, phase, k, phase_records, progress)
            loads[phase].append(load)
            row = _phase_row(w, phase, k, load, p99)
            per_phase.append(row)
    alone_rows = [r for r in per_phase if r["phase"] == "alone"]
    busy_rows = [r for r in per_phase if r["phase"] != "alone"]
    busy = loads["with-backlog-readers"][-1]
    res = result_from_load(w, target, busy, params)
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
    p_alone = hist.summary(hist.merge([r.get("hist") for x in loads["alone"] for r in x.producers]))
    p_busy = hist.summary(
        hist.merge([r.get("hist") for x in loads["with-backlog-readers"] for r in x.producers])
    )
    res.publish = p_busy
    med_alone = median_of([r["publish_p99_ms"] for r in alone_rows])
    med_busy = median_of([r["publish_p99_ms"] for r in busy_rows])
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
        alone_p99_spread=(max(alone_p99s) / min(alone_p99s) - 1) if len(alone_p99s) > 1 else None,
        p99_increase=(med_busy / med_alone - 1.0) if med_alone and med_busy else None,
    )
    for what, key in (
        ("broker_produce_p99_ms", "broker_produce_p99"),
        ("fsync_p99_ms", "fsync_p99"),
        ("commit_p99_ms", "commit_p99"),
        ("loop_lag_p99_ms", "loop_lag_p99"),
    ):
        a = median_of([r[what] for r in alone_rows if r.get(what) is not None])
        b = median_of([r[what] for r in busy_rows if r.get(what) is not None])
        if a is not None and b is not None:
            res.extra[f"{key}_alone_ms"] = a
            res.extra[f"{key}_with_backlog_ms"] = b
    return res


def _catchup_phase(
    w: Workload,
    target: Target,
    rate: float,
    phase: str,
    pair: int,
    records: int,
    progress: Progress,
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
        progress=progress,
        drain_timeout_s=w.drain_timeout_s,
        counted_consumers=w.consumers,
    )
    return load, (broker_p99_since(target, before) if before else {})


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
