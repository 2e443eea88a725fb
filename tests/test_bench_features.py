"""The workloads of issues 28 and 29 (txn, compaction, sasl, auth): their files, their goals in
the report, and one real quick run of the failed-logins case on a secured ``stratalog serve``
(about 10 s). Never a speed: the figures are for docs/benchmarks.md."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from stratalog.bench import features_report
from stratalog.bench.rows import aggregate
from stratalog.bench.workload import find_workloads

pytestmark = pytest.mark.timeout(300)


def test_the_feature_workloads_load_in_both_profiles():
    full = {w.name: w for w in find_workloads(["txn", "compaction", "sasl", "auth"], "full")}
    quick = {w.name: w for w in find_workloads(["txn", "compaction", "sasl", "auth"], "quick")}
    assert full["txn"].transaction_records == 1000 and full["txn"].acks == "all"
    assert full["compaction"].kind == "compaction" and full["compaction"].compacted_bytes == 2**30
    assert full["compaction"].compacted_live_fraction == 0.1
    assert full["auth"].kind == "auth-storm" and full["auth"].failed_logins == 10_000
    assert {t.kind for t in full["sasl"].targets} == {"stratalog-secure", "kafka-secure"}
    for name in full:
        assert quick[name].kind == full[name].kind
    assert quick["compaction"].compacted_bytes < full["compaction"].compacted_bytes
    assert quick["auth"].failed_logins < full["auth"].failed_logins


def _row(workload: str, target: str, mb: float, **extra: object) -> dict:
    return {
        "workload": workload,
        "target": target,
        "kind": "stratalog",
        "describe": target,
        "params": {},
        "ok": True,
        "error": "",
        "records_per_s": mb * 1000,
        "mb_per_s": mb,
        "server_cores": 0.5,
        "extra": extra,
    }


def test_the_goals_are_ratios_of_the_same_run():
    phases = [
        {"phase": p, "acked": 1, "seconds": 1.0, "publish_p99_ms": v, "publish_max_ms": v}
        for p, v in (("before", 10.0), ("cleaning", 14.0), ("after", 10.0))
    ]
    raw = [
        _row("txn", "stratalog", 90),
        _row("txn", "kafka-fsync", 60),
        _row("sasl", "stratalog-plaintext", 100),
        _row("sasl", "stratalog-sasl-ssl", 70),
        _row("sasl", "kafka-fsync-sasl-ssl", 35),
        _row(
            "compaction",
            "stratalog",
            20,
            cleaning_p99_rise=0.4,
            publish_p99_cleaning_ms=14.0,
            publish_p99_alone_ms=10.0,
            compacted={"bytes": 2**30, "keys": 104857, "records": 1048576},
            cleaning_s=40.0,
            phases=phases,
        ),
    ]
    # An experiment on the compaction load (bench/experiments/compaction-steered.toml) is
    # judged by the same goal, per target.
    raw.append(raw[-1] | {"workload": "compaction-steered", "target": "stratalog-steered-5"})
    raw[-1]["extra"] = raw[-1]["extra"] | {"cleaning_p99_rise": 0.1}
    goals = {g.name: g for g in features_report.feature_goals(aggregate(raw), raw)}
    assert goals["transactional produce vs Kafka (flush.messages=1)"].met is True
    assert goals["transactional produce vs Kafka (default, reference)"].met is None
    assert goals["produce over SASL_SSL vs plaintext (same broker)"].met is False  # 70%
    assert goals["produce over SASL_SSL vs Kafka over SASL_SSL (flush.messages=1)"].met is True
    cleaning = goals["produce p99 while a compacted topic is cleaned (stratalog)"]
    assert cleaning.met is False and "+40%" in cleaning.measured
    steered = goals["produce p99 while a compacted topic is cleaned (stratalog-steered-5)"]
    assert steered.met is True and "+10%" in steered.measured
    md = "\n".join(features_report.markdown_lines(aggregate(raw), raw))
    assert "Phases of compaction-steered on stratalog-steered-5" in md


def test_failed_logins_beside_a_good_client(tmp_path: Path):
    out = tmp_path / "bench"
    r = subprocess.run(
        [sys.executable, "-m", "stratalog.cli", "bench", "auth", "-t", "stratalog-sasl-plaintext",
         "--quick", "--no-limits", "-o", str(out)],
        capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    (res,) = json.loads((out / "results.json").read_text())["results"]
    assert res["ok"], res["error"]
    x = res["extra"]
    assert x["storm"]["outcomes"] == {"refused": x["storm"]["logins"]}
    assert [p["phase"] for p in x["phases"]] == ["before", "storm", "after"]
    assert x["good_client_failed_sends"] == 0 and all(p["acked"] for p in x["phases"])
    assert x["rss_mib"]["before_storm"] > 0 and x["rss_growth_mib"] is not None
    md = (out / "results.md").read_text()
    assert "failed SASL logins (stratalog-sasl-plaintext)" in md
    assert (out / "features.png").is_file()


def test_a_share_group_drains_the_topic_each_record_acknowledged_once(tmp_path: Path):
    """The share workload's quick profile, for real (about 15 s): a filled topic drained by 4
    librdkafka share consumers of one group; the harness counts the acknowledgements the
    broker confirmed to each consumer across the group."""
    (w,) = find_workloads(["share"], "full")
    assert w.kind == "share" and w.share_consumers == 4 and w.record_size == 100
    out = tmp_path / "bench"
    r = subprocess.run(
        [sys.executable, "-m", "stratalog.cli", "bench", "share", "--quick", "--no-limits",
         "-o", str(out)],
        capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    (res,) = json.loads((out / "results.json").read_text())["results"]
    assert res["ok"], res["error"]
    v = res["extra"]["share"]
    assert v["acked_once"] == v["expected"] == res["records"] > 0
    assert v["acked_more"] == 0 and v["never"] == 0
    assert res["records_per_s"] > 0 and res["consumed"] >= res["records"]
    assert v["delivered"] == sum(res["extra"]["per_consumer"]) >= res["records"]
    assert "a share group of 4 consumers (stratalog)" in (out / "results.md").read_text()


def test_the_share_goal_needs_the_rate_and_exactly_once():
    verdict = {"acked_once": 10, "acked_more": 0, "never": 0, "expected": 10}
    fast = _row("share", "stratalog", 12, share=verdict)  # 12,000 records/s
    goal = features_report.share_goal([fast | {"records_per_s": 120_000}], "stratalog")
    assert goal.met is True and "120,000 records/s" in goal.measured
    assert features_report.share_goal([fast], "stratalog").met is False
    failed = fast | {"ok": False, "error": "3 of 10 records acknowledged once"}
    assert features_report.share_goal([failed], "stratalog").met is None
