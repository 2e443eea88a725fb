"""Spark reading one topic with ``format("stratalog")`` and with Spark's own ``format("kafka")``.

Run as a child process of the harness (``python -m stratalog.bench.spark_read``), so the JVM of
Spark lives and dies with it. Each format reads the whole topic in a batch query that touches
every value (``sum(length(value))``), alternating formats ``runs`` times; the JSON printed last
holds every run's rows/s. The first, untimed, read of each format warms the JVM and the caches.
"""

from __future__ import annotations

import argparse
import json
import sys
import time


def read_once(spark, fmt: str, bootstrap: str, topic: str) -> tuple[int, int, float]:
    t0 = time.perf_counter()
    row = (
        spark.read.format(fmt)
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("endingOffsets", "latest")
        .load()
        .selectExpr("count(*) AS n", "sum(length(value)) AS b")
        .collect()[0]
    )
    return int(row["n"]), int(row["b"] or 0), time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--topic", required=True)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--cores", type=int, default=2)
    args = ap.parse_args(argv)

    from stratalog.spark import local_session, register

    spark = local_session("stratalog-bench-spark", cores=args.cores, kafka_connector=True)
    register(spark)
    out: dict[str, list[dict[str, float]]] = {"stratalog": [], "kafka": []}
    try:
        for fmt in out:
            read_once(spark, fmt, args.bootstrap, args.topic)
        for _ in range(args.runs):
            for fmt in out:
                n, b, secs = read_once(spark, fmt, args.bootstrap, args.topic)
                out[fmt].append({"rows": n, "bytes": b, "seconds": secs, "rows_per_s": n / secs})
                print(f"{fmt}: {n:,} rows in {secs:.2f} s", file=sys.stderr, flush=True)
    finally:
        spark.stop()
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
