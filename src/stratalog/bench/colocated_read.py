"""Co-located reads against Fetch: one reader, the same topic, the broker's CPU meanwhile.

``python -m stratalog.bench.colocated_read [--gb 1] [--runs 3] [--out DIR]`` starts
``stratalog serve`` as a process of its own on loopback, writes ``--gb`` of 1 KiB records to a
topic of one partition, then times reading all of it back with one reader in four ways, in a
rotating order each run:

* ``fetch-raw`` / ``direct-raw``: the record batches only (Fetch through ``WireClient``, or the
  leader's files through ``client/colocated.py``), what a reader of raw batches (replay, the
  JVM connector's decoder) starts from;
* ``fetch-arrow`` / ``direct-arrow``: ``read_partition`` into Arrow columns (the Python Spark
  source's read), the same decoder on both; the direct one reads the next range on a thread
  while the decoder works on this one, as ``read_partition(colocated=True)`` does.

For each read: the rate (MB of batches per second), the broker's CPU during it (utime + stime
of its process from /proc, as a share of one core) and the reader's own. Everything is in the
page cache (just written, 24 GiB of memory): the comparison is of the paths, not of the disk.
Results: ``results.json``, ``results.md`` and ``colocated-read.png`` in ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from stratalog.bench.charts import bar_pair
from stratalog.bench.targets import start_serve

MB = 1_000_000
RECORD = 1024
TOPIC = "history"
MODES = ("fetch-raw", "direct-raw", "fetch-arrow", "direct-arrow")
# Goals (issue 32 item 2): direct >= 3x Fetch with the same reader, broker <= 5% of a core.
GOAL_RATIO = 3.0
GOAL_BROKER_CPU = 0.05


def _proc_cpu(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _self_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def timed_read(broker_pid: int, read, nbytes: int) -> dict:
    """Run ``read()``; its wall time, rate (``nbytes`` in MB/s) and the broker's and this
    process's CPU meanwhile, as shares of a core."""
    b0, s0, t0 = _proc_cpu(broker_pid), _self_cpu(), time.perf_counter()
    read()
    wall = time.perf_counter() - t0
    return {
        "seconds": wall,
        "mb_per_s": nbytes / MB / wall,
        "broker_cpu": (_proc_cpu(broker_pid) - b0) / wall,
        "reader_cpu": (_self_cpu() - s0) / wall,
    }


def medians(runs: list[dict], modes) -> dict:
    """Each mode's median of each figure over the runs."""
    return {
        mode: {
            k: statistics.median(run[mode][k] for run in runs)
            for k in ("mb_per_s", "broker_cpu", "reader_cpu", "seconds")
        }
        for mode in modes
    }


def _start_broker(data_dir: Path) -> tuple[subprocess.Popen, str]:
    cmd = [sys.executable, "-m", "stratalog.cli", "serve", "--data-dir", str(data_dir)]
    cmd += ["--port", "0", "--log-level", "WARNING"]
    data_dir.parent.mkdir(parents=True, exist_ok=True)
    return start_serve(cmd, data_dir.parent / "broker.log")


def _produce(bootstrap: str, total: int, progress) -> int:
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(TOPIC, 1, 1)])[TOPIC].result(30)
    p = Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": "1",
            "linger.ms": 20,
            "batch.size": 1_000_000,
            "queue.buffering.max.kbytes": 512 * 1024,
        }
    )
    value = os.urandom(RECORD)
    n = total // RECORD
    for i in range(n):
        while True:
            try:
                p.produce(TOPIC, value=value, key=b"%d" % i)
                break
            except BufferError:
                p.poll(0.01)
        if i % 10_000 == 0:
            p.poll(0)
            progress(i * RECORD)
    if p.flush(300):
        raise RuntimeError("records left unsent")
    progress(total)
    return n


def _after(records) -> int:
    """The offset after the last whole batch of a Fetch answer's records."""
    view = memoryview(records)
    at, nxt = 0, -1
    while at + 61 <= len(view):
        base, length = struct.unpack_from(">qi", view, at)
        if at + 12 + length > len(view):
            break
        nxt = base + struct.unpack_from(">i", view, at + 23)[0] + 1
        at += 12 + length
    return nxt


def _read_raw_fetch(client, end: int) -> int:
    offset = total = 0
    while offset < end:
        data = client.fetch(
            TOPIC,
            {0: offset},
            partition_max_bytes=8 << 20,
            max_bytes=8 << 20,
            max_wait_ms=0,
            reuse_buffer=True,
        )[0]
        if not data.records:
            break
        total += len(data.records)
        offset = _after(data.records)
    return total


def _read_raw_direct(local, end: int) -> int:
    offset = total = 0
    while offset < end:
        got = local.read(offset, 8 << 20)
        if got is None or not got.records:
            raise RuntimeError(f"the direct read stopped at {offset} of {end}")
        total += len(got.records)
        offset = got.next_offset
    return total


def _read_arrow(client, end: int, colocated) -> int:
    from stratalog.client.arrow_reader import read_partition

    rows = 0
    for rb in read_partition(client, TOPIC, 0, 0, end, colocated=colocated):
        rows += rb.num_rows
    if rows != end:
        raise RuntimeError(f"read {rows} rows of {end}")
    return end * RECORD  # the values' bytes; the rate below is of batches, measured raw


def run(gb: float, runs: int, out: Path) -> dict:
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    from stratalog.client.arrow_reader import read_partition
    from stratalog.client.colocated import find
    from stratalog.client.wire import LATEST, WireClient

    out.mkdir(parents=True, exist_ok=True)
    total = int(gb * (1 << 30))
    results: dict = {"gb": gb, "record_bytes": RECORD, "runs": []}
    with tempfile.TemporaryDirectory(prefix="stratalog-colocated-") as tmp:
        proc, bootstrap = _start_broker(Path(tmp) / "data")
        try:
            with Progress(
                TextColumn("{task.description}"), BarColumn(), TimeRemainingColumn()
            ) as bar:
                task = bar.add_task("writing", total=total)
                _produce(bootstrap, total, lambda done: bar.update(task, completed=done))
                with WireClient(bootstrap) as client:
                    end = client.list_offsets(TOPIC, [0], LATEST)[0][0]
                    local = find(client, TOPIC, 0)
                    if local is None:
                        raise RuntimeError("the broker's files are not readable from here")
                    batch_bytes = _read_raw_direct(local, end)  # also warms both paths' files
                    # The decoder's first use (imports, the C extension) is not a read's cost.
                    list(read_partition(client, TOPIC, 0, 0, min(end, 1000), colocated=True))
                    list(read_partition(client, TOPIC, 0, 0, min(end, 1000), colocated=False))
                    results["batch_bytes"] = batch_bytes
                    results["records"] = end
                    reads = bar.add_task("reading", total=runs * len(MODES))
                    for r in range(runs):
                        order = MODES[r % len(MODES) :] + MODES[: r % len(MODES)]
                        row = {}
                        for mode in order:
                            bar.update(reads, description=f"run {r + 1}: {mode}")
                            read = {
                                "fetch-raw": lambda: _read_raw_fetch(client, end),
                                "direct-raw": lambda: _read_raw_direct(local, end),
                                # As the Spark source reads: it finds the files (and reads
                                # ahead while decoding) by itself.
                                "fetch-arrow": lambda: _read_arrow(client, end, False),
                                "direct-arrow": lambda: _read_arrow(client, end, True),
                            }[mode]
                            row[mode] = timed_read(proc.pid, read, batch_bytes)
                            bar.advance(reads)
                        results["runs"].append(row)
                    local.close()
        finally:
            proc.terminate()
            proc.wait(60)
    results["medians"] = medians(results["runs"], MODES)
    med = results["medians"]
    results["ratio_raw"] = med["direct-raw"]["mb_per_s"] / med["fetch-raw"]["mb_per_s"]
    results["ratio_arrow"] = med["direct-arrow"]["mb_per_s"] / med["fetch-arrow"]["mb_per_s"]
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    (out / "results.md").write_text(_markdown(results))
    _chart(results, out / "colocated-read.png")
    return results


def _markdown(results: dict) -> str:
    med = results["medians"]
    lines = [
        f"# Co-located reads against Fetch ({results['gb']} GiB, one partition, "
        f"{results['record_bytes']} B records, medians of {len(results['runs'])} runs)",
        "",
        "| read | MB/s | broker CPU (share of a core) | reader CPU |",
        "|---|---:|---:|---:|",
    ]
    for mode in MODES:
        m = med[mode]
        lines.append(
            f"| {mode} | {m['mb_per_s']:,.0f} | {m['broker_cpu']:.1%} | {m['reader_cpu']:.0%} |"
        )
    ok_raw = results["ratio_raw"] >= GOAL_RATIO
    ok_arrow = results["ratio_arrow"] >= GOAL_RATIO
    broker = max(med["direct-raw"]["broker_cpu"], med["direct-arrow"]["broker_cpu"])
    lines += [
        "",
        f"- direct / Fetch, raw batches: {results['ratio_raw']:.2f}x "
        f"(goal {GOAL_RATIO:.0f}x: {'met' if ok_raw else 'missed'})",
        f"- direct / Fetch, into Arrow: {results['ratio_arrow']:.2f}x "
        f"(goal {GOAL_RATIO:.0f}x: {'met' if ok_arrow else 'missed'})",
        f"- broker CPU during direct reads: {broker:.1%} of a core "
        f"(goal <= {GOAL_BROKER_CPU:.0%}: {'met' if broker <= GOAL_BROKER_CPU else 'missed'})",
        "",
    ]
    return "\n".join(lines)


def _chart(results: dict, path: Path) -> None:
    med = results["medians"]
    bar_pair(
        path, list(MODES), ["#888888", "#2a7ab9", "#888888", "#2a7ab9"],
        ("MB/s of record batches", [med[m]["mb_per_s"] for m in MODES],
         "one reader, one partition"),
        ("broker CPU, % of a core", [100 * med[m]["broker_cpu"] for m in MODES],
         "the broker meanwhile"),
        right_goal=100 * GOAL_BROKER_CPU,
    )  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gb", type=float, default=1.0, help="GiB written and read (default 1)")
    ap.add_argument("--runs", type=int, default=3, help="runs of the four reads (default 3)")
    ap.add_argument("--out", type=Path, default=Path("bench-results/colocated-read"))
    args = ap.parse_args()
    if args.gb <= 0 or args.runs < 1:
        ap.error("--gb must be positive and --runs at least 1")
    res = run(args.gb, args.runs, args.out)
    print(_markdown(res))


if __name__ == "__main__":
    main()
