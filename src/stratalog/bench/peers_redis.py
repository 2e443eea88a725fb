"""Redis Streams as benchmark peers: target kinds ``redis`` and ``redis-benchmark``.

Server (both kinds): Debian's ``redis-server`` (``/usr/bin/redis-server``, ``make bench-deps``),
started by the target with ``--port <free> --bind 127.0.0.1 --dir <tmpdir> --appendonly yes
--appendfsync <always|everysec|no> --save ''`` and stopped by PID. Setting ``appendfsync``
(default ``"always"``: Redis writes and fsyncs the AOF before it replies to the commands of an
event-loop turn, so every acknowledged XADD is on disk).

``redis`` (role "broker", driven by the harness's clients): one stream key ``<topic>:<n>`` per
topic-partition. Producers (redis-py with the hiredis parser) XADD with a non-transactional
pipeline of ``pipeline`` commands per round trip (setting, default 64), records round-robin over
the topic's streams; the publish latency of a sampled record is the end of its pipeline's round
trip minus its send time. Consumer ``i`` of ``n`` XREADs (BLOCK) from id 0 every ``n``-th stream.

``redis-benchmark`` (role **"tool"**): the harness does not run its clients against it. It calls
``target.run_tool(workload, progress_cb)`` (when ``getattr(target, "role", "broker") == "tool"``),
which runs Redis's own C load generator, ``redis-benchmark -n <records> -c <clients> -P
<pipeline> XADD <key> * f <record_size bytes>``, against this target's redis-server and returns
the dict described at :meth:`RedisBenchmarkTarget.run_tool`. Settings: ``appendfsync``,
``pipeline`` (default 64), ``clients`` (default 50, redis-benchmark's own default).
"""

from __future__ import annotations

import re
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from stratalog.bench.clients import (
    _UNPACK_FROM,
    ClientFactory,
    ConsumerClient,
    ConsumerJob,
    ProducerClient,
    ProducerJob,
)
from stratalog.bench.targets import (
    Target,
    TargetUnavailable,
    free_port,
    process_cpu_s,
    register,
    stop_process,
    wait_port,
)
from stratalog.bench.workload import TargetSpec, Workload

REDIS_SERVER = Path("/usr/bin/redis-server")
REDIS_BENCHMARK = Path("/usr/bin/redis-benchmark")
FSYNC_CHOICES = ("always", "everysec", "no")
FIELD = b"v"
_MAX_ARG = 128 * 1024 - 1  # Linux's limit on one command-line argument (MAX_ARG_STRLEN)


def stream_key(topic: str, partition: int) -> str:
    return f"{topic}:{partition}"


def _redis(port: int, timeout: float = 120):
    import redis
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    # No retries: a silently repeated XADD would store a record twice.
    return redis.Redis(
        host="127.0.0.1",
        port=port,
        socket_timeout=timeout,
        socket_connect_timeout=10,
        retry=Retry(NoBackoff(), 0),
    )


def _version(binary: Path) -> str:
    try:
        out = subprocess.run(
            [str(binary), "--version"], capture_output=True, text=True, timeout=10
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return ""
    m = re.search(r"(\d+\.\d+\.\d+)", out)
    return m.group(1) if m else out.strip()


@register
class RedisTarget(Target):
    """Redis Streams with an AOF; see the module docstring."""

    kind = "redis"
    role: ClassVar[str] = "broker"

    def __init__(self, spec: TargetSpec, workload: Workload) -> None:
        super().__init__(spec, workload)
        self.proc: subprocess.Popen | None = None
        self.port = 0
        self.appendfsync = str(spec.settings.get("appendfsync", "always"))
        self.pipeline = int(spec.settings.get("pipeline", 64))
        self._version = ""

    def version(self) -> str:
        if not self._version and REDIS_SERVER.exists():
            self._version = _version(REDIS_SERVER)
        return self._version

    def describe(self) -> str:
        return (
            f"Redis {self.version() or '?'} Streams (AOF, appendfsync {self.appendfsync}; "
            f"redis-py + hiredis, pipeline {self.pipeline})"
        )

    def start(self) -> None:
        if not REDIS_SERVER.exists():
            raise TargetUnavailable(f"{REDIS_SERVER} is missing (make bench-deps)")
        if self.appendfsync not in FSYNC_CHOICES:
            raise RuntimeError(
                f"redis: appendfsync must be one of {FSYNC_CHOICES}, not {self.appendfsync!r}"
            )
        if self.pipeline < 1:
            raise RuntimeError("redis: pipeline must be >= 1")
        wd = self._mkworkdir()
        self.port = free_port()
        cmd = [
            str(REDIS_SERVER),
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--dir", str(wd),
            "--appendonly", "yes",
            "--appendfsync", self.appendfsync,
            "--save", "",
            "--daemonize", "no",
            "--logfile", str(wd / "redis.log"),
        ]  # fmt: skip
        self.proc = subprocess.Popen(
            cmd,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            cwd=wd,
        )
        try:
            wait_port(self.port, 30, self.proc)
            r = _redis(self.port, 10)
            deadline = time.monotonic() + 30
            while True:  # the port opens before the AOF is loaded
                try:
                    r.ping()
                    break
                except Exception:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.05)
            r.close()
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        stop_process(proc, timeout=15)
        self._rmworkdir()

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def data_dirs(self) -> list[Path]:
        return [self.workdir] if self.workdir else []

    def create_topics(self, names: list[str], partitions: int) -> None:
        # Streams come into being with their first XADD; just make sure none is left over.
        r = _redis(self.port)
        try:
            keys = [stream_key(t, p) for t in names for p in range(partitions)]
            for i in range(0, len(keys), 1000):
                r.delete(*keys[i : i + 1000])
        finally:
            r.close()

    def count_records(self, topics: list[str], partitions: int) -> int | None:
        return self._xlen_total([stream_key(t, p) for t in topics for p in range(partitions)])

    def _xlen_total(self, keys: list[str]) -> int:
        r = _redis(self.port)
        try:
            pipe = r.pipeline(transaction=False)
            for k in keys:
                pipe.xlen(k)
            return int(sum(pipe.execute()))
        finally:
            r.close()

    def client_factory(self) -> ClientFactory:
        return RedisClientFactory(self.port, self.pipeline)


# ------------------------------------------------------------------------------------------------
# Clients (run in the load child processes)
# ------------------------------------------------------------------------------------------------


@dataclass
class RedisClientFactory(ClientFactory):
    port: int
    pipeline: int = 64


class RedisProducerClient(ProducerClient):
    """XADD through a pipeline: one round trip per ``pipeline`` records."""

    def __init__(self, factory: RedisClientFactory, job: ProducerJob) -> None:
        super().__init__()
        self.r = _redis(factory.port)
        self.r.ping()  # connected before the clock starts
        self.pipe = self.r.pipeline(transaction=False)
        self.size = factory.pipeline
        self.keys = {t: [stream_key(t, p) for p in range(job.partitions)] for t in job.topics}
        self.next = dict.fromkeys(job.topics, 0)
        self.queued = 0
        self.tracked: list[bytes] = []

    def _execute(self) -> None:
        n, tracked = self.queued, self.tracked
        self.queued, self.tracked = 0, []
        try:
            results = self.pipe.execute(raise_on_error=False)
        except Exception as e:  # the connection failed: the whole pipeline is lost
            self.pipe.reset()
            self.errors += n
            if not self.first_error:
                self.first_error = f"{type(e).__name__}: {e}"
            return
        now = time.time_ns() // 1000
        add = self.latency.pending.append
        for v in tracked:
            add(now - _UNPACK_FROM(v)[0])
        for res in results:
            if isinstance(res, Exception):
                self.errors += 1
                if not self.first_error:
                    self.first_error = f"{type(res).__name__}: {res}"

    def send(self, topic: str, value: bytes, track: bool) -> None:
        keys = self.keys[topic]
        i = self.next[topic]
        self.next[topic] = i + 1
        self.pipe.execute_command("XADD", keys[i % len(keys)], "*", FIELD, value)
        self.sent += 1
        self.queued += 1
        if track:
            self.tracked.append(value)
        if self.queued >= self.size:
            self._execute()

    def idle(self, seconds: float) -> None:
        if self.queued:  # records never wait in the pipeline for more to come
            self._execute()
        if seconds > 0:
            time.sleep(min(seconds, 0.05))

    def flush(self, timeout: float) -> None:
        if self.queued:
            self._execute()
        self.unacked = 0
        self.latency.fold()

    def close(self) -> None:
        self.r.close()


class RedisConsumerClient(ConsumerClient):
    """XREAD BLOCK from id 0 over this consumer's share of the streams."""

    def __init__(self, factory: RedisClientFactory, job: ConsumerJob) -> None:
        super().__init__(job.track_latency)
        tps = [(t, p) for t in job.topics for p in range(job.partitions)]
        self.last: dict[bytes, bytes] = {
            stream_key(t, p).encode(): b"0-0" for t, p in tps[job.index :: job.count]
        }
        self.r = _redis(factory.port)
        self.r.ping()

    def consume(self, timeout: float) -> tuple[int, int]:
        if not self.last:
            time.sleep(timeout)
            return 0, 0
        resp = self.r.xread(self.last, count=2000, block=max(1, int(timeout * 1000)))
        if not resp:
            return 0, 0
        values: list[bytes] = []
        for key, entries in resp:
            if entries:
                self.last[key] = entries[-1][0]
                values.extend(fields[FIELD] for _id, fields in entries)
        if self.track:
            self.record_latencies(values)
        return len(values), sum(map(len, values))

    def close(self) -> None:
        self.r.close()


# ------------------------------------------------------------------------------------------------
# redis-benchmark: Redis's own load generator (a "tool" target)
# ------------------------------------------------------------------------------------------------

_THROUGHPUT = re.compile(r"throughput summary:\s*([\d.]+)\s*requests per second")
_PERCENTILE = re.compile(r"^\s*([\d.]+)% <= ([\d.]+) milliseconds", re.M)


def parse_redis_benchmark(out: str) -> dict[str, Any]:
    """Throughput and latency (ms) from redis-benchmark 7's default (not -q/--csv) output.

    The summary table gives avg/min/p50/p95/p99/max; p99.9 comes from the "latency by percentile
    distribution" lines (HdrHistogram's halving steps), as the first step at or above 99.9 %:
    never below the true p99.9.
    """
    text = out.replace("\r", "\n")
    m = _THROUGHPUT.search(text)
    if not m:
        raise ValueError("no 'throughput summary' in redis-benchmark's output")
    res: dict[str, Any] = {"rps": float(m.group(1))}
    lines = text[m.end() :].splitlines()
    for i, line in enumerate(lines):
        if line.split() == ["avg", "min", "p50", "p95", "p99", "max"] and i + 1 < len(lines):
            vals = [float(x) for x in lines[i + 1].split()]
            res.update(zip(("avg", "min", "p50", "p95", "p99", "max"), vals, strict=True))
            break
    for pct, ms in _PERCENTILE.findall(text.split("Cumulative distribution")[0]):
        if float(pct) >= 99.9:
            res["p99.9"] = float(ms)
            break
    return res


@register
class RedisBenchmarkTarget(RedisTarget):
    """Tool target (``role = "tool"``): redis-benchmark XADDs into its own redis-server.

    The harness calls :meth:`run_tool` instead of running producer/consumer clients.
    """

    kind = "redis-benchmark"
    role: ClassVar[str] = "tool"

    def __init__(self, spec: TargetSpec, workload: Workload) -> None:
        super().__init__(spec, workload)
        self.clients = int(spec.settings.get("clients", 50))

    def describe(self) -> str:
        return (
            f"redis-benchmark → Redis {self.version() or '?'} Streams (AOF, appendfsync "
            f"{self.appendfsync}; {self.clients} connections, pipeline {self.pipeline})"
        )

    def start(self) -> None:
        if not REDIS_BENCHMARK.exists():
            raise TargetUnavailable(f"{REDIS_BENCHMARK} is missing (make bench-deps)")
        super().start()

    def client_factory(self) -> ClientFactory:
        raise RuntimeError("redis-benchmark is a tool target: call run_tool(), not clients")

    def stream_keys(self, workload: Workload) -> list[str]:
        n = max(1, workload.topics * workload.partitions)
        if n == 1:
            return ["bench-stream"]
        # redis-benchmark replaces __rand_int__ with a 12-digit number below -r.
        return [f"bench-stream-{i:012d}" for i in range(n)]

    def run_tool(self, workload: Workload, progress_cb: Any = None) -> dict[str, Any]:
        """Run redis-benchmark for ``workload`` and return::

            {"records": int,            # XLEN total after the run (what the server holds)
             "bytes": int,              # records x record_size
             "seconds": float,          # records / the tool's own requests/s
             "records_per_s": float, "mb_per_s": float,
             "publish": {"p50", "p99", "p99.9", "max", "mean" (ms), "count"} or None,
             "server_cpu_s": float,     # redis-server's user+system CPU during the run
             # extra: "tool", "command", "requested", "clients", "pipeline", "streams",
             #        "wall_s", "p95_ms", "error" (when the tool failed or timed out)}

        ``progress_cb(done)`` is called about twice a second with the records stored so far.
        """
        assert self.proc is not None, "start() the target first"
        w = workload
        n = w.records or int((w.rate or 0) * w.duration_s)
        if n <= 0:
            raise RuntimeError(f"workload {w.name}: set records, or a rate and duration_s")
        if w.record_size > _MAX_ARG:
            raise RuntimeError(
                f"record_size {w.record_size} is over the {_MAX_ARG}-byte limit of one "
                "command-line argument: redis-benchmark cannot send it"
            )
        keys = self.stream_keys(w)
        key_arg = keys[0] if len(keys) == 1 else "bench-stream-__rand_int__"
        value = "x" * w.record_size  # fixed bytes: -d only sizes SET/GET values
        cmd = [
            str(REDIS_BENCHMARK),
            "-h", "127.0.0.1",
            "-p", str(self.port),
            "-n", str(n),
            "-c", str(self.clients),
            "-P", str(self.pipeline),
        ]  # fmt: skip
        if len(keys) > 1:
            cmd += ["-r", str(len(keys))]
        cmd += ["XADD", key_arg, "*", "f", value]
        shown = " ".join(cmd[:-1]) + f" <{w.record_size} bytes>"
        assert self.workdir is not None
        out_path = self.workdir / "redis-benchmark.out"
        limit = w.max_duration_s + 60
        error = ""
        cpu0 = process_cpu_s(self.proc.pid)
        t0 = time.perf_counter()
        with open(out_path, "wb") as out:
            tool = subprocess.Popen(
                cmd,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
            try:
                while tool.poll() is None:
                    if time.perf_counter() - t0 > limit:
                        error = f"redis-benchmark did not finish within {limit:.0f}s"
                        break
                    if progress_cb is not None:
                        progress_cb(self._xlen_total(keys))
                    try:
                        tool.wait(timeout=0.5)
                    except subprocess.TimeoutExpired:
                        pass
            finally:
                stop_process(tool, timeout=5)
        wall = time.perf_counter() - t0
        cpu = process_cpu_s(self.proc.pid) - cpu0
        stored = self._xlen_total(keys)
        if progress_cb is not None:
            progress_cb(stored)
        text = out_path.read_text(errors="replace")
        parsed: dict[str, Any] = {}
        if not error:
            if tool.returncode != 0:
                error = f"redis-benchmark exited with status {tool.returncode}: {text[-300:]}"
            else:
                try:
                    parsed = parse_redis_benchmark(text)
                except ValueError as e:
                    error = f"{e}: {text[-300:]}"
        # Without the tool's summary the wall clock (process start included) is all there is.
        seconds = stored / parsed["rps"] if parsed.get("rps") and stored else wall
        rps = stored / seconds if seconds else 0.0
        nbytes = stored * w.record_size
        publish = None
        if "p50" in parsed:
            publish = {
                "count": float(stored),
                "p50": parsed["p50"],
                "p99": parsed["p99"],
                "p99.9": parsed.get("p99.9", parsed["max"]),
                "max": parsed["max"],
                "mean": parsed["avg"],
            }
        res: dict[str, Any] = {
            "records": stored,
            "bytes": nbytes,
            "seconds": seconds,
            "records_per_s": rps,
            "mb_per_s": nbytes / seconds / 1e6 if seconds else 0.0,
            "publish": publish,
            "server_cpu_s": cpu,
            "tool": f"redis-benchmark {_version(REDIS_BENCHMARK)}",
            "command": shown,
            "requested": n,
            "clients": self.clients,
            "pipeline": self.pipeline,
            "streams": len(keys),
            "wall_s": wall,
        }
        if "p95" in parsed:
            res["p95_ms"] = parsed["p95"]
        if not error and stored < n:
            error = f"the server holds {stored} records, redis-benchmark sent {n}"
        if error:
            res["error"] = error
        return res


RedisClientFactory.producer_class = RedisProducerClient
RedisClientFactory.consumer_class = RedisConsumerClient
