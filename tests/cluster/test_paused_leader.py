"""A leader that is also the controller, paused past its lease (SIGSTOP), then resumed.

Its registration goes with its lease, and so does the controller key: the broker elected next
waits a lease time before it takes an absent broker for dead, and the paused one comes back
within it, still primary at the same epoch. Meanwhile clients must still be told it leads: a
Metadata answer without it made librdkafka drop its connection and take the requests in flight
for not written, though the broker wrote them once it ran again; re-sent under a bumped
producer epoch they were written twice (the fault harness's duplicates, 2026-11-28).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections import Counter

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from ..conformance import wire
from .etcd_gateway import etcd_value
from .waits import until

TOPIC = "paused"
PARTITIONS = 6
ROOT = "/stratalog/stratalog/"


def _partitions(bootstrap: str) -> tuple[dict[int, tuple[int, int]], set[int]]:
    """partition -> (leader, leader epoch), and the brokers listed, from one broker's Metadata."""
    md = wire.call(
        bootstrap, 3, 12,
        topics=[{"name": TOPIC, "topic_id": None}],
        allow_auto_topic_creation=False, include_topic_authorized_operations=False,
    )  # fmt: skip
    parts = {p["partition_index"]: (p["leader_id"], p["leader_epoch"])
             for p in md["topics"][0]["partitions"]}  # fmt: skip
    return parts, {b["node_id"] for b in md["brokers"]}


def test_a_paused_controller_stays_named_leader_and_nothing_is_written_twice(cluster):
    first = cluster.brokers[0].bootstrap
    admin = AdminClient({"bootstrap.servers": first})  # held until its future is done
    admin.create_topics([NewTopic(TOPIC, PARTITIONS, 3)])[TOPIC].result(timeout=30)
    before = until(
        lambda: (p := _partitions(first)[0]) and all(lead >= 0 for lead, _ in p.values()) and p,
        "leaders for every partition",
    )
    ctl = int(until(lambda: etcd_value(cluster.etcd.endpoint, ROOT + "controller"), "a controller"))
    led = sorted(p for p, (lead, _) in before.items() if lead == ctl)
    assert led, f"the controller {ctl} leads none of {before}"
    victim = next(b for b in cluster.brokers if b.node_id == ctl)
    peer = next(b for b in cluster.brokers if b.node_id != ctl).bootstrap

    acked: dict[int, tuple[int, int]] = {}
    failed: list[str] = []
    stop = threading.Event()

    def produce() -> None:
        producer = Producer({
            "bootstrap.servers": ",".join(b.bootstrap for b in cluster.brokers),
            "enable.idempotence": True, "acks": "all", "linger.ms": 5,
            "max.in.flight.requests.per.connection": 5, "message.timeout.ms": 60_000,
        })  # fmt: skip

        def report(err, msg) -> None:
            if err is None:
                acked[int(msg.value())] = (msg.partition(), msg.offset())
            else:
                failed.append(err.name())

        value = 0
        while not stop.is_set():
            producer.produce(TOPIC, str(value).encode(), partition=value % PARTITIONS,
                             on_delivery=report)  # fmt: skip
            value += 1
            producer.poll(0.005)
        assert producer.flush(60) == 0

    writer = threading.Thread(target=produce)
    writer.start()
    try:
        time.sleep(1.0)
        os.kill(victim.pid, signal.SIGSTOP)
        try:
            until(
                lambda: etcd_value(cluster.etcd.endpoint, f"{ROOT}brokers/{ctl}") is None,
                "the paused broker's registration to go", timeout=15, every=0.05,
            )  # fmt: skip
            during, listed = _partitions(peer)
        finally:
            os.kill(victim.pid, signal.SIGCONT)
        # Within the next controller's grace: still the leader, at the same epoch, and listed.
        assert ctl in listed, listed
        assert {p: during[p] for p in led} == {p: before[p] for p in led}
        time.sleep(4.0)  # it registers again and goes on leading; the producer goes on
    finally:
        stop.set()
        writer.join(90)
    assert not writer.is_alive()
    assert not failed, Counter(failed)
    assert len(acked) > 500

    consumer = Consumer({"bootstrap.servers": peer, "group.id": "paused-check",
                         "enable.auto.commit": False})  # fmt: skip
    try:
        consumer.assign([TopicPartition(TOPIC, p, 0) for p in range(PARTITIONS)])
        seen: Counter[int] = Counter()
        deadline = time.monotonic() + 60
        while not set(acked) <= set(seen) and time.monotonic() < deadline:
            for m in consumer.consume(500, 1.0):
                if m.error() is None:
                    seen[int(m.value())] += 1
        time.sleep(1.0)  # anything written twice after the last acknowledged record
        for m in consumer.consume(500, 1.0):
            if m.error() is None:
                seen[int(m.value())] += 1
    finally:
        consumer.close()
    assert set(acked) <= set(seen), sorted(set(acked) - set(seen))[:20]
    assert [v for v, n in seen.items() if n > 1] == []
