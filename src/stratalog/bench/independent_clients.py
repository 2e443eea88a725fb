"""Clients other than the harness's, run after a plain case as a second opinion: kcat reading the
topics back, and Kafka's own kafka-producer-perf-test (the Java client) writing a topic of the
same shape."""

from __future__ import annotations

import contextlib
import re
import subprocess
import time
from typing import Any

from stratalog.bench.targets import Target, process_cpu_s
from stratalog.bench.workload import Workload


def kcat_consume(bootstrap: str, topics: list[str], records: int, record_size: int) -> dict:
    """Read the topics back with kcat twice: first as they are, then warm, from the page cache
    (the best case of a consumer). The two differ where appends skip the page cache
    (``storage.direct_io``): there the first read finds older chunks only on the disk."""
    import shutil

    kcat = shutil.which("kcat") or shutil.which("kafkacat")
    if kcat is None:
        return {"error": "kcat is not installed"}
    first = _kcat_read(kcat, bootstrap, topics, records, record_size)
    if "error" in first:
        return first
    out = _kcat_read(kcat, bootstrap, topics, records, record_size)
    if "error" not in out:
        out["first_read"] = first
    return out


def _kcat_read(
    kcat: str, bootstrap: str, topics: list[str], records: int, record_size: int
) -> dict[str, Any]:
    total_records = 0
    t0 = time.perf_counter()
    for t in topics:
        proc = subprocess.run(
            [kcat, "-C", "-b", bootstrap, "-t", t, "-o", "beginning", "-e", "-q",
             "-f", "%o\n", "-X", "fetch.max.bytes=52428800"],
            capture_output=True, timeout=600, check=False,
        )  # fmt: skip
        if proc.returncode != 0:
            return {"error": proc.stderr.decode(errors="replace")[-300:]}
        total_records += proc.stdout.count(b"\n")
    secs = time.perf_counter() - t0
    out: dict[str, Any] = dict(
        records=total_records,
        seconds=secs,
        mb_per_s=total_records * record_size / 1e6 / secs if secs else 0.0,
        complete=total_records >= records,
    )
    with contextlib.suppress(Exception):
        out["records_per_s"] = total_records / secs
    return out


_PERF_SUMMARY = re.compile(
    r"^(?P<records>\d+) records sent, (?P<rps>[\d.]+) records/sec \((?P<mbps>[\d.]+) MB/sec\), "
    r"(?P<avg>[\d.]+) ms avg latency, (?P<max>[\d.]+) ms max latency, (?P<p50>\d+) ms 50th, "
    r"(?P<p95>\d+) ms 95th, (?P<p99>\d+) ms 99th, (?P<p999>\d+) ms 99\.9th\.$"
)


def producer_perf_test(w: Workload, target: Target, records: int) -> dict[str, Any]:
    """Kafka's own kafka-producer-perf-test (the Java client) as an independent load generator
    on a fresh topic of the same shape: the same records, acks, linger and batch size."""
    from stratalog.peers.kafka import KafkaSetupError, run_tool

    topic = f"bench-{w.name}-perf-test"
    target.create_topics([topic], w.partitions)
    acks = {"all": "-1"}.get(w.acks, w.acks)
    cpu0 = process_cpu_s(target.pid)
    t0 = time.perf_counter()
    try:
        proc = run_tool(
            "kafka-producer-perf-test",
            "--topic", topic,
            "--num-records", str(records),
            "--record-size", str(w.record_size),
            "--throughput", "-1",
            # One flag, many values: the tool keeps only the last --command-property flag.
            "--command-property",
            f"bootstrap.servers={target.bootstrap}",
            f"acks={acks}",
            f"linger.ms={int(w.linger_ms)}",
            f"batch.size={w.batch_bytes}",
            "buffer.memory=268435456",
            timeout=max(120.0, w.max_duration_s * 4),
            heap="1g",
        )  # fmt: skip
    except (KafkaSetupError, OSError, subprocess.TimeoutExpired) as e:
        return {"error": f"kafka-producer-perf-test: {e}"}
    secs = time.perf_counter() - t0
    found = [m for line in proc.stdout.splitlines() if (m := _PERF_SUMMARY.match(line.strip()))]
    if proc.returncode != 0 or not found:
        return {"error": (proc.stderr or proc.stdout)[-300:]}
    m = found[-1]
    return {
        "records": int(m["records"]),
        "records_per_s": float(m["rps"]),
        "mb_per_s": float(m["mbps"]) * 1.048576,  # the tool's MB is MiB
        "publish": {
            "mean": float(m["avg"]),
            "p50": float(m["p50"]),
            "p95": float(m["p95"]),
            "p99": float(m["p99"]),
            "p99.9": float(m["p999"]),
            "max": float(m["max"]),
        },
        "server_cpu_s": process_cpu_s(target.pid) - cpu0,
        "wall_s": secs,
    }
