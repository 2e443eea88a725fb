"""The "stratalog" Spark sink, batch and streaming, writing each record exactly once.

Every write task is an idempotent producer whose id is *derived* from what it writes: the
query id, the micro-batch id and the task's partition (streaming), or the write job and the
partition (batch). It numbers its batches per target partition from sequence 0. A retried task
or a micro-batch re-run after a crash repeats the same records under the same id and
sequences, and the broker answers the ones it already has as duplicates without appending them
again (see storage/producer_state.py, DETERMINISTIC_PRODUCER_IDS). Records with a null key go
round-robin in a fixed order and keyed records follow Kafka's murmur2 partitioner, so a re-run
sends every record to the same partition as the first run.

All of that needs a re-run to see its rows in the same order: true without a shuffle (a
topic-to-topic pipeline) or with sorted data, not after a shuffle whose order varies. The broker
checks: a repeat that holds other rows than the first run wrote under those sequences is refused
(INVALID_RECORD), and this sink writes the rest of that partition under a fresh producer id, at
least once, rather than dropping rows the first run never wrote. With
``exactlyOnce=sorted`` a task first orders its rows by what it writes (topic, partition, key,
timestamp, value, headers), as the JVM sink has Spark do: any order of the same rows becomes the
same records under the same sequences. The Python Data Source API has no way to ask Spark for
that sort, so this sink holds the task's rows in memory to sort them, up to
``exactlyOnce.maxTaskBytes``. ``exactlyOnce=false`` gives each attempt a producer id of its own:
at least once, as Spark's Kafka sink.
"""

from __future__ import annotations

import hashlib
import logging
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import StructType

from stratalog.client.partitioner import kafka_partition
from stratalog.client.security import ClientSecurity
from stratalog.client.wire import WireClient, WireError
from stratalog.protocol.errors import code
from stratalog.records import build_batch
from stratalog.spark.options import FAIL_OPTION, OptionError, SinkOptions, parse_sink_options
from stratalog.storage.producer_state import DETERMINISTIC_PRODUCER_IDS

BATCH_RECORDS = 5000
OUT_OF_ORDER_SEQUENCE = 45
INVALID_RECORD = 87
BATCH_BYTES = 512 * 1024
log = logging.getLogger(__name__)


def derived_producer_id(*parts: object) -> int:
    digest = hashlib.sha256("\x1f".join(map(str, parts)).encode()).digest()
    return DETERMINISTIC_PRODUCER_IDS | (
        int.from_bytes(digest[:8], "big") & (DETERMINISTIC_PRODUCER_IDS - 1)
    )


@dataclass
class WriteResult(WriterCommitMessage):
    records: int
    duplicates: int


# Column -> the types Spark's Kafka sink accepts for it. Names match exactly, as in Spark's sink:
# a "KEY" column is just another column.
_COLUMN_TYPES = {
    "topic": ("string",),
    "key": ("string", "binary"),
    "value": ("string", "binary"),
    "partition": ("int",),
    "headers": ("array<struct<key:string,value:binary>>",),
}


def check_schema(schema: StructType, topic_option: str | None) -> None:
    names = {f.name: f for f in schema.fields}
    if "value" not in names:
        raise OptionError("required attribute 'value' not found in the data to write")
    if topic_option is None and "topic" not in names:
        raise OptionError(
            "topic option required when no 'topic' attribute is present; use the 'topic' option"
            " or a 'topic' column"
        )
    for col, allowed in _COLUMN_TYPES.items():
        if col in names:
            got = names[col].dataType.simpleString()
            if got not in allowed:
                raise OptionError(
                    f"{col} attribute unsupported type {got}. {col} must be a(n) "
                    f"{' or '.join(allowed)}"
                )


class _TaskWriter:
    """One task's producer: buffers per target partition, exact sequences, acks=all."""

    def __init__(
        self,
        bootstrap: str,
        topic_option: str | None,
        producer_id: int,
        fail_after: int | None = None,
        security: ClientSecurity | None = None,
    ) -> None:
        self.client = WireClient(bootstrap, client_id="stratalog-spark-writer", security=security)
        self.topic_option = topic_option
        self.producer_id = producer_id
        self.fail_after = fail_after
        self.partitions: dict[str, int] = {}
        self.buffers: dict[tuple[str, int], list] = {}
        self.buffer_bytes: dict[tuple[str, int], int] = {}
        self.sequence: dict[tuple[str, int], int] = {}
        self.round_robin: dict[str, int] = {}
        # Target partitions where a re-run found other rows under sequences it repeats: their
        # rows go on under a producer id of their own, from the sequence where that was found.
        self.fallback: dict[tuple[str, int], tuple[int, int]] = {}
        self.written = 0
        self.duplicates = 0

    def _partition_count(self, topic: str) -> int:
        n = self.partitions.get(topic)
        if n is None:
            # As a Kafka producer asks: a broker with auto.create.topics.enable creates it.
            info = self.client.metadata([topic], allow_auto_create=True).get(topic)
            for _ in range(50):
                if info is None or info.error_code != code("LEADER_NOT_AVAILABLE"):
                    break
                time.sleep(0.1)  # just created: its partitions are being set up
                info = self.client.metadata([topic]).get(topic)
            if info is None or info.error_code:
                raise WireError(f"topic {topic!r} does not exist")
            n = self.partitions[topic] = info.partitions
        return n

    def add_arrow(self, batch: pa.RecordBatch) -> None:
        cols = {name: batch.column(i) for i, name in enumerate(batch.schema.names)}
        n = batch.num_rows
        values = _as_bytes(cols["value"])
        keys = _as_bytes(cols["key"]) if "key" in cols else [None] * n
        topics = cols["topic"].to_pylist() if "topic" in cols and not self.topic_option else None
        parts = cols["partition"].to_pylist() if "partition" in cols else [None] * n
        headers = cols["headers"].to_pylist() if "headers" in cols else None
        stamps = _millis(cols["timestamp"]) if _event_time(batch) else None
        now = int(time.time() * 1000)
        for i in range(n):
            topic = self.topic_option or (topics[i] if topics else None)
            if not topic:
                raise OptionError("null topic present in the data; set the 'topic' option")
            count = self._partition_count(topic)
            p = parts[i]
            if p is None:
                key = keys[i]
                if key is None:
                    rr = self.round_robin.get(topic, 0)
                    self.round_robin[topic] = rr + 1
                    p = rr % count
                else:
                    p = kafka_partition(key, count)
            elif not 0 <= p < count:
                raise WireError(f"partition {p} does not exist in {topic} ({count} partitions)")
            hdrs = (
                # A null header name is written empty, as the JVM sink writes it.
                [(h["key"] or "", h["value"]) for h in headers[i]] if headers and headers[i] else []
            )
            ts = stamps[i] if stamps is not None and stamps[i] is not None else now
            tp = (topic, p)
            buf = self.buffers.setdefault(tp, [])
            buf.append((keys[i], values[i], ts, hdrs))
            size = self.buffer_bytes.get(tp, 0) + len(values[i] or b"") + len(keys[i] or b"")
            self.buffer_bytes[tp] = size
            if len(buf) >= BATCH_RECORDS or size >= BATCH_BYTES:
                self._send(tp)

    def _send(self, tp: tuple[str, int]) -> None:
        recs = self.buffers.pop(tp, None)
        self.buffer_bytes.pop(tp, None)
        if not recs:
            return
        seq = self.sequence.get(tp, 0)
        self._produce(tp, recs, seq)
        self.sequence[tp] = seq + len(recs)

    def _produce(self, tp: tuple[str, int], recs: list, seq: int) -> None:
        producer_id, first = self.fallback.get(tp, (self.producer_id, 0))
        raw = build_batch(
            [(k, v, ts) for k, v, ts, _ in recs],
            headers=[h for *_, h in recs] if any(h for *_, h in recs) else None,
            producer_id=producer_id,
            producer_epoch=0,
            base_sequence=seq - first,
        )
        topic, p = tp
        err, base = self.client.produce(topic, {p: raw}, acks=-1)[p]
        if err == INVALID_RECORD and tp not in self.fallback:
            # An earlier attempt wrote other rows under these sequences: this re-run sees its
            # rows in another order (a shuffle). Which of its rows are in the log already cannot
            # be told from the sequences any more, so from here on this partition's rows go out
            # under a fresh producer id: some may be written twice, none is lost (at least once,
            # as Spark's own sink; exactlyOnce=sorted avoids this).
            log.warning(
                "%s-%d: a re-run of this write task sees its rows in another order; writing "
                "the rest at least once from sequence %d (exactlyOnce=sorted keeps it exact)",
                topic,
                p,
                seq,
            )
            self.fallback[tp] = (derived_producer_id("fallback", uuid.uuid4()), seq)
            self._produce(tp, recs, seq)
            return
        if err == OUT_OF_ORDER_SEQUENCE and len(recs) > 1:
            # An earlier attempt of this task stopped part-way through this batch: the broker
            # has its head but not its tail. Halve until every piece is either wholly written
            # before (a duplicate) or wholly new (next in sequence); left first keeps order.
            mid = len(recs) // 2
            self._produce(tp, recs[:mid], seq)
            self._produce(tp, recs[mid:], seq + mid)
            return
        if err:
            raise WireError(f"produce to {topic}-{p} failed with error {err}", err)
        if base < 0:
            self.duplicates += len(recs)  # written by an earlier attempt
        else:
            self.written += len(recs)
        acked = self.written + self.duplicates
        if self.fail_after and acked >= self.fail_after:
            raise RuntimeError(f"injected failure ({FAIL_OPTION}) after {acked} acked records")

    def finish(self) -> WriteResult:
        try:
            for tp in sorted(self.buffers):
                self._send(tp)
        finally:
            self.client.close()
        return WriteResult(self.written, self.duplicates)


def _as_bytes(col: pa.Array) -> list:
    if pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
        return [None if v is None else v.encode() for v in col.to_pylist()]
    return col.to_pylist()


def _millis(col: pa.Array) -> list:
    # Rounded down to the millisecond, as the JVM sink does (floorDiv of Spark's microseconds).
    micros = col.cast(pa.timestamp("us", tz="UTC")).cast(pa.int64()).to_pylist()
    return [None if v is None else v // 1000 for v in micros]


def _event_time(batch: pa.RecordBatch) -> bool:
    """Whether the rows carry a ``timestamp`` column the sinks write as CreateTime: Spark's
    TimestampType only (an Arrow timestamp with a time zone), as in the JVM sink; a column of
    another type by that name is neither written nor sorted by."""
    i = batch.schema.get_field_index("timestamp")
    if i < 0:
        return False
    t = batch.schema.field(i).type
    return pa.types.is_timestamp(t) and t.tz is not None


# The columns a record is made of, in the order both sinks sort a task's rows by.
ORDER_COLUMNS = ("topic", "partition", "key", "timestamp", "value", "headers")


def _order_key(value: bytes | None) -> bytes:
    """An encoding whose byte order is the order of the values (a prefix sorts first)."""
    if value is None:
        return b"\x00\x00"  # null first, as Spark's ascending sort
    return value.replace(b"\x00", b"\x00\xff") + b"\x00\x01"


def _headers_order(col: pa.Array) -> pa.Array:
    """Headers as binary that sorts as Spark sorts array<struct<key, value>>."""
    out: list[bytes | None] = []
    for hs in col.to_pylist():
        if hs is None:
            out.append(None)
            continue
        parts = []
        for h in hs:
            k = h["key"]
            parts.append(_order_key(None if k is None else k.encode()) + _order_key(h["value"]))
        out.append(b"".join(parts))
    return pa.array(out, pa.binary())


def ordered(batches: Iterator[pa.RecordBatch], max_bytes: int) -> list[pa.RecordBatch]:
    """The task's rows sorted by what is written (exactlyOnce=sorted), so a re-run sends the
    same records."""
    held: list[pa.RecordBatch] = []
    size = 0
    for b in batches:
        size += b.nbytes
        if size > max_bytes:
            raise OptionError(
                f'a write task of format("stratalog-python") holds its rows in memory to order '
                f"them for exactly-once, and this task has more than {max_bytes} bytes "
                '(option exactlyOnce.maxTaskBytes); write with format("stratalog"), whose sort '
                "Spark spills to disk, split the data into more partitions (in a stream, bound "
                "each micro-batch with the source's maxOffsetsPerTrigger), or sort the data "
                "yourself and use exactlyOnce=true"
            )
        held.append(b)
    if not held:
        return []
    table = pa.Table.from_batches(held)
    keys = []
    for name in ORDER_COLUMNS:
        if name not in table.schema.names:
            continue
        if name == "timestamp" and not _event_time(held[0]):
            continue
        if name == "headers":
            table = table.append_column("__headers_order", _headers_order(table["headers"]))
            name = "__headers_order"
        keys.append((name, "ascending", "at_start"))  # nulls first, as Spark's ascending
    order = pc.sort_indices(table, sort_keys=keys)
    table = table.take(order)
    if "__headers_order" in table.schema.names:
        table = table.drop_columns(["__headers_order"])
    return table.to_batches(max_chunksize=BATCH_RECORDS)


def _write(opts: SinkOptions, producer_id: int, batches: Iterator[pa.RecordBatch]) -> WriteResult:
    from pyspark import TaskContext

    ctx = TaskContext.get()
    attempt = ctx.attemptNumber() if ctx is not None else 0
    if opts.sorted:
        batches = iter(ordered(batches, opts.max_task_bytes))
    elif not opts.exactly_once:
        producer_id = derived_producer_id("attempt", uuid.uuid4())
    fail_after = opts.fail_after_records if attempt < opts.fail_attempts else None
    w = _TaskWriter(opts.bootstrap, opts.topic, producer_id, fail_after, opts.security)
    try:
        for b in batches:
            w.add_arrow(b)
    except BaseException:
        w.client.close()
        raise
    return w.finish()


def _task_partition() -> int:
    from pyspark import TaskContext

    ctx = TaskContext.get()
    return ctx.partitionId() if ctx is not None else 0


class StratalogBatchWriter(DataSourceArrowWriter):
    def __init__(self, options, schema: StructType) -> None:
        self.opts = parse_sink_options(options)
        check_schema(schema, self.opts.topic)
        self.job = str(uuid.uuid4())  # made on the driver: the same for every task attempt

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriteResult:
        pid = derived_producer_id("batch", self.job, _task_partition())
        return _write(self.opts, pid, iterator)

    def commit(self, messages: list) -> None:
        return None

    def abort(self, messages: list) -> None:
        return None


class StratalogStreamWriter(DataSourceStreamArrowWriter):
    def __init__(self, options, schema: StructType) -> None:
        self.opts = parse_sink_options(options)
        check_schema(schema, self.opts.topic)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriteResult:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        query = ctx.getLocalProperty("sql.streaming.queryId") if ctx else None
        batch = ctx.getLocalProperty("streaming.sql.batchId") if ctx else None
        if query is None or batch is None:
            raise WireError("the stratalog stream sink needs Spark's query and batch ids")
        pid = derived_producer_id("stream", query, batch, _task_partition())
        return _write(self.opts, pid, iterator)

    def commit(self, messages: list, batchId: int) -> None:
        return None

    def abort(self, messages: list, batchId: int) -> None:
        return None
