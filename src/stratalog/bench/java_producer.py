"""Kafka's Java client as a benchmark producer (``java/LoadProducer.java``).

librdkafka sends one partition per Produce request; Kafka's Java client sends every ready
partition bound for a broker in one request. A workload with ``producer_client = "java"`` runs
its producers on the Java client, so that KerA's experiment (many streams per client, workload
d) measures requests that carry many streams, as Kafka's own clients send them.

A load process (``clients.producer_main``) runs one JVM and relays between it and the harness:
readiness, the start signal, progress and the result, in the same shape as the Python
producers' (``clients._produce``). The source is compiled once per version into the Kafka cache,
against the Kafka release the project resolves (``stratalog.peers.kafka``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

from stratalog.bench.hist import LatencyRecorder

SOURCE = Path(__file__).parent / "java" / "LoadProducer.java"
MAIN = "LoadProducer"


def compiled_classes() -> tuple[Path, str]:
    """(directory of the compiled class, the Java client's classpath), compiling on first use."""
    from stratalog.javac import compile_java
    from stratalog.peers import kafka

    classpath = kafka.tools_classpath()
    cache = Path(classpath.rstrip("*")).parent / "load-producer"
    return compile_java([SOURCE], classpath, cache, "the Java producer"), classpath


def _java_config(bootstrap: str, job: Any) -> list[str]:
    conf = {
        "bootstrap.servers": bootstrap,
        "acks": "all" if job.acks in ("all", "-1") else job.acks,
        "linger.ms": str(int(job.linger_ms)),
        "batch.size": str(job.batch_bytes),
        "compression.type": job.compression,
        "enable.idempotence": "false",
        "buffer.memory": str(256 * 1024 * 1024),
        "delivery.timeout.ms": "120000",
        "request.timeout.ms": "60000",
    }
    return [f"producer.{k}={v}" for k, v in conf.items()]


def run(bootstrap: str, job: Any, ready_q, start_evt, stop_evt, progress) -> dict[str, Any]:
    """Produce ``job`` through a JVM; returns the result fields of ``clients._produce``."""
    classes, classpath = compiled_classes()
    cmd = [
        shutil.which("java") or "java", "-Xmx1g", "-XX:+UseParallelGC",
        "-cp", f"{classes}{os.pathsep}{classpath}", MAIN,
        f"topics={','.join(job.topics)}", f"record_size={job.record_size}",
        f"records={job.records}", f"rate={job.rate or 0}", f"sample_every={job.sample_every}",
        f"max_duration_s={job.max_duration_s}", *_java_config(bootstrap, job),
    ]  # fmt: skip
    proc = subprocess.Popen(
        cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    lines: list[str] = []
    ready = threading.Event()
    stderr: list[str] = []

    def read_out() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith("P "):
                progress.value = int(line[2:])
            elif line.startswith("READY"):
                ready.set()
            else:
                lines.append(line)

    def read_err() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            stderr.append(line)
            del stderr[:-40]

    threads = [threading.Thread(target=f, daemon=True) for f in (read_out, read_err)]
    for t in threads:
        t.start()
    try:
        deadline = time.monotonic() + 180
        while not ready.wait(0.1):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the Java producer did not start: " + "".join(stderr)[-800:])
        ready_q.put(("producer", job.index, ""))
        start_evt.wait()
        proc.stdin.write("GO\n")
        proc.stdin.flush()
        stopped = False
        while proc.poll() is None:
            if stop_evt.is_set() and not stopped:
                proc.stdin.write("STOP\n")
                proc.stdin.flush()
                stopped = True
            time.sleep(0.05)
        for t in threads:
            t.join(10)
        result = next((ln for ln in reversed(lines) if ln.startswith("R ")), None)
        if proc.returncode != 0 or result is None:
            raise RuntimeError(
                f"the Java producer failed (exit {proc.returncode}): " + "".join(stderr)[-800:]
            )
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    out = json.loads(result[2:])
    rec = LatencyRecorder()
    for us in out.pop("latencies_us"):
        rec.add(us)
    unacked = out["sent"] - out["records"] - out["errors"]
    return {
        **out,
        "unacked": unacked,
        "purged": 0,
        "bytes": out["records"] * job.record_size,
        "hist": rec.encode(),
    }
