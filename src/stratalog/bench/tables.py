"""The Markdown of a ``stratalog bench`` run: the machine's limits, the goals, then one table per
workload (medians of the runs) with what its cases measured beside the table."""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

from stratalog.bench.goals import goals
from stratalog.bench.rows import aggregate, catchup_p99


def _f(x: float | None, digits: int = 1) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return f"{x:,.{digits}f}"


def _lat(s: dict[str, float] | None, key: str) -> str:
    return _f(s.get(key), 2) if s else "-"


def _runs(r: dict[str, Any]) -> str:
    each = r.get("runs_records_per_s") or [r["records_per_s"]]
    failed = r.get("failed_runs", 0)
    text = " / ".join(f"{x:,.0f}" for x in each)
    return f"{len(each)}: {text}" + (f" ({failed} failed)" if failed else "")


def _params(r: dict[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in r.get("params", {}).items())


def markdown(run: dict[str, Any]) -> str:
    results = aggregate(run["results"])
    lines = [f"# stratalog bench: {run['started']}", ""]
    lines += [f"Command: `{run['command']}`", ""]
    load = run.get("load_average") or {}
    if load:
        lines += [
            "Load average (1, 5, 15 min) "
            + ", ".join(
                f"at the {k}: {' / '.join(f'{x:.2f}' for x in v)}" for k, v in load.items()
            ),
            "",
        ]
    n = run.get("runs", 1)
    if n > 1:
        lines += [
            f"Every case ran {n} times, in rounds over all targets; each figure is the median "
            "of the successful runs, and the last column gives every run's records/s.",
            "",
        ]
    m = run.get("machine") or {}
    if m:
        lines += ["## The machine's limits", ""]
        lines += ["| measure | value |", "|---|---|"]
        for key, label, unit in (
            ("fdatasync_1m", "sequential write, fdatasync every 1 MiB", "mb_per_s"),
            ("direct_write", "sequential write, O_DIRECT", "mb_per_s"),
            ("seq_read", "sequential read, not in the page cache", "mb_per_s"),
            ("loopback", "loopback TCP", "gb_per_s"),
        ):
            v = m.get(key) or {}
            if "error" in v:
                val = v["error"]
            elif unit == "gb_per_s":
                val = f"{_f(v.get(unit), 2)} GB/s"
            else:
                val = f"{_f(v.get(unit))} MB/s"
            lines.append(f"| {label} | {val} |")
        w4 = m.get("write_4k_fdatasync") or {}
        if "error" in w4:
            lines.append(f"| 4 KiB write + fdatasync | {w4['error']} |")
        elif w4:
            lines.append(
                f"| 4 KiB write + fdatasync | p50 {_f(w4.get('p50_ms'), 3)} ms, "
                f"p99 {_f(w4.get('p99_ms'), 3)} ms, {_f(w4.get('iops'), 0)} IOPS |"
            )
        ur = m.get("fdatasync_under_reads") or {}
        if "error" in ur:
            lines.append(f"| fdatasync beside a sequential reader | {ur['error']} |")
        elif ur:
            for key, label in (("reader_default", "default"), ("reader_idle", "idle")):
                r = ur.get(key) or {}
                fs = r.get("fdatasync") or {}
                lines.append(
                    f"| fdatasync beside a sequential reader ({label} I/O class) | "
                    f"p50 {_f(fs.get('p50_ms'), 3)} ms, p99 {_f(fs.get('p99_ms'), 3)} ms, "
                    f"p99.9 {_f(fs.get('p99.9_ms'), 3)} ms; reader {_f(r.get('read_mb_per_s'))} "
                    "MB/s |"
                )
        facts = m.get("facts") or {}
        if facts:
            lines.append("| machine | " + ", ".join(f"{k}: {v}" for k, v in facts.items()) + " |")
        lines.append("")
    lines += ["## Goals (ratios from this run)", ""]
    lines += ["| goal | wanted | measured | verdict |", "|---|---|---|---|"]
    for g in goals(results, m):
        lines.append(f"| {g.name} | {g.want} | {g.measured} | {g.verdict} |")
    lines.append("")
    from stratalog.bench import latency_goals

    lines += latency_goals.markdown_lines(results)
    from stratalog.bench import cluster_report

    if cluster_report.has_cluster(results):
        lines += cluster_report.markdown_lines(results)
    from stratalog.bench import features_report

    if features_report.has_features(results):
        lines += features_report.markdown_lines(results, run["results"])
    by_w: dict[str, list[dict]] = defaultdict(list)
    for r in results:
        by_w[r["workload"]].append(r)
    titles = run.get("workloads", {})
    for name, rs in by_w.items():
        lines += [f"## Workload {name}: {titles.get(name, '')}", ""]
        lines += [
            "| target | durability / settings | params | records/s | MB/s | publish p50 / p99 / "
            "p99.9 / max (ms) | end-to-end p99 (ms) | server cores | client cores | "
            "server CPU s/MB | runs (records/s) |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in rs:
            if not r["ok"]:
                lines.append(
                    f"| {r['target']} | {r['describe']} | {_params(r)} | failed: "
                    f"{r['error'][:160]} | | | | | | | |"
                )
                continue
            p = r.get("publish")
            pub = " / ".join(_lat(p, k) for k in ("p50", "p99", "p99.9", "max"))
            lines.append(
                f"| {r['target']} | {r['describe']} | {_params(r)} | {_f(r['records_per_s'], 0)} "
                f"| {_f(r['mb_per_s'])} | {pub} | {_lat(r.get('end_to_end'), 'p99')} "
                f"| {_f(r['server_cores'], 2)} | {_f(r.get('client_cores'), 2)} "
                f"| {_f(r.get('cpu_s_per_mb'), 4)} "
                f"| {_runs(r)} |"
            )
        extras = [r for r in rs if r["ok"] and r.get("extra")]
        for r in extras:
            x = r["extra"]
            if "p99_increase" in x and x["p99_increase"] is not None:
                a99, b99 = catchup_p99(r, "alone"), catchup_p99(r, "with_backlog")
                lines.append("")
                lines.append(
                    f"- {r['target']}: produce p99 {a99:.2f} ms alone, {b99:.2f} ms "
                    f"while {x['backlog_read_bytes'] / 1e9:.2f} GB of backlog was read at "
                    f"{x['backlog_read_mb_per_s']:,.0f} MB/s ({x['p99_increase']:+.0%}); backlog "
                    f"{x['backlog_bytes_written'] / 1e9:.2f} GB, "
                    f"{x['evicted_bytes'] / 1e9:.2f} GB dropped from the page cache first"
                )
                ba, bb = (
                    x.get("broker_produce_p99_alone_ms"),
                    x.get("broker_produce_p99_with_backlog_ms"),
                )
                if ba is not None and bb is not None:
                    lines[-1] += (
                        f"; the broker's own produce p99 (request received to response "
                        f"written): {ba:.2f} ms alone, {bb:.2f} ms with the readers"
                    )
                fa, fb = x.get("fsync_p99_alone_ms"), x.get("fsync_p99_with_backlog_ms")
                if fa is not None and fb is not None:
                    lines[-1] += f"; its fsync p99: {fa:.2f} ms alone, {fb:.2f} ms with the readers"
                ca, cb = x.get("commit_p99_alone_ms"), x.get("commit_p99_with_backlog_ms")
                if ca is not None and cb is not None:
                    lines[-1] += (
                        f"; its group commit p99 as the event loop sees it (the fsyncs and the "
                        f"hand-offs to their thread): {ca:.2f} ms alone, {cb:.2f} ms with the "
                        "readers"
                    )
                la, lb = x.get("loop_lag_p99_alone_ms"), x.get("loop_lag_p99_with_backlog_ms")
                if la is not None and lb is not None:
                    lines[-1] += (
                        f"; its event loop's lag p99: {la:.2f} ms alone, {lb:.2f} ms with the "
                        "readers"
                    )
                phases = x.get("phases") or []
                if len(phases) > 2:
                    # Medians of alternating phases; each phase's own figures, in order.
                    lines[-1] += (
                        f". Medians of {x['phase_pairs']} alternating pairs of phases; the alone "
                        f"phases' p99s lie {x['alone_p99_spread']:.0%} apart (the noise floor). "
                        "Phase by phase (client p99 / broker's own p99, ms): "
                        + ", ".join(
                            f"{'A' if ph['phase'] == 'alone' else 'B'}{ph['pair'] + 1} "
                            f"{_f(ph['publish_p99_ms'], 1)} / {_f(ph['broker_produce_p99_ms'], 1)}"
                            for ph in phases
                        )
                    )
            b = x.get("burst")
            if isinstance(b, dict) and b.get("absorb_s") is not None:
                lines.append("")
                after = b.get("after_full_mb_per_s")
                drain = b.get("drain_s")
                lines.append(
                    f"- {r['target']}: {b['offered_mb_per_s']:,.0f} MB/s offered; the hot tier "
                    f"({b['capacity_mb']:,.0f} MB, {b['hot_at_start_mb']:,.0f} MB used at the "
                    f"start, cold tier {b['cold_mb_per_s']:,.0f} MB/s) took it at "
                    f"{b['absorb_mb_per_s']:,.1f} MB/s for {b['absorb_s']:.1f} s (estimate "
                    f"{_f(b.get('expected_absorb_s'))} s; Pafka's reserve/rate "
                    f"{b['pafka_absorb_s']:.1f} s)"
                    + (f", then {after:,.1f} MB/s while full" if after is not None else "")
                    + (
                        f"; drained back to the threshold in {drain:.1f} s (estimate "
                        f"{_f(b.get('expected_drain_s'))} s)"
                        if drain is not None
                        else "; not drained back to the threshold in time"
                    )
                )
            for fmt, v in (x.get("spark") or {}).items():
                lines.append("")
                lines.append(
                    f'- Spark `format("{fmt}")` read the topic at {v["rows_per_s"]:,.0f} rows/s '
                    f"({v['mb_per_s']:,.1f} MB/s of values; median of {len(v['runs'])} runs"
                    + (
                        f" after {len(v['warmup'])} warm-up reads; the first read in the "
                        f"session: {v['first_rows_per_s']:,.0f} rows/s)"
                        if v.get("warmup")
                        else ")"
                    )
                    + (
                        f"; as a one-off job (the only read of a fresh session): "
                        f"{v['one_off']['rows_per_s']:,.0f} rows/s, "
                        f"{v['one_off']['seconds']:.1f} s"
                        if v.get("one_off")
                        else ""
                    )
                )
            if isinstance(x.get("tiers"), dict):
                t = x["tiers"]
                lines.append("")
                lines.append(
                    f"- {r['target']}: after the producers, {t['hot'] / 1e6:,.0f} MB in the hot "
                    f"tier and {t['cold'] / 1e6:,.0f} MB in the cold tier"
                )
            if x.get("broker_produce_p99_ms") is not None:
                lines.append("")
                lines.append(
                    f"- {r['target']}"
                    + (f" ({_params(r)})" if r.get("params") else "")
                    + f": the broker's own produce p99 (request received to response written) "
                    f"{x['broker_produce_p99_ms']:.2f} ms, its group-commit fsync p99 "
                    f"{_f(x.get('fsync_p99_ms'), 2)} ms"
                    + (
                        f", its collector's pauses p99 {x['gc_pause_p99_ms']:.2f} ms "
                        f"(the longest under {_f(x.get('gc_pause_max_ms'), 1)} ms)"
                        if x.get("gc_pause_p99_ms") is not None
                        else ""
                    )
                )
            pt = x.get("perf_test")
            if isinstance(pt, dict) and "records_per_s" in pt:
                lines.append("")
                lines.append(
                    f"- {r['target']}: kafka-producer-perf-test (Java client) sent "
                    f"{pt['records']:,} records at {pt['records_per_s']:,.0f} rec/s "
                    f"({pt['mb_per_s']:,.1f} MB/s), latency p50 {pt['publish']['p50']:.0f} / "
                    f"p99 {pt['publish']['p99']:.0f} / p99.9 {pt['publish']['p99.9']:.0f} ms"
                )
            elif isinstance(pt, dict):
                lines += ["", f"- {r['target']}: kafka-producer-perf-test failed: {pt['error']}"]
            if isinstance(x.get("kcat"), dict) and "mb_per_s" in x["kcat"]:
                k = x["kcat"]
                lines.append("")
                first = k.get("first_read") or {}
                lines.append(
                    f"- {r['target']}: kcat read {k['records']:,} records back in "
                    f"{k['seconds']:.2f} s: {k['mb_per_s']:,.0f} MB/s"
                    + (
                        f" (warm; the first read {first['mb_per_s']:,.0f} MB/s)"
                        if "mb_per_s" in first
                        else ""
                    )
                )
        lines.append("")
    return "\n".join(lines)
