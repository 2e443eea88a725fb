"""MirrorMaker 2 between two clusters: two Stratalog brokers against two Apache Kafka brokers.

``python -m stratalog.bench.mirror [--records N] [--runs R] [--pairs stratalog,kafka] [--out DIR]
[--set key=value] [--quick]`` runs, for each pair of clusters and each run (a fresh pair every
run, the pairs in a rotating order):

* the pair: two ``stratalog serve`` processes (the defaults: ``fsync=always``), or two Apache
  Kafka 4.4.0 single-node KRaft brokers (:class:`stratalog.peers.kafka.KafkaBroker`, as the
  bench's ``kafka`` target starts them: 1 GiB heap, 3 network and 8 I/O threads, the defaults:
  the page cache). Not Kafka with ``log.flush.interval.messages=1``: its source does not keep up
  with the lag phase's producer (acknowledgements seconds late at 1,000 records/s);
* ``N`` records of 1 KiB written to topic ``mirror`` (4 partitions) on the source;
* MirrorMaker 2 (``org.apache.kafka.connect.mirror.MirrorMaker`` from Maven Central, unchanged,
  dedicated mode, driving the target: ``source->target``, ``tasks.max = 2``), started with the
  classpath of ``tests/apps/`` (:func:`stratalog.peers.kafka.app_command`);
* copy: the time from MirrorMaker's start until the target's ``source.mirror`` holds all ``N``
  records (high watermarks through ListOffsets, every 0.1 s); the throughput is the records'
  bytes over it, and also over the copy itself (first record on the target to the last);
* lag: with MirrorMaker running and caught up, one producer writes to the source at a fixed
  rate (``--rate`` records/s for ``--warmup`` + ``--seconds``; the warm-up's records are not
  counted: a new producer's first seconds against Kafka are acknowledged up to seconds late),
  and a consumer on the target reads
  ``source.mirror``: a record's end-to-end lag is the time its copy was read minus the time it
  was produced (carried in the value, to the microsecond; the record's timestamp, which
  MirrorMaker keeps, is checked against it). Every record must arrive.

CPU of the two brokers and of MirrorMaker's JVM is read from ``/proc/<pid>/stat`` over each
phase. A run whose copy does not finish within 120 s (or whose lag phase loses records) is
recorded as failed, with the error, and the bench goes on (exit status 1 at the end). Results
(medians of the good runs, the ratio Stratalog / Kafka) go to ``results.json``, ``results.md``
and ``mirror.png`` in ``--out``, with MirrorMaker's WARN and ERROR lines and each run's brokers'
own warnings. ``--set key=value`` passes a setting to both Stratalog brokers.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import re
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from stratalog.bench.mirror_clusters import (
    _STAMP,
    COPY_TIMEOUT,
    DEFAULTS,
    MB,
    MIRRORED,
    PAIRS,
    PARTITIONS,
    QUICK,
    RECORD,
    TOPIC,
    _cluster,
    _describe,
    _MirrorMaker,
)
from stratalog.bench.mirror_report import _chart, _markdown, _ratios
from stratalog.bench.targets import process_cpu_s


def _create_topic(bootstrap: str) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(TOPIC, PARTITIONS, 1)])[TOPIC].result(30)


def _fill(bootstrap: str, n: int, progress: Callable[[int], None]) -> None:
    from confluent_kafka import Producer

    p = Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": 20,
            "batch.size": 1_000_000,
            "queue.buffering.max.kbytes": 256 * 1024,
        }
    )
    value = os.urandom(RECORD)
    for i in range(n):
        while True:
            try:
                p.produce(TOPIC, value=value, partition=i % PARTITIONS)
                break
            except BufferError:
                p.poll(0.01)
        if i % 5_000 == 0:
            p.poll(0)
            progress(i)
    if p.flush(300):
        raise RuntimeError("records left unsent")
    progress(n)


def _end_offsets(admin, topic: str) -> int | None:
    """The sum of ``topic``'s high watermarks, None while it does not exist."""
    from confluent_kafka import KafkaException, TopicPartition
    from confluent_kafka.admin import OffsetSpec

    md = admin.list_topics(topic, timeout=10).topics.get(topic)
    if md is None or md.error is not None or len(md.partitions) < PARTITIONS:
        return None
    req = {TopicPartition(topic, p): OffsetSpec.latest() for p in range(PARTITIONS)}
    try:
        got = admin.list_offsets(req, request_timeout=10)
        return sum(f.result().offset for f in got.values())
    except KafkaException:  # a partition without a leader yet, just after its creation
        return None


def _cpu(pids: dict[str, int | None]) -> dict[str, float]:
    return {name: process_cpu_s(pid) for name, pid in pids.items()}


def _cores(before: dict[str, float], after: dict[str, float], wall: float) -> dict[str, float]:
    return {k: (after[k] - before[k]) / wall for k in before}


def _copy(mm2: _MirrorMaker, target: str, n: int, pids, progress) -> dict:
    """Start MirrorMaker and time it until the target holds all ``n`` records."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": target})
    cpu0 = _cpu(pids)
    t0 = time.monotonic()
    mm2.start()
    pids["mirrormaker"] = mm2.pid
    cpu0["mirrormaker"] = 0.0
    first = None
    while True:
        got = _end_offsets(admin, MIRRORED) or 0
        now = time.monotonic()
        if got and first is None:
            first = now
        progress(got)
        if got >= n:
            break
        if not mm2.alive:
            raise RuntimeError("MirrorMaker exited\n" + mm2.tail())
        if now - t0 > COPY_TIMEOUT:
            raise RuntimeError(
                f"{got} of {n} records mirrored in {COPY_TIMEOUT:.0f}s\n" + mm2.tail()
            )
        time.sleep(0.1)
    done = time.monotonic()
    wall, copy = done - t0, done - (first or t0)
    return {
        "seconds_from_start": wall,
        "seconds_to_first": (first or done) - t0,
        "seconds_copying": copy,
        "mb_per_s": n * RECORD / MB / wall,
        "copy_mb_per_s": n * RECORD / MB / copy if copy > 0 else float("nan"),
        "cores": _cores(cpu0, _cpu(pids), wall),
    }


def _lag(
    source: str, target: str, rate: int, seconds: float, warmup: float, pids, progress
) -> dict:
    """Produce at ``rate`` for ``warmup`` + ``seconds`` on the source; read the copies on the
    target. Every record must arrive; the figures are of those produced after the warm-up (a
    new producer's first seconds against a Kafka broker are acknowledged in 0.2-1 s)."""
    from confluent_kafka import Consumer, Producer, TopicPartition

    total = int(rate * (warmup + seconds))
    lags: list[float] = []
    sent_at: list[float] = []  # each read record's produce time, for the timeline
    acks: list[tuple[float, float]] = []  # (produce time, the source's ack after it in ms)
    stamp_off = 0
    errors: list[str] = []
    c = Consumer(
        {
            "bootstrap.servers": target,
            "group.id": "mirror-lag",
            "enable.auto.commit": False,
            "enable.partition.eof": False,
        }
    )
    # From the mirror's present end: MirrorMaker has copied everything before (the copy phase).
    ends = [
        c.get_watermark_offsets(TopicPartition(MIRRORED, p), timeout=10)[1]
        for p in range(PARTITIONS)
    ]
    c.assign([TopicPartition(MIRRORED, p, end) for p, end in enumerate(ends)])
    stop = threading.Event()

    def consume() -> None:
        nonlocal stamp_off
        try:
            while len(lags) < total and not stop.is_set():
                m = c.poll(0.2)
                if m is None:
                    continue
                if m.error() is not None:
                    errors.append(str(m.error()))
                    continue
                now = time.time()
                sent = _STAMP.unpack_from(m.value())[0]
                lags.append((now - sent) * 1000)
                sent_at.append(sent)
                if abs(m.timestamp()[1] - int(sent * 1000)) > 1:
                    stamp_off += 1
        except Exception as e:  # pragma: no cover - reported below
            errors.append(repr(e))

    reader = threading.Thread(target=consume, name="mirror-lag-reader")
    reader.start()
    p = Producer({"bootstrap.servers": source, "linger.ms": 1})
    pad = os.urandom(RECORD - _STAMP.size)
    cpu0, t0, wall0 = _cpu(pids), time.monotonic(), time.time()

    def acked(err, msg) -> None:
        if err is None:
            sent = _STAMP.unpack_from(msg.value())[0]
            acks.append((sent, (time.time() - sent) * 1000))
        else:
            errors.append(str(err))

    tick = 0.01
    per_tick = rate * tick
    sent = 0
    try:
        while sent < total:
            due = min(total, int((time.monotonic() - t0) / tick * per_tick) + 1)
            while sent < due:
                now = time.time()
                p.produce(
                    TOPIC,
                    value=_STAMP.pack(now) + pad,
                    partition=sent % PARTITIONS,
                    timestamp=int(now * 1000),
                    on_delivery=acked,
                )
                sent += 1
            p.poll(0)
            progress(len(lags))
            time.sleep(max(0.0, t0 + (sent / rate) - time.monotonic()))
        if p.flush(60):
            raise RuntimeError("records left unsent")
        produced = time.monotonic() - t0
        drain = time.monotonic() + 60
        while len(lags) < total and time.monotonic() < drain and reader.is_alive():
            progress(len(lags))
            time.sleep(0.1)
    finally:
        stop.set()
        reader.join(10)
        c.close()
    wall = time.monotonic() - t0
    progress(len(lags))
    if len(lags) < total or errors:
        raise RuntimeError(f"{len(lags)} of {total} records read on the target; {errors[:3]}")
    timeline: dict[int, list[float]] = {}
    for sent, lag in zip(sent_at, lags, strict=True):
        timeline.setdefault(int(sent - wall0), []).append(lag)
    ack_line: dict[int, list[float]] = {}
    for sent, ack in acks:
        ack_line.setdefault(int(sent - wall0), []).append(ack)
    steady = wall0 + warmup
    early = sorted(lag for sent, lag in zip(sent_at, lags, strict=True) if sent < steady)
    early_acks = sorted(ack for sent, ack in acks if sent < steady)
    lags = sorted(lag for sent, lag in zip(sent_at, lags, strict=True) if sent >= steady)
    ack_ms = sorted(ack for sent, ack in acks if sent >= steady)
    return {
        "records": total,
        "measured": len(lags),
        "rate": rate,
        "produced_in_s": produced,
        "p50_ms": _pct(lags, 50),
        "p99_ms": _pct(lags, 99),
        "max_ms": lags[-1],
        "ack_p50_ms": _pct(ack_ms, 50),
        "ack_p99_ms": _pct(ack_ms, 99),
        # The warm-up's records, not in the figures above.
        "warmup_p50_ms": _pct(early, 50) if early else float("nan"),
        "warmup_max_ms": early[-1] if early else float("nan"),
        "warmup_ack_max_ms": early_acks[-1] if early_acks else float("nan"),
        # Each second of the phase: [second, median lag, max lag, median ack] of the records
        # produced in it.
        "timeline": [
            [sec, statistics.median(v), max(v), statistics.median(ack_line.get(sec, [0.0]))]
            for sec, v in sorted(timeline.items())
        ],
        "timestamps_changed": stamp_off,
        "cores": _cores(cpu0, _cpu(pids), wall),
    }


def _pct(values: list[float], p: float) -> float:
    return values[min(len(values) - 1, int(len(values) * p / 100))]


def _one_run(
    pair: str,
    n: int,
    rate: int,
    seconds: float,
    warmup: float,
    settings: dict[str, str],
    tmp: Path,
    bar,
) -> dict:
    """One run of a pair: ``{"copy": ..., "lag": ...}``, or ``{"error": ...}`` when a phase
    failed (a copy or a drain past its timeout), with both brokers' and MirrorMaker's warnings."""
    source = _cluster(pair, tmp / "source", settings)
    target = _cluster(pair, tmp / "target", settings)
    mm2: _MirrorMaker | None = None
    got: dict = {}
    task = None
    try:
        task = bar.add_task(f"{pair}: starting the clusters", total=n)
        source.start()
        target.start()
        _create_topic(source.bootstrap)
        bar.update(task, description=f"{pair}: writing the source")
        _fill(source.bootstrap, n, lambda done: bar.update(task, completed=done))
        bar.update(task, description=f"{pair}: mirroring", completed=0)
        mm2 = _MirrorMaker(tmp, source.bootstrap, target.bootstrap)
        pids = {"source": source.pid, "target": target.pid}
        copy = _copy(mm2, target.bootstrap, n, pids, lambda got: bar.update(task, completed=got))
        total = int(rate * (warmup + seconds))
        bar.update(task, description=f"{pair}: lag at {rate:,} rec/s", completed=0, total=total)
        lag = _lag(
            source.bootstrap,
            target.bootstrap,
            rate,
            seconds,
            warmup,
            pids,
            lambda got: bar.update(task, completed=got),
        )
        got = {"copy": copy, "lag": lag}
    except RuntimeError as e:
        got = {"error": str(e)[-4000:]}
        bar.console.print(f"[red]{pair}: run failed[/red] {str(e).splitlines()[0]}")
    finally:
        if task is not None:
            bar.remove_task(task)
        if mm2 is not None:
            mm2.stop()
            got["mm2_warnings"] = mm2.warnings()
        gc.collect()  # this run's clients (admin futures keep cycles) go before their brokers
        got["broker_warnings"] = [
            f"{name}: {line}"
            for name, c in (("source", source), ("target", target))
            for line in c.warnings()
        ]
        target.stop()
        source.stop()
    return got


# --------------------------------------------------------------------------------------------
# The whole bench and its report
# --------------------------------------------------------------------------------------------

_MEDIAN_KEYS = {
    "copy": ("seconds_from_start", "seconds_to_first", "mb_per_s", "copy_mb_per_s"),
    "lag": (
        "p50_ms",
        "p99_ms",
        "max_ms",
        "ack_p50_ms",
        "ack_p99_ms",
        "warmup_p50_ms",
        "warmup_max_ms",
        "warmup_ack_max_ms",
    ),
}


def run(
    pairs: list[str],
    records: int,
    runs: int,
    rate: int,
    seconds: float,
    out: Path,
    warmup: float = DEFAULTS["warmup"],
    settings: dict[str, str] | None = None,
) -> dict:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from stratalog.peers.kafka import APPS_VERSION, KAFKA_VERSION, resolve_kafka, resolve_kafka_apps

    out.mkdir(parents=True, exist_ok=True)
    if "kafka" in pairs:
        resolve_kafka()
    resolve_kafka_apps()
    results: dict = {
        "records": records,
        "record_bytes": RECORD,
        "partitions": PARTITIONS,
        "rate": rate,
        "seconds": seconds,
        "warmup": warmup,
        "kafka_version": KAFKA_VERSION,
        "mirror_maker_version": APPS_VERSION,
        "stratalog_settings": dict(settings or {}),
        "pairs": {p: {"describe": _describe(p, settings or {}), "runs": []} for p in pairs},
    }
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    ) as bar:
        overall = bar.add_task("runs", total=runs * len(pairs))
        for r in range(runs):
            order = pairs[r % len(pairs) :] + pairs[: r % len(pairs)]
            for pair in order:
                bar.update(overall, description=f"run {r + 1} of {runs}")
                with tempfile.TemporaryDirectory(prefix=f"stratalog-mirror-{pair}-") as tmp:
                    got = _one_run(
                        pair, records, rate, seconds, warmup, settings or {}, Path(tmp), bar
                    )
                results["pairs"][pair]["runs"].append(got)
                bar.advance(overall)
    for res in results["pairs"].values():
        good = [r for r in res["runs"] if "error" not in r]
        res["failed_runs"] = len(res["runs"]) - len(good)
        res["medians"] = (
            {
                phase: {k: statistics.median(r[phase][k] for r in good) for k in keys}
                for phase, keys in _MEDIAN_KEYS.items()
            }
            | {
                "cores": {
                    phase: {
                        proc: statistics.median(r[phase]["cores"][proc] for r in good)
                        for proc in good[0][phase]["cores"]
                    }
                    for phase in ("copy", "lag")
                }
            }
            if good
            else None
        )
        warnings = Counter(
            re.sub(r"[0-9a-f]{8}-[0-9a-f-]{27}", "<id>", w)
            for r in res["runs"]
            for w in r.get("mm2_warnings", [])
        )
        res["mm2_warnings"] = [f"{n}x {w}" for w, n in warnings.most_common(40)]
    results["ratios"] = _ratios(results)
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    (out / "results.md").write_text(_markdown(results))
    _chart(results, out / "mirror.png")
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, help="records copied (default 200,000; quick 20,000)")
    ap.add_argument("--runs", type=int, help="runs of each pair (default 3; quick 1)")
    ap.add_argument("--rate", type=int, help="records/s in the lag phase (default 2,000)")
    ap.add_argument("--seconds", type=float, help="length of the lag phase (default 20)")
    ap.add_argument(
        "--warmup", type=float, help="seconds at the rate before the lag phase (default 20)"
    )
    ap.add_argument(
        "--pairs",
        default="stratalog,kafka",
        help=f"comma-separated, of {', '.join(PAIRS)} (default both)",
    )
    ap.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a setting of both Stratalog brokers (stratalog serve --set), repeatable",
    )
    ap.add_argument("--quick", action="store_true", help="small sizes: checks the set-up")
    ap.add_argument("--out", type=Path, default=Path("bench-results/mirror"))
    args = ap.parse_args()
    base = QUICK if args.quick else DEFAULTS
    records = args.records or base["records"]
    runs = args.runs or base["runs"]
    rate = args.rate or base["rate"]
    seconds = args.seconds or base["seconds"]
    warmup = base["warmup"] if args.warmup is None else args.warmup
    pairs = [p.strip() for p in args.pairs.split(",") if p.strip()]
    if unknown := [p for p in pairs if p not in PAIRS]:
        ap.error(f"unknown pairs {unknown}; known: {', '.join(PAIRS)}")
    if records < 1 or runs < 1 or rate < 1 or seconds <= 0 or warmup < 0 or not pairs:
        ap.error("--records, --runs, --rate and --seconds must be positive")
    if bad := [kv for kv in args.set if "=" not in kv]:
        ap.error(f"--set takes KEY=VALUE: {bad}")
    settings = dict(kv.split("=", 1) for kv in args.set)
    res = run(pairs, records, runs, rate, seconds, args.out, warmup, settings)
    print(_markdown(res))
    if any(r["failed_runs"] for r in res["pairs"].values()):
        sys.exit(1)


if __name__ == "__main__":
    main()
