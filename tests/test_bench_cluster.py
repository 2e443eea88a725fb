"""The cluster benchmark failover at its quick size against a three-broker Stratalog cluster:
the harness kills, times and reports completely. No assertion on speed: speeds are for
docs/benchmarks.md. (Its Kafka KRaft peer, and rf3, rf3-kera and rejoin, which share its
targets and report, would add minutes to `make test`: `make bench-cluster` runs them. The
three-node Kafka cluster under kill -9 is exercised by tests/cluster/faults/test_runs.py.)"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from stratalog.bench import cluster_report
from stratalog.bench.failover import quantile

pytestmark = [pytest.mark.timeout(1500)]

WORKLOADS = ("failover",)


@pytest.fixture(scope="module")
def cluster_run(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("bench-cluster")
    r = subprocess.run(
        [sys.executable, "-m", "stratalog.cli", "bench", *WORKLOADS, "-t", "stratalog-rf3",
         "--quick", "--no-limits", "-o", str(out)],
        capture_output=True, text=True, timeout=1400, check=False,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    run = json.loads((out / "results.json").read_text())
    run["_dir"] = str(out)
    return run


def _rows(run: dict, workload: str) -> list[dict]:
    return [r for r in run["results"] if r["workload"] == workload]


def test_failover_trials_each_kill_the_leader_and_see_a_new_one(cluster_run):
    rows = _rows(cluster_run, "failover")
    assert {r["target"] for r in rows} == {"stratalog-rf3"}
    for r in rows:
        assert r["ok"], (r["target"], r["error"])
        x = r["extra"]
        assert len(x["trials"]) == 2 and x["never"] == 0
        for t in x["trials"]:
            assert t["seconds"] > 0
            assert t["new_leader"] != t["killed"]
            assert t["leader_moved_s"] is None or t["leader_moved_s"] > 0
            assert t["resync_s"] >= 0
        assert 0 < x["failover_p50_s"] <= x["failover_p99_s"] == x["failover_max_s"]
        assert r["records"] > 0  # the steady load went on across the kills


def test_cluster_report_files(cluster_run):
    out = Path(cluster_run["_dir"])
    assert (out / "cluster.png").stat().st_size > 0
    md = (out / "results.md").read_text()
    assert "## Cluster goals" in md and "Failover trials on stratalog-rf3" in md
    goals = cluster_run["cluster_goals"]
    ran = {k: g for k, g in goals.items() if k.startswith("failover")}
    assert len(ran) == 1 and all(g["verdict"] in ("met", "missed") for g in ran.values()), goals


def _failover_row(target: str, p99: float | None) -> dict:
    return {
        "workload": "failover",
        "target": target,
        "kind": "stratalog-cluster",
        "ok": True,
        "params": {},
        "extra": {"trials": [{}] * 20, "failover_p50_s": 1.0, "failover_p99_s": p99},
    }


@pytest.mark.parametrize(
    ("mine", "kafka", "verdict"),
    [(2.5, 10.0, "met"), (3.5, 10.0, "missed"), (2.0, 1.5, "missed"), (None, 10.0, "missed")],
)
def test_failover_goal_needs_three_seconds_and_kafkas_p99(mine, kafka, verdict):
    rows = [_failover_row("stratalog-rf3", mine), _failover_row("kafka-rf3", kafka)]
    (g,) = [g for g in cluster_report.cluster_goals(rows) if g.name.startswith("failover")]
    assert g.verdict == verdict


def test_quantile_is_nearest_rank():
    xs = [float(i) for i in range(1, 21)]
    assert quantile(xs, 0.5) == 10.0 and quantile(xs, 0.99) == 20.0 and quantile([], 0.5) is None
