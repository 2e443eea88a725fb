"""Running ``stratalog bench`` from tests (quick profile) and finding one case in its results:
shared by test_bench.py and test_bench_tiers.py, whose quick runs go to two workers."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


def stratalog(*args: str, timeout: float = 840) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "stratalog.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def _one(run: dict, workload: str, target: str, **params) -> dict:
    hits = [
        r
        for r in run["results"]
        if r["workload"] == workload
        and r["target"] == target
        and all(str(r["params"].get(k)) == str(v) for k, v in params.items())
    ]
    assert len(hits) == 1, [(r["workload"], r["target"], r["params"]) for r in run["results"]]
    return hits[0]


def quick_bench(out: Path, *args: str) -> dict:
    """One ``stratalog bench ARGS --quick --no-limits`` into ``out``; its results.json."""
    r = stratalog("bench", *args, "--quick", "--no-limits", "-o", str(out))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    run = json.loads((out / "results.json").read_text())
    run["_dir"] = str(out)
    return run


def merged(runs: list[dict]) -> dict:
    """Several runs' results as one; ``_dirs`` are their result directories, in order."""
    return {"results": [r for run in runs for r in run["results"]],
            "_dirs": [run["_dir"] for run in runs]}  # fmt: skip


def assert_report(out: str | Path, workloads: str, charts: tuple[str, ...]) -> None:
    """results.md of a run names each workload and links each chart, drawn."""
    md = (Path(out) / "results.md").read_text()
    assert "## Goals (ratios from this run)" in md
    for w in workloads:
        assert f"## Workload {w}:" in md
    for png in charts:
        assert (Path(out) / png).stat().st_size > 1000, png
        assert f"({png})" in md
