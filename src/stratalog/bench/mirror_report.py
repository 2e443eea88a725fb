"""``bench/mirror.py``'s results as a table, ratios and a chart."""

from __future__ import annotations

from pathlib import Path


def _ratios(results: dict) -> dict:
    """Stratalog / Kafka for each Kafka pair measured: MB/s (higher is better), lag (lower)."""
    pairs = results["pairs"]
    if "stratalog" not in pairs or pairs["stratalog"]["medians"] is None:
        return {}
    s = pairs["stratalog"]["medians"]
    ratios = {}
    for k in (p for p in pairs if p != "stratalog" and pairs[p]["medians"] is not None):
        m = pairs[k]["medians"]
        ratios[k] = {
            "mb_per_s": s["copy"]["mb_per_s"] / m["copy"]["mb_per_s"],
            "copy_mb_per_s": s["copy"]["copy_mb_per_s"] / m["copy"]["copy_mb_per_s"],
            "lag_p50": s["lag"]["p50_ms"] / m["lag"]["p50_ms"],
            "lag_p99": s["lag"]["p99_ms"] / m["lag"]["p99_ms"],
        }
    return ratios


def _markdown(results: dict) -> str:
    pairs = results["pairs"]
    runs = len(next(iter(pairs.values()))["runs"])
    n = results["records"]
    lines = [
        f"# MirrorMaker 2 ({results['mirror_maker_version']}) between two clusters: "
        f"{n:,} records of {results['record_bytes']} B, {results['partitions']} partitions, "
        f"medians of {runs} runs",
        "",
        "| pair | runs failed | copy from MM2's start (s) | MB/s from start | first record (s) "
        "| MB/s copying | lag p50 (ms) | lag p99 (ms) | lag max (ms) "
        "| source's ack p50 / p99 (ms) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    ok = {p: r for p, r in pairs.items() if r["medians"] is not None}
    for pair, res in pairs.items():
        failed = f"{res['failed_runs']} of {len(res['runs'])}"
        if pair not in ok:
            lines.append(f"| {pair} | {failed} |" + " |" * 8)
            continue
        c, lg = res["medians"]["copy"], res["medians"]["lag"]
        lines.append(
            f"| {pair} | {failed} | {c['seconds_from_start']:.1f} | {c['mb_per_s']:.1f} "
            f"| {c['seconds_to_first']:.1f} | {c['copy_mb_per_s']:.1f} "
            f"| {lg['p50_ms']:.1f} | {lg['p99_ms']:.1f} | {lg['max_ms']:.1f} "
            f"| {lg['ack_p50_ms']:.1f} / {lg['ack_p99_ms']:.1f} |"
        )
    lines += [
        "",
        f"Lag: {results['rate']:,} records/s for {results['seconds']:g} s on the source "
        f"(after {results['warmup']:g} s at that rate, not counted), "
        "read on the target (produce time to the copy's arrival); the source's ack is the "
        "producer's (acks=all) for the same records. During the warm-up (medians of the runs):",
        "",
        *(
            f"- {pair}: lag p50 {m['warmup_p50_ms']:.1f} ms, max {m['warmup_max_ms']:.1f} ms; "
            f"the source's slowest ack {m['warmup_ack_max_ms']:.1f} ms"
            for pair, m in ((p, r["medians"]["lag"]) for p, r in ok.items())
        ),
        "",
        "CPU (share of a core, medians), copy / lag phase (the lag phase with its warm-up):",
        "",
        "| pair | source broker | target broker | MirrorMaker |",
        "|---|---:|---:|---:|",
    ]
    for pair, res in ok.items():
        cc, lc = res["medians"]["cores"]["copy"], res["medians"]["cores"]["lag"]
        lines.append(
            f"| {pair} | {cc['source']:.0%} / {lc['source']:.0%} "
            f"| {cc['target']:.0%} / {lc['target']:.0%} "
            f"| {cc['mirrormaker']:.0%} / {lc['mirrormaker']:.0%} |"
        )
    if results["ratios"]:
        lines += ["", "Stratalog / Kafka:", ""]
        for k, r in results["ratios"].items():
            lines.append(
                f"- against {k}: MB/s from start {r['mb_per_s']:.2f}x, MB/s copying "
                f"{r['copy_mb_per_s']:.2f}x, lag p50 {r['lag_p50']:.2f}x, "
                f"p99 {r['lag_p99']:.2f}x (lower is better for lag)"
            )
    lines += ["", "Pairs:", ""]
    lines += [f"- {pair}: {res['describe']}" for pair, res in pairs.items()]
    for pair, res in pairs.items():
        for i, r in enumerate(res["runs"]):
            if "error" in r:
                lines += ["", f"{pair}, run {i + 1} failed:", "", "```"]
                lines += r["error"].splitlines()[:1]
                lines += ["```"]
            if r.get("broker_warnings"):
                lines += ["", f"{pair}, run {i + 1}, the brokers' warnings:", "", "```"]
                lines += r["broker_warnings"][:20]
                lines += ["```"]
        if res["mm2_warnings"]:
            lines += ["", f"MirrorMaker's WARN/ERROR lines ({pair}, all runs):", "", "```"]
            lines += res["mm2_warnings"]
            lines.append("```")
    lines.append("")
    return "\n".join(lines)


def _chart(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pairs = [p for p, r in results["pairs"].items() if r["medians"] is not None]
    if not pairs:
        return
    med = {p: results["pairs"][p]["medians"] for p in pairs}
    palette = {"stratalog": "#2a7ab9", "kafka": "#888888"}
    colors = [palette[p] for p in pairs]
    fig, (a, b, t) = plt.subplots(1, 3, figsize=(15, 4))
    x = range(len(pairs))
    w = 0.38
    for ax, key, labels, title in (
        (a, "copy", ("mb_per_s", "copy_mb_per_s"), f"copy of {results['records']:,} x 1 KiB"),
        (b, "lag", ("p50_ms", "p99_ms"), f"lag at {results['rate']:,} records/s"),
    ):
        for shift, alpha, label in ((-w / 2, 1.0, labels[0]), (w / 2, 0.5, labels[1])):
            ax.bar(
                [i + shift for i in x],
                [med[p][key][label] for p in pairs],
                w,
                color=colors,
                alpha=alpha,
                label={
                    "mb_per_s": "from MM2's start",
                    "copy_mb_per_s": "copying (first to last record)",
                    "p50_ms": "p50",
                    "p99_ms": "p99",
                }[label],
            )
        ax.set_xticks(list(x), pairs)
        ax.set_title(title)
        ax.legend(fontsize=8)
    a.set_ylabel("MB/s mirrored")
    b.set_ylabel("end-to-end lag, ms")
    for p in pairs:
        run = next(r for r in results["pairs"][p]["runs"] if "error" not in r)
        line = run["lag"]["timeline"]
        t.plot([row[0] for row in line], [row[1] for row in line], color=palette[p], label=p)
    t.axvline(results["warmup"], color="black", linestyle=":", label="end of the warm-up")
    t.set_xlabel("second of the lag phase (first good run)")
    t.set_ylabel("median lag of the records sent, ms")
    t.set_yscale("log")
    t.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
