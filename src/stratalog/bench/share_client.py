"""A share consumer for the load processes (issue 28's share-group goal: a share group of 4
consumers delivers >= 100,000 records/s, every record acknowledged exactly once).

librdkafka's share consumer (confluent-kafka ``ShareConsumer``) in implicit acknowledgement
mode, as an application that processes what it polls would run it: the records a poll returned
are accepted with the next poll. Every consumer of a case joins the same share group, so the
broker, not the harness, spreads the records. The acknowledgement-commit callback tells which
offsets the broker confirmed: ``consume`` counts those (a record counts once it is acknowledged,
not when delivered; a record whose lock ran out in a slow client's queue counts when its
redelivery is acknowledged), and they are kept per partition and handed back as runs, so the
harness can check that every record was acknowledged once across the group
(``share_acks_verdict``).
"""

from __future__ import annotations

from typing import Any

from stratalog.bench.clients import ConsumerClient, ConsumerJob, KafkaClientFactory

Runs = list[tuple[int, int]]  # [first, last] offsets


class ShareConsumerClient(ConsumerClient):
    def __init__(self, factory: KafkaClientFactory, job: ConsumerJob) -> None:
        super().__init__(job.track_latency)
        from confluent_kafka import ShareConsumer

        self.sample = max(1, job.sample_every)
        conf = {
            "bootstrap.servers": factory.bootstrap,
            # One group for all the consumers of a case.
            "group.id": f"stratalog-bench-share-{job.topics[0]}",
            "share.acknowledgement.mode": "implicit",
            "log_level": 3,
            **job.extra,
        }
        self.c = ShareConsumer(conf)
        self.acked: dict[str, list[int]] = {}  # "topic:partition" -> confirmed offsets
        self.refused = 0
        self.confirmed = 0  # offsets the broker confirmed
        self.reported = 0  # of them, counted by consume already
        self.delivered = 0
        self.delivered_bytes = 0
        self.c.set_acknowledgement_commit_callback(self._acked)
        self.c.subscribe(job.topics)
        # Join before the clock starts; the topic is full already, so what this first poll
        # brings is handed out by the first consume (and counted there).
        self._early = list(self.c.poll(0.05))

    def _acked(self, offsets, error) -> None:
        for tp, offs in offsets.items():
            if error is None:
                self.acked.setdefault(f"{tp.topic}:{tp.partition}", []).extend(offs)
                self.confirmed += len(offs)
            else:
                self.refused += len(offs)

    def consume(self, timeout: float) -> tuple[int, int]:
        if self._early:
            msgs, self._early = self._early, []
        else:
            msgs = self.c.poll(timeout)
        values = [v for m in msgs if m.error() is None and (v := m.value()) is not None]
        if self.track and values:
            self.record_latencies(values[:: self.sample] if self.sample > 1 else values)
        self.delivered += len(values)
        self.delivered_bytes += sum(map(len, values))
        # Acknowledgements confirmed since the last call (the callback runs inside poll).
        new, self.reported = self.confirmed - self.reported, self.confirmed
        size = self.delivered_bytes // self.delivered if self.delivered else 0
        return new, new * size

    def close(self) -> None:
        self.c.commit_sync(30)  # the last poll's records
        self.c.close()

    def result_extra(self) -> dict[str, Any]:
        """The confirmed offsets as runs per partition (a repeat within this consumer stays a
        run of its own, so the harness sees it), and how many acknowledgements were refused."""
        acked = {}
        for tp, offs in self.acked.items():
            offs.sort()
            runs: Runs = []
            for o in offs:
                if runs and o == runs[-1][1] + 1:
                    runs[-1] = (runs[-1][0], o)
                else:
                    runs.append((o, o))
            acked[tp] = runs
        return {
            "share_acked": acked,
            "share_refused": self.refused,
            "share_delivered": self.delivered,
        }


def share_acks_verdict(consumers: list[dict[str, Any]], total: int) -> dict[str, int]:
    """Across the consumers' confirmed runs: records acknowledged once, more than once, and
    never, of the ``total`` produced."""
    counts: dict[str, list[tuple[int, int]]] = {}
    for r in consumers:
        for tp, runs in (r.get("share_acked") or {}).items():
            counts.setdefault(tp, []).extend((a, b) for a, b in runs)
    once = twice = 0
    for runs in counts.values():
        # Sweep: +1 at a run's first offset, -1 after its last; lengths at each level.
        events: dict[int, int] = {}
        for a, b in runs:
            events[a] = events.get(a, 0) + 1
            events[b + 1] = events.get(b + 1, 0) - 1
        level = prev = 0
        for at in sorted(events):
            if level == 1:
                once += at - prev
            elif level > 1:
                twice += at - prev
            level += events[at]
            prev = at
    return {"acked_once": once, "acked_more": twice, "never": max(0, total - once - twice)}
