"""``stratalog bench``'s tier workload kinds, a real quick run on real brokers: catch-up (e, on
the hot tier and from a cold tier), Spark reads (f), tiers (g) and a burst into a small hot tier
(h), on Stratalog. A module of its own so that its run and test_bench.py's go to two workers.
As there, the tests check what the harness measures and reports, never a speed."""

from __future__ import annotations

from pathlib import Path

import pytest

from stratalog.bench.goals import goals as bench_goals
from stratalog.bench.workload import find_workloads

from .bench_runs import _one, assert_report, quick_bench

pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def tier_run(tmp_path_factory) -> dict:
    """One command: a target named on the command line runs every workload that has it."""
    run = quick_bench(
        tmp_path_factory.mktemp("bench"), "e", "f", "g", "h", "-t", "stratalog",
        "-t", "stratalog-cold-only", "-t", "stratalog-tiered", "-t", "stratalog-hot-only",
    )  # fmt: skip
    return {"results": run["results"], "_dirs": [run["_dir"]]}


def test_report_files(tier_run):
    assert_report(tier_run["_dirs"][0], "efgh", ("catchup.png",))
    verdicts = {g.name: g.verdict for g in bench_goals(tier_run["results"], None)}
    assert verdicts["e: produce p99 with backlog readers (stratalog)"] in ("met", "missed")


def test_e_measures_both_phases(tier_run):
    e = _one(tier_run, "e", "stratalog")
    assert e["ok"], e["error"]
    x = e["extra"]
    assert x["backlog_bytes_written"] >= 16_777_216 - 1024
    assert x["evicted_bytes"] >= x["backlog_bytes_written"]
    # Each phase with readers reads the backlog from its start again: at most all of it.
    assert 0 < x["backlog_read_bytes"] <= x["phase_pairs"] * x["backlog_bytes_written"]
    # The tail consumers read exactly the phase's records (backlog readers are told apart by
    # group, not by the order their results arrive in).
    assert e["consumed"] == e["records"] > 0
    assert x["publish_alone"]["count"] > 0 and x["publish_with_backlog"]["count"] > 0
    # The quick profile alternates two pairs of phases: A B A B, each with its own tail topics
    # and tail readers, the backlog readers in every B phase.
    phases = x["phases"]
    assert [(p["phase"], p["pair"]) for p in phases] == [
        ("alone", 0), ("with-backlog-readers", 0), ("alone", 1), ("with-backlog-readers", 1),
    ]  # fmt: skip
    for p in phases:
        assert p["tail_read"] == p["acked"] > 0
        assert (p["backlog_read_bytes"] > 0) == (p["phase"] != "alone")
        assert p["backlog_read_bytes"] <= x["backlog_bytes_written"]
    assert x["backlog_read_bytes"] == sum(p["backlog_read_bytes"] for p in phases)
    # The goal compares medians of the phases' p99s (of two values: their mean).
    med = {
        kind: sum(p["publish_p99_ms"] for p in phases if p["phase"] == kind) / 2
        for kind in ("alone", "with-backlog-readers")
    }
    assert x["publish_p99_alone_ms"] == pytest.approx(med["alone"])
    assert x["p99_increase"] == pytest.approx(med["with-backlog-readers"] / med["alone"] - 1)
    a1, a2 = (p["publish_p99_ms"] for p in phases if p["phase"] == "alone")
    assert x["alone_p99_spread"] == pytest.approx(max(a1, a2) / min(a1, a2) - 1)
    # The broker's own produce p99 per phase, from its /metrics histogram: a produce (acks=all,
    # fsync=always) is answered after an fsync, so it takes some time, and no more than the
    # client's own p99 plus a bucket's width (the histogram's resolution is 1.5x).
    for p in phases:
        assert 0 < p["broker_produce_p99_ms"] <= p["publish_max_ms"] * 1.5
        assert p["fsync_p99_ms"] > 0  # fsync=always: group commits ran in each phase
        # Each group commit as the loop sees it holds its fsyncs (same buckets: never less).
        assert p["commit_p99_ms"] >= p["fsync_p99_ms"]
    for phase in ("alone", "with_backlog"):
        assert x[f"broker_produce_p99_{phase}_ms"] > 0
        assert x[f"fsync_p99_{phase}_ms"] > 0
        assert x[f"commit_p99_{phase}_ms"] >= x[f"fsync_p99_{phase}_ms"]
    # From a cold tier too: the backlog was migrated down first, then read in every B phase.
    t = _one(tier_run, "e", "stratalog-tiered")
    assert t["ok"], t["error"]
    assert t["extra"]["migration_wait_s"] > 0
    assert all(
        (p["backlog_read_bytes"] > 0) == (p["phase"] != "alone") for p in t["extra"]["phases"]
    )


def test_f_reads_the_topic_into_spark_with_every_format(tier_run):
    f = _one(tier_run, "f", "stratalog")
    assert f["ok"], f["error"]
    # The quick profile reads Stratalog's two formats (the full one Spark's Kafka source too).
    assert set(f["extra"]["spark"]) == {"stratalog", "stratalog-python"}
    for fmt in ("stratalog", "stratalog-python"):
        sp = f["extra"]["spark"][fmt]
        runs, warm = sp["runs"], sp["warmup"]
        assert len(runs) == 1 and len(warm) == 1  # the quick profile's counts
        assert all(r["rows"] == f["records"] == 20_000 for r in runs + warm)
        assert all(r["bytes"] == 20_000 * 1024 for r in runs + warm)
        assert sp["first_rows_per_s"] == warm[0]["rows_per_s"]
    # The one-off job: its own fresh session, the whole topic once (in the quick profile for
    # the JVM connector only: each costs a JVM start).
    one = f["extra"]["spark"]["stratalog"]["one_off"]
    assert one["rows"] == 20_000 and one["bytes"] == 20_000 * 1024 and one["seconds"] > 0
    assert one["rows_per_s"] == one["rows"] / one["seconds"]
    assert one is not f["extra"]["spark"]["stratalog"]["warmup"][0]
    assert f["extra"]["spark"]["stratalog-python"]["one_off"] is None


def test_g_reads_a_log_back_across_tiers(tier_run):
    g = _one(tier_run, "g", "stratalog-cold-only")
    assert g["ok"], g["error"]
    assert g["stored"] == g["records"] == 20_000
    assert g["extra"]["kcat"]["records"] == g["records"]
    assert "tiers.hot.capacity" in g["describe"]


def test_h_follows_a_burst_into_a_small_hot_tier_and_its_drain(tier_run):
    quick = find_workloads(["h"], "quick")[0]
    prefill = quick.prefill_bytes // quick.record_size
    for target in ("stratalog-tiered", "stratalog-hot-only"):
        h = _one(tier_run, "h", target)
        assert h["ok"], h["error"]
        assert h["records"] == quick.records
        assert h["stored"] == quick.records + prefill
    b = _one(tier_run, "h", "stratalog-tiered")["extra"]["burst"]
    cap = quick.vars["hot_capacity"]
    seg = quick.vars["segment_bytes"]
    assert b["capacity_mb"] == cap / 1e6 and b["cold_mb_per_s"] == quick.vars["cold_rate"] / 1e6
    # The burst (20 MB into a 16 MiB hot tier holding ~7.5 MB) filled the hot tier ...
    tl = b["timeline"]
    assert max(p["hot_mb"] for p in tl) >= (cap - seg) / 1e6
    assert b["absorb_s"] > 0 and b["absorb_mb_per_s"] > 0
    # ... every acknowledged byte is on the timeline, and migration drained the hot tier back
    # to the threshold afterwards.
    assert tl[-1]["acked_mb"] == pytest.approx(quick.records * quick.record_size / 1e6)
    assert b["drain_s"] is not None
    assert tl[-1]["hot_mb"] <= (cap * b["threshold"] + seg) / 1e6
    assert "burst-h.png" in (Path(tier_run["_dirs"][0]) / "results.md").read_text()
    hot_only = _one(tier_run, "h", "stratalog-hot-only")["extra"]["burst"]
    assert "capacity_mb" not in hot_only and hot_only["timeline"]
    # Both burst goals are judged from this run (whatever the verdict), for the tiered target.
    verdicts = {g.name: g.verdict for g in bench_goals(tier_run["results"], None)}
    filled = "burst taken at the offered rate until the hot tier fills"
    for goal in (filled, "drain to the threshold"):
        assert verdicts[f"h: {goal} (stratalog-tiered)"] in ("met", "missed")
        assert f"h: {goal} (stratalog-hot-only)" not in verdicts
