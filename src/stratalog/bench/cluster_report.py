"""The cluster workloads in a ``stratalog bench`` report: issue 27's goals as figures from the
same run (Stratalog's three brokers against Kafka's three), the failover and rejoin trials, and
one chart of all four scenarios."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from stratalog.bench.figures import save_figure
from stratalog.bench.goals import Goal
from stratalog.bench.rows import by_client, by_name, client_label, ok_rows

MINE, KAFKA, KAFKA_FSYNC = "stratalog-rf3", "kafka-rf3", "kafka-rf3-fsync"
WORKLOADS = ("rf3", "rf3-kera", "failover", "rejoin")
FAILOVER_GOAL_S = 3.0


def has_cluster(results: list[dict]) -> bool:
    return any(r["workload"] in WORKLOADS for r in results)


def _ratio(mine: dict | None, ref: dict | None, key: str) -> float | None:
    if not mine or not ref or not ref.get(key) or mine.get(key) is None:
        return None
    return mine[key] / ref[key]


def _ingest_goal(name: str, results: list[dict], w: str, ref: str, at_least: float, **pick) -> Goal:
    want = f"≥ {at_least:g}x"
    mine, other = by_name(results, w, MINE, **pick), by_name(results, w, ref, **pick)
    ratio = _ratio(mine, other, "mb_per_s")
    if ratio is None or mine is None or other is None:
        return Goal(name, want, "-", None)
    text = f"{ratio:.2f}x ({mine['mb_per_s']:,.1f} vs {other['mb_per_s']:,.1f} MB/s)"
    return Goal(name, want, text, ratio >= at_least)


def _fmt_s(x: float | None) -> str:
    return f"{x:.2f} s" if x is not None else "never"


def cluster_goals(results: list[dict]) -> list[Goal]:
    """The goals of issue 27 that a bench run measures, from ``rows.aggregate`` rows."""
    out = []
    mine = by_name(results, "failover", MINE)
    ref = by_name(results, "failover", KAFKA)
    want = f"p99 ≤ {FAILOVER_GOAL_S:g} s and ≤ Kafka's"
    if mine:
        x = mine["extra"]
        n = len(x["trials"])
        text = f"p50 {_fmt_s(x['failover_p50_s'])}, p99 {_fmt_s(x['failover_p99_s'])} ({n} trials)"
        met = x["failover_p99_s"] is not None and x["failover_p99_s"] <= FAILOVER_GOAL_S
        if ref:
            y = ref["extra"]
            text += (
                f"; Kafka p50 {_fmt_s(y['failover_p50_s'])}, p99 {_fmt_s(y['failover_p99_s'])} "
                f"({len(y['trials'])} trials)"
            )
            if met and y["failover_p99_s"] is not None:
                met = x["failover_p99_s"] <= y["failover_p99_s"]
        out.append(
            Goal("failover: kill -9 of the leader to the next acks=all ack", want, text, met)
        )
    else:
        out.append(
            Goal("failover: kill -9 of the leader to the next acks=all ack", want, "-", None)
        )
    out.append(
        _ingest_goal("RF 3 durable ingest vs Kafka RF 3 (default)", results, "rf3", KAFKA, 1)
    )
    out.append(
        _ingest_goal(
            "RF 3 durable ingest vs Kafka RF 3 (flush.messages=1)", results, "rf3", KAFKA_FSYNC, 2
        )
    )
    kera = ok_rows(results, "rf3-kera")
    for client in by_client(kera) or {"": []}:
        pick = {"producer_client": client} if client else {}
        for ref_name, label in ((KAFKA, "default"), (KAFKA_FSYNC, "flush.messages=1")):
            out.append(
                _ingest_goal(
                    f"1,000 partitions at RF 3 vs Kafka RF 3 ({label}){client_label(client)}",
                    results,
                    "rf3-kera",
                    ref_name,
                    4,
                    **pick,
                )
            )
    rj = by_name(results, "rejoin", MINE)
    want = "≥ 50% of the disk's sequential read"
    if rj and rj["extra"].get("of_disk") is not None:
        x = rj["extra"]
        text = (
            f"{x['of_disk']:.0%} ({x['catch_up_mb_per_s']:,.0f} of "
            f"{x['disk_read_mb_per_s']:,.0f} MB/s)"
        )
        kr = by_name(results, "rejoin", KAFKA)
        if kr and kr["extra"].get("of_disk") is not None:
            y = kr["extra"]
            text += f"; Kafka {y['of_disk']:.0%} ({y['catch_up_mb_per_s']:,.0f} MB/s)"
        out.append(Goal("rejoining replica's catch-up", want, text, x["of_disk"] >= 0.5))
    else:
        out.append(Goal("rejoining replica's catch-up", want, "-", None))
    return out


def markdown_lines(results: list[dict]) -> list[str]:
    """The cluster goals' table and, per target, the failover and rejoin trials."""
    lines = ["## Cluster goals (issue 27, ratios from this run)", ""]
    lines += ["| goal | wanted | measured | verdict |", "|---|---|---|---|"]
    for g in cluster_goals(results):
        lines.append(f"| {g.name} | {g.want} | {g.measured} | {g.verdict} |")
    lines.append("")
    for r in results:
        if not r["ok"] or r["workload"] not in ("failover", "rejoin"):
            continue
        x = r["extra"]
        if r["workload"] == "failover":
            lines += [f"Failover trials on {r['target']} ({r['describe']}):", ""]
            lines += [
                "| trial | killed | next ack (s) | metadata named a new leader (s) | new leader "
                "| sends failed | back in sync after restart (s) |",
                "|---|---|---|---|---|---|---|",
            ]
            for t in x["trials"]:
                lines.append(
                    f"| {t['trial']} | {t['killed']} | {_num(t['seconds'])} "
                    f"| {_num(t.get('leader_moved_s'))} | {t['new_leader']} "
                    f"| {t['failed_sends']} | {_num(t['resync_s'])} |"
                )
        else:
            lines += [f"Rejoin trials on {r['target']} ({r['describe']}):", ""]
            lines += [
                "| trial | broker | MB written while away | listed again (s) | in sync (s) "
                "| catch-up MB/s | from the restart MB/s | disk read MB/s | of the disk |",
                "|---|---|---|---|---|---|---|---|---|",
            ]
            for t in x["trials"]:
                lines.append(
                    f"| {t['trial']} | {t['broker']} | {t['bytes'] / 1e6:,.0f} "
                    f"| {_num(t['listed_s'])} | {_num(t['in_sync_s'])} | {_num(t.get('mb_per_s'))} "
                    f"| {_num(t.get('mb_per_s_from_restart'))} | {_num(t['disk']['mb_per_s'])} "
                    f"| {_pct(t.get('of_disk'))} |"
                )
        lines.append("")
    return lines


def _num(x: float | None) -> str:
    return f"{x:,.2f}" if x is not None else "-"


def _pct(x: float | None) -> str:
    return f"{x:.0%}" if x is not None else "-"


def chart(results: list[dict], out_dir: Path) -> Path | None:
    """One PNG, a panel per scenario that has figures: RF 3 ingest, 1,000 partitions, failover
    p50 / p99, catch-up against the disk."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in results if r["ok"] and r["workload"] in WORKLOADS]
    if not ok:
        return None
    panels = [w for w in WORKLOADS if any(r["workload"] == w for r in ok)]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 4), squeeze=False)
    for ax, w in zip(axes[0], panels, strict=True):
        rows = [r for r in ok if r["workload"] == w]
        if w in ("rf3", "rf3-kera"):
            labels = [
                r["target"]
                + (
                    f"\n{r['params']['producer_client']}"
                    if "producer_client" in r["params"]
                    else ""
                )
                for r in rows
            ]
            ax.bar(range(len(rows)), [r["mb_per_s"] for r in rows], color=_colors(rows))
            ax.set_xticks(range(len(rows)), labels, rotation=30, ha="right", fontsize=7)
            ax.set_ylabel("MB/s acknowledged (acks=all)")
            ax.set_title(
                "RF 3 ingest, 16 partitions"
                if w == "rf3"
                else "KerA at RF 3 (topics x 1 partition)"
            )
        elif w == "failover":
            xs = range(len(rows))
            for off, key, name in ((-0.2, "failover_p50_s", "p50"), (0.2, "failover_p99_s", "p99")):
                ax.bar([x + off for x in xs], [r["extra"][key] or 0 for r in rows], 0.4, label=name)
            ax.axhline(FAILOVER_GOAL_S, color="black", linestyle="--", linewidth=1, label="goal")
            ax.set_xticks(list(xs), [r["target"] for r in rows], fontsize=7)
            ax.set_ylabel("kill -9 to next acknowledged write (s)")
            ax.set_title("Failover")
            ax.legend(fontsize=7)
        else:
            xs = range(len(rows))
            ax.bar(
                [x - 0.2 for x in xs],
                [r["extra"].get("catch_up_mb_per_s") or 0 for r in rows],
                0.4,
                label="catch-up",
            )
            ax.bar(
                [x + 0.2 for x in xs],
                [r["extra"].get("disk_read_mb_per_s") or 0 for r in rows],
                0.4,
                label="disk sequential read",
            )
            ax.set_xticks(list(xs), [r["target"] for r in rows], fontsize=7)
            ax.set_ylabel("MB/s")
            ax.set_title("Rejoining replica")
            ax.legend(fontsize=7)
    fig.tight_layout()
    path = save_figure(fig, out_dir / "cluster.png")
    plt.close(fig)
    return path


def _colors(rows: list[dict]) -> list[str]:
    return ["tab:blue" if r["target"] == MINE else "tab:orange" for r in rows]


def summary(results: list[dict]) -> dict[str, Any]:
    """The goals as plain data, for results.json."""
    return {
        g.name: {"want": g.want, "measured": g.measured, "verdict": g.verdict}
        for g in cluster_goals(results)
    }
