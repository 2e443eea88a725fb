"""Spark reading one topic with ``format("stratalog")``, ``format("stratalog-python")`` and Spark's
own ``format("kafka")``.

Run as a child process of the harness (``python -m stratalog.bench.spark_read``), so the JVM of
Spark lives and dies with it. Each format reads the whole topic in a batch query that touches
every value (``sum(length(value))``), alternating formats ``runs`` times; the JSON printed last
holds every run's rows/s. First each format reads the topic ``warmup`` times, alternating, to
warm the JVM's compiler and the caches; those reads are reported apart (the first of them is
what a one-off job sees). In a run of 60 reads in one session on the 2-core machine, both
formats kept speeding up for about ten reads (docs/benchmarks.md, workload f).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

# Every column of the Kafka schema, touched: what a query that keeps whole rows pays.
ALL_COLUMNS = (
    "max(offset)", "max(timestamp)", "count(key)", "count(topic)", "max(partition)",
    "max(timestampType)",
)  # fmt: skip


def read_once(
    spark, fmt: str, bootstrap: str, topic: str, all_columns: bool = False
) -> tuple[int, int, float]:
    t0 = time.perf_counter()
    extra = ALL_COLUMNS if all_columns else ()
    row = (
        spark.read.format(fmt)
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("endingOffsets", "latest")
        .load()
        .selectExpr("count(*) AS n", "sum(length(value)) AS b", *extra)
        .collect()[0]
    )
    return int(row["n"]), int(row["b"] or 0), time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--topic", required=True)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--cores", type=int, default=2)
    ap.add_argument(
        "--formats",
        default="stratalog,stratalog-python,kafka",
        help="formats in the order each round reads them",
    )
    ap.add_argument(
        "--all-columns",
        action="store_true",
        help="touch every column of the schema, not only the values",
    )
    args = ap.parse_args(argv)

    from stratalog.spark import local_session, register

    formats = tuple(args.formats.split(","))
    # Spark's Kafka connector is resolved and loaded only when its format is read.
    spark = local_session(
        "stratalog-bench-spark", cores=args.cores, kafka_connector="kafka" in formats
    )
    register(spark)
    out: dict[str, dict[str, list[dict[str, float]]]] = {
        f: {"warmup": [], "runs": []} for f in formats
    }
    try:
        for phase, count in (("warmup", args.warmup), ("runs", args.runs)):
            for _ in range(count):
                for fmt in formats:
                    n, b, secs = read_once(spark, fmt, args.bootstrap, args.topic, args.all_columns)
                    out[fmt][phase].append(
                        {"rows": n, "bytes": b, "seconds": secs, "rows_per_s": n / secs}
                    )
                    print(f"{phase} {fmt}: {n:,} rows in {secs:.2f} s", file=sys.stderr, flush=True)
    finally:
        spark.stop()
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
