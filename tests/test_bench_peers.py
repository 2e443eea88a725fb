"""The bench peers (NATS JetStream, Redis Streams, redis-benchmark) and the machine's limits,
against real servers and tools started by the targets: no mocks."""

from __future__ import annotations

import pickle
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from hdrh.histogram import HdrHistogram

from stratalog.bench.clients import ConsumerJob, ProducerJob, _produce
from stratalog.bench.limits import FIO, measure_limits
from stratalog.bench.peers_nats import NATS_SERVER
from stratalog.bench.peers_redis import REDIS_BENCHMARK, REDIS_SERVER
from stratalog.bench.peers_tansu import TansuTarget
from stratalog.bench.targets import Target, TargetUnavailable, make_target
from stratalog.bench.workload import TargetSpec, Workload

N = 2000
SIZE = 128
PARTITIONS = 2
TOPIC = "bench-peers-0"


def _need(binary: Path) -> None:
    if not binary.exists():
        pytest.skip(f"{binary} is not installed (make bench-deps)")


def _workload() -> Workload:
    return Workload(name="peers", partitions=PARTITIONS, record_size=SIZE, records=N)


def _roundtrip(target: Target, counted: bool = True) -> None:
    """Two consumers (one partition each) and one producer, all in this process; ``counted``:
    the server can also say how many records it holds, and spreads them over both partitions."""
    target.create_topics([TOPIC], PARTITIONS)
    factory = target.client_factory()
    factory = pickle.loads(pickle.dumps(factory))  # the harness ships it to child processes
    consumers = [factory.consumer(ConsumerJob(i, 2, [TOPIC], PARTITIONS)) for i in range(2)]
    job = ProducerJob(0, [TOPIC], PARTITIONS, SIZE, N, rate=None, sample_every=1)
    producer = factory.producer(job)
    try:
        # The harness's own producer loop, with a stop event and progress counter of its own.
        res = _produce(producer, job, threading.Event(), SimpleNamespace(value=0))
        assert res["first_error"] == ""
        assert (res["sent"], res["errors"], res["unacked"], res["records"]) == (N, 0, 0, N)
        assert res["bytes"] == N * SIZE
        publish = HdrHistogram.decode(res["hist"])
        assert publish.get_total_count() == N  # every record sampled (sample_every=1)
        assert publish.get_value_at_percentile(99) > 0

        got = [0, 0]
        nbytes = 0
        deadline = time.monotonic() + 30
        while sum(got) < N and time.monotonic() < deadline:
            for i, c in enumerate(consumers):
                n, b = c.consume(0.05)
                got[i] += n
                nbytes += b
        assert sum(got) == N
        if counted:
            assert got[0] > 0 and got[1] > 0  # each consumer read its own partition
        assert nbytes == N * SIZE
        for c in consumers:
            c.latency.fold()
        assert sum(c.latency.hist.get_total_count() for c in consumers) == N
        if counted:
            assert target.count_records([TOPIC], PARTITIONS) == N
    finally:
        producer.close()
        for c in consumers:
            c.close()


def test_nats_jetstream_roundtrip() -> None:
    _need(NATS_SERVER)
    target = make_target(TargetSpec("nats", "nats"), _workload())
    assert "NATS JetStream" in target.describe()
    try:
        target.start()
        assert target.pid is not None
        assert target.data_dirs() and target.data_dirs()[0].is_dir()
        _roundtrip(target)
    finally:
        workdir = target.workdir
        target.stop()
    assert workdir is not None and not workdir.exists()


def test_tansu_memory_only_roundtrip() -> None:
    """A memory-only native broker serves the same clients."""
    target = make_target(TargetSpec("tansu", "tansu"), _workload())
    assert isinstance(target, TansuTarget)
    assert "memory only" in target.describe()
    try:
        target.start()
        assert target.pid is not None
        # librdkafka's sticky partitioner may put a run this short on one partition (it did in
        # one CI run), and Tansu's ListOffsets lagged what it acknowledged: only the total read
        # back is checked.
        _roundtrip(target, counted=False)
        assert target.count_records([TOPIC], PARTITIONS) is None  # it cannot say
    finally:
        workdir = target.workdir
        target.stop()
    assert target.pid is None
    assert workdir is not None and not workdir.exists()


def test_nats_sync_always_runs_or_says_why() -> None:
    _need(NATS_SERVER)
    target = make_target(TargetSpec("nats", "nats", {"sync": "always"}), _workload())
    assert "sync_interval: always" in target.describe()
    try:
        target.start()
    except TargetUnavailable as e:
        # nats-server before 2.10 has no sync_interval; it must say so, not run weaker.
        assert "2.10" in str(e)
        major, minor = (int(x) for x in target.version().split(".")[:2])
        assert (major, minor) < (2, 10)
    else:
        try:
            _roundtrip(target)
        finally:
            target.stop()
    assert target.pid is None


def test_redis_streams_roundtrip_appendfsync_always() -> None:
    _need(REDIS_SERVER)
    spec = TargetSpec("redis", "redis", {"appendfsync": "always", "pipeline": 32})
    target = make_target(spec, _workload())
    assert "appendfsync always" in target.describe()
    try:
        target.start()
        assert target.pid is not None
        _roundtrip(target)
        aof = target.workdir / "appendonlydir" if target.workdir else None
        assert aof is not None and any(f.stat().st_size > N * SIZE for f in aof.iterdir())
    finally:
        target.stop()


def test_redis_benchmark_tool() -> None:
    _need(REDIS_SERVER)
    _need(REDIS_BENCHMARK)
    w = Workload(name="peers", partitions=2, record_size=SIZE, records=5000)
    spec = TargetSpec("redis-benchmark", "redis-benchmark", {"clients": 4, "pipeline": 16})
    target = make_target(spec, w)
    assert getattr(target, "role", "broker") == "tool"
    assert "always" in target.describe()
    seen: list[int] = []
    try:
        target.start()
        out = target.run_tool(w, seen.append)  # type: ignore[attr-defined]
    finally:
        target.stop()
    assert "error" not in out, out.get("error")
    assert out["records"] >= 5000  # redis-benchmark rounds up to whole pipelines
    assert out["bytes"] == out["records"] * SIZE
    assert out["records_per_s"] > 0 and out["mb_per_s"] > 0 and out["seconds"] > 0
    assert out["streams"] == 2
    p = out["publish"]
    assert p is not None and 0 < p["p50"] <= p["p99"] <= p["p99.9"] <= p["max"]
    assert out["server_cpu_s"] >= 0
    assert seen and seen[-1] == out["records"]


def test_measure_limits_quick(tmp_path: Path) -> None:
    _need(FIO)
    before = set(tmp_path.iterdir())
    m = measure_limits(tmp_path, quick=True)
    assert set(tmp_path.iterdir()) == before  # its scratch directory is gone
    facts = m["facts"]
    assert facts["filesystem"] and facts["cpus"] >= 1 and facts["memory_gib"] > 0
    assert facts["kernel"] and facts["cpu"]
    for key in ("fdatasync_1m", "write_4k_fdatasync", "seq_read", "loopback"):
        assert "error" not in m[key], (key, m[key])
    assert m["fdatasync_1m"]["mb_per_s"] > 0
    assert m["seq_read"]["bytes"] == 128 * 1024 * 1024 and m["seq_read"]["mb_per_s"] > 0
    assert m["loopback"]["gb_per_s"] > 0
    w4 = m["write_4k_fdatasync"]
    assert w4["iops"] > 0 and w4["ops"] > 0
    assert 0 < w4["p50_ms"] <= w4["p99_ms"] <= w4["p99.9_ms"]
    assert w4["fdatasync"]["p50_ms"] > 0
    d = m["direct_write"]
    under = m["fdatasync_under_reads"]
    if d.get("supported") is False:
        assert "O_DIRECT" in d["error"]
        assert "error" in under  # its reader uses O_DIRECT too
    else:
        assert "error" not in d, d
        assert d["mb_per_s"] > 0
        for reader in ("reader_default", "reader_idle"):
            fs = under[reader]["fdatasync"]
            assert 0 < fs["p50_ms"] <= fs["p99_ms"] <= fs["p99.9_ms"], (reader, under)
            assert under[reader]["read_mb_per_s"] > 0, (reader, under)


def test_stratalog_target_keeps_its_hot_tier_on_the_fast_root(tmp_path: Path) -> None:
    """``{fastdir}``: a directory of the target's own under vars.fast_root (the second device of
    e-fast-hot; a plain directory stands in for it here) holds the hot tier and goes at stop."""
    fast = tmp_path / "fast"
    fast.mkdir()
    w = Workload(
        name="peers",
        partitions=PARTITIONS,
        record_size=SIZE,
        records=N,
        vars={"fast_root": str(fast)},
    )
    target = make_target(TargetSpec("fast-hot", "stratalog", {"tiers.hot.path": "{fastdir}"}), w)
    target.start()
    try:
        _roundtrip(target, counted=False)  # librdkafka's sticky partitioner: one partition
        (hot,) = list(fast.iterdir())
        assert hot in target.data_dirs()
        stored = sum(f.stat().st_size for f in hot.rglob("*") if f.is_file())
        assert stored >= N * SIZE  # the records went to the fast root, not the work directory
    finally:
        target.stop()
    assert list(fast.iterdir()) == []


def test_stratalog_target_names_a_missing_fast_root(tmp_path: Path) -> None:
    w = Workload(
        name="peers",
        partitions=PARTITIONS,
        record_size=SIZE,
        records=N,
        vars={"fast_root": str(tmp_path / "absent")},
    )
    target = make_target(TargetSpec("fast-hot", "stratalog", {"tiers.hot.path": "{fastdir}"}), w)
    with pytest.raises(RuntimeError, match=r"vars\.fast_root"):
        target.start()
    assert target.pid is None and target.workdir is None  # nothing started, nothing left


def test_backlog_readers_can_run_in_sched_idle(tmp_path: Path) -> None:
    """backlog_readers_idle: the harness's reader process puts itself in SCHED_IDLE and still
    reads (a real broker, the harness's own consumer_main in a spawned process)."""
    import multiprocessing

    from stratalog.bench.clients import consumer_main

    target = make_target(TargetSpec("idle-readers", "stratalog"), _workload())
    target.start()
    try:
        target.create_topics([TOPIC], 1)
        factory = target.client_factory()
        job = ProducerJob(0, [TOPIC], 1, SIZE, 100, rate=None, sample_every=1)
        producer = factory.producer(job)
        _produce(producer, job, threading.Event(), SimpleNamespace(value=0))
        producer.close()
        ctx = multiprocessing.get_context("spawn")
        ready, results = ctx.Queue(), ctx.Queue()
        start, stop, progress = ctx.Event(), ctx.Event(), ctx.Value("q", 0)
        reader = ConsumerJob(
            0,
            1,
            [TOPIC],
            1,
            track_latency=False,
            max_duration_s=20,
            group="backlog",
            sched_idle=True,
        )
        proc = ctx.Process(
            target=consumer_main, args=(factory, reader, ready, start, stop, progress, results)
        )
        proc.start()
        try:
            assert ready.get(timeout=60)[2] == ""
            start.set()
            deadline = time.monotonic() + 20
            while progress.value < 100 and time.monotonic() < deadline:
                time.sleep(0.05)
            stop.set()
            result = results.get(timeout=30)
        finally:
            proc.join(30)
            if proc.is_alive():
                proc.kill()
        assert result["error"] == ""
        assert result["sched_idle"] is True
        assert result["records"] == 100
    finally:
        target.stop()
