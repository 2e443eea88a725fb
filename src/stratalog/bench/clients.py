"""Load processes: producers and consumers in child processes, one client each.

Every target hands the harness a picklable :class:`ClientFactory`; a child process (started with
``spawn``, so no broker state or thread is inherited) calls ``factory.producer(job)`` or
``factory.consumer(job)`` and runs the loops below. The loops are the same for every target: only
the client differs.

Records carry their send time: the first 8 bytes of every value are the wall-clock time in
microseconds (``time.time_ns() // 1000``) at ``send``; the rest is random bytes made once. So

* publish latency = ack callback time - send time (every ``latency_sample_every``-th record;
  the others' delivery reports only count, which keeps the client's per-record cost down);
* end-to-end latency = time the consumer's ``consume`` call returned the record - send time
  (every record, on consumers that track it).

All processes run on one machine, so the wall clocks are the same clock.
"""

from __future__ import annotations

import json
import os
import queue
import struct
import sys
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar

from stratalog.bench.hist import LatencyRecorder
from stratalog.broker.cpu_isolation import parse_cpus

_PACK = struct.Struct("<q").pack
_UNPACK_FROM = struct.Struct("<q").unpack_from
CHUNK = 512  # records between checks of the stop event and progress updates


@dataclass
class ProducerJob:
    index: int
    topics: list[str]
    partitions: int
    record_size: int
    records: int  # this producer's share
    rate: float | None  # this producer's records/s; None = as fast as it can
    acks: str = "all"
    compression: str = "none"
    linger_ms: float = 5.0
    batch_bytes: int = 1_000_000
    sample_every: int = 1
    max_duration_s: float = 120.0
    extra: dict[str, Any] = field(default_factory=dict)
    client: str = "confluent-kafka"  # or "java": Kafka's Java client (bench/java_producer.py)
    # > 0: a transactional producer committing every this many records (bench/txn_client.py).
    transaction_records: int = 0


@dataclass
class ConsumerJob:
    index: int
    count: int  # consumers sharing the topics' partitions
    topics: list[str]
    partitions: int
    track_latency: bool = True
    max_duration_s: float = 300.0
    sample_every: int = 1  # end-to-end latency of every n-th record read
    extra: dict[str, Any] = field(default_factory=dict)
    group: str = "tail"  # which readers of a case this one belongs to ("backlog" in catch-up)
    # Bytes per second this reader takes at most (0: as fast as it can): the same read load
    # for every target, whatever the broker would serve.
    max_bytes_per_s: float = 0.0
    sched_idle: bool = False  # run in SCHED_IDLE: only the CPU nobody else wants
    cpus: str = ""  # a Linux CPU list to run on (empty: anywhere)
    # "confluent-kafka" (the factory's consumer) or "arrow": raw batches decoded into Arrow
    # columns as the Spark source does (bench/history_reader.py), for Kafka-protocol targets;
    # or "share": a share consumer, all of a case's in one share group (bench/share_client.py).
    client: str = "confluent-kafka"


class ProducerClient(ABC):
    """One producer connection. ``send`` may buffer; acks are counted and timed by the client."""

    def __init__(self) -> None:
        self.latency = LatencyRecorder()
        self.sent = 0
        self.errors = 0
        self.unacked = 0  # still unacknowledged after the final flush
        self.purged = 0  # dropped unsent from the client's queue when a case hit its time cap
        self.first_error = ""

    @abstractmethod
    def send(self, topic: str, value: bytes, track: bool) -> None: ...

    @abstractmethod
    def idle(self, seconds: float) -> None:
        """Nothing to send for ``seconds``: serve acks (and flush buffers whose time has come)."""

    @abstractmethod
    def flush(self, timeout: float) -> None:
        """Wait until every record sent is acked or failed; set ``unacked`` to what is left."""

    def outstanding(self) -> int:
        """Records sent but not yet acknowledged or failed (0 if the client cannot tell)."""
        return 0

    def acknowledged(self) -> int:
        """Records the server acknowledged, after ``flush``. A client that learns of every
        record's failure (``errors``, ``purged``) and of what is left (``unacked``) may subtract;
        one that hears about some records only must count acknowledgements instead."""
        return self.sent - self.unacked - self.errors - self.purged

    def close(self) -> None:  # noqa: B027 - optional hook
        pass

    def result_extra(self) -> dict[str, Any]:
        """More figures for the producer's result (a transactional client's commits)."""
        return {}


class ConsumerClient(ABC):
    def __init__(self, track_latency: bool) -> None:
        self.latency = LatencyRecorder()
        self.track = track_latency

    @abstractmethod
    def consume(self, timeout: float) -> tuple[int, int]:
        """Wait up to ``timeout`` for records; return (records, bytes) received."""

    def close(self) -> None:  # noqa: B027 - optional hook
        pass

    def result_extra(self) -> dict[str, Any]:
        return {}

    def record_latencies(self, values: list[bytes]) -> None:
        """End-to-end latency of each value (its first 8 bytes are the send time in us)."""
        now = time.time_ns() // 1000
        add = self.latency.pending.append
        for v in values:
            add(now - _UNPACK_FROM(v)[0])
        if len(self.latency.pending) >= 65_536:
            self.latency.fold()


class ClientFactory:
    """Picklable: made by a target in the harness, used in child processes. A subclass names
    its client classes; each is built as ``cls(factory, job)``."""

    producer_class: ClassVar[type]
    consumer_class: ClassVar[type]

    def producer(self, job: ProducerJob) -> ProducerClient:
        return self.producer_class(self, job)

    def consumer(self, job: ConsumerJob) -> ConsumerClient:
        return self.consumer_class(self, job)


# ------------------------------------------------------------------------------------------------
# Kafka protocol (Stratalog, Apache Kafka): confluent-kafka
# ------------------------------------------------------------------------------------------------


@dataclass
class KafkaClientFactory(ClientFactory):
    bootstrap: str
    producer_config: dict[str, Any] = field(default_factory=dict)
    consumer_config: dict[str, Any] = field(default_factory=dict)

    def producer(self, job: ProducerJob) -> ProducerClient:
        if job.transaction_records:
            from stratalog.bench.txn_client import TransactionalProducerClient

            return TransactionalProducerClient(self, job)
        return super().producer(job)


class KafkaProducerClient(ProducerClient):
    def __init__(self, factory: KafkaClientFactory, job: ProducerJob) -> None:
        super().__init__()
        from confluent_kafka import KafkaError, Producer

        self._purge_code = KafkaError._PURGE_QUEUE

        conf = {
            "bootstrap.servers": factory.bootstrap,
            "acks": {"all": "-1"}.get(job.acks, job.acks),
            "linger.ms": job.linger_ms,
            "batch.size": job.batch_bytes,
            "compression.type": job.compression,
            "queue.buffering.max.messages": 1_000_000,
            "queue.buffering.max.kbytes": 512 * 1024,
            "enable.idempotence": False,
            "message.timeout.ms": 120_000,
            "log_level": 3,
            **factory.producer_config,
            **job.extra,
        }
        if debug := os.environ.get("STRATALOG_BENCH_CLIENT_DEBUG"):
            # librdkafka's own account (e.g. "metadata,topic,broker"), on stderr, for a run
            # whose figures need explaining (a failover trial's wait).
            conf |= {"debug": debug, "log_level": 7}
        idempotent = str(conf.get("enable.idempotence", False)).lower() in ("true", "1")
        self._pid_state = ""
        if idempotent:
            # Its statistics say when the producer holds its producer id (below).
            conf |= {"statistics.interval.ms": 100, "stats_cb": self._stats}
        self.p = Producer(conf)
        self._n = 0
        # Delivery reports without an error, of every record (tracked or not): a record purged
        # at a time cap or failed without a callback would otherwise pass for acknowledged.
        self.acked = 0
        # Connect and fetch metadata before the clock starts.
        self.p.list_topics(timeout=30)
        if idempotent:
            # And the producer id: librdkafka asks for one only over a connection to a broker
            # it learned from the metadata, and until one is up it retries on a 500 ms timer,
            # so the first records of a fresh idempotent producer wait about half a second,
            # whatever the broker (seen on Stratalog and Kafka alike): start-up, not latency.
            deadline = time.monotonic() + 30
            while self._pid_state != "Assigned" and time.monotonic() < deadline:
                self.p.poll(0.05)
            if self._pid_state != "Assigned":
                # Timed from here anyway: the first records will show the wait.
                print(f"producer {job.index}: no producer id after 30 s", file=sys.stderr)

    def _stats(self, stats: str) -> None:
        if self._pid_state == "Assigned":
            return  # (librdkafka goes on sending them; they are no longer read)
        self._pid_state = json.loads(stats).get("eos", {}).get("idemp_state", "")

    def _failed(self, err) -> None:
        if err.code() == self._purge_code:
            self.purged += 1  # never sent: not a failure of the server
            return
        self.errors += 1
        if not self.first_error:
            self.first_error = str(err)

    def _cb(self, err, msg) -> None:
        """A sampled record's delivery report: counted and timed."""
        if err is not None:
            self._failed(err)
            return
        self.acked += 1
        self.latency.pending.append(time.time_ns() // 1000 - _UNPACK_FROM(msg.value())[0])

    def _count(self, err, msg) -> None:
        """Any other record's delivery report: counted only."""
        if err is None:
            self.acked += 1
        else:
            self._failed(err)

    def send(self, topic: str, value: bytes, track: bool) -> None:
        p = self.p
        while True:
            try:
                p.produce(topic, value, callback=self._cb if track else self._count)
                break
            except BufferError:
                p.poll(0.002)
        self.sent += 1
        self._n += 1
        if self._n >= 64:
            self._n = 0
            p.poll(0)

    def idle(self, seconds: float) -> None:
        self.p.poll(max(0.0, min(seconds, 0.05)))

    def flush(self, timeout: float) -> None:
        self.unacked = self.p.flush(timeout)
        self.latency.fold()

    def outstanding(self) -> int:
        return len(self.p)  # librdkafka: queued plus in flight

    def acknowledged(self) -> int:
        return self.acked

    def purge(self) -> None:
        self.p.purge(in_queue=True, in_flight=False)
        self.p.poll(0)


class KafkaConsumerClient(ConsumerClient):
    def __init__(self, factory: KafkaClientFactory, job: ConsumerJob) -> None:
        super().__init__(job.track_latency)
        from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

        self.sample = max(1, job.sample_every)

        conf = {
            "bootstrap.servers": factory.bootstrap,
            "group.id": f"stratalog-bench-{os.getpid()}",
            "enable.auto.commit": False,
            "enable.partition.eof": False,
            "fetch.wait.max.ms": 100,
            # librdkafka pauses fetching for fetch.queue.backoff.ms (1 s) whenever its local
            # queue is full: a catch-up reader would then drain at a rate set by that pause.
            "fetch.queue.backoff.ms": 10,
            "log_level": 3,
            **factory.consumer_config,
            **job.extra,
        }
        self.c = Consumer(conf)
        tps = [(t, p) for t in job.topics for p in range(job.partitions)]
        mine = tps[job.index :: job.count]
        self.c.assign([TopicPartition(t, p, OFFSET_BEGINNING) for t, p in mine])
        self.c.consume(1, 0.05)  # connect before the clock starts (topics are empty)

    def consume(self, timeout: float) -> tuple[int, int]:
        # consume(n, timeout) waits for n messages or the whole timeout, which would add up to
        # the timeout to end-to-end latency: take what is there, else wait for one.
        msgs = self.c.consume(2000, 0)
        if not msgs:
            first = self.c.poll(timeout)
            if first is None:
                return 0, 0
            msgs = [first, *self.c.consume(2000, 0)]
        values = [v for m in msgs if (v := m.value()) is not None and m.error() is None]
        if self.track:
            # Sampled like the producers' publish latency, so the client's own CPU stays low.
            self.record_latencies(values[:: self.sample] if self.sample > 1 else values)
        return len(values), sum(map(len, values))

    def close(self) -> None:
        self.c.close()


KafkaClientFactory.producer_class = KafkaProducerClient
KafkaClientFactory.consumer_class = KafkaConsumerClient


# ------------------------------------------------------------------------------------------------
# Child process entry points
# ------------------------------------------------------------------------------------------------


def _cpu() -> float:
    t = os.times()
    return t.user + t.system


def producer_main(factory, job, ready_q, start_evt, stop_evt, progress, result_q) -> None:
    result: dict[str, Any] = {"role": "producer", "index": job.index, "error": ""}
    try:
        if job.client == "java":
            from stratalog.bench import java_producer

            bootstrap = getattr(factory, "bootstrap", None)
            if bootstrap is None:
                raise RuntimeError("the Java producer speaks Kafka; this target does not")
            result.update(java_producer.run(bootstrap, job, ready_q, start_evt, stop_evt, progress))
            result_q.put(result)
            return
        client = factory.producer(job)
        ready_q.put(("producer", job.index, ""))
        start_evt.wait()
        result.update(_produce(client, job, stop_evt, progress))
        client.close()
    except Exception as e:  # reported to the harness, which fails the case
        result["error"] = f"{type(e).__name__}: {e}"
        ready_q.put(("producer", job.index, result["error"]))
    result_q.put(result)


def _produce(client: ProducerClient, job: ProducerJob, stop_evt, progress) -> dict[str, Any]:
    tail = os.urandom(job.record_size - 8)
    topics = job.topics
    nt = len(topics)
    n = job.records
    sample = max(1, job.sample_every)
    rate = job.rate
    send = client.send
    now_us = time.time_ns
    perf = time.perf_counter
    cpu0 = _cpu()
    t_first = time.time()
    t0 = perf()
    deadline = t0 + job.max_duration_s
    capped = False
    i = 0
    while i < n:
        if rate:
            now = perf()
            due = min(n, int((now - t0) * rate) + 1)
            if due <= i:
                # At least 1 ms: librdkafka's poll() counts whole milliseconds, so a shorter
                # wait would spin and starve the server on a small machine.
                client.idle(max(0.001, t0 + i / rate - now))
                continue
            end = min(due, i + CHUNK)
        else:
            end = min(n, i + CHUNK)
        for j in range(i, end):
            send(topics[j % nt], _PACK(now_us() // 1000) + tail, j % sample == 0)
        i = end
        progress.value = i - client.outstanding()  # acknowledged (or failed) so far
        if stop_evt.is_set():
            break
        if perf() > deadline:
            capped = True
            break
    t_sent = time.time()
    if capped and hasattr(client, "purge"):
        client.purge()  # what is still queued would only measure the drain
    flush_deadline = perf() + 120
    while client.outstanding() and perf() < flush_deadline:
        client.idle(0.05)  # the harness follows the acks while the queue drains
        progress.value = i - client.outstanding()
    client.flush(max(1.0, flush_deadline - perf()))
    progress.value = i - client.unacked
    t_last = time.time()
    acked = client.acknowledged()
    return {
        "records": acked,
        "sent": client.sent,
        "errors": client.errors,
        "unacked": client.unacked,
        "first_error": client.first_error,
        "purged": client.purged,
        "bytes": acked * job.record_size,
        "t_first": t_first,
        "t_sent": t_sent,
        "t_last": t_last,
        "capped": capped,
        "cpu_s": _cpu() - cpu0,
        "hist": client.latency.encode(),
        **client.result_extra(),
    }


def consumer_main(factory, job, ready_q, start_evt, stop_evt, progress, result_q) -> None:
    result: dict[str, Any] = {
        "role": "consumer",
        "index": job.index,
        "group": job.group,
        "error": "",
    }
    try:
        if job.sched_idle:
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
        if job.cpus:
            os.sched_setaffinity(0, parse_cpus(job.cpus))
        client = _consumer(factory, job)
        ready_q.put(("consumer", job.index, ""))
        start_evt.wait()
        cpu0 = _cpu()
        t_start = time.time()
        deadline = time.perf_counter() + job.max_duration_s
        records = nbytes = 0
        t_first = t_last = 0.0
        t0 = time.perf_counter()
        while not stop_evt.is_set() and time.perf_counter() < deadline:
            n, b = client.consume(0.1)
            if n:
                if not t_first:
                    t_first = time.time()
                t_last = time.time()
                records += n
                nbytes += b
                progress.value = records
            if job.max_bytes_per_s > 0:
                ahead = nbytes / job.max_bytes_per_s - (time.perf_counter() - t0)
                if ahead > 0:
                    time.sleep(min(ahead, 0.05))
        result.update(
            records=records,
            bytes=nbytes,
            t_start=t_start,
            t_first=t_first,
            t_last=t_last,
            cpu_s=_cpu() - cpu0,
            hist=client.latency.encode(),
            sched_idle=os.sched_getscheduler(0) == os.SCHED_IDLE,
        )
        client.close()
        result.update(client.result_extra())  # (after close: a share consumer's last acks)
    except Exception as e:
        result["error"] = f"{type(e).__name__}: {e}"
        ready_q.put(("consumer", job.index, result["error"]))
    result_q.put(result)


def _consumer(factory: ClientFactory, job: ConsumerJob) -> ConsumerClient:
    if job.client == "confluent-kafka":
        return factory.consumer(job)
    if job.client == "arrow":
        from stratalog.bench.history_reader import ArrowHistoryReader

        bootstrap = getattr(factory, "bootstrap", None)
        if not bootstrap:
            raise ValueError("the arrow reader needs a target that speaks the Kafka protocol")
        return ArrowHistoryReader(bootstrap, job)
    if job.client == "share":
        from stratalog.bench.share_client import ShareConsumerClient

        if not isinstance(factory, KafkaClientFactory):
            raise ValueError("share consumers need a target that speaks the Kafka protocol")
        return ShareConsumerClient(factory, job)
    raise ValueError(f"unknown consumer client {job.client!r} (confluent-kafka, arrow, share)")


def drain(q, n: int, timeout: float) -> list[Any]:
    """Take ``n`` items from a multiprocessing queue, waiting at most ``timeout`` overall."""
    out = []
    deadline = time.monotonic() + timeout
    while len(out) < n:
        try:
            out.append(q.get(timeout=max(0.01, deadline - time.monotonic())))
        except queue.Empty:
            break
    return out
