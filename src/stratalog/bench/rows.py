"""The rows the report reads: ``aggregate`` merges a case's ``--runs`` rounds into one row
(medians), and the lookups the goals, tables and charts share find rows by workload, target,
kind, sweep point and producers' client."""

from __future__ import annotations

import json
import statistics
from collections import defaultdict

_MEDIAN_KEYS = (
    "records_per_s",
    "mb_per_s",
    "consume_mb_per_s",
    "server_cores",
    "client_cores",
    "cpu_s_per_mb",
)


def aggregate(results: list[dict]) -> list[dict]:
    """One row per workload, target and sweep point: the median of its successful runs for
    every rate, CPU and latency figure (extras from the run of median throughput), with each
    run's records/s kept in ``runs_records_per_s``. A case with no successful run shows its
    first failure."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in results:
        groups[
            (r["workload"], r["target"], json.dumps(r.get("params", {}), sort_keys=True))
        ].append(r)
    out = []
    for rs in groups.values():
        ok = [r for r in rs if r["ok"]]
        if not ok:
            out.append(rs[0])
            continue
        by_rate = sorted(ok, key=lambda r: r["records_per_s"])
        row = dict(by_rate[(len(by_rate) - 1) // 2])
        row["runs"] = len(ok)
        row["failed_runs"] = len(rs) - len(ok)
        row["runs_records_per_s"] = [r["records_per_s"] for r in ok]
        for k in _MEDIAN_KEYS:
            vals = [r[k] for r in ok if r.get(k) is not None]
            if vals:
                row[k] = statistics.median(vals)
        for h in ("publish", "end_to_end"):
            hs = [r[h] for r in ok if r.get(h)]
            if hs:
                row[h] = {k: statistics.median(x[k] for x in hs) for k in hs[0]}
        out.append(row)
    return out


def ok_rows(results: list[dict], workload: str, kind: str | None = None, **params) -> list[dict]:
    out = []
    for r in results:
        if r["workload"] != workload or not r["ok"]:
            continue
        if kind is not None and r["kind"] != kind:
            continue
        if any(str(r.get("params", {}).get(k)) != str(v) for k, v in params.items()):
            continue
        out.append(r)
    return out


def by_name(results: list[dict], workload: str, target: str, **params) -> dict | None:
    for r in ok_rows(results, workload, **params):
        if r["target"] == target:
            return r
    return None


def by_client(rows: list[dict]) -> dict[str, list[dict]]:
    """Sweep results by the producers' client ("" when the workload does not sweep it)."""
    out: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        out[str(r["params"].get("producer_client", ""))].append(r)
    return dict(sorted(out.items(), key=lambda kv: kv[0] != "java"))


def client_label(client: str) -> str:
    return f" ({client} producers)" if client else ""


def catchup_p99(r: dict, phase: str) -> float:
    """A catch-up case's produce p99 in one kind of phase: the median of its phases' p99s
    (results from before alternating phases have only the pooled histogram)."""
    x = r["extra"]
    return x.get(f"publish_p99_{phase}_ms") or x[f"publish_{phase}"]["p99"]
