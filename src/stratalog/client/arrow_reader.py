"""Raw record batches to Arrow columns, with the schema of Spark's Kafka source.

Batches are fetched as stored (no per-record objects on the broker or in librdkafka) and
decoded here. The fast path is this package's native decoder (``_columns.c``), which writes keys,
values, offsets and timestamps straight into Arrow buffers without a Python object per record;
compressed batches are decompressed first. Headers, and a build without a C
compiler, take the general path: aiokafka's Cython record decoder (pinned) into Python lists,
then Arrow in bulk, with a pure-Python decoder as the last resort.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from stratalog.client.colocated import ColocatedPartition, find
from stratalog.client.committed import committed_batches
from stratalog.client.wire import WireClient, WireError
from stratalog.records import uncompressed_batches

try:
    from stratalog.client import _columns as _native
except ImportError:  # pragma: no cover - built without a C compiler
    _native = None

try:  # aiokafka's private module path; wrapped here so a change breaks only this file
    from aiokafka.record._crecords import MemoryRecords as _MemoryRecords
except ImportError:  # pragma: no cover
    _MemoryRecords = None

HEADER_TYPE = pa.list_(
    pa.field("element", pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())]))
)


def kafka_schema(include_headers: bool = False) -> pa.Schema:
    """Spark's Kafka source schema, as Arrow (Spark's own mapping: int -> int32, timestamp ->
    timestamp[us, UTC], all nullable)."""
    fields = [
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("topic", pa.string()),
        pa.field("partition", pa.int32()),
        pa.field("offset", pa.int64()),
        pa.field("timestamp", pa.timestamp("us", tz="UTC")),
        pa.field("timestampType", pa.int32()),
    ]
    if include_headers:
        fields.append(pa.field("headers", HEADER_TYPE))
    return pa.schema(fields)


@dataclass
class _Columns:
    keys: list
    values: list
    offsets: list
    timestamps: list
    types: list
    headers: list | None
    producers: list | None  # (producer id, sequence) per record, for time-ordered replay

    @classmethod
    def empty(cls, headers: bool, producers: bool = False) -> _Columns:
        return cls([], [], [], [], [], [] if headers else None, [] if producers else None)

    def __len__(self) -> int:
        return len(self.offsets)


class ArrowDecoder:
    """Accumulates records of one topic-partition in [start, end) and emits RecordBatches."""

    def __init__(
        self,
        topic: str,
        partition: int,
        include_headers: bool = False,
        include_producer: bool = False,
    ) -> None:
        self.topic = topic
        self.partition = partition
        self.include_headers = include_headers
        self.include_producer = include_producer
        self.schema = kafka_schema(include_headers)
        if include_producer:
            self.schema = self.schema.append(pa.field("producerId", pa.int64())).append(
                pa.field("sequence", pa.int64())
            )
        self._cols = _Columns.empty(include_headers, include_producer)
        # Decoded pieces in offset order, joined by flush(); the native path adds one per call.
        self._chunks: list[pa.RecordBatch] = []
        self._rows = 0
        self.native = _native is not None and not include_headers

    def __len__(self) -> int:
        return self._rows + len(self._cols)

    def add(self, raw: bytes | bytearray | memoryview, start: int, end: int) -> int:
        """Decode the batches in ``raw``; keep records with start <= offset < end.

        Returns the offset after the last record seen (where the next fetch starts), or
        ``start`` if ``raw`` held no complete batch.
        """
        if self.native:
            try:
                return self._add_native(raw, start, end)
            except NotImplementedError:
                pass  # a magic other than 2: the general path below reads it
            nxt = self._add_general(raw, start, end)
            if len(self._cols):
                self._rows += len(self._cols)
                self._chunks.append(self._columns_batch())
            return nxt
        return self._add_general(raw, start, end)

    def _add_native(self, raw: bytes | bytearray | memoryview, start: int, end: int) -> int:
        try:
            out = _native.decode(raw, start, end, self.include_producer)
        except NotImplementedError:
            out = _native.decode(uncompressed_batches(raw), start, end, self.include_producer)
        nxt, n, kv, ko, kd, vv, vo, vd, offs, ts, types, kn, vn, pids, seqs = out
        if n:
            buf = pa.py_buffer
            arrays = [
                pa.Array.from_buffers(
                    pa.binary(), n, [kv and buf(kv), buf(ko), buf(kd)], null_count=kn
                ),
                pa.Array.from_buffers(
                    pa.binary(), n, [vv and buf(vv), buf(vo), buf(vd)], null_count=vn
                ),
                pa.repeat(pa.scalar(self.topic, pa.string()), n),
                pa.repeat(pa.scalar(self.partition, pa.int32()), n),
                pa.Array.from_buffers(pa.int64(), n, [None, buf(offs)]),
                pa.Array.from_buffers(pa.timestamp("us", tz="UTC"), n, [None, buf(ts)]),
                pa.Array.from_buffers(pa.int32(), n, [None, buf(types)]),
            ]
            if self.include_producer:
                arrays.append(pa.Array.from_buffers(pa.int64(), n, [None, buf(pids)]))
                arrays.append(pa.Array.from_buffers(pa.int64(), n, [None, buf(seqs)]))
            self._chunks.append(pa.RecordBatch.from_arrays(arrays, schema=self.schema))
            self._rows += n
        return nxt

    def _add_general(self, raw: bytes | bytearray | memoryview, start: int, end: int) -> int:
        if _MemoryRecords is None:
            return self._add_python(raw, start, end)
        c = self._cols
        nxt = start
        mr = _MemoryRecords(raw if isinstance(raw, bytes) else bytes(raw))
        while True:
            batch = mr.next_batch()
            if batch is None:
                break
            last = batch.next_offset - 1
            if last < start:
                nxt = max(nxt, last + 1)
                continue
            if batch.is_control_batch:
                nxt = max(nxt, last + 1)
                continue
            recs = list(batch)
            if recs[0].offset < start or recs[-1].offset >= end:
                recs = [r for r in recs if start <= r.offset < end]
            if recs:
                ttype = batch.timestamp_type
                c.keys.extend([r.key for r in recs])
                c.values.extend([r.value for r in recs])
                c.offsets.extend([r.offset for r in recs])
                c.timestamps.extend([r.timestamp for r in recs])
                c.types.extend([ttype] * len(recs))
                if c.producers is not None:
                    pid, seq, base = batch.producer_id, batch.base_sequence, batch.base_offset
                    c.producers.extend(
                        [(pid, seq + r.offset - base if seq >= 0 else -1) for r in recs]
                    )
                if c.headers is not None:
                    # As Spark's Kafka source: null, not an empty array, when there are none.
                    c.headers.extend(
                        [
                            [{"key": k, "value": v} for k, v in r.headers] if r.headers else None
                            for r in recs
                        ]
                    )
            nxt = max(nxt, last + 1)
            if last + 1 >= end:
                break
        return nxt

    def _add_python(self, raw: bytes, start: int, end: int) -> int:
        from stratalog.records import iter_records
        from stratalog.storage.batch import LOG_OVERHEAD, parse_header

        c = self._cols
        raw = bytes(raw)  # keys and values are slices kept past this call: not views of raw
        pos = 0
        nxt = start
        while pos + 61 <= len(raw):
            h = parse_header(raw, pos)
            if pos + h.size > len(raw):
                break
            batch = raw[pos : pos + h.size]
            pos += h.batch_length + LOG_OVERHEAD
            nxt = max(nxt, h.last_offset + 1)
            if h.last_offset < start or h.is_control:
                continue
            for r in iter_records(batch, h):
                if start <= r.offset < end:
                    c.keys.append(r.key)
                    c.values.append(r.value)
                    c.offsets.append(r.offset)
                    c.timestamps.append(r.timestamp)
                    c.types.append(1 if h.is_log_append_time else 0)
                    if c.producers is not None:
                        seq = h.base_sequence + r.offset - h.base_offset
                        c.producers.append((h.producer_id, seq if h.base_sequence >= 0 else -1))
                    if c.headers is not None:
                        c.headers.append(
                            [{"key": k, "value": v} for k, v in r.headers] if r.headers else None
                        )
        return nxt

    def flush(self) -> pa.RecordBatch:
        """The records gathered so far as one RecordBatch (then starts afresh)."""
        chunks = self.drain()
        if not chunks:
            return self._columns_batch()
        if len(chunks) == 1:
            return chunks[0]
        return pa.Table.from_batches(chunks, self.schema).combine_chunks().to_batches()[0]

    def drain(self) -> list[pa.RecordBatch]:
        """The records gathered so far as RecordBatches in offset order, without joining them
        (joining copies every value once more); then starts afresh."""
        if len(self._cols):
            self._chunks.append(self._columns_batch())
        chunks, self._chunks, self._rows = self._chunks, [], 0
        return chunks

    def _columns_batch(self) -> pa.RecordBatch:
        """The records gathered by the general path as one RecordBatch (then starts afresh)."""
        c = self._cols
        n = len(c)
        ts = pa.array(c.timestamps, pa.int64())
        arrays = [
            pa.array(c.keys, pa.binary()),
            pa.array(c.values, pa.binary()),
            pa.array([self.topic] * n, pa.string()) if n else pa.array([], pa.string()),
            pa.array([self.partition] * n, pa.int32()),
            pa.array(c.offsets, pa.int64()),
            pc.multiply(ts, 1000).cast(pa.timestamp("us", tz="UTC")),
            pa.array(c.types, pa.int32()),
        ]
        if c.headers is not None:
            arrays.append(pa.array(c.headers, HEADER_TYPE))
        if c.producers is not None:
            arrays.append(pa.array([p for p, _ in c.producers], pa.int64()))
            arrays.append(pa.array([q for _, q in c.producers], pa.int64()))
        self._cols = _Columns.empty(self.include_headers, self.include_producer)
        return pa.RecordBatch.from_arrays(arrays, schema=self.schema)


def read_partition(
    client: WireClient,
    topic: str,
    partition: int,
    start: int,
    end: int,
    *,
    include_headers: bool = False,
    include_producer: bool = False,
    rows_per_batch: int = 50_000,
    fetch_bytes: int = 8 * 1024 * 1024,
    read_committed: bool = False,
    colocated: bool | ColocatedPartition = False,
) -> Iterator[pa.RecordBatch]:
    """Arrow batches of the records of one partition with start <= offset < end; with
    ``read_committed``, those of aborted transactions left out (their offsets are gaps, as
    transaction markers are). With ``colocated`` the partition is read from its leader's files
    when the leader runs on this host (client/colocated.py), through Fetch otherwise and for
    whatever the files do not hold (the cold tier); read_committed always fetches."""
    dec = ArrowDecoder(topic, partition, include_headers, include_producer)
    local: ColocatedPartition | None = None
    if isinstance(colocated, ColocatedPartition):
        local = colocated
    elif colocated and not read_committed:
        local = find(client, topic, partition, read_ahead=True)
    try:
        offset = start
        while offset < end:
            if local is not None:
                got = local.read(offset, fetch_bytes)
                if got is not None and got.records:
                    nxt = max(dec.add(got.records, offset, end), got.next_offset)
                    offset = nxt
                    if len(dec) >= rows_per_batch:
                        yield from dec.drain()
                    continue
                # Not here (cold tier, a stale or withdrawn slot) or past its end: ask Fetch.
            data = client.fetch(
                topic,
                {partition: offset},
                partition_max_bytes=fetch_bytes,
                max_bytes=fetch_bytes,
                max_wait_ms=0,
                isolation_level=int(read_committed),
                reuse_buffer=True,  # dec.add copies out what it keeps
            )[partition]
            if data.error_code:
                raise WireError(
                    f"fetch {topic}/{partition} at {offset}: error {data.error_code}",
                    data.error_code,
                )
            if not data.records:
                readable = data.last_stable_offset if read_committed else data.high_watermark
                if readable <= offset:
                    break  # nothing more there (yet): the caller asked past the end
                raise WireError(f"fetch {topic}/{partition} at {offset} returned no data")
            records, after = committed_batches(data.records, data.aborted)
            nxt = max(dec.add(records, offset, end), after)
            if nxt <= offset:
                raise WireError(f"fetch {topic}/{partition} at {offset} made no progress")
            offset = nxt
            if len(dec) >= rows_per_batch:
                yield from dec.drain()
        yield from dec.drain()
    finally:
        if local is not None and local is not colocated:
            local.close()
