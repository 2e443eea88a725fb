"""The Spark case (workload f): fill a topic, then read it into Spark with each format, in one
session and as one-off jobs (each read run by ``spark_read.py`` in a process of its own)."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from typing import Any

from stratalog.bench.load import Progress, producer_jobs, run_load, topic_names
from stratalog.bench.results import CaseResult, result_from_load
from stratalog.bench.targets import Target, process_cpu_s
from stratalog.bench.workload import Workload


def run_spark(
    w: Workload, target: Target, params: dict[str, Any], progress: Progress
) -> CaseResult:
    """Fill a topic, then read it into Spark with each format (spark_read.py)."""
    topics = topic_names(w)
    target.create_topics(topics, w.partitions)
    fill = run_load(
        target,
        producer_jobs(w, topics, None, w.records),
        [],
        label=f"{w.name} · {target.name} · fill",
        progress=progress,
    )
    res = result_from_load(w, target, fill, params)
    if not res.ok:
        return res
    progress(f"{w.name} · {target.name} · Spark reads", 0, 0, 0)
    columns = ["--all-columns"] if w.spark_all_columns else []
    cpu0 = process_cpu_s(target.pid)
    proc = subprocess.run(
        [sys.executable, "-m", "stratalog.bench.spark_read", "--bootstrap", target.bootstrap,
         "--topic", topics[0], "--runs", str(w.spark_runs),
         "--warmup", str(w.spark_warmup), "--formats", ",".join(w.spark_formats), *columns],
        capture_output=True, text=True, timeout=w.max_duration_s * 20 + 600, check=False,
    )  # fmt: skip
    if proc.returncode != 0:
        res.ok, res.error = False, "Spark reads failed: " + proc.stderr[-400:]
        return res
    runs = json.loads(proc.stdout.strip().splitlines()[-1])
    # A one-off job: each format's read as the only query of a fresh session (the session
    # above reads one format first, so its first read of the other is not a first).
    one_off: dict[str, dict[str, Any]] = {}
    for fmt in [f for f in runs if not w.spark_one_off or f in w.spark_one_off]:
        single = subprocess.run(
            [sys.executable, "-m", "stratalog.bench.spark_read", "--bootstrap",
             target.bootstrap, "--topic", topics[0], "--runs", "1", "--warmup", "0",
             "--formats", fmt, *columns],
            capture_output=True, text=True, timeout=w.max_duration_s * 4 + 600, check=False,
        )  # fmt: skip
        if single.returncode != 0:
            res.ok, res.error = False, f"Spark read ({fmt}) failed: " + single.stderr[-400:]
            return res
        one_off[fmt] = json.loads(single.stdout.strip().splitlines()[-1])[fmt]["runs"][0]
    res.server_cpu_s = process_cpu_s(target.pid) - cpu0
    spark: dict[str, Any] = {}
    for fmt, phases in runs.items():
        rs, warm = phases["runs"], phases["warmup"]
        single = [one_off[fmt]] if fmt in one_off else []
        complete = all(r["rows"] == res.records for r in [*rs, *warm, *single])
        spark[fmt] = {
            "rows_per_s": statistics.median(r["rows_per_s"] for r in rs),
            "mb_per_s": statistics.median(r["bytes"] / 1e6 / r["seconds"] for r in rs),
            "runs": rs,
            "warmup": warm,
            "first_rows_per_s": (warm or rs)[0]["rows_per_s"],
            "one_off": one_off.get(fmt),
            "complete": complete,
        }
        if not complete:
            res.ok = False
            got = [r["rows"] for r in [*warm, *rs, *single]]
            res.error = f"format({fmt}) read {got} of {res.records} rows"
    res.extra["spark"] = spark
    return res
