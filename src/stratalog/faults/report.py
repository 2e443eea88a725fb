"""Results as a table: one row per run, anomaly counts beside what the run did."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from rich.table import Table

from stratalog.faults.checker import ANOMALIES

# Short column headers for the anomalies, in ANOMALIES order.
_SHORT = {
    "lost-write": "lost",
    "unseen": "unseen",
    "duplicate": "dup",
    "inconsistent-offset": "incons",
    "nonmonotonic-send": "nm-send",
    "nonmonotonic-poll": "nm-poll",
    "poll-skip": "skip",
    "g1a": "G1a",
    "phantom": "phantom",
    "incomplete-final-read": "incompl",
}


def load_results(root: Path) -> list[tuple[Path, dict[str, Any]]]:
    """Every ``result.json`` under ``root`` (or ``root`` itself), oldest run first."""
    paths = [root] if root.is_file() else sorted(root.rglob("result.json"))
    out = []
    for p in paths:
        try:
            out.append((p.parent, json.loads(p.read_text())))
        except (OSError, ValueError):
            continue
    out.sort(key=lambda item: item[1].get("started", ""))
    return out


def _slowest_recovery(check: dict[str, Any]) -> float | str | None:
    """The slowest recovery after a fault; "never" when some fault's partitions never
    acknowledged a send again before the workload ended."""
    # A fault on a broker that led nothing (a paused controller, say) has nothing to recover.
    times = [
        f.get("first_ok_s")
        for f in check.get("stats", {}).get("recovery", [])
        if f.get("partitions", [None])
    ]
    if any(t is None for t in times):
        return "never"
    return max((t for t in times if t is not None), default=None)


def row(run_dir: Path, result: dict[str, Any]) -> dict[str, Any]:
    cfg = result.get("config", {})
    check = result.get("check", {})
    sends = check.get("stats", {}).get("sends", {})
    return {
        "run": run_dir.name,
        "target": cfg.get("target"),
        "seed": cfg.get("seed"),
        "duration": cfg.get("duration"),
        "faults": len(result.get("nemesis", {}).get("applied", [])),
        "ok": sends.get("ok", 0),
        "info": sends.get("info", 0),
        "fail": sends.get("fail", 0),
        **{a: check.get("counts", {}).get(a, 0) for a in ANOMALIES},
        "valid": check.get("valid", result.get("error", "error")),
        "recovery_s": _slowest_recovery(check),
        "gap_s": check.get("stats", {}).get("longest_gap", {}).get("seconds"),
        "wall_s": result.get("timings", {}).get("checked"),
    }


def _seconds(value: Any) -> str:
    if isinstance(value, int | float):
        return f"{value:.1f}"
    return "" if value is None else str(value)


def table(rows: Iterable[dict[str, Any]], title: str = "fault-injection runs") -> Table:
    t = Table(title=title)
    for col in ("run", "target", "seed", "s", "faults", "ok", "info", "fail"):
        t.add_column(col, justify="left" if col in ("run", "target") else "right")
    for a in ANOMALIES:
        t.add_column(_SHORT[a], justify="right")
    t.add_column("valid")
    t.add_column("recov s", justify="right")
    t.add_column("gap s", justify="right")
    t.add_column("wall s", justify="right")
    totals = dict.fromkeys(ANOMALIES, 0)
    n = 0
    for r in rows:
        n += 1
        for a in ANOMALIES:
            totals[a] += r[a] or 0
        valid = r["valid"]
        style = {True: "green", False: "bold red"}.get(valid, "yellow")
        t.add_row(
            str(r["run"]),
            str(r["target"]),
            str(r["seed"]),
            f"{r['duration']:g}" if isinstance(r["duration"], int | float) else "",
            str(r["faults"]),
            str(r["ok"]),
            str(r["info"]),
            str(r["fail"]),
            *[(f"[bold red]{r[a]}[/]" if r[a] else "0") for a in ANOMALIES],
            f"[{style}]{valid}[/]",
            _seconds(r.get("recovery_s")),
            _seconds(r.get("gap_s")),
            f"{r['wall_s']:.0f}" if isinstance(r["wall_s"], int | float) else "",
        )
    if n > 1:
        t.add_section()
        t.add_row(
            "total",
            "",
            "",
            "",
            "",
            "",
            "",
            "",
            *[str(totals[a]) for a in ANOMALIES],
            "",
            "",
            "",
            "",
        )
    return t


def anomaly_table(check: dict[str, Any]) -> Table:
    """One checker result: each anomaly's count and its first example."""
    t = Table(title=f"valid: {check.get('valid')}")
    t.add_column("anomaly")
    t.add_column("count", justify="right")
    t.add_column("first example", overflow="fold")
    for a in ANOMALIES:
        n = check.get("counts", {}).get(a, 0)
        examples = check.get("anomalies", {}).get(a) or []
        first = json.dumps(examples[0]) if examples else ""
        t.add_row(a, f"[bold red]{n}[/]" if n else "0", first)
    return t
