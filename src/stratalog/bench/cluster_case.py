"""The cluster cases: failover trials and a rejoining replica's catch-up (``failover.py``,
``rejoin.py``) as one case result."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from stratalog.bench import hist
from stratalog.bench.load import Progress
from stratalog.bench.results import CaseResult, median_of
from stratalog.bench.targets import Target
from stratalog.bench.workload import Workload


def run_cluster_case(
    w: Workload,
    target: Target,
    params: dict[str, Any],
    progress: Progress,
    log: Callable[[str], None],
) -> CaseResult:
    """Failover trials or a rejoining replica's catch-up (bench/failover.py, rejoin.py)."""
    from stratalog.bench.cluster_targets import ClusterTarget
    from stratalog.bench.failover import run_failover
    from stratalog.bench.rejoin import run_rejoin

    if not isinstance(target, ClusterTarget):
        raise RuntimeError(f"workload {w.name} needs a cluster target, not {target.kind}")
    res = CaseResult(w.name, target.name, target.kind, target.describe(), params)
    if w.kind == "failover":
        out = run_failover(w, target, progress, log)
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
        out = run_rejoin(w, target, progress, log)
        trials = out["trials"]
        rates = [t["mb_per_s"] for t in trials if t.get("mb_per_s")]
        disks = [t["disk"]["mb_per_s"] for t in trials]
        res.bytes = sum(t["bytes"] for t in trials)
        res.records = res.bytes // w.record_size
        res.extra.update(
            out,
            catch_up_mb_per_s=median_of(rates),
            disk_read_mb_per_s=median_of(disks),
            of_disk=median_of([t["of_disk"] for t in trials if t.get("of_disk")]),
            catch_up_mb_per_s_from_restart=median_of(
                [t["mb_per_s_from_restart"] for t in trials if t.get("mb_per_s_from_restart")]
            ),
        )
        if len(rates) < len(trials):
            res.ok = False
            res.error = f"{len(trials) - len(rates)} of {len(trials)} rejoins did not finish"
    return res
