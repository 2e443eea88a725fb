"""The PNG charts of a ``stratalog bench`` run: throughput per workload and target (with the
disk's limit), publish latency percentiles, the topic-count sweep, bursts and the catch-up."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

from stratalog.bench.figures import save_figure
from stratalog.bench.rows import aggregate, catchup_p99


def charts(run: dict[str, Any], out_dir: Path) -> list[Path]:
    """PNG charts: throughput per workload and target (with the disk's limit), publish latency
    percentiles, the topic-count sweep, and the catch-up comparison."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    results = [r for r in aggregate(run["results"]) if r["ok"]]
    made: list[Path] = []
    if not results:
        return made
    disk = ((run.get("machine") or {}).get("fdatasync_1m") or {}).get("mb_per_s")

    plain = [
        r
        for r in results
        if not r.get("params") and r["workload"] not in ("e", "failover", "rejoin")
    ]
    if plain:
        workloads = sorted({r["workload"] for r in plain})
        targets = sorted({r["target"] for r in plain})
        fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(workloads) + 2), 4))
        width = 0.8 / max(1, len(targets))
        for i, t in enumerate(targets):
            xs, ys = [], []
            for j, w in enumerate(workloads):
                hit = [r for r in plain if r["workload"] == w and r["target"] == t]
                if hit:
                    xs.append(j + i * width)
                    ys.append(hit[0]["mb_per_s"])
            ax.bar(xs, ys, width, label=t)
        if disk:
            ax.axhline(
                disk, color="black", linestyle="--", linewidth=1, label="disk: fdatasync/1 MiB"
            )
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(workloads))], workloads)
        ax.set_ylabel("MB/s produced")
        ax.set_title("Throughput by workload")
        ax.legend(fontsize=7)
        fig.tight_layout()
        made.append(save_figure(fig, out_dir / "throughput.png"))
        plt.close(fig)

    lat = [r for r in plain if r.get("publish")]
    if lat:
        fig, ax = plt.subplots(figsize=(8, 4))
        labels = [f"{r['workload']}·{r['target']}" for r in lat]
        width = 0.27
        for i, key in enumerate(("p50", "p99", "p99.9")):
            ax.bar(
                [j + i * width for j in range(len(lat))],
                [r["publish"][key] for r in lat],
                width,
                label=key,
            )
        ax.set_xticks(
            [j + width for j in range(len(lat))], labels, rotation=45, ha="right", fontsize=7
        )
        ax.set_yscale("log")
        ax.set_ylabel("publish latency (ms, log)")
        ax.set_title("Publish latency percentiles")
        ax.legend()
        fig.tight_layout()
        made.append(save_figure(fig, out_dir / "latency.png"))
        plt.close(fig)

    sweep = [r for r in results if "topics" in r.get("params", {})]
    for w in sorted({r["workload"] for r in sweep}):
        rs = [r for r in sweep if r["workload"] == w]
        fig, ax = plt.subplots(figsize=(6, 4))
        series: dict[str, list[tuple[int, float]]] = defaultdict(list)
        for r in rs:
            layout = r["params"].get("layout", "n/a")
            name = r["target"] if layout == "n/a" else f"{r['target']} ({layout})"
            if "producer_client" in r["params"]:
                name += f", {r['params']['producer_client']}"
            series[name].append((int(r["params"]["topics"]), r["mb_per_s"]))
        for name, pts in sorted(series.items()):
            pts.sort()
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=name)
        ax.set_xscale("log")
        ax.set_xlabel("topics (1 partition each)")
        ax.set_ylabel("MB/s produced")
        ax.set_title(f"Workload {w}: throughput by topic count")
        ax.legend(fontsize=7)
        fig.tight_layout()
        made.append(save_figure(fig, out_dir / f"sweep-{w}.png"))
        plt.close(fig)

    bursts = [r for r in results if (r.get("extra", {}).get("burst") or {}).get("timeline")]
    for w in sorted({r["workload"] for r in bursts}):
        fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 6), sharex=True)
        for r in (r for r in bursts if r["workload"] == w):
            b = r["extra"]["burst"]
            ts = [p["t"] for p in b["timeline"]]
            top.plot(ts, [p["acked_mb"] for p in b["timeline"]], label=r["target"])
            if r["kind"] == "stratalog":
                bottom.plot(ts, [p["hot_mb"] for p in b["timeline"]], label=r["target"])
            if b.get("capacity_mb"):
                bottom.axhline(b["capacity_mb"], color="black", linestyle="--", linewidth=1)
                bottom.axhline(
                    b["capacity_mb"] * b["threshold"], color="grey", linestyle=":", linewidth=1
                )
        top.set_ylabel("MB acknowledged")
        top.set_title(f"Workload {w}: a burst into a tiered broker")
        top.legend(fontsize=7)
        bottom.set_ylabel("hot tier MB (-- capacity, : threshold)")
        bottom.set_xlabel("seconds since the burst started")
        bottom.legend(fontsize=7)
        fig.tight_layout()
        made.append(save_figure(fig, out_dir / f"burst-{w}.png"))
        plt.close(fig)

    cu = [r for r in results if r.get("extra", {}).get("p99_increase") is not None]
    if cu:
        fig, ax = plt.subplots(figsize=(6, 4))
        xs = range(len(cu))
        ax.bar(
            [x - 0.2 for x in xs],
            [catchup_p99(r, "alone") for r in cu],
            0.4,
            label="alone",
        )
        ax.bar(
            [x + 0.2 for x in xs],
            [catchup_p99(r, "with_backlog") for r in cu],
            0.4,
            label="with backlog readers",
        )
        ax.set_xticks(list(xs), [r["target"] for r in cu])
        ax.set_ylabel("produce p99 (ms), median of the phases")
        ax.set_title("Catch-up: produce p99 while consumers drain a cold backlog")
        ax.legend()
        fig.tight_layout()
        made.append(save_figure(fig, out_dir / "catchup.png"))
        plt.close(fig)
    from stratalog.bench import cluster_report

    cluster = cluster_report.chart(results, out_dir)
    if cluster is not None:
        made.append(cluster)
    from stratalog.bench import features_report

    features = features_report.chart(results, run["results"], out_dir)
    if features is not None:
        made.append(features)
    return made


def bar_pair(
    path: Path,
    labels: list[str],
    colors: list[str],
    left: tuple[str, list[float], str],
    right: tuple[str, list[float], str],
    right_goal: float | None = None,
) -> None:
    """Two bar charts side by side, (y label, values, title) each, over the same ``labels``
    (the small benches' figure: a rate, and the broker's CPU meanwhile); ``right_goal`` draws
    a goal line on the right one."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, (ylabel, values, title) in zip(axes, (left, right), strict=True):
        ax.bar(labels, values, color=colors)
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.tick_params(axis="x", rotation=20)
    if right_goal is not None:
        axes[1].axhline(right_goal, color="red", linestyle="--", label="goal")
        axes[1].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
