"""Issue 31's latency goals (workloads latency, latency-max, latency-load): what one producer
waits with the defaults, against fsync=never, the old 2 ms group-commit window and Apache Kafka
in the same run."""

from __future__ import annotations

from stratalog.bench.goals import Goal
from stratalog.bench.rows import by_name

WORKLOADS = ("latency", "latency-max", "latency-load", "b-group-commit")

GOAL_5K = "latency: one producer at 5,000 rec/s (defaults)"
GOAL_500 = "latency: p50 at 500 rec/s vs fsync=never"
GOAL_B = "b: throughput with the adaptive group commit vs the 2 ms window"


def _pub(row: dict | None) -> dict | None:
    return row.get("publish") if row else None


def _peers(results: list[dict], rate: int) -> str:
    """The same load's p50 / p99 / p99.9 on the other targets of this run."""
    out = []
    for target in ("stratalog-gc2", "kafka-fsync", "kafka"):
        p = _pub(by_name(results, "latency", target, rate=rate))
        if p:
            out.append(f"{target} {p['p50']:.2f} / {p['p99']:.2f} / {p['p99.9']:.2f} ms")
    return "; ".join(out)


def latency_goals(results: list[dict]) -> list[Goal]:
    out: list[Goal] = []
    want = "p99 ≤ 5 ms, p99.9 ≤ 15 ms"
    p = _pub(by_name(results, "latency", "stratalog", rate=5000))
    if p:
        measured = f"p50 {p['p50']:.2f}, p99 {p['p99']:.2f}, p99.9 {p['p99.9']:.2f} ms"
        if peers := _peers(results, 5000):
            measured += f" (p50 / p99 / p99.9: {peers})"
        out.append(Goal(GOAL_5K, want, measured, p["p99"] <= 5 and p["p99.9"] <= 15))
    else:
        out.append(Goal(GOAL_5K, want, "-", None))
    want = "≤ fsync=never's p50 + 1 ms"
    p = _pub(by_name(results, "latency", "stratalog", rate=500))
    never = _pub(by_name(results, "latency", "stratalog-nosync", rate=500))
    if p and never:
        measured = f"{p['p50']:.2f} ms against {never['p50']:.2f} ms"
        if peers := _peers(results, 500):
            measured += f" (p50 / p99 / p99.9: {peers})"
        out.append(Goal(GOAL_500, want, measured, p["p50"] <= never["p50"] + 1.0))
    else:
        out.append(Goal(GOAL_500, want, "-", None))
    # "Throughput on workload b not lower than today's in the same run": b's load with both
    # group commits (bench/experiments/b-group-commit.toml).
    want = "≥ 1x (medians)"
    adaptive = by_name(results, "b-group-commit", "stratalog")
    window = by_name(results, "b-group-commit", "stratalog-gc2")
    if adaptive and window and window["records_per_s"]:
        ratio = adaptive["records_per_s"] / window["records_per_s"]
        measured = (
            f"{ratio:.2f}x ({adaptive['records_per_s']:,.0f} against "
            f"{window['records_per_s']:,.0f} rec/s; publish p99 {_p99(adaptive)} against "
            f"{_p99(window)})"
        )
        out.append(Goal(GOAL_B, want, measured, ratio >= 1.0))
    else:
        out.append(Goal(GOAL_B, want, "-", None))
    return out


def _p99(row: dict) -> str:
    p = row.get("publish")
    return f"{p['p99']:.1f} ms" if p else "-"


def markdown_lines(results: list[dict]) -> list[str]:
    """The goals as a section of results.md, when this run measured any of them."""
    if not any(r["workload"] in WORKLOADS for r in results):
        return []
    lines = ["## Latency goals (issue 31, from this run)", ""]
    lines += ["| goal | wanted | measured | verdict |", "|---|---|---|---|"]
    for g in latency_goals(results):
        lines.append(f"| {g.name} | {g.want} | {g.measured} | {g.verdict} |")
    return [*lines, ""]
