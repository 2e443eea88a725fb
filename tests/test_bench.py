"""``stratalog bench``: workload files, and a real quick run of every workload kind on real
brokers (Stratalog and Apache Kafka) with real confluent-kafka clients in separate processes.

These tests check that the harness measures and reports correctly (counts, stored records, the
derived rate of workload c, the sweep of d, both phases of the catch-up e); they never assert a
speed: speeds are for docs/benchmarks.md."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from stratalog.bench.catchup import evict_page_cache
from stratalog.bench.goals import goals as bench_goals
from stratalog.bench.latency_goals import GOAL_5K, GOAL_500, GOAL_B, latency_goals, markdown_lines
from stratalog.bench.results import CaseResult
from stratalog.bench.rows import aggregate
from stratalog.bench.runner import Runner
from stratalog.bench.tables import markdown
from stratalog.bench.targets import process_cpu_s
from stratalog.bench.workload import WorkloadError, find_workloads, load_workload, parse_workload

from .bench_runs import _one, assert_report, merged, quick_bench, stratalog

pytestmark = pytest.mark.timeout(900)


def test_every_workload_file_loads_in_both_profiles():
    full = {w.name: w for w in find_workloads(None, "full")}
    quick = {w.name: w for w in find_workloads(None, "quick")}
    assert set(full) == set(quick) >= {"a", "b", "c", "d", "e", "f"}
    # The cluster workloads take an hour and a half: only when named.
    assert not {"rf3", "rf3-kera", "failover", "rejoin"} & set(full)
    named = find_workloads(["rf3", "rf3-kera", "failover", "rejoin"], "quick")
    assert {w.name for w in named} == {"rf3", "rf3-kera", "failover", "rejoin"}
    assert full["b"].partitions == 16 and full["b"].record_size == 1024
    assert full["b"].producers == 4 and full["b"].consumers == 4 and full["b"].acks == "all"
    assert full["a"].acks == "1" and full["a"].rate is None
    assert full["c"].rate_from == "b" and full["c"].rate_fraction == 0.5
    assert full["d"].sweep["topics"] == [1, 10, 100, 1000]
    assert full["e"].backlog_bytes >= 2**31
    assert quick["a"].records < full["a"].records
    kinds = {t.kind for w in full.values() for t in w.targets}
    assert {"stratalog", "kafka", "nats", "redis", "redis-benchmark"} <= kinds


def test_experiment_files_load_by_path():
    """bench/experiments/ holds one-off comparisons that docs/benchmarks.md cites by path."""
    files = sorted((Path(__file__).parent.parent / "bench" / "experiments").glob("*.toml"))
    assert files
    for f in files:
        (w,) = find_workloads([str(f)])
        # Each compares something: two targets or more, or (a Spark read) the three formats.
        assert w.name == f.stem and (len(w.targets) >= 2 or w.spark_read), f


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"name": "x", "recordz": 1}, "unknown keys"),
        ({"name": "x", "rate": -3, "records": 1}, "rate must be"),
        ({"name": "x", "acks": "2", "records": 1}, "acks must be"),
        ({"name": "x", "record_size": 4, "records": 1}, "record_size"),
        ({"name": "x", "target": [{"kind": "kafka"}]}, "needs name and kind"),
        ({}, "set records, or duration_s"),
        ({"name": "x", "profile": {"quick": {"bogus": 1}}}, "profile.quick"),
        ({"name": "x", "records": 1, "producer_client": "kcat"}, "producer_client must be"),
        ({"name": "x", "records": 1, "sweep": {"producer_client": ["rust"]}}, "producer_client"),
        (
            {"name": "x", "records": 1, "backlog_readers_client": "kcat"},
            "backlog_readers_client must be confluent-kafka or arrow",
        ),
        (
            {
                "name": "x",
                "records": 1,
                "backlog_readers_client": "arrow",
                "backlog_readers_config": {"socket.receive.buffer.bytes": 262144},
            },
            r"takes fetch_bytes and partition_fetch_bytes, not \['socket.receive.buffer.bytes'\]",
        ),
    ],
)
def test_bad_workload_is_named(data, message):
    with pytest.raises(WorkloadError, match=message):
        parse_workload(data, "quick")


def test_cli_names_unknown_workload_and_target():
    r = stratalog("bench", "no-such-workload")
    assert r.returncode == 1 and "no workload 'no-such-workload'" in r.stderr
    r = stratalog("bench", "a", "--target", "no-such-target")
    assert r.returncode == 1 and "no target ['no-such-target']" in r.stderr


def test_list():
    r = stratalog("bench", "--list")
    assert r.returncode == 0, r.stderr
    for name in "abcdef":
        assert f"{name}:" in r.stdout


def test_process_cpu_and_page_cache_eviction(tmp_path):
    # The child spins until it has used 0.5 s of CPU, says so, then waits.
    spin = "import time\nwhile time.process_time() < 0.5: pass\nprint('spun', flush=True)\ninput()"
    burn = subprocess.Popen(
        [sys.executable, "-c", spin], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert burn.stdout is not None and burn.stdout.readline() == "spun\n"
        assert 0.45 <= process_cpu_s(burn.pid) < 30  # clock ticks: 10 ms steps
    finally:
        burn.kill()
        burn.wait()
    assert process_cpu_s(None) == 0.0
    (tmp_path / "seg").write_bytes(b"x" * 1_000_000)
    assert evict_page_cache([tmp_path]) == 1_000_000


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory) -> dict:
    """Quick runs of the plain workload kinds: plain (a, b with kcat read-back), derived rate
    (c) and sweep (d) on Stratalog, and a, d on Apache Kafka as a peer (two commands, as a
    target named on the command line runs every workload that has it; the tiers' kinds are in
    test_bench_tiers.py, so the two modules run on two workers). Their results are merged;
    ``_dirs`` are the result directories."""
    runs = []
    for args in (
        ("a", "b", "c", "d", "-t", "stratalog"),
        ("a", "d", "-t", "kafka"),
    ):  # fmt: skip
        runs.append(quick_bench(tmp_path_factory.mktemp("bench"), *args))
    return merged(runs)


def test_plain_cases_count_every_record(quick_run):
    quick = {w.name: w for w in find_workloads(None, "quick")}
    server_cpu = 0.0
    for workload, target in (
        ("a", "stratalog"),
        ("a", "kafka"),
        ("b", "stratalog"),
    ):
        r = _one(quick_run, workload, target)
        assert r["ok"], r["error"]
        assert r["records"] == quick[workload].records
        assert r["stored"] >= r["records"]
        assert r["bytes"] == r["records"] * quick[workload].record_size
        assert r["records_per_s"] > 0 and r["mb_per_s"] > 0
        assert r["publish"]["count"] > 0
        assert r["publish"]["p50"] <= r["publish"]["p99"] <= r["publish"]["max"]
        # CPU time is counted in clock ticks (10 ms): a quick case of 30 ms may show none.
        assert r["server_cpu_s"] >= 0
        server_cpu += r["server_cpu_s"]
    assert server_cpu > 0
    b = _one(quick_run, "b", "stratalog")
    assert b["consumed"] >= b["records"]
    # End-to-end latency of every latency_sample_every-th record each consumer read.
    every = find_workloads(["b"], "quick")[0].latency_sample_every
    assert b["records"] // every <= b["end_to_end"]["count"] <= b["consumed"]
    assert b["extra"]["kcat"]["records"] == b["records"]
    assert b["extra"]["kcat"]["first_read"]["records"] == b["records"]
    # Stratalog's own histograms over the load: its produce time, and the group commits' fsync
    # (fsync=always); a peer has neither.
    assert 0 < b["extra"]["broker_produce_p99_ms"] < 60_000
    assert 0 < b["extra"]["fsync_p99_ms"] < 60_000
    # Its collector's pauses (a serving broker collects under any load).
    assert 0 < b["extra"]["gc_pause_p99_ms"] <= b["extra"]["gc_pause_max_ms"] < 60_000
    assert "broker_produce_p99_ms" not in _one(quick_run, "a", "kafka")["extra"]
    # Kafka's own producer (the Java client) drove both brokers too, all records acknowledged.
    for workload, target in (("a", "stratalog"), ("a", "kafka"), ("b", "stratalog")):
        pt = _one(quick_run, workload, target)["extra"]["perf_test"]
        assert pt.get("records") == quick[workload].records, pt
        assert pt["records_per_s"] > 0 and pt["publish"]["p50"] <= pt["publish"]["max"]


def test_c_runs_at_half_of_b(quick_run):
    b = _one(quick_run, "b", "stratalog")
    c = _one(quick_run, "c", "stratalog")
    assert c["ok"], c["error"]
    assert c["extra"]["target_rate"] == pytest.approx(b["records_per_s"] / 2)
    # A fixed rate for 3 s: the record count follows from the rate.
    assert c["records"] == int(c["extra"]["target_rate"] * 3)


def test_d_sweeps_topics_and_layouts(quick_run):
    for topics in (10,):  # the quick profile's one topic count
        for layout in ("virtual", "per-partition"):
            r = _one(quick_run, "d", "stratalog", topics=topics, layout=layout)
            assert r["params"]["producer_client"] == "java"  # the quick profile's one client
            assert r["ok"], r["error"]
            assert r["stored"] == r["records"] == 4_000
            assert r["publish"]["count"] > 0
    # Kafka's Java client drove Apache Kafka too (no layout there: once per topic count).
    k = _one(quick_run, "d", "kafka", topics=10, producer_client="java")
    assert k["ok"] and k["stored"] == k["records"] == 4_000, k["error"]
    # "-t kafka" selects the target named kafka, not every target of kind kafka (kafka-fsync).
    assert not [r for r in quick_run["results"] if r["target"] == "kafka-fsync"]


def test_report_files(quick_run):
    assert_report(quick_run["_dirs"][0], "abcd", ("throughput.png", "latency.png", "sweep-d.png"))
    verdicts = {g.name: g.verdict for g in bench_goals(quick_run["results"], None)}
    # Measured in this run (whatever the verdict), or plainly not measured.
    assert verdicts["b vs disk"] == "not measured"  # --no-limits
    assert verdicts["a: one producer, 100 B"] in ("met", "missed")


def test_several_runs_are_reported_as_medians():
    def case(run: int, rps: float, p99: float, ok: bool = True) -> dict:
        return {
            "workload": "a", "target": "t", "kind": "stratalog", "describe": "t", "params": {},
            "ok": ok, "error": "" if ok else "boom", "run": run, "records_per_s": rps,
            "mb_per_s": rps / 1e4, "consume_mb_per_s": 0.0, "server_cores": 0.1,
            "cpu_s_per_mb": 0.01, "publish": {"p50": p99 / 2, "p99": p99}, "end_to_end": None,
            "extra": {},
        }  # fmt: skip

    rows = aggregate([case(1, 300, 9), case(2, 100, 1), case(3, 200, 5), case(4, 0, 0, False)])
    assert len(rows) == 1
    row = rows[0]
    assert row["records_per_s"] == 200 and row["mb_per_s"] == 0.02
    assert row["publish"] == {"p50": 2.5, "p99": 5}
    assert row["runs"] == 3 and row["failed_runs"] == 1
    assert row["runs_records_per_s"] == [300, 100, 200]
    md = markdown({"started": "-", "command": "x", "runs": 4, "results": [case(1, 300, 9)]})
    assert "median" in md and "| 1: 300 |" in md


@pytest.mark.parametrize(
    ("client_rise", "broker_alone", "broker_busy", "verdict"),
    [
        (-0.31, 6.19, 38.09, "missed"),  # the full run's case: the clients' "alone" p99 a spike
        (0.10, 6.0, 7.0, "met"),
        (0.10, None, None, "met"),  # a peer reports no broker histogram: the clients decide
        (0.40, 6.0, 6.5, "missed"),
    ],
)
def test_catch_up_goal_needs_the_brokers_own_p99_too(
    client_rise, broker_alone, broker_busy, verdict
):
    extra = {"p99_increase": client_rise}
    if broker_alone is not None:
        extra |= {
            "broker_produce_p99_alone_ms": broker_alone,
            "broker_produce_p99_with_backlog_ms": broker_busy,
        }
    row = {"workload": "e", "ok": True, "kind": "stratalog", "target": "stratalog", "extra": extra}
    (goal,) = [g for g in bench_goals([row], None) if g.name.startswith("e: produce p99")]
    assert goal.verdict == verdict
    if broker_alone is not None:
        assert "the broker's own" in goal.measured


def test_catch_up_experiments_are_judged_against_the_goals_too():
    """A catch-up from an experiment file (e-fast-hot.toml...) gets e's two goals in its own
    run's table, the cold read against that run's sequential read."""
    extra = {"p99_increase": 0.10, "backlog_read_mb_per_s": 480.0}
    rows = [
        {"workload": "e-fast-hot", "ok": True, "kind": "stratalog", "target": "fast-hot",
         "describe": "Stratalog (tiers.hot.capacity=1073741824)", "extra": extra},
        # not a catch-up: a workload whose name only starts alike, without the phases' figures
        {"workload": "e-other", "ok": True, "kind": "stratalog", "target": "x", "extra": {}},
    ]  # fmt: skip
    by_name = {g.name: g for g in bench_goals(rows, {"seq_read": {"mb_per_s": 900.0}})}
    assert by_name["e: produce p99 with backlog readers (fast-hot)"].verdict == "met"
    cold = by_name["e: cold read vs the disk's sequential read (fast-hot)"]
    assert cold.verdict == "met" and cold.measured.startswith("53%")
    assert not any("(x)" in name for name in by_name)


def _row(workload: str, target: str, kind: str, mb: float, **extra) -> dict:
    return {
        "workload": workload, "target": target, "kind": kind, "ok": True, "mb_per_s": mb,
        "records_per_s": mb * 1e6 / 1024, "describe": target, "extra": {}, **extra,
    }  # fmt: skip


def test_b_vs_disk_says_what_else_bounds_it():
    rows = [
        _row("b", "stratalog", "stratalog", 330.0, client_cores=1.24, server_cores=0.56),
        _row("b", "tansu", "tansu", 250.0),
        _row("b", "redis", "redis-benchmark", 200.0, describe="appendfsync always"),
    ]
    by_name = {g.name: g for g in bench_goals(rows, {"fdatasync_1m": {"mb_per_s": 800.0}})}
    g = by_name["b vs disk"]
    assert g.verdict == "missed" and g.measured.startswith("41% (330 of 800 MB/s")
    assert "clients 1.24 cores, broker 0.56" in g.measured
    assert "memory-only broker 250 MB/s" in g.measured
    # 3x Redis (600 MB/s) is within this disk's 800 MB/s: nothing to add.
    redis = "b vs Redis (appendfsync always, best client)"
    assert "above the disk" not in by_name[redis].measured
    by_name = {g.name: g for g in bench_goals(rows, {"fdatasync_1m": {"mb_per_s": 500.0}})}
    assert "above the disk's 500" in by_name[redis].measured


def test_c_reports_the_memory_only_brokers_latency_at_the_same_rate():
    lat = {"p50": 1.0, "p99": 40.0, "p99.9": 60.0, "max": 70.0}
    own = {"p50": 1.0, "p99": 30.0, "p99.9": 50.0, "max": 55.0}
    rows = [
        _row("c", "stratalog", "stratalog", 100.0, publish=lat),
        _row("c", "tansu", "tansu", 100.0, publish=own),
    ]
    (g,) = [g for g in bench_goals(rows, None) if g.name.startswith("c: publish latency")]
    assert g.verdict == "missed"
    assert "memory-only broker" in g.measured and "p99 30.00 ms" in g.measured


def test_a_target_can_take_its_rate_from_another_target():
    (c,) = find_workloads(["c"], None)
    (tansu,) = [t for t in c.targets if t.kind == "tansu"]
    assert tansu.rate_reference == "stratalog"
    runner = Runner(log=lambda _m: None)
    for target, rps in (("stratalog", 200_000.0), ("tansu", 300_000.0)):
        runner.results.append(CaseResult("b", target, target, target, {}, records_per_s=rps))
    # The memory-only broker runs at half of Stratalog's b rate, every other at half of its own.
    assert runner.resolve_rate(c, tansu) == pytest.approx(100_000)
    (strat,) = [t for t in c.targets if t.name == "stratalog"]
    assert runner.resolve_rate(c, strat) == pytest.approx(100_000)
    runner.results[0].ok = False  # no Stratalog b to take the rate from: named
    with pytest.raises(RuntimeError, match="workload b on stratalog"):
        runner.resolve_rate(c, tansu)


def test_d_reports_the_memory_only_broker_beside_the_layouts():
    def d(target: str, kind: str, mb: float, layout: str) -> dict:
        params = {"topics": 1000, "layout": layout, "producer_client": "java"}
        return _row("d", target, kind, mb, params=params)

    rows = [
        d("stratalog", "stratalog", 30.0, "virtual"),
        d("stratalog", "stratalog", 25.0, "per-partition"),
        d("tansu", "tansu", 32.5, "n/a"),
    ]
    (g,) = [g for g in bench_goals(rows, None) if g.name.startswith("d: virtual vs")]
    assert g.verdict == "missed"
    assert g.measured.startswith("1.20x")
    assert "memory-only broker with the same producers: 1.30x" in g.measured


def test_backlog_readers_get_their_own_client_settings():
    """backlog_readers_config reaches the catch-up's backlog readers (and only them), beside
    their SCHED_IDLE choice; the experiment files that use it parse."""
    from stratalog.bench.load import backlog_reader_jobs, consumer_jobs

    w = parse_workload(
        {
            "name": "x",
            "records": 1,
            "backlog_consumers": 2,
            "backlog_readers_idle": True,
            "backlog_readers_config": {"socket.receive.buffer.bytes": 262144},
        }
    )
    jobs = backlog_reader_jobs(w, ["bench-x-backlog"])
    assert [j.index for j in jobs] == [0, 1]
    for j in jobs:
        assert j.group == "backlog" and j.sched_idle and not j.track_latency
        assert j.extra == {"socket.receive.buffer.bytes": 262144}
    assert all(j.extra == {} for j in consumer_jobs(2, ["tail"], 4))
    small = load_workload(
        Path(__file__).parent.parent / "bench/experiments/e-sender-small-recv.toml"
    )
    assert small.backlog_readers_config == {"socket.receive.buffer.bytes": 262144}
    assert small.backlog_readers_idle


def test_the_preemption_probe_times_wakeups_beside_idle_work():
    """The probe behind docs/benchmarks.md's "History sent by a process of its own"
    (stratalog.bench.preemption_probe); here short, only to show each kind of work runs,
    wake-ups are timed, and its processes stop."""
    import multiprocessing

    from stratalog.bench import preemption_probe

    for mode in preemption_probe.MODES:
        r = preemption_probe.measure(mode, seconds=0.3)
        assert r["wakeups"] > 10 and 0 <= r["p50_ms"] <= r["p99_ms"] <= r["max_ms"], (mode, r)
    assert multiprocessing.active_children() == []
    with pytest.raises(ValueError, match="mode must be one of"):
        preemption_probe.measure("yield")


def _children(pid: int) -> set[int]:
    """Every live descendant of ``pid`` (from /proc), zombies excluded."""
    parent: dict[int, int] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                stat = (d / "stat").read_text()
            except OSError:
                continue
            fields = stat.rsplit(")", 1)[1].split()
            if fields[0] != "Z":
                parent[int(d.name)] = int(fields[1])
    out: set[int] = set()
    todo = [pid]
    while todo:
        p = todo.pop()
        kids = [c for c, pp in parent.items() if pp == p]
        out.update(kids)
        todo += kids
    return out


def test_a_bench_stopped_by_sigterm_stops_its_brokers_and_load_processes(tmp_path):
    """SIGTERM (a job runner's stop, a timeout) ends a bench like Ctrl-C: its broker and its load
    processes are stopped, none left running once it has exited."""
    bench = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "stratalog.cli",
            "bench",
            "e",
            "--quick",
            "--no-limits",
            "-t",
            "stratalog",
            "-o",
            str(tmp_path / "out"),
        ],
        stdout=open(tmp_path / "bench.log", "w"),  # noqa: SIM115
        stderr=subprocess.STDOUT,
    )
    try:
        # Wait until it runs a broker and its load processes (the producers of the backlog).
        seen: set[int] = set()
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and bench.poll() is None:
            seen = _children(bench.pid)
            if len(seen) >= 3:
                break
            time.sleep(0.2)
        assert len(seen) >= 3, f"the bench started {len(seen)} processes"
        bench.send_signal(signal.SIGTERM)
        rc = bench.wait(timeout=180)
    finally:
        if bench.poll() is None:
            bench.kill()
            bench.wait()
    assert rc == 130, (tmp_path / "bench.log").read_text()[-2000:]
    # (multiprocessing's resource tracker ends by itself a moment after the bench.)
    deadline = time.monotonic() + 15
    while (left := _alive(seen)) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid, _ in left:  # not to leave them to the rest of the suite if the test fails
        os.kill(pid, signal.SIGKILL)
    assert not left, left


def _raise_interrupt(_signum: int, _frame: object) -> None:
    raise KeyboardInterrupt  # as the bench's SIGTERM handler does (stratalog.cli)


def test_sigterm_while_a_load_process_starts_waits_until_it_has_started(monkeypatch):
    """The window behind the test above's leftovers: the child runs before its parent has its
    pid. SIGTERM there used to leave a load process the harness could not join or kill (and,
    with it, the forkserver and resource tracker); now it acts once the start is complete."""
    import multiprocessing
    from multiprocessing.context import SpawnProcess

    from stratalog.bench.load import interrupts_held, start_process

    real = SpawnProcess._Popen

    def popen_then_sigterm(process_obj):
        popen = real(process_obj)
        signal.raise_signal(signal.SIGTERM)  # child started, its Process not yet told
        return popen

    monkeypatch.setattr(SpawnProcess, "_Popen", staticmethod(popen_then_sigterm))
    p = multiprocessing.get_context("spawn").Process(target=time.sleep, args=(0,), daemon=True)
    old = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        with pytest.raises(KeyboardInterrupt):
            start_process(p)
        assert signal.getsignal(signal.SIGTERM) is _raise_interrupt
        reached = False
        with pytest.raises(KeyboardInterrupt), interrupts_held():
            signal.raise_signal(signal.SIGTERM)
            reached = True
        assert reached
    finally:
        signal.signal(signal.SIGTERM, old)
    assert p.pid is not None  # so run_load's finally joins it
    p.join(30)
    assert p.exitcode == 0


def _alive(pids: set[int]) -> list[tuple[int, bytes]]:
    """Those of ``pids`` still running (not zombies), with their command lines."""
    out = []
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            if state != "Z":
                out.append((pid, Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")))
        except OSError:
            continue
    return out


def test_latency_goals_compare_with_fsync_never_the_old_window_and_kafka():
    def lat(p50: float, p99: float, p999: float) -> dict:
        return {"p50": p50, "p99": p99, "p99.9": p999, "max": p999 * 2}

    rows = [
        _row("latency", "stratalog", "stratalog", 5.0, params={"rate": 5000},
             publish=lat(1.8, 4.2, 9.0)),
        _row("latency", "stratalog-gc2", "stratalog", 5.0, params={"rate": 5000},
             publish=lat(4.7, 16.0, 20.0)),
        _row("latency", "kafka-fsync", "kafka", 5.0, params={"rate": 5000},
             publish=lat(3.0, 8.0, 30.0)),
        _row("latency", "stratalog", "stratalog", 0.5, params={"rate": 500},
             publish=lat(2.6, 4.0, 5.0)),
        _row("latency", "stratalog-nosync", "stratalog", 0.5, params={"rate": 500},
             publish=lat(1.2, 2.0, 3.0)),
        _row("b-group-commit", "stratalog", "stratalog", 300.0, publish=lat(50, 400, 500)),
        _row("b-group-commit", "stratalog-gc2", "stratalog", 310.0, publish=lat(60, 450, 500)),
    ]  # fmt: skip
    by = {g.name: g for g in latency_goals(rows)}
    five_k = by[GOAL_5K]
    assert five_k.verdict == "met" and "p99 4.20" in five_k.measured
    assert "stratalog-gc2 4.70 / 16.00 / 20.00 ms" in five_k.measured
    assert "kafka-fsync 3.00 / 8.00 / 30.00 ms" in five_k.measured
    # 2.6 ms against fsync=never's 1.2 + 1: missed, and said with both figures.
    assert by[GOAL_500].verdict == "missed"
    assert by[GOAL_500].measured.startswith("2.60 ms against 1.20 ms")
    assert by[GOAL_B].verdict == "missed" and by[GOAL_B].measured.startswith("0.97x")
    # A run without the workloads shows no section; one with them shows every goal.
    assert markdown_lines([_row("b", "stratalog", "stratalog", 1.0)]) == []
    section = "\n".join(markdown_lines(rows))
    assert GOAL_5K in section and GOAL_500 in section and GOAL_B in section
    assert all(g.verdict == "not measured" for g in latency_goals(rows[-2:])[:2])
