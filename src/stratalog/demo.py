"""``make run`` until the Spark pipeline lands: an embedded broker, a real client, a summary.

Starts Stratalog in a temporary directory, creates a topic, produces records with
confluent-kafka (acks=all, so each is fsynced before it is acknowledged), consumes them back in
a consumer group, checks that content and order match, and prints what happened.
"""

from __future__ import annotations

import hashlib
import sys
import tempfile
import time

from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from stratalog import Broker

RECORDS = 200_000
PARTITIONS = 4
TOPIC = "demo-events"


def main() -> int:
    console = Console()
    with tempfile.TemporaryDirectory(prefix="stratalog-demo-") as data, Broker(data) as broker:
        console.print(f"Stratalog broker at [bold]{broker.bootstrap}[/bold], data in {data}")
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        admin.create_topics([NewTopic(TOPIC, PARTITIONS, 1)])[TOPIC].result(15)

        sent = hashlib.sha256()
        producer = Producer(
            {
                "bootstrap.servers": broker.bootstrap,
                "acks": "all",
                "linger.ms": 5,
                "enable.idempotence": True,
            }
        )
        t0 = time.perf_counter()
        with Progress(console=console, transient=True) as progress:
            task = progress.add_task("producing", total=RECORDS)
            for i in range(RECORDS):
                value = f"event-{i:08d}".encode()
                while True:
                    try:
                        producer.produce(
                            TOPIC,
                            key=str(i % PARTITIONS).encode(),
                            value=value,
                            partition=i % PARTITIONS,
                        )
                        break
                    except BufferError:  # the client's queue is full: let deliveries drain
                        producer.poll(0.05)
                if i % 5000 == 0:
                    producer.poll(0)
                    progress.update(task, completed=i)
            producer.flush(60)
        del producer, admin  # close client connections before the broker goes away
        produce_s = time.perf_counter() - t0

        consumer = Consumer(
            {
                "bootstrap.servers": broker.bootstrap,
                "group.id": "demo",
                "auto.offset.reset": "earliest",
            }
        )
        consumer.subscribe([TOPIC])
        per_partition: dict[int, list[bytes]] = {p: [] for p in range(PARTITIONS)}
        t0 = time.perf_counter()
        n = 0
        with Progress(console=console, transient=True) as progress:
            task = progress.add_task("consuming", total=RECORDS)
            while n < RECORDS and time.perf_counter() - t0 < 120:
                for m in consumer.consume(10000, 1.0):
                    if m.error():
                        continue
                    per_partition[m.partition()].append(m.value())
                    n += 1
                progress.update(task, completed=n)
        consume_s = time.perf_counter() - t0
        consumer.close()

        # Each partition must hold its records in produce order.
        received = hashlib.sha256()
        ok = True
        for p in range(PARTITIONS):
            expected = [f"event-{i:08d}".encode() for i in range(p, RECORDS, PARTITIONS)]
            ok &= per_partition[p] == expected
        for i in range(RECORDS):
            sent.update(f"event-{i:08d}".encode())
        merged = sorted(v for vs in per_partition.values() for v in vs)
        for v in merged:
            received.update(v)
        ok &= sent.digest() == received.digest()

        table = Table(title="Stratalog demo")
        table.add_column("step")
        table.add_column("records", justify="right")
        table.add_column("seconds", justify="right")
        table.add_column("records/s", justify="right")
        table.add_row(
            "produce (acks=all, fsync=always)",
            f"{RECORDS:,}",
            f"{produce_s:.2f}",
            f"{RECORDS / produce_s:,.0f}",
        )
        table.add_row(
            "consume (group 'demo')", f"{n:,}", f"{consume_s:.2f}", f"{n / consume_s:,.0f}"
        )
        console.print(table)
        console.print(f"content and per-partition order identical: {'yes' if ok else 'NO'}")
        return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
