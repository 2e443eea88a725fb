"""A clean stop always ends, even right after a burst of acks=all appends.

Once in about eight stops, a broker given SIGTERM right after a 20-second acks=all run waited in
its stop for over 13 minutes. Each step of a stop is now bounded (broker/stopping.py); this runs
many stop-under-load cycles on one data directory, each SIGTERM sent while the producer still
has records in flight, and checks that every stop ends, that the broker says it stopped, and
that every record acknowledged in any cycle is there at the end, once.
"""

from __future__ import annotations

import signal
import subprocess
import time

from confluent_kafka import Consumer, Producer, TopicPartition

from .conftest import BrokerProcess, create_topic

CYCLES = 6
PARTITIONS = 4
RATE = 8_000  # records per second offered, about 8 MB/s


def test_stops_under_load_always_end_and_keep_every_acknowledged_record(tmp_path):
    b = BrokerProcess(tmp_path / "data")
    b.start()
    create_topic(b.bootstrap, "stops", PARTITIONS)
    acked: dict[tuple[int, int], bytes] = {}
    n = 0
    try:
        for cycle in range(CYCLES):
            if cycle:
                b.start()
            p = Producer(
                {
                    "bootstrap.servers": b.bootstrap,
                    "acks": "all",
                    "enable.idempotence": True,
                    "linger.ms": 1,
                    "message.timeout.ms": 5000,
                }
            )

            def done(err, msg) -> None:
                if err is None:
                    acked[(msg.partition(), msg.offset())] = msg.value()

            start = time.monotonic()
            first = n
            while (now := time.monotonic()) < start + 2:
                if n - first >= RATE * (now - start):
                    p.poll(0.001)  # paced, so records are still in flight at the SIGTERM
                    continue
                try:
                    p.produce("stops", b"%08d" % n + b"s" * 1016, partition=n % PARTITIONS,
                              on_delivery=done)  # fmt: skip
                except BufferError:  # the producer's queue is full: let it drain a little
                    p.poll(0.05)
                    continue
                n += 1
                if n % 100 == 0:
                    p.poll(0)
            assert b.proc is not None
            b.proc.send_signal(signal.SIGTERM)  # with records still in flight
            try:
                code = b.proc.wait(timeout=90)
            except subprocess.TimeoutExpired:
                raise AssertionError(f"cycle {cycle}: the stop did not end within 90 s") from None
            p.flush(10)
            b.proc.stdout.close()
            b.proc = None
            log = b.log_path.read_text()
            assert code == 0, f"cycle {cycle}: exit {code}\n{log[-3000:]}"
            assert "gave up waiting" not in log
        b.start()
        c = Consumer({"bootstrap.servers": b.bootstrap, "group.id": "stops",
                      "enable.auto.commit": False})  # fmt: skip
        c.assign([TopicPartition("stops", i, 0) for i in range(PARTITIONS)])
        read: dict[tuple[int, int], bytes] = {}
        deadline = time.monotonic() + 60
        # Records written but not acknowledged before a stop are read too: wait for the acked.
        while not acked.keys() <= read.keys() and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is not None and m.error() is None:
                read[(m.partition(), m.offset())] = m.value()
        c.close()
    finally:
        b.kill()
    assert len(acked) > 1000
    lost = [k for k, v in acked.items() if read.get(k) != v]
    assert not lost, (
        f"{len(lost)} of {len(acked)} acknowledged records not read back ({len(read)} read), "
        f"e.g. {sorted(lost)[:5]}; last offset read per partition: "
        f"{ {q: max((o for (pp, o) in read if pp == q), default=-1) for q in range(PARTITIONS)} }"
    )
    values = list(read.values())
    assert len(values) == len(set(values))
