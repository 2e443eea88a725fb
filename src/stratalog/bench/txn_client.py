"""A transactional producer for the load processes (issue 28's transactional-produce goal).

confluent-kafka's transactional producer, driven as an application would: ``init_transactions``
once, then ``begin_transaction``, ``transaction_records`` produce calls, ``commit_transaction``,
and again. Records count as acknowledged once their transaction committed; every commit's
duration (the call, which flushes the transaction's records and writes the markers) is kept in
a histogram of its own beside the records' publish latency.
"""

from __future__ import annotations

import os
import time

from stratalog.bench.clients import KafkaClientFactory, KafkaProducerClient, ProducerJob
from stratalog.bench.hist import LatencyRecorder


class TransactionalProducerClient(KafkaProducerClient):
    def __init__(self, factory: KafkaClientFactory, job: ProducerJob) -> None:
        job.extra = {
            **job.extra,
            "transactional.id": f"stratalog-bench-{os.getpid()}-{job.index}",
            "enable.idempotence": True,
            "acks": "-1",
            # librdkafka caps in-flight requests at 5 with idempotence.
            "max.in.flight.requests.per.connection": 5,
            "transaction.timeout.ms": 120_000,
        }
        super().__init__(factory, job)
        self.per_txn = job.transaction_records
        self.in_txn = 0
        self.committed = 0
        self.transactions = 0
        self.commits = LatencyRecorder()
        self.p.init_transactions(60)
        self.p.begin_transaction()

    def send(self, topic: str, value: bytes, track: bool) -> None:
        super().send(topic, value, track)
        self.in_txn += 1
        if self.in_txn >= self.per_txn:
            self._commit()
            self.p.begin_transaction()

    def _commit(self) -> None:
        t0 = time.perf_counter_ns()
        self.p.commit_transaction(120)
        self.commits.pending.append((time.perf_counter_ns() - t0) // 1000)
        self.committed += self.in_txn
        self.transactions += 1
        self.in_txn = 0

    def purge(self) -> None:
        """At a case's time cap the open transaction is committed, not dropped (a purged
        record would abort it): at most ``transaction_records`` - 1 more records."""

    def flush(self, timeout: float) -> None:
        if self.in_txn:
            self._commit()
        else:
            self.p.abort_transaction(timeout)  # the empty one begun after the last commit
        # Records not in a committed transaction were not acknowledged.
        self.unacked = self.sent - self.committed - self.errors
        self.latency.fold()
        self.commits.fold()

    def acknowledged(self) -> int:
        return self.committed  # a delivered record counts once its transaction committed

    def result_extra(self) -> dict[str, object]:
        return {"transactions": self.transactions, "commit_hist": self.commits.encode()}
