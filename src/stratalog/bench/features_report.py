"""The Kafka-features and security workloads in a ``stratalog bench`` report: the goals of issues
28 and 29 as figures from the same run (transactions, compaction under load, SASL_SSL, failed
logins), each case's phases, and one chart of the four.

Goals on rates use ``rows.aggregate`` rows (medians of the runs); the compaction and login
goals take the median of each run's own figure, with every run's figure listed."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from stratalog.bench.cluster_report import _num
from stratalog.bench.figures import save_figure
from stratalog.bench.goals import Goal
from stratalog.bench.rows import by_name

WORKLOADS = ("txn", "compaction", "share", "sasl", "auth")
P99_RISE_GOAL = 0.25
RSS_GOAL_MIB = 50.0
SHARE_GOAL = 100_000  # records/s a share group of 4 consumers delivers


def has_features(results: list[dict]) -> bool:
    return any(r["workload"] in WORKLOADS or _compaction(r["workload"]) for r in results)


def _compaction(workload: str) -> bool:
    """The compaction workload, or an experiment on its load (bench/experiments/compaction-*)."""
    return workload == "compaction" or workload.startswith("compaction-")


def _ratio_text(mine: dict, other: dict) -> str:
    a, b = mine["mb_per_s"], other["mb_per_s"]
    return f"{a / b:.2f}x ({a:,.1f} vs {b:,.1f} MB/s)"


def _ratio_goal(name: str, rows: list[dict], w: str, a: str, b: str, at_least: float) -> Goal:
    mine, other = by_name(rows, w, a), by_name(rows, w, b)
    want = f"≥ {at_least:g}x" if at_least != 0.8 else "≥ 80%"
    if not mine or not other or not other.get("mb_per_s"):
        return Goal(name, want, "-", None)
    ratio = mine["mb_per_s"] / other["mb_per_s"]
    return Goal(name, want, _ratio_text(mine, other), ratio >= at_least)


def _runs_of(raw: list[dict], w: str, target: str) -> list[dict]:
    return [r for r in raw if r["workload"] == w and r["target"] == target]


def _pct(x: float | None) -> str:
    return f"{x:+.0%}" if x is not None else "-"


def _s(x: float | None) -> str:
    return f"{x:,.1f} s" if x is not None else "-"


def _ms(x: float | None) -> str:
    return f"{x:,.1f} ms" if x is not None else "-"


def compaction_goal(raw: list[dict], target: str, workload: str = "compaction") -> Goal:
    runs = _runs_of(raw, workload, target)
    name = f"produce p99 while a compacted topic is cleaned ({target})"
    want = f"rises < {P99_RISE_GOAL:.0%}"
    ok = [r for r in runs if r["ok"] and r["extra"].get("cleaning_p99_rise") is not None]
    if not ok:
        why = runs[0]["error"][:120] if runs else "-"
        return Goal(name, want, why, None)
    rises = [r["extra"]["cleaning_p99_rise"] for r in ok]
    med = statistics.median(rises)
    x = ok[0]["extra"]
    size = x["compacted"]["bytes"] / 2**30
    text = (
        f"median {_pct(med)} over {len(ok)} run(s) ({', '.join(_pct(v) for v in rises)}); "
        f"p99 {', '.join(_ms(r['extra']['publish_p99_cleaning_ms']) for r in ok)} cleaning vs "
        f"{', '.join(_ms(r['extra']['publish_p99_alone_ms']) for r in ok)} alone; "
        f"{size:.2f} GiB, {x['compacted']['keys']:,} keys, cleaned in "
        f"{', '.join(_s(r['extra']['cleaning_s']) for r in ok)}"
    )
    if len(ok) < len(runs):
        text += f"; {len(runs) - len(ok)} run(s) failed"
    return Goal(name, want, text, med < P99_RISE_GOAL)


def share_goal(raw: list[dict], target: str) -> Goal:
    """Records/s the share group delivered (median of the runs), each run's every record
    acknowledged exactly once."""
    runs = _runs_of(raw, "share", target)
    name = f"a share group of 4 consumers ({target})"
    want = f"≥ {SHARE_GOAL:,} records/s, each acknowledged once"
    ok = [r for r in runs if r["ok"]]
    if not ok:
        return Goal(name, want, runs[0]["error"][:120] if runs else "-", None)
    rates = [r["records_per_s"] for r in ok]
    med = statistics.median(rates)
    v = ok[0]["extra"]["share"]
    text = (
        f"median {med:,.0f} records/s over {len(ok)} run(s) "
        f"({', '.join(f'{x:,.0f}' for x in rates)}); {v['acked_once']:,} of {v['expected']:,} "
        f"acknowledged once, {v['acked_more']} more than once, {v['never']} never"
    )
    if len(ok) < len(runs):
        text += f"; {len(runs) - len(ok)} run(s) failed: {runs[0]['error'][:80]}"
    return Goal(name, want, text, med >= SHARE_GOAL and len(ok) == len(runs))


def auth_goal(raw: list[dict], target: str) -> Goal:
    runs = _runs_of(raw, "auth", target)
    name = f"failed SASL logins ({target})"
    want = f"RSS within {RSS_GOAL_MIB:g} MiB, good client served"
    if not runs:
        return Goal(name, want, "-", None)
    parts, met = [], True
    for r in runs:
        x = r.get("extra") or {}
        if "rss_mib" not in x:
            parts.append(f"failed: {r['error'][:120]}")
            met = False
            continue
        storm = x.get("storm", {})
        phases = {p["phase"]: p for p in x["phases"]}
        growth = x.get("rss_growth_mib")
        parts.append(
            f"{sum(storm.get('outcomes', {}).values()):,} logins "
            f"({storm.get('outcomes')}, {storm.get('logins_per_s', 0):,.0f}/s): RSS "
            f"{x['rss_mib']['before_storm']:.1f} → peak {x['rss_mib']['peak_during']:.1f} → "
            f"{x['rss_mib']['after_storm']:.1f} MiB (+{growth:.1f}); good client "
            f"{x['good_client_failed_sends']} failed sends, max "
            f"{_ms(phases['storm']['publish_max_ms'])} (p99 "
            f"{_ms(phases['storm']['publish_p99_ms'])}) during vs max "
            f"{_ms(phases['before']['publish_max_ms'])} before"
        )
        met = met and r["ok"] and growth is not None and growth < RSS_GOAL_MIB
    return Goal(name, want, "; ".join(parts), met)


# (goal, workload, Stratalog's target, the reference target, at least this ratio)
RATIO_GOALS = (
    ("transactional produce vs Kafka (flush.messages=1)", "txn", "stratalog", "kafka-fsync", 1),
    ("transactional produce vs Kafka (default, reference)", "txn", "stratalog", "kafka", 1),
    (
        "transactional produce vs Kafka (every log fsynced, the transaction log too)",
        "txn",
        "stratalog",
        "kafka-fsync-all",
        1,
    ),
    (
        "produce over SASL_SSL vs plaintext (same broker)",
        "sasl",
        "stratalog-sasl-ssl",
        "stratalog-plaintext",
        0.8,
    ),
    (
        "produce over SASL_SSL vs Kafka over SASL_SSL (flush.messages=1)",
        "sasl",
        "stratalog-sasl-ssl",
        "kafka-fsync-sasl-ssl",
        1,
    ),
)


def feature_goals(rows: list[dict], raw: list[dict]) -> list[Goal]:
    """Issues 28 and 29's goals that a bench run measures (``rows``: aggregated)."""
    ratios = [_ratio_goal(name, rows, *args) for name, *args in RATIO_GOALS]
    out = ratios[:3]
    for w, t in sorted({(r["workload"], r["target"]) for r in raw if _compaction(r["workload"])}):
        out.append(compaction_goal(raw, t, w))
    for t in sorted({r["target"] for r in raw if r["workload"] == "share"}):
        out.append(share_goal(raw, t))
    out += ratios[3:]
    for t in sorted({r["target"] for r in raw if r["workload"] == "auth"}):
        out.append(auth_goal(raw, t))
    return out


def markdown_lines(rows: list[dict], raw: list[dict]) -> list[str]:
    """The goals' table, then every compaction and failed-login run phase by phase."""
    lines = ["## Kafka-features and security goals (issues 28, 29; ratios from this run)", ""]
    lines += ["| goal | wanted | measured | verdict |", "|---|---|---|---|"]
    for g in feature_goals(rows, raw):
        lines.append(f"| {g.name} | {g.want} | {g.measured} | {g.verdict} |")
    lines.append("")
    for r in raw:
        x = r.get("extra") or {}
        if not (_compaction(r["workload"]) or r["workload"] == "auth") or "phases" not in x:
            continue
        lines += [f"Phases of {r['workload']} on {r['target']}, run {r.get('run', 1)}:", ""]
        lines += [
            "| phase | records acknowledged | seconds | publish p99 (ms) | publish max (ms) "
            "| broker produce p99 (ms) | fsync p99 (ms) | server cores |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for p in x["phases"]:
            lines.append(
                f"| {p['phase']} | {p['acked']:,} | {p['seconds']:.1f} "
                f"| {_num(p.get('publish_p99_ms'))} | {_num(p.get('publish_max_ms'))} "
                f"| {_num(p.get('broker_produce_p99_ms'))} | {_num(p.get('fsync_p99_ms'))} "
                f"| {_num(p.get('server_cores'))} |"
            )
        if _compaction(r["workload"]):
            c = x.get("cleaner_during_phase", {})
            lines += [
                "",
                f"Cleaner during the phase: {c.get('cleanings')} cleanings, read "
                f"{c.get('read_bytes', 0) / 1e6:,.0f} MB, wrote "
                f"{c.get('written_bytes', 0) / 1e6:,.0f} MB, removed "
                f"{c.get('records_removed', 0):,} records "
                f"({_share(x.get('removed_share'))} of the topic); error: {x.get('cleaner_error')}",
            ]
        lines.append("")
    return lines


def _share(x: float | None) -> str:
    return f"{x:.1%}" if x is not None else "-"


def chart(rows: list[dict], raw: list[dict], out_dir: Path) -> Path | None:
    """One PNG, a panel per workload that has figures."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in rows if r["ok"] and (r["workload"] in WORKLOADS or _compaction(r["workload"]))]
    panels = [w for w in WORKLOADS if any(r["workload"] == w for r in ok)]
    panels += sorted({r["workload"] for r in ok} - set(WORKLOADS))  # compaction experiments
    if not panels:
        return None
    fig, axes = plt.subplots(1, len(panels), figsize=(4.6 * len(panels), 4.4), squeeze=False)
    for ax, w in zip(axes[0], panels, strict=True):
        mine = [r for r in ok if r["workload"] == w]
        names = [r["target"] for r in mine]
        if w in ("txn", "sasl"):
            colors = ["tab:blue" if "stratalog" in n else "tab:gray" for n in names]
            ax.bar(range(len(mine)), [r["mb_per_s"] for r in mine], color=colors)
            ax.set_ylabel("MB/s acknowledged (median of runs)")
            ax.set_title(
                "Transactions of 1,000 x 1 KiB" if w == "txn" else "Produce, 1 KiB, acks=all"
            )
        elif w == "share":
            ax.bar(range(len(mine)), [r["records_per_s"] for r in mine], color="tab:blue")
            ax.axhline(SHARE_GOAL, color="r", ls=":", lw=1)
            ax.set_ylabel("records/s delivered and acknowledged (median of runs)")
            ax.set_title("A share group of 4 consumers")
        elif _compaction(w):
            _phase_bars(ax, raw, w, names, "publish_p99_ms", "produce p99 (ms)")
            ax.set_title("Produce p99 around a cleaning")
        else:
            _phase_bars(ax, raw, w, names, "publish_max_ms", "good client's max latency (ms)")
            twin = ax.twinx()
            growth = [_median_extra(raw, w, n, "rss_growth_mib") for n in names]
            twin.plot(range(len(names)), growth, "rD", label="RSS growth (MiB)")
            twin.axhline(RSS_GOAL_MIB, color="r", ls=":", lw=1)
            twin.set_ylabel("broker RSS growth (MiB)")
            twin.set_ylim(bottom=0, top=max(RSS_GOAL_MIB * 1.2, *(g or 0 for g in growth)))
            logins = max(
                (r["extra"]["storm"]["logins"] for r in raw if r["workload"] == w and r["ok"]),
                default=0,
            )
            ax.set_title(f"{logins:,} failed SASL logins")
        ax.set_xticks(range(len(names)), names, rotation=20, ha="right", fontsize=8)
    fig.tight_layout()
    path = save_figure(fig, out_dir / "features.png")
    plt.close(fig)
    return path


def _median_extra(raw: list[dict], w: str, target: str, key: str) -> float | None:
    vals = [r["extra"][key] for r in _runs_of(raw, w, target) if r["ok"] and r["extra"].get(key)]
    return statistics.median(vals) if vals else None


def _phase_bars(ax: Any, raw: list[dict], w: str, names: list[str], key: str, label: str) -> None:
    """Bars per phase (median over the runs) for each target."""
    phases: list[str] = []
    for r in raw:
        if r["workload"] == w and r["ok"]:
            phases = [p["phase"] for p in r["extra"]["phases"]]
            break
    width = 0.8 / max(1, len(phases))
    for j, ph in enumerate(phases):
        ys = []
        for n in names:
            vals = [
                p[key]
                for r in _runs_of(raw, w, n)
                if r["ok"]
                for p in r["extra"]["phases"]
                if p["phase"] == ph and p.get(key) is not None
            ]
            ys.append(statistics.median(vals) if vals else 0.0)
        ax.bar(
            [i + (j - (len(phases) - 1) / 2) * width for i in range(len(names))],
            ys,
            width,
            label=ph,
        )
    ax.set_ylabel(label)
    ax.legend(fontsize=8)
