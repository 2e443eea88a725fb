"""What a split costs readers: a split topic read by families against the same data unsplit.

``python -m stratalog.bench.split_read [--gb 0.5] [--runs 5] [--out DIR]`` starts ``stratalog
serve`` on loopback and writes the same keyed 1 KiB records to two topics: ``plain``, created
with 4 partitions, and ``split``, created with 2 (``partition.autoscale.enable=true``) and split
to 4 (CreatePartitions) after half of the records, so its children's batches carry order marks.
Then, in a rotating order each run, it reads everything into Arrow three ways:

* ``plain-partitions``: each partition of ``plain`` on its own (``read_partition``), as
  Spark's Kafka source and Stratalog's reads of an unsplit topic do;
* ``split-partitions``: each partition of ``split`` on its own; the broker computes the
  children's order marks (``PartitionLog.order_marks``) and the reader ignores them;
* ``split-families``: ``split`` by families (``read_family``), as ``format("stratalog-python")``
  reads a split topic: one reader per family, a child's batches only after the parent's before
  them.

For each: the rate (MB of record values per second), the broker's CPU during it (share of a
core) and the reader's. Everything is in the page cache; reads use Fetch (not co-located).
Results: ``results.json``, ``results.md`` and ``split-read.png`` in ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

from stratalog.bench.charts import bar_pair
from stratalog.bench.colocated_read import _start_broker, medians, timed_read

MB = 1_000_000
RECORD = 1024
MODES = ("plain-partitions", "split-partitions", "split-families")


def _produce(bootstrap: str, topic: str, first: int, last: int, tick) -> None:
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap, "acks": "1", "linger.ms": 20,
                  "batch.size": 1_000_000, "queue.buffering.max.kbytes": 512 * 1024})  # fmt: skip
    value = os.urandom(RECORD)
    for i in range(first, last):
        while True:
            try:
                p.produce(topic, value=value, key=b"key-%d" % (i % 100_000))
                break
            except BufferError:
                p.poll(0.01)
        if i % 10_000 == 0:
            p.poll(0)
            tick(10_000)
    if p.flush(300):
        raise RuntimeError("records left unsent")


def _write(bootstrap: str, n: int, tick) -> None:
    from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    split = {"partition.autoscale.enable": "true", "retention.ms": "-1"}
    for f in admin.create_topics([NewTopic("plain", 4, 1, config={"retention.ms": "-1"}),
                                  NewTopic("split", 2, 1, config=split)]).values():  # fmt: skip
        f.result(30)
    _produce(bootstrap, "plain", 0, n, tick)
    _produce(bootstrap, "split", 0, n // 2, tick)
    admin.create_partitions([NewPartitions("split", 4)])["split"].result(30)
    _produce(bootstrap, "split", n // 2, n, tick)  # a new producer: it sees 4 partitions


def _ends(client, topic: str) -> dict[int, int]:
    from stratalog.client.wire import LATEST

    return {p: o for p, (o, _) in client.list_offsets(topic, list(range(4)), LATEST).items()}


def _read(client, mode: str, ends: dict[str, dict[int, int]]) -> int:
    from stratalog.client.arrow_reader import read_partition
    from stratalog.client.family_reader import Member, read_family

    topic = "plain" if mode == "plain-partitions" else "split"
    rows = 0
    if mode == "split-families":
        for root in (0, 1):
            members = [Member(root, 0, ends[topic][root]),
                       Member(root + 2, 0, ends[topic][root + 2], parent=root)]  # fmt: skip
            rows += sum(rb.num_rows for rb in read_family(client, topic, members))
    else:
        for p, end in ends[topic].items():
            rows += sum(rb.num_rows for rb in read_partition(client, topic, p, 0, end))
    return rows


def run(gb: float, runs: int, out: Path) -> dict:
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    from stratalog.client.wire import WireClient

    out.mkdir(parents=True, exist_ok=True)
    n = int(gb * (1 << 30)) // RECORD
    results: dict = {"gb": gb, "record_bytes": RECORD, "records": n, "runs": []}
    with tempfile.TemporaryDirectory(prefix="stratalog-split-read-") as tmp:
        proc, bootstrap = _start_broker(Path(tmp) / "data")
        try:
            with Progress(
                TextColumn("{task.description}"), BarColumn(), TimeRemainingColumn()
            ) as bar:
                task = bar.add_task("writing", total=2 * n)
                _write(bootstrap, n, lambda k: bar.advance(task, k))
                with WireClient(bootstrap) as client:
                    deadline = time.monotonic() + 60
                    while True:  # (acks=1: the high watermark may trail the last answer)
                        ends = {t: _ends(client, t) for t in ("plain", "split")}
                        if all(sum(e.values()) == n for e in ends.values()):
                            break
                        if time.monotonic() > deadline:
                            raise RuntimeError(f"the topics end at {ends}, not at {n} records")
                        time.sleep(0.1)
                    for mode in MODES:  # warms the page cache and the decoder
                        if _read(client, mode, ends) != n:
                            raise RuntimeError(f"{mode} did not read {n} records: {ends}")
                    reads = bar.add_task("reading", total=runs * len(MODES))
                    for r in range(runs):
                        row = {}
                        for mode in MODES[r % 3 :] + MODES[: r % 3]:
                            bar.update(reads, description=f"run {r + 1}: {mode}")
                            row[mode] = timed_read(
                                proc.pid, lambda m=mode: _read(client, m, ends), n * RECORD
                            )
                            bar.advance(reads)
                        results["runs"].append(row)
        finally:
            proc.terminate()
            proc.wait(60)
    results["medians"] = medians(results["runs"], MODES)
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    (out / "results.md").write_text(_markdown(results))
    _chart(results, out / "split-read.png")
    return results


def _markdown(results: dict) -> str:
    med = results["medians"]
    base = med["plain-partitions"]["mb_per_s"]
    lines = [
        f"# A split topic's reads ({results['gb']} GiB of {results['record_bytes']} B records, "
        f"4 partitions, medians of {len(results['runs'])} runs)",
        "",
        "| read | MB/s | vs plain | broker CPU (share of a core) | reader CPU |",
        "|---|---:|---:|---:|---:|",
    ]
    for mode in MODES:
        m = med[mode]
        lines.append(
            f"| {mode} | {m['mb_per_s']:,.0f} | {m['mb_per_s'] / base:.2f}x "
            f"| {m['broker_cpu']:.1%} | {m['reader_cpu']:.0%} |"
        )
    return "\n".join([*lines, ""])


def _chart(results: dict, path: Path) -> None:
    med = results["medians"]
    bar_pair(
        path, list(MODES), ["#888888", "#888888", "#2a7ab9"],
        ("MB/s of record values", [med[m]["mb_per_s"] for m in MODES],
         "one reader, 4 partitions, into Arrow"),
        ("broker CPU, % of a core", [100 * med[m]["broker_cpu"] for m in MODES],
         "the broker meanwhile"),
    )  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gb", type=float, default=0.5, help="GiB per topic (default 0.5)")
    ap.add_argument("--runs", type=int, default=5, help="runs of the three reads (default 5)")
    ap.add_argument("--out", type=Path, default=Path("bench-results/split-read"))
    args = ap.parse_args()
    if args.gb <= 0 or args.runs < 1:
        ap.error("--gb must be positive and --runs at least 1")
    print(_markdown(run(args.gb, args.runs, args.out)))


if __name__ == "__main__":
    main()
