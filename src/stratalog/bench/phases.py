"""A phase of steady producers at the workload's fixed rate, for the cases that compare one
phase with another (compaction_load.py, auth_storm.py): the load, and a row of its figures
(the clients' publish p99 and max, the broker's own produce, fsync and event-loop-lag p99 from
its /metrics where it has them, its CPU, the failed sends)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from stratalog.bench.broker_histograms import broker_buckets, broker_p99_since
from stratalog.bench.load import LoadResult, Progress, producer_jobs, run_load
from stratalog.bench.targets import Target
from stratalog.bench.workload import Workload


def fixed_rate(w: Workload, who: str) -> float:
    """The workload's rate, which these cases need fixed."""
    if not w.rate:
        raise RuntimeError(f"workload {w.name}: {who} need a fixed rate")
    return w.rate


def steady_phase(
    w: Workload,
    target: Target,
    topics: list[str],
    name: str,
    seconds: float,
    progress: Progress,
    stop_when: Callable[[], bool] | None = None,
) -> tuple[LoadResult, dict[str, Any]]:
    """``seconds`` at the workload's rate (``stop_when`` may end it sooner)."""
    records = int(w.rate * seconds) if w.rate else 0
    before = broker_buckets(target)
    phase_w = w.with_overrides(max_duration_s=seconds + 30)
    load = run_load(
        target,
        producer_jobs(phase_w, topics, w.rate, records),
        [],
        label=f"{w.name} · {target.name} · {name}",
        progress=progress,
        stop_when=stop_when,
    )
    p99 = broker_p99_since(target, before) if before else {}
    pub = load.publish_hist()
    row = {
        "phase": name,
        "acked": load.acked,
        "seconds": load.produce_seconds,
        "publish_p99_ms": pub["p99"] if pub else None,
        "publish_p999_ms": pub["p99.9"] if pub else None,
        "publish_max_ms": pub["max"] if pub else None,
        "broker_produce_p99_ms": p99.get("produce"),
        "fsync_p99_ms": p99.get("fsync"),
        "loop_lag_p99_ms": p99.get("loop_lag"),
        "loop_lag_max_ms": p99.get("loop_lag_max"),
        "server_cores": load.server_cpu_s / (load.t_end - load.t_start)
        if load.t_end > load.t_start
        else 0.0,
        "errors": load.errors,
        "failed_sends": sum(r.get("errors", 0) + r.get("unacked", 0) for r in load.producers),
    }
    return load, row
