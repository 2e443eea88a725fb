"""The "stratalog-python" PySpark data source: Kafka-source options and schema, Arrow-batch reads.

Planning (``partitions``, ``initialOffset``, ``latestOffset``) runs in Spark's driver-side Python
workers and talks to the broker with the wire client; ``read`` runs in executor Python workers,
fetches raw record batches and decodes them straight into Arrow columns with exactly Spark's
Arrow schema, so Spark never converts rows one by one. In a cluster the wire client sends each
partition's requests to its leader and follows a leader change; a task starts at the leader
its planning saw.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from stratalog.client.arrow_reader import kafka_schema, read_partition
from stratalog.client.family_reader import Member, read_family
from stratalog.client.wire import EARLIEST, WireClient, WireError
from stratalog.spark import planning, worker_gc
from stratalog.spark.options import OptionError, SourceOptions, parse_source_options


def spark_schema(include_headers: bool) -> StructType:
    fields = [
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
        StructField("timestamp", TimestampType()),
        StructField("timestampType", IntegerType()),
    ]
    if include_headers:
        fields.append(
            StructField(
                "headers",
                ArrayType(
                    StructType(
                        [StructField("key", StringType()), StructField("value", BinaryType())]
                    )
                ),
            )
        )
    return StructType(fields)


@dataclass(frozen=True)
class OffsetRangePartition(InputPartition):
    topic: str
    partition: int
    start: int
    end: int
    # The partition's leader when planned (HOST:PORT), tried first by the task: in a cluster it
    # spares each task a wrong first guess. Only a hint; the client follows a moved leader.
    leader: str | None = None


def _client(opts: SourceOptions) -> WireClient:
    return WireClient(opts.bootstrap, client_id="stratalog-spark", security=opts.security)


@dataclass(frozen=True)
class FamilyRangePartition(InputPartition):
    """A split partition family (stratalog.splits), read by one task in an order that keeps
    each key's: (partition, start, end, parent) per member, parents first."""

    topic: str
    members: tuple[tuple[int, int, int, int | None], ...]
    leader: str | None = None


def _tasks(
    client: WireClient, start: planning.Offsets, end: planning.Offsets, min_partitions: int | None
) -> list[InputPartition]:
    """One task per range (cut to ``min_partitions`` as Spark's Kafka source cuts them); a
    split topic's families one task each, never cut."""
    families = planning.split_families(client, start, end)
    plain = {t: parts for t, parts in end.items() if t not in families}
    tasks: list[InputPartition] = [
        OffsetRangePartition(
            r.topic, r.partition, r.start, r.end, client.leader_address(r.topic, r.partition)
        )
        for r in planning.plan_ranges(start, plain, min_partitions)
    ]
    for t, members in families.items():
        tasks.extend(
            FamilyRangePartition(t, tuple(m), client.leader_address(t, m[0][0])) for m in members
        )
    return tasks


class _Reading:
    """The executor side, shared by batch and streaming reads."""

    def __init__(self, opts: SourceOptions) -> None:
        self.bootstrap = opts.bootstrap
        self.include_headers = opts.include_headers
        self.fail_on_data_loss = opts.fail_on_data_loss
        self.read_committed = opts.read_committed
        self.security = opts.security
        self.colocated_reads = opts.colocated_reads
        self.fetch_bytes = opts.fetch_bytes

    def _start(self, client: WireClient, topic: str, partition: int, start: int) -> int:
        """``start``, or the log start past it (failOnDataLoss=false) when retention cut there."""
        log_start = client.list_offsets(topic, [partition], EARLIEST)[partition][0]
        if start < log_start:
            if self.fail_on_data_loss:
                raise WireError(
                    f"offsets {start}..{log_start - 1} of {topic}-{partition} are gone "
                    "(retention removed them); set failOnDataLoss=false to skip them"
                )
            return log_start
        return start

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if isinstance(partition, FamilyRangePartition):
            yield from self._read_family(partition)
            return
        # Spark substitutes InputPartition(None) when planning found nothing to read.
        if not isinstance(partition, OffsetRangePartition) or partition.end <= partition.start:
            return
        worker_gc.freeze_once()
        bootstrap = self.bootstrap
        if partition.leader:
            bootstrap = f"{partition.leader},{bootstrap}"
        with WireClient(bootstrap, client_id="stratalog-spark", security=self.security) as client:
            start = self._start(client, partition.topic, partition.partition, partition.start)
            yield from read_partition(
                client,
                partition.topic,
                partition.partition,
                start,
                partition.end,
                include_headers=self.include_headers,
                read_committed=self.read_committed,
                colocated=self.colocated_reads,
                fetch_bytes=self.fetch_bytes,
            )

    def _read_family(self, task: FamilyRangePartition) -> Iterator[pa.RecordBatch]:
        if all(end <= start for _, start, end, _ in task.members):
            return
        worker_gc.freeze_once()
        bootstrap = f"{task.leader},{self.bootstrap}" if task.leader else self.bootstrap
        with WireClient(bootstrap, client_id="stratalog-spark", security=self.security) as client:
            members = [
                Member(p, self._start(client, task.topic, p, s) if e > s else s, e, parent)
                for p, s, e, parent in task.members
            ]
            yield from read_family(
                client,
                task.topic,
                members,
                include_headers=self.include_headers,
                read_committed=self.read_committed,
                fetch_bytes=self.fetch_bytes,
            )


class StratalogBatchReader(DataSourceReader):
    def __init__(self, options) -> None:
        self.opts = parse_source_options(options, streaming=False)
        self._reading = _Reading(self.opts)

    def partitions(self) -> list[InputPartition]:
        with _client(self.opts) as client:
            tps = planning.topic_partitions(client, self.opts)
            start = planning.resolve_start(client, tps, self.opts, "earliest")
            end = planning.resolve_end(client, tps, self.opts)
            planning.check_batch_ranges(start, end)
            return _tasks(client, start, end, self.opts.min_partitions)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        yield from self._reading.read(partition)


class StratalogStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options) -> None:
        self.options = options
        self.opts = parse_source_options(options, streaming=True)
        self._reading = _Reading(self.opts)
        self._client: WireClient | None = None
        self._available_now: planning.Offsets | None = None
        # This query start, as logged on the broker (see planning.StartLog).
        self._start: planning.Offsets | None = None
        self._start_id: str | None = None
        self._planned_from_start = False
        self._first_partitions = True

    def _wire(self) -> WireClient:
        # The planning process is long-lived; keep one connection in it.
        if self._client is None:
            self._client = _client(self.opts)
        return self._client

    def _latest(self) -> planning.Offsets:
        client = self._wire()
        tps = planning.topic_partitions(client, self.opts)
        return {
            t: {
                p: off
                for p, (off, _) in client.list_offsets(
                    t, ps, -1, isolation_level=planning.isolation(self.opts)
                ).items()
            }
            for t, ps in tps.items()
            if ps
        }

    def _start_log(self) -> planning.StartLog:
        return planning.StartLog(self._wire(), planning.options_key(self.options))

    def initialOffset(self) -> dict:
        client = self._wire()
        if self._start is None:  # Spark asks twice at query start; answer the same
            tps = planning.topic_partitions(client, self.opts)
            self._start = planning.resolve_start(client, tps, self.opts, "latest")
            self._start_id = self._start_log().record_start(self._start)
        return planning.to_json_offsets(self._start)

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.opts.max_offsets_per_trigger:
            return ReadMaxRows(self.opts.max_offsets_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._available_now = self._latest()

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        latest = self._available_now if self._available_now is not None else self._latest()
        latest = {t: dict(parts) for t, parts in latest.items()}  # the snapshot stays as taken
        begin = planning.from_json_offsets(start)
        # Partitions that appeared since the start are read from their beginning.
        for t, parts in latest.items():
            for p in parts:
                begin.setdefault(t, {}).setdefault(p, 0)
        ends = {(t, p): e for t, parts in latest.items() for p, e in parts.items()}
        behind = {tp for tp, e in ends.items() if e < begin[tp[0]][tp[1]]}
        if behind and self._available_now is not None:
            # The availableNow snapshot can predate a start resolved after it: only an end
            # that is behind the start right now too means the start is past the data.
            live = self._latest()
            behind = {(t, p) for t, p in behind if live.get(t, {}).get(p, 0) < begin[t][p]}
        if isinstance(limit, ReadMaxRows):
            full = latest
            latest = planning.rate_limit(begin, latest, limit.max_rows)
            planning.cut_families(self._wire(), begin, latest, full)
        for t, parts in latest.items():
            for p in parts:
                if (t, p) in behind:
                    # A start past the partition's end: partitions() reports the lost offsets
                    # (failOnDataLoss) or goes on from the real end, as Spark's Kafka source.
                    parts[p] = ends[(t, p)]
                else:
                    parts[p] = max(parts[p], begin[t][p])
        if (
            self._start_id is not None
            and not self._planned_from_start
            and planning.from_json_offsets(start) == self._start
        ):
            self._planned_from_start = True
            self._start_log().record_planned(self._start_id, latest)
        return planning.to_json_offsets(latest)

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        begin = planning.from_json_offsets(start)
        finish = planning.from_json_offsets(end)
        if self._first_partitions and self._start_id is not None and not self._planned_from_start:
            # Batch 0 replanned without latestOffset: a restart before it committed. Read it
            # from the start the first run resolved, not from the one just resolved again.
            earlier = self._start_log().start_planned_with(finish)
            if earlier is not None:
                begin = earlier
        else:
            self._check_data_loss(begin, finish)
        self._first_partitions = False
        return _tasks(self._wire(), begin, finish, self.opts.min_partitions)

    def _check_data_loss(self, begin: planning.Offsets, finish: planning.Offsets) -> None:
        """An end before the start: the offsets from the end on are gone (Spark's Kafka source
        calls it data loss). Fail, or read nothing of that partition and go on from its end."""
        for t, parts in finish.items():
            for p, e in parts.items():
                s = begin.get(t, {}).get(p)
                if s is not None and e < s and self.opts.fail_on_data_loss:
                    raise WireError(
                        f"{t}-{p}'s offset went from {s} back to {e}: some data may have been "
                        "lost (the start is past the partition's end, or the log was cut). "
                        "Set failOnDataLoss=false to go on from the end instead"
                    )

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        yield from self._reading.read(partition)

    def commit(self, end: dict) -> None:
        # Progress is kept in Spark's checkpoint; nothing to do on the broker.
        return None

    def stop(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_client"] = None  # sockets do not travel to executors
        return state


class StratalogDataSource(DataSource):
    """``spark.read.format("stratalog-python")`` / ``readStream`` / ``write`` / ``writeStream``.

    The Python data source: it needs no jar, only this package. ``format("stratalog")`` is the
    JVM connector (``stratalog.spark.jvm``), faster, with the same options and results."""

    @classmethod
    def name(cls) -> str:
        return "stratalog-python"

    def schema(self) -> StructType:
        try:
            include = str(self.options.get("includeheaders", "false")).lower() == "true"
        except AttributeError:
            include = False
        return spark_schema(include)

    def reader(self, schema: StructType) -> DataSourceReader:
        return StratalogBatchReader(self.options)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return StratalogStreamReader(self.options)

    def writer(self, schema: StructType, overwrite: bool):
        from stratalog.spark.writer import StratalogBatchWriter

        if overwrite:
            # A log cannot be overwritten; Spark's Kafka sink refuses the mode too.
            raise OptionError(
                'save mode Overwrite is not allowed for format("stratalog-python"): a topic is '
                'appended to; use mode("append")'
            )

        return StratalogBatchWriter(self.options, schema)

    def streamWriter(self, schema: StructType, overwrite: bool):
        from stratalog.spark.writer import StratalogStreamWriter

        return StratalogStreamWriter(self.options, schema)


__all__ = ["OptionError", "StratalogDataSource", "kafka_schema", "spark_schema"]
