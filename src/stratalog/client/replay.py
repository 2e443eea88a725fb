"""Time-range replay (ChronoLog): a topic's records between two times, in event-time order.

Each partition is entered through the broker's time index (ListOffsets by timestamp: the first
record at or after ``start``) and read up to the first record at or after ``end + lateness``;
records with ``start <= timestamp < end`` are kept and all partitions are merged in event-time
order, ties broken by producer id, then sequence (then partition and offset, for records of
non-idempotent producers). ``lateness`` is how far behind the stream's newest time a record may
arrive and still be seen: records that arrive later than that after the range closed are not.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime

import pyarrow as pa
import pyarrow.compute as pc

from stratalog import splits
from stratalog.client.arrow_reader import read_partition
from stratalog.client.family_reader import Member, read_family
from stratalog.client.security import ClientSecurity
from stratalog.client.wire import EARLIEST, LATEST, WireClient, WireError


def to_millis(t: int | float | str | datetime) -> int:
    """Epoch milliseconds from an int/float (ms), an ISO-8601 string, or a datetime (UTC if
    naive)."""
    if isinstance(t, datetime):
        if t.tzinfo is None:
            t = t.replace(tzinfo=UTC)
        return int(t.timestamp() * 1000)
    if isinstance(t, int | float):
        return int(t)
    text = str(t).strip()
    if text.lstrip("-").isdigit():
        return int(text)
    try:
        return to_millis(datetime.fromisoformat(text.replace("Z", "+00:00")))
    except ValueError:
        raise ValueError(
            f"time {t!r} is neither epoch milliseconds nor ISO-8601 (e.g. 2013-01-01T05:00)"
        ) from None


def _partition_range(
    client: WireClient, topic: str, p: int, start: int, stop_time: int
) -> tuple[int, int]:
    first, _ = client.list_offsets(topic, [p], start)[p]
    if first < 0:
        return 0, 0  # nothing at or after start
    stop, _ = client.list_offsets(topic, [p], stop_time)[p]
    if stop < 0:
        stop, _ = client.list_offsets(topic, [p], LATEST)[p]
    return first, stop


def replay_table(
    bootstrap: str,
    topic: str,
    start: int | float | str | datetime,
    end: int | float | str | datetime,
    *,
    lateness_ms: int = 0,
    include_headers: bool = False,
    security: ClientSecurity | None = None,
) -> pa.Table:
    """The records of ``topic`` with start <= timestamp < end, sorted in event-time order
    (``security``: TLS and SASL for a secured listener)."""
    start_ms, end_ms = to_millis(start), to_millis(end)
    if end_ms < start_ms:
        raise ValueError(f"the range ends ({end}) before it starts ({start})")
    batches: list[pa.RecordBatch] = []
    with WireClient(bootstrap, client_id="stratalog-replay", security=security) as client:
        info = client.metadata([topic]).get(topic)
        if info is None or info.error_code:
            raise WireError(f"topic {topic!r} does not exist")
        ranges = {}
        for p in range(info.partitions):
            low, _ = client.list_offsets(topic, [p], EARLIEST)[p]
            first, stop = _partition_range(client, topic, p, start_ms, end_ms + lateness_ms)
            ranges[p] = (max(first, low), stop)
        counts = splits.parse_history(_split_history(client, topic))
        if counts:
            # A split topic: each family in the order that keeps each producer's keys in the
            # order written (client/family_reader.py); that order breaks ties below.
            for family in splits.families(counts, info.partitions):
                members = [Member(p, *ranges[p], splits.parent_of(p, counts)) for p in family]
                read = read_family(
                    client, topic, members, include_headers=include_headers,
                    include_producer=True,
                )  # fmt: skip
                batches += _in_range(read, start_ms, end_ms, family[0])
        else:
            for p, (first, stop) in ranges.items():
                read = read_partition(
                    client,
                    topic,
                    p,
                    first,
                    stop,
                    include_headers=include_headers,
                    include_producer=True,
                    colocated=True,  # the leader's files when it runs on this host
                )
                batches += _in_range(read, start_ms, end_ms, p)
    if not batches:
        from stratalog.client.arrow_reader import kafka_schema

        schema = kafka_schema(include_headers).append(pa.field("producerId", pa.int64()))
        return schema.append(pa.field("sequence", pa.int64())).empty_table()
    table = pa.Table.from_batches(batches)
    # Ties in time: one producer's records in the order it wrote them (a partition's offsets;
    # across a split, the family's read order), then partition and offset.
    tie = ("sequence", "ascending") if not counts else ("_rank", "ascending")
    order = pc.sort_indices(
        table,
        sort_keys=[
            ("timestamp", "ascending"),
            ("producerId", "ascending"),
            *([("_family", "ascending")] if counts else []),
            tie,
            ("partition", "ascending"),
            ("offset", "ascending"),
        ],
    )
    return table.take(order).drop_columns(["_family", "_rank"])


def _split_history(client: WireClient, topic: str) -> str | None:
    from stratalog.client.admin import topic_configs

    try:
        return topic_configs(client, topic).get(splits.SPLIT_HISTORY, {}).get("value")
    except WireError:
        return None  # an older broker, or no right to describe: read as Kafka's


def _in_range(
    read: Iterator[pa.RecordBatch], start_ms: int, end_ms: int, family: int
) -> list[pa.RecordBatch]:
    """The records with start <= timestamp < end, with their family and rank in read order."""
    out = []
    rank = 0
    for rb in read:
        ts = pc.cast(rb.column("timestamp"), pa.int64())
        keep = pc.and_(pc.greater_equal(ts, start_ms * 1000), pc.less(ts, end_ms * 1000))
        rb = rb.append_column("_family", pa.array([family] * rb.num_rows, pa.int32()))
        rb = rb.append_column("_rank", pa.array(range(rank, rank + rb.num_rows), pa.int64()))
        rank += rb.num_rows
        out.append(rb.filter(keep))
    return out


def replay(
    bootstrap: str,
    topic: str,
    start: int | float | str | datetime,
    end: int | float | str | datetime,
    *,
    lateness_ms: int = 0,
    include_headers: bool = False,
) -> Iterator[dict]:
    """Iterate the records of a time range in event-time order, as dicts."""
    table = replay_table(
        bootstrap, topic, start, end, lateness_ms=lateness_ms, include_headers=include_headers
    )
    for batch in table.to_batches(max_chunksize=10_000):
        yield from batch.to_pylist()
