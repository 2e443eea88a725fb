"""The four client stacks under test, behind one small interface each.

kcat (librdkafka CLI), confluent-kafka (librdkafka), aiokafka and kafka-python: produce records
(keys, values, headers, timestamps; optionally compressed or idempotent), consume them back, ask
for offsets (earliest, latest, by timestamp) and act as consumer-group members. Every call is
bounded in time. What they return is plain data, so a scenario's result on Stratalog compares
with its result on Kafka.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import threading
import time
from collections.abc import Callable, Coroutine, Iterable
from dataclasses import dataclass
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.coordinator.assignors.range import RangePartitionAssignor as AioRange
from aiokafka.structs import OffsetAndMetadata as AioOffsetAndMetadata
from aiokafka.structs import TopicPartition as AioTP
from confluent_kafka import (
    OFFSET_BEGINNING,
    TIMESTAMP_LOG_APPEND_TIME,
    Consumer,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from kafka import KafkaConsumer, KafkaProducer
from kafka import TopicPartition as KpTP
from kafka.coordinator.assignors.range import RangePartitionAssignor as KpRange
from kafka.errors import RebalanceInProgressError as KpRebalanceInProgress
from kafka.structs import OffsetAndMetadata as KpOffsetAndMetadata

KCAT = "/usr/bin/kcat"
CLIENTS = ("kcat", "confluent", "aiokafka", "kafka-python")
CODECS = ("gzip", "snappy", "lz4", "zstd")
CODEC_IDS = {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}
TIMEOUT = 30  # seconds any one client operation may take

Headers = tuple[tuple[str, bytes], ...]


@dataclass(frozen=True)
class Rec:
    partition: int
    key: bytes | None
    value: bytes | None
    headers: Headers = ()
    timestamp: int | None = None  # ms; None: the client stamps it


def consumed(partition, offset, key, value, headers, timestamp, ts_type) -> tuple:
    """One consumed record as plain data."""
    hdrs = tuple((k, bytes(v) if v is not None else None) for k, v in (headers or ()))
    return (partition, offset, key, value, hdrs, timestamp, ts_type)


def records(n: int, partitions: int, base_ts: int | None, *, tag: str = "r") -> list[Rec]:
    """kcat-safe ASCII records (no ':' or newline), spread round-robin over partitions.

    Every third record has a header, every sixth two; one in seven has no key. Timestamps rise
    by 7 ms with one record stamped earlier than its predecessor.
    """
    out = []
    for i in range(n):
        hdrs: Headers = ()
        if i % 3 == 0:
            hdrs = (("idx", str(i).encode()),)
            if i % 6 == 0:
                hdrs += (("origin", b"conformance"),)
        ts = None if base_ts is None else base_ts + 7 * i - (500 if i == 4 else 0)
        key = None if i % 7 == 3 else f"{tag}-k{i:04d}".encode()
        value = f"{tag}-v{i:04d}-{'x' * (i % 13)}".encode()
        out.append(Rec(i % partitions, key, value, hdrs, ts))
    return out


# -- confluent-kafka ------------------------------------------------------------------------------


def _cf_error(err: KafkaError) -> str:
    return err.name()


def cf_produce(bs: str, topic: str, recs: list[Rec], **conf: Any) -> list[Any]:
    """Per record: (partition, offset) on success or the delivery error's name."""
    p = Producer(
        {
            "bootstrap.servers": bs,
            "linger.ms": 5,
            "acks": "all",
            "message.timeout.ms": 15000,
            **conf,
        }
    )
    results: list[Any] = [None] * len(recs)

    def on_delivery(i: int) -> Callable:
        def cb(err, msg):
            results[i] = _cf_error(err) if err is not None else (msg.partition(), msg.offset())

        return cb

    for i, r in enumerate(recs):
        p.produce(
            topic,
            value=r.value,
            key=r.key,
            partition=r.partition,
            headers=list(r.headers) or None,
            timestamp=r.timestamp or 0,
            on_delivery=on_delivery(i),
        )
        p.poll(0)
    assert p.flush(TIMEOUT) == 0, "confluent-kafka producer did not finish"
    return results


def cf_consume(bs: str, topic: str, partitions: int, count: int, **conf: Any) -> list[tuple]:
    c = Consumer(
        {
            "bootstrap.servers": bs,
            "group.id": "cf-reader",
            "enable.auto.commit": False,
            "enable.partition.eof": False,
            **conf,
        }
    )
    out: list[tuple] = []
    try:
        c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
        deadline = time.monotonic() + TIMEOUT
        while len(out) < count and time.monotonic() < deadline:
            for m in c.consume(500, 0.2):
                assert m.error() is None, m.error()
                ts_type, ts = m.timestamp()
                kind = "log-append" if ts_type == TIMESTAMP_LOG_APPEND_TIME else "create"
                out.append(
                    consumed(m.partition(), m.offset(), m.key(), m.value(), m.headers(), ts, kind)
                )
        out.extend(_cf_extra(c))
    finally:
        c.close()
    return sorted(out)


def _cf_extra(c: Consumer) -> list[tuple]:
    """Anything beyond what was expected shows up as an extra record."""
    extra = []
    for m in c.consume(100, 0.3):
        if m.error() is None:
            extra.append(("EXTRA", m.partition(), m.offset()))
    return extra


def cf_offsets(bs: str, topic: str, partition: int, queries: Iterable[int]) -> dict[int, Any]:
    """ListOffsets through librdkafka: -2 earliest, -1 latest, else by timestamp."""
    c = Consumer({"bootstrap.servers": bs, "group.id": "cf-offsets"})
    out: dict[int, Any] = {}
    try:
        for q in queries:
            if q in (-1, -2):
                low, high = c.get_watermark_offsets(TopicPartition(topic, partition), timeout=10)
                out[q] = low if q == -2 else high
            else:
                r = c.offsets_for_times([TopicPartition(topic, partition, q)], timeout=10)[0]
                out[q] = r.error.name() if r.error is not None else r.offset
    finally:
        c.close()
    return out


# -- kafka-python ---------------------------------------------------------------------------------


def kp_produce(bs: str, topic: str, recs: list[Rec], **conf: Any) -> list[Any]:
    p = KafkaProducer(bootstrap_servers=bs, linger_ms=5, acks="all", **conf)
    try:
        futs = [
            p.send(
                topic,
                key=r.key,
                value=r.value,
                headers=list(r.headers),
                partition=r.partition,
                timestamp_ms=r.timestamp,
            )
            for r in recs
        ]
        p.flush(timeout=TIMEOUT)
        out: list[Any] = []
        for f in futs:
            try:
                md = f.get(timeout=TIMEOUT)
                out.append((md.partition, md.offset))
            except Exception as e:
                out.append(type(e).__name__)
        return out
    finally:
        p.close(timeout=10)


def kp_consume(bs: str, topic: str, partitions: int, count: int) -> list[tuple]:
    c = KafkaConsumer(bootstrap_servers=bs, enable_auto_commit=False, auto_offset_reset="earliest")
    out: list[tuple] = []
    try:
        tps = [KpTP(topic, p) for p in range(partitions)]
        c.assign(tps)
        c.seek_to_beginning(*tps)
        deadline = time.monotonic() + TIMEOUT
        while len(out) < count and time.monotonic() < deadline:
            for tp, msgs in c.poll(timeout_ms=200, max_records=1000).items():
                for m in msgs:
                    kind = "log-append" if m.timestamp_type == 1 else "create"
                    out.append(
                        consumed(
                            tp.partition, m.offset, m.key, m.value, m.headers, m.timestamp, kind
                        )
                    )
        for tp, msgs in c.poll(timeout_ms=300).items():
            out.extend(("EXTRA", tp.partition, m.offset) for m in msgs)
    finally:
        c.close()
    return sorted(out)


def kp_offsets(bs: str, topic: str, partition: int, queries: Iterable[int]) -> dict[int, Any]:
    c = KafkaConsumer(bootstrap_servers=bs, request_timeout_ms=10000)
    tp = KpTP(topic, partition)
    out: dict[int, Any] = {}
    try:
        for q in queries:
            if q == -2:
                out[q] = c.beginning_offsets([tp], timeout_ms=10000)[tp]
            elif q == -1:
                out[q] = c.end_offsets([tp], timeout_ms=10000)[tp]
            else:
                r = c.offsets_for_times({tp: q}, timeout_ms=10000)[tp]
                out[q] = None if r is None else (r.offset, r.timestamp)
    finally:
        c.close()
    return out


# -- aiokafka -------------------------------------------------------------------------------------


class AioLoop:
    """An event loop on its own thread, so synchronous scenarios can drive aiokafka objects."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine, timeout: float = TIMEOUT) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


def aio_produce(bs: str, topic: str, recs: list[Rec], **conf: Any) -> list[Any]:
    async def run() -> list[Any]:
        p = AIOKafkaProducer(bootstrap_servers=bs, linger_ms=5, acks="all", **conf)
        await p.start()
        try:
            futs = [
                await p.send(
                    topic,
                    value=r.value,
                    key=r.key,
                    headers=list(r.headers),
                    partition=r.partition,
                    timestamp_ms=r.timestamp,
                )
                for r in recs
            ]
            out: list[Any] = []
            for f in futs:
                try:
                    md = await asyncio.wait_for(f, TIMEOUT)
                    out.append((md.partition, md.offset))
                except Exception as e:
                    out.append(type(e).__name__)
            return out
        finally:
            await p.stop()

    return asyncio.run(run())


def aio_consume(bs: str, topic: str, partitions: int, count: int) -> list[tuple]:
    async def run() -> list[tuple]:
        c = AIOKafkaConsumer(bootstrap_servers=bs, enable_auto_commit=False)
        await c.start()
        out: list[tuple] = []
        try:
            tps = [AioTP(topic, p) for p in range(partitions)]
            c.assign(tps)
            await c.seek_to_beginning(*tps)
            deadline = time.monotonic() + TIMEOUT
            while len(out) < count and time.monotonic() < deadline:
                batch = await c.getmany(timeout_ms=200, max_records=1000)
                for tp, msgs in batch.items():
                    for m in msgs:
                        kind = "log-append" if m.timestamp_type == 1 else "create"
                        out.append(
                            consumed(
                                tp.partition, m.offset, m.key, m.value, m.headers, m.timestamp, kind
                            )
                        )
            for tp, msgs in (await c.getmany(timeout_ms=300)).items():
                out.extend(("EXTRA", tp.partition, m.offset) for m in msgs)
        finally:
            await c.stop()
        return sorted(out)

    return asyncio.run(run())


def aio_offsets(bs: str, topic: str, partition: int, queries: Iterable[int]) -> dict[int, Any]:
    async def run() -> dict[int, Any]:
        c = AIOKafkaConsumer(bootstrap_servers=bs, request_timeout_ms=10000)
        await c.start()
        tp = AioTP(topic, partition)
        out: dict[int, Any] = {}
        try:
            for q in queries:
                if q == -2:
                    out[q] = (await c.beginning_offsets([tp]))[tp]
                elif q == -1:
                    out[q] = (await c.end_offsets([tp]))[tp]
                else:
                    r = (await c.offsets_for_times({tp: q}))[tp]
                    out[q] = None if r is None else (r.offset, r.timestamp)
        finally:
            await c.stop()
        return out

    return asyncio.run(run())


# -- kcat -----------------------------------------------------------------------------------------


def _kcat(args: list[str], *, stdin: str | None = None, timeout: float = TIMEOUT) -> str:
    res = subprocess.run(
        [KCAT, *args], input=stdin, capture_output=True, text=True, timeout=timeout
    )
    assert res.returncode == 0, f"kcat {' '.join(args)} failed: {res.stderr}"
    return res.stdout


def kcat_produce(bs: str, topic: str, recs: list[Rec], **conf: Any) -> list[Any]:
    """kcat -P, one run per run of records with the same partition and headers.

    kcat cannot set per-record timestamps, headers or null keys per line, so records are grouped;
    keyless records are sent with an empty key. Returns no per-record offsets (kcat prints none).
    """
    extra: list[str] = []
    for k, v in conf.items():
        if k == "compression":
            extra += ["-z", v]
        else:
            extra += ["-X", f"{k}={v}"]
    groups: list[tuple[int, Headers, list[Rec]]] = []
    for r in recs:
        if groups and groups[-1][0] == r.partition and groups[-1][1] == r.headers:
            groups[-1][2].append(r)
        else:
            groups.append((r.partition, r.headers, [r]))
    for partition, headers, group in groups:
        hdr_args = [a for name, val in headers for a in ("-H", f"{name}={val.decode()}")]
        lines = "".join(f"{(r.key or b'').decode()}:{(r.value or b'').decode()}\n" for r in group)
        _kcat(
            ["-P", "-b", bs, "-t", topic, "-p", str(partition), "-K:", *hdr_args, *extra],
            stdin=lines,
        )
    return []


def kcat_records(recs: list[Rec]) -> list[Rec]:
    """What kcat actually sends for ``recs``: empty keys for null ones, its own timestamps."""
    return [Rec(r.partition, r.key or b"", r.value, r.headers, None) for r in recs]


def kcat_consume(bs: str, topic: str, partitions: int, count: int) -> list[tuple]:
    out_text = _kcat(["-C", "-b", bs, "-t", topic, "-o", "beginning", "-e", "-J", "-q"])
    out = []
    for line in out_text.splitlines():
        m = json.loads(line)
        h = m.get("headers") or []
        hdrs = tuple((h[i], h[i + 1].encode()) for i in range(0, len(h), 2))
        key = m["key"].encode() if m["key"] is not None else None
        value = m["payload"].encode() if m["payload"] is not None else None
        kind = "log-append" if m["tstype"] == "logappend" else m["tstype"]
        out.append(consumed(m["partition"], m["offset"], key, value, hdrs, m["ts"], kind))
    return sorted(out)


def kcat_offsets(bs: str, topic: str, partition: int, queries: Iterable[int]) -> dict[int, Any]:
    out: dict[int, Any] = {}
    for q in queries:
        text = _kcat(["-Q", "-b", bs, "-t", f"{topic}:{partition}:{q}"]).strip()
        # "<topic> [<partition>] offset <n>" (with ": <error>" appended on failure)
        out[q] = int(text.split(" offset ", 1)[1].split(":")[0])
    return out


PRODUCE = {
    "kcat": kcat_produce,
    "confluent": cf_produce,
    "aiokafka": aio_produce,
    "kafka-python": kp_produce,
}
CONSUME = {
    "kcat": kcat_consume,
    "confluent": cf_consume,
    "aiokafka": aio_consume,
    "kafka-python": kp_consume,
}
OFFSETS = {
    "kcat": kcat_offsets,
    "confluent": cf_offsets,
    "aiokafka": aio_offsets,
    "kafka-python": kp_offsets,
}


def produce_conf(client: str, *, compression: str | None = None, idempotent: bool = False):
    """Client-specific producer settings for compression and idempotence."""
    conf: dict[str, Any] = {}
    if client == "kcat":
        if compression:
            conf["compression"] = compression
        if idempotent:
            conf["enable.idempotence"] = "true"
    elif client == "confluent":
        if compression:
            conf["compression.type"] = compression
        if idempotent:
            conf["enable.idempotence"] = True
    else:
        if compression:
            conf["compression_type"] = compression
        if idempotent:
            conf["enable_idempotence"] = True
    return conf


# -- consumer-group members -----------------------------------------------------------------------

GROUP_TIMING = {"session": 6000, "heartbeat": 300}


class CfMember:
    def __init__(self, bs: str, group: str, topic: str, client_id: str) -> None:
        self.topic = topic
        self.c = Consumer(
            {
                "bootstrap.servers": bs,
                "group.id": group,
                "client.id": client_id,
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
                "session.timeout.ms": GROUP_TIMING["session"],
                "heartbeat.interval.ms": GROUP_TIMING["heartbeat"],
                "partition.assignment.strategy": "range",
                "enable.partition.eof": False,
            }
        )
        self.c.subscribe([topic])

    def poll(self) -> list[tuple[int, int]]:
        got = []
        for m in self.c.consume(100, 0.05):
            if m.error() is None:
                got.append((m.partition(), m.offset()))
        return got

    def assignment(self) -> frozenset[int]:
        return frozenset(tp.partition for tp in self.c.assignment())

    def commit(self, offsets: dict[int, int]) -> None:
        self.c.commit(
            offsets=[TopicPartition(self.topic, p, o) for p, o in offsets.items()],
            asynchronous=False,
        )

    def committed(self, partitions: Iterable[int]) -> dict[int, int]:
        tps = self.c.committed([TopicPartition(self.topic, p) for p in partitions], timeout=10)
        return {tp.partition: tp.offset for tp in tps}

    def close(self) -> None:
        with contextlib.suppress(RuntimeError, KafkaException):
            self.c.close()


class KpMember:
    def __init__(self, bs: str, group: str, topic: str, client_id: str) -> None:
        self.topic = topic
        self.c = KafkaConsumer(
            bootstrap_servers=bs,
            group_id=group,
            client_id=client_id,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            session_timeout_ms=GROUP_TIMING["session"],
            heartbeat_interval_ms=GROUP_TIMING["heartbeat"],
            # The rebalance timeout: a rejoin that waits on a member starved of CPU (a loaded CI
            # machine) ends within seconds instead of Kafka's default five minutes.
            max_poll_interval_ms=15000,
            partition_assignment_strategy=[KpRange],
            # A stale cache is refreshed within a second, and a changed one triggers a rejoin.
            metadata_max_age_ms=1000,
        )
        # The leader assigns from its own metadata cache: one that does not know the new topic
        # yet assigns nothing ("No partition metadata") until its next refresh, minutes later.
        deadline = time.monotonic() + 30
        while not self.c.partitions_for_topic(topic) and time.monotonic() < deadline:
            time.sleep(0.05)
        self.c.subscribe([topic])
        # kafka-python 3.0's group leader that assigned from an empty metadata snapshot (one
        # taken before the subscription's first refresh) rejoins once the snapshot fills; a
        # poll() that times out during that rejoin leaves the member unjoined for good (the
        # rejoin was never recorded as needed, so no later poll finishes it: its heartbeats
        # stop, the session expires, and every commit says a rebalance is under way). Seen
        # against Apache Kafka and Stratalog alike under load; the first poll waits for it.
        coordinator = getattr(self.c, "_coordinator", None)
        deadline = time.monotonic() + 10
        while (
            coordinator is not None
            and not getattr(coordinator, "_metadata_snapshot", {topic: 1}).get(topic)
            and time.monotonic() < deadline
        ):
            time.sleep(0.05)

    def poll(self) -> list[tuple[int, int]]:
        got = []
        for tp, msgs in self.c.poll(timeout_ms=50).items():
            got.extend((tp.partition, m.offset) for m in msgs)
        return got

    def assignment(self) -> frozenset[int]:
        return frozenset(tp.partition for tp in self.c.assignment())

    def commit(self, offsets: dict[int, int]) -> None:
        # kafka-python refuses to commit while it believes a rebalance is under way (seen against
        # Apache Kafka too); its documented remedy is to poll until the group is stable and retry.
        deadline = time.monotonic() + 60
        meta = {KpTP(self.topic, p): KpOffsetAndMetadata(o, "", -1) for p, o in offsets.items()}
        while True:
            try:
                self.c.commit(meta)
                return
            except KpRebalanceInProgress:
                if time.monotonic() > deadline:
                    raise
                self.c.poll(timeout_ms=100)

    def committed(self, partitions: Iterable[int]) -> dict[int, int]:
        out = {}
        for p in partitions:
            o = self.c.committed(KpTP(self.topic, p))
            out[p] = -1001 if o is None else o  # librdkafka's "invalid offset", for comparison
        return out

    def close(self) -> None:
        self.c.close()


class AioMember:
    def __init__(self, bs: str, group: str, topic: str, client_id: str) -> None:
        self.topic = topic
        self.loop = AioLoop()

        async def start() -> AIOKafkaConsumer:
            c = AIOKafkaConsumer(
                topic,
                bootstrap_servers=bs,
                group_id=group,
                client_id=client_id,
                enable_auto_commit=False,
                auto_offset_reset="earliest",
                session_timeout_ms=GROUP_TIMING["session"],
                heartbeat_interval_ms=GROUP_TIMING["heartbeat"],
                partition_assignment_strategy=(AioRange,),
            )
            await c.start()
            return c

        self.c = self.loop.run(start())

    def poll(self) -> list[tuple[int, int]]:
        batch = self.loop.run(self.c.getmany(timeout_ms=50))
        return [(tp.partition, m.offset) for tp, msgs in batch.items() for m in msgs]

    def assignment(self) -> frozenset[int]:
        return frozenset(tp.partition for tp in self.c.assignment())

    def commit(self, offsets: dict[int, int]) -> None:
        self.loop.run(
            self.c.commit(
                {AioTP(self.topic, p): AioOffsetAndMetadata(o, "") for p, o in offsets.items()}
            )
        )

    def committed(self, partitions: Iterable[int]) -> dict[int, int]:
        out = {}
        for p in partitions:
            o = self.loop.run(self.c.committed(AioTP(self.topic, p)))
            out[p] = -1001 if o is None else o
        return out

    def close(self) -> None:
        try:
            self.loop.run(self.c.stop())
        finally:
            self.loop.close()


MEMBERS = {"confluent": CfMember, "kafka-python": KpMember, "aiokafka": AioMember}
