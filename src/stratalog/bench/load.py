"""The load of one phase: the producer and consumer processes a case starts.

``run_load`` starts them as separate processes (see ``load_context``), releases them together,
waits for the producers to finish and for the consumers to have read what was acknowledged, and
returns what each process measured with the server's CPU time over the phase (``LoadResult``). The
``*_jobs`` functions turn a workload into what each process does.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from stratalog.bench import hist
from stratalog.bench.clients import (
    ConsumerJob,
    ProducerJob,
    consumer_main,
    drain,
    producer_main,
)
from stratalog.bench.targets import Target
from stratalog.bench.workload import Workload

Progress = Callable[[str, int, int, int], None]  # (label, produced, consumed, total)


def no_progress(label: str, produced: int, consumed: int, total: int) -> None:
    pass


def load_context():
    """Where load processes come from: forked from a server that has imported the clients
    once. A fresh interpreter per process (``spawn``) spent a second or more importing them
    before it was ready, every phase, for each of up to ten processes; the server is itself
    a new interpreter, so no state of the harness (its threads, its brokers' pipes) is
    inherited."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["confluent_kafka", "stratalog.bench.clients"])
    return ctx


@contextlib.contextmanager
def interrupts_held() -> Iterator[None]:
    """Ctrl-C and SIGTERM (which the bench turns into Ctrl-C) wait until the block is done, then
    act as they would have: the block cannot be cut short."""
    sigs = (signal.SIGINT, signal.SIGTERM)
    old = {s: signal.getsignal(s) for s in sigs}
    if threading.current_thread() is not threading.main_thread() or None in old.values():
        yield  # only the main thread sets handlers (None: one set outside Python, kept)
        return
    got: list[int] = []
    for s in sigs:
        signal.signal(s, lambda signum, _frame: got.append(signum))
    try:
        yield
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
        if got:
            signal.raise_signal(got[0])  # now, to the handler it was meant for


def start_process(p: mp.process.BaseProcess) -> None:
    """Start ``p`` whole, or not at all, whatever signal arrives meanwhile.

    A forkserver child is forked, and runs, before its parent has read back its pid. Ctrl-C or
    SIGTERM in between left a load process the harness had no handle on (``p.pid`` None, so
    neither joined nor killed), running on after the bench (its client waits up to 30 s for a
    broker already stopped); and with it the forkserver and the resource tracker, which stay
    until every process they serve is gone."""
    with interrupts_held():
        p.start()


@dataclass
class LoadResult:
    """What the load processes of one phase measured."""

    producers: list[dict[str, Any]]
    consumers: list[dict[str, Any]]
    t_start: float
    t_end: float
    server_cpu_s: float

    @property
    def errors(self) -> list[str]:
        return [r["error"] for r in self.producers + self.consumers if r.get("error")]

    @property
    def acked(self) -> int:
        return sum(r.get("records", 0) for r in self.producers)

    @property
    def acked_bytes(self) -> int:
        return sum(r.get("bytes", 0) for r in self.producers)

    @property
    def produce_seconds(self) -> float:
        firsts = [r["t_first"] for r in self.producers if "t_first" in r]
        lasts = [r["t_last"] for r in self.producers if "t_last" in r]
        return max(lasts) - min(firsts) if firsts and lasts else 0.0

    @property
    def consumed(self) -> int:
        return sum(r.get("records", 0) for r in self.consumers)

    @property
    def consumed_bytes(self) -> int:
        return sum(r.get("bytes", 0) for r in self.consumers)

    @property
    def consume_seconds(self) -> float:
        firsts = [r["t_start"] for r in self.consumers if r.get("t_first")]
        lasts = [r["t_last"] for r in self.consumers if r.get("t_last")]
        return max(lasts) - min(firsts) if firsts and lasts else 0.0

    def publish_hist(self) -> dict[str, float] | None:
        return hist.summary(hist.merge([r.get("hist") for r in self.producers]))

    def e2e_hist(self) -> dict[str, float] | None:
        return hist.summary(hist.merge([r.get("hist") for r in self.consumers]))

    @property
    def client_cpu_s(self) -> float:
        return sum(r.get("cpu_s", 0.0) for r in self.producers + self.consumers)


def run_load(
    target: Target,
    producer_jobs: list[ProducerJob],
    consumer_jobs: list[ConsumerJob],
    *,
    label: str,
    progress: Progress = no_progress,
    drain_timeout_s: float = 60.0,
    counted_consumers: int | None = None,
    sample: Callable[[float, int], None] | None = None,
    stop_when: Callable[[], bool] | None = None,
    expect: int | None = None,
) -> LoadResult:
    """Start the load processes, release them together, wait for the producers, then for the
    first ``counted_consumers`` consumers (default: all) to have read what was acknowledged;
    the others (backlog readers) run until then. ``stop_when``, asked while the producers run,
    stops them early when it turns true (a phase that lasts as long as something else).
    ``expect``: what the consumers must read, if not what the producers here acknowledged (a
    load of consumers alone, draining a topic filled before)."""
    ctx = load_context()
    factory = target.client_factory()
    ready_q, result_q = ctx.Queue(), ctx.Queue()
    start_evt, stop_evt = ctx.Event(), ctx.Event()
    prod_progress = [ctx.Value("q", 0, lock=False) for _ in producer_jobs]
    cons_progress = [ctx.Value("q", 0, lock=False) for _ in consumer_jobs]
    procs = []
    for job, val in zip(producer_jobs, prod_progress, strict=True):
        procs.append(
            ctx.Process(
                target=producer_main,
                args=(factory, job, ready_q, start_evt, stop_evt, val, result_q),
                daemon=True,
            )
        )
    for job, val in zip(consumer_jobs, cons_progress, strict=True):
        procs.append(
            ctx.Process(
                target=consumer_main,
                args=(factory, job, ready_q, start_evt, stop_evt, val, result_q),
                daemon=True,
            )
        )
    total = sum(j.records for j in producer_jobs)
    counted = cons_progress[: counted_consumers if counted_consumers is not None else None]
    try:
        for p in procs:
            start_process(p)
        ready = drain(ready_q, len(procs), timeout=180)
        failed = [msg for _role, _i, msg in ready if msg]
        if len(ready) < len(procs) or failed:
            stop_evt.set()
            raise RuntimeError(
                f"{label}: load processes did not start: "
                + ("; ".join(failed) or f"{len(ready)}/{len(procs)} ready after 180 s")
            )
        cpu0 = target.cpu_s()
        t_start = time.time()
        start_evt.set()
        results: list[dict[str, Any]] = []
        # Producers finish by themselves (record count or max_duration_s).
        deadline = (
            time.monotonic() + max((j.max_duration_s for j in producer_jobs), default=0) + 180
        )
        while sum(1 for r in results if r["role"] == "producer") < len(producer_jobs):
            results += drain(result_q, 1, timeout=0.25)
            produced = sum(v.value for v in prod_progress)
            progress(label, produced, sum(v.value for v in counted), total)
            if sample is not None:
                sample(time.time(), produced)
            if stop_when is not None and not stop_evt.is_set() and stop_when():
                stop_evt.set()
            if time.monotonic() > deadline:
                stop_evt.set()
                raise RuntimeError(f"{label}: producers did not finish in time")
        acked = sum(r.get("records", 0) for r in results if r["role"] == "producer")
        if expect is not None:
            acked = total = expect
        if counted:
            drain_deadline = time.monotonic() + drain_timeout_s
            while time.monotonic() < drain_deadline:
                consumed = sum(v.value for v in counted)
                progress(label, total, consumed, total)
                if consumed >= acked:
                    break
                time.sleep(0.1)
        stop_evt.set()
        results += drain(result_q, len(procs) - len(results), timeout=120)
        t_end = time.time()
        cpu1 = target.cpu_s()
        progress(label, total, sum(v.value for v in counted), total)
    finally:
        stop_evt.set()
        start_evt.set()
        for p in procs:
            if p.pid is None:
                continue  # never started (interrupted while starting the others)
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
                p.join(timeout=10)
    return LoadResult(
        producers=[r for r in results if r["role"] == "producer"],
        consumers=[r for r in results if r["role"] == "consumer"],
        t_start=t_start,
        t_end=t_end,
        server_cpu_s=cpu1 - cpu0,
    )


def _split(total: int, n: int, i: int) -> int:
    return total // n + (1 if i < total % n else 0)


def producer_jobs(
    w: Workload, topics: list[str], rate: float | None, records: int
) -> list[ProducerJob]:
    jobs = []
    for i in range(w.producers):
        # Each producer writes every topic in turn: 1,000 topics means 1,000 streams per client.
        jobs.append(
            ProducerJob(
                index=i,
                topics=topics,
                partitions=w.partitions,
                record_size=w.record_size,
                records=_split(records, w.producers, i),
                rate=rate / w.producers if rate else None,
                acks=w.acks,
                compression=w.compression,
                linger_ms=w.linger_ms,
                batch_bytes=w.batch_bytes,
                sample_every=w.latency_sample_every,
                max_duration_s=w.max_duration_s,
                client=w.producer_client,
                transaction_records=w.transaction_records,
                extra=dict(w.producer_config),
            )
        )
    return jobs


def consumer_jobs(
    n: int,
    topics: list[str],
    partitions: int,
    track: bool = True,
    max_s: float = 600.0,
    sample_every: int = 1,
) -> list[ConsumerJob]:
    return [
        ConsumerJob(
            index=i,
            count=n,
            topics=topics,
            partitions=partitions,
            track_latency=track,
            max_duration_s=max_s,
            sample_every=sample_every,
        )
        for i in range(n)
    ]


def backlog_reader_jobs(w: Workload, topics: list[str]) -> list[ConsumerJob]:
    """The catch-up's backlog readers: from the backlog's start, at the workload's pace, with
    its SCHED_IDLE choice and its librdkafka settings for them."""
    return [
        ConsumerJob(
            index=i,
            count=w.backlog_consumers,
            topics=topics,
            partitions=w.backlog_partitions,
            track_latency=False,
            max_duration_s=w.phase_duration_s * 2 + w.drain_timeout_s,
            group="backlog",
            max_bytes_per_s=w.backlog_read_mb_per_s * 1e6 / w.backlog_consumers,
            sched_idle=w.backlog_readers_idle,
            cpus=w.backlog_readers_cpus,
            client=w.backlog_readers_client,
            extra={
                # A paced reader keeps little in its client's queue, so the broker's reads
                # follow its pace rather than filling 64 MB ahead of it.
                **(
                    {"queued.max.messages.kbytes": 4096}
                    if w.backlog_read_mb_per_s and w.backlog_readers_client == "confluent-kafka"
                    else {}
                ),
                **w.backlog_readers_config,
            },
        )
        for i in range(w.backlog_consumers)
    ]


def topic_names(w: Workload, prefix: str = "") -> list[str]:
    return [f"bench-{w.name}{prefix}-{i}" for i in range(w.topics)]
