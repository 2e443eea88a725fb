"""What a case measured: ``CaseResult`` (one workload on one target, one sweep point, one of the
``--runs`` rounds), made from a phase's ``LoadResult`` by ``result_from_load``."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

from stratalog.bench import hist
from stratalog.bench.load import LoadResult
from stratalog.bench.targets import Target
from stratalog.bench.workload import Workload


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


def result_from_load(
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


def median_of(xs: list[float]) -> float | None:
    """The median of the values that are not None (None if there are none)."""
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None
