"""Turning source options into topic-partition offset ranges (runs on Spark's driver side)."""

from __future__ import annotations

import hashlib
import json
import math
import re
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass

from stratalog import splits
from stratalog.client.admin import topic_configs
from stratalog.client.family_reader import child_end
from stratalog.client.wire import WireClient, WireError
from stratalog.protocol.errors import code
from stratalog.spark.options import EARLIEST, LATEST, OptionError, SourceOptions
from stratalog.splits import SPLIT_HISTORY

Offsets = dict[str, dict[int, int]]


@dataclass(frozen=True)
class Range:
    topic: str
    partition: int
    start: int
    end: int

    @property
    def size(self) -> int:
        return max(0, self.end - self.start)


def to_json_offsets(offsets: Offsets) -> dict[str, dict[str, int]]:
    """Spark compares offsets as JSON text: emit topics and partitions in one canonical order."""
    return {t: {str(p): offsets[t][p] for p in sorted(offsets[t])} for t in sorted(offsets)}


def from_json_offsets(raw: Mapping | None) -> Offsets:
    if not raw:
        return {}
    return {t: {int(p): int(o) for p, o in parts.items()} for t, parts in raw.items()}


def isolation(opts: SourceOptions) -> int:
    """The ListOffsets and Fetch isolation level of the options: read_committed (1) ends
    ranges at the last stable offset and leaves aborted transactions out, as Spark's Kafka
    source does with the same option."""
    return 1 if opts.read_committed else 0


def topic_partitions(client: WireClient, opts: SourceOptions) -> dict[str, list[int]]:
    """The topic-partitions the options select, checked against the broker."""
    if opts.subscribe_pattern is not None:
        rx = re.compile(opts.subscribe_pattern)
        meta = client.metadata(None)
        return {
            t: list(range(info.partitions))
            for t, info in sorted(meta.items())
            # Found anywhere in the name, as Spark's Kafka source matches (Regex.findFirstIn),
            # among the topics its admin client lists: internal ones (__consumer_offsets) not.
            if rx.search(t) and info.error_code == 0 and not info.internal and t != START_LOG_TOPIC
        }
    names = list(opts.subscribe) if opts.subscribe else list(opts.assign)
    meta = client.metadata(names)
    out: dict[str, list[int]] = {}
    for t in names:
        info = meta.get(t)
        if info is None or info.error_code != 0:
            raise OptionError(f"topic {t!r} does not exist on {opts.bootstrap}")
        if opts.assign:
            bad = [p for p in opts.assign[t] if not 0 <= p < info.partitions]
            if bad:
                raise OptionError(
                    f"option 'assign': topic {t!r} has {info.partitions} partitions, no {bad}"
                )
            out[t] = sorted(opts.assign[t])
        else:
            out[t] = list(range(info.partitions))
    return out


def _check_exact(name: str, spec: Mapping[str, Mapping[int, int]], tps: dict[str, list[int]]):
    """A per-partition option must name exactly the assigned partitions (Spark's Kafka source:
    a partition it names that is not assigned fails the query, as does one it leaves out)."""
    named = {(t, p) for t, parts in spec.items() for p in parts}
    assigned = {(t, p) for t, ps in tps.items() for p in ps}
    if named != assigned:

        def show(tp: set) -> str:
            return ", ".join(f"{t}-{p}" for t, p in sorted(tp)) or "none"

        raise OptionError(
            f"partitions in option '{name}' don't match the assigned ones: named but not "
            f"assigned: {show(named - assigned)}; assigned but not named: "
            f"{show(assigned - named)}"
        )


def _list(client: WireClient, tps: dict[str, list[int]], ts: int, isolation: int = 0) -> Offsets:
    return {
        t: {
            p: off
            for p, (off, _ts) in client.list_offsets(t, ps, ts, isolation_level=isolation).items()
        }
        for t, ps in tps.items()
        if ps
    }


def resolve_start(
    client: WireClient, tps: dict[str, list[int]], opts: SourceOptions, default: str
) -> Offsets:
    """Starting offsets: startingTimestamp > startingOffsetsByTimestamp > startingOffsets."""
    earliest = _list(client, tps, EARLIEST)
    latest = _list(client, tps, LATEST, isolation(opts))
    if opts.starting_timestamp is None and opts.starting_by_timestamp is not None:
        _check_exact("startingOffsetsByTimestamp", opts.starting_by_timestamp, tps)
    if opts.starting_timestamp is not None or opts.starting_by_timestamp is not None:
        out: Offsets = {}
        for t, ps in tps.items():
            out[t] = {}
            for p in ps:
                ts = opts.starting_timestamp
                if ts is None:
                    ts = (opts.starting_by_timestamp or {}).get(t, {}).get(p)
                if ts is None:
                    raise OptionError(
                        f"option 'startingOffsetsByTimestamp' has no timestamp for {t}-{p}"
                    )
                off, _ = client.list_offsets(t, [p], ts)[p]
                if off < 0:
                    if opts.timestamp_strategy == "latest":
                        off = latest[t][p]
                    else:
                        raise OptionError(
                            f"no record at or after timestamp {ts} in {t}-{p}; set "
                            "startingOffsetsByTimestampStrategy=latest to start at the end"
                        )
                out[t][p] = off
        return out
    spec = opts.starting or default
    return _apply(spec, tps, earliest, latest, "startingOffsets")


def resolve_end(client: WireClient, tps: dict[str, list[int]], opts: SourceOptions) -> Offsets:
    """Ending offsets (batch): endingTimestamp > endingOffsetsByTimestamp > endingOffsets."""
    latest = _list(client, tps, LATEST, isolation(opts))
    if opts.ending_timestamp is None and opts.ending_by_timestamp is not None:
        _check_exact("endingOffsetsByTimestamp", opts.ending_by_timestamp, tps)
    if opts.ending_timestamp is not None or opts.ending_by_timestamp is not None:
        out: Offsets = {}
        for t, ps in tps.items():
            out[t] = {}
            for p in ps:
                ts = opts.ending_timestamp
                if ts is None:
                    ts = (opts.ending_by_timestamp or {}).get(t, {}).get(p)
                if ts is None:
                    raise OptionError(
                        f"option 'endingOffsetsByTimestamp' has no timestamp for {t}-{p}"
                    )
                off, _ = client.list_offsets(t, [p], ts)[p]
                out[t][p] = latest[t][p] if off < 0 else off
        return out
    end = _apply(opts.ending or "latest", tps, {}, latest, "endingOffsets")
    for t, parts in end.items():
        for p, e in parts.items():
            if e > latest[t][p]:
                if opts.fail_on_data_loss:
                    # Spark's Kafka source fails when it reads, finding the offsets missing.
                    raise OptionError(
                        f"option 'endingOffsets' asks for offsets up to {e} of {t}-{p}, which "
                        f"ends at {latest[t][p]}; set failOnDataLoss=false to read what there is"
                    )
                parts[p] = latest[t][p]
    return end


def check_batch_ranges(start: Offsets, end: Offsets) -> None:
    """A resolved start past the resolved end fails a batch query (as Spark's Kafka source
    does), rather than reading that partition as empty."""
    for t, parts in end.items():
        for p, e in parts.items():
            s = start.get(t, {}).get(p)
            if s is not None and s > e:
                raise OptionError(
                    f"the start offset {s} of {t}-{p} is greater than the resolved end offset {e}"
                )


def _apply(spec, tps, earliest: Offsets, latest: Offsets, name: str) -> Offsets:
    if spec == "earliest":
        return {t: dict(earliest[t]) for t in tps}
    if spec == "latest":
        return {t: dict(latest[t]) for t in tps}
    _check_exact(name, spec, tps)
    out: Offsets = {}
    for t, ps in tps.items():
        given = spec[t]
        out[t] = {}
        for p in ps:
            v = given[p]
            out[t][p] = (
                earliest.get(t, {}).get(p, 0)
                if v == EARLIEST
                else latest[t][p]
                if v == LATEST
                else v
            )
    return out


def _part_count(size: int, total: int, min_parts: int) -> int:
    if total == 0:
        return 1  # Scala rounds NaN to 0, and a range has at least one part
    # Scala's math.round: half away from zero for these positive numbers (not Python's round).
    return max(math.floor(size / total * min_parts + 0.5), 1)


def plan_ranges(start: Offsets, end: Offsets, min_partitions: int | None) -> list[Range]:
    """One range per topic-partition, empty ones too (a start past the end reads nothing),
    split so that there are at least ``min_partitions`` when asked, cut as the installed Spark's
    (4.2) KafkaOffsetRangeCalculator cuts them, so both sources run the same tasks; when cut,
    empty parts are dropped."""
    ranges = []
    for t in sorted(end):
        for p in sorted(end[t]):
            s = start.get(t, {}).get(p, 0)
            e = end[t][p]
            ranges.append(Range(t, p, s, max(s, e)))
    if not min_partitions or len(ranges) >= min_partitions:
        return ranges
    total = sum(r.size for r in ranges)
    # Ranges too small to split keep one task each, and leave the proportion to the others.
    unsplit = {
        (r.topic, r.partition) for r in ranges if _part_count(r.size, total, min_partitions) == 1
    }
    split_total = total - sum(r.size for r in ranges if (r.topic, r.partition) in unsplit)
    split_min = max(min_partitions - len(unsplit), 1)
    out = []
    for r in ranges:
        if (r.topic, r.partition) in unsplit:
            parts = 1
        else:
            parts = _part_count(r.size, split_total, split_min)
        remaining, s = r.size, r.start
        for part in range(parts):
            this = remaining // (parts - part)  # the last part takes the remainder
            remaining -= this
            e = min(s + this, r.end)
            if e > s:
                out.append(Range(r.topic, r.partition, s, e))
            s = e
    return out


def split_families(
    client: WireClient, start: Offsets, end: Offsets
) -> dict[str, list[list[tuple[int, int, int, int | None]]]]:
    """Of the topics in ``end`` that were split (stratalog.splits): each family's members as
    (partition, start, end, parent), parents first; partitions not in ``end`` (split after it
    was taken) are left for a later batch."""
    out = {}
    for t in sorted(end):
        try:
            history = topic_configs(client, t).get(SPLIT_HISTORY, {}).get("value")
        except WireError:
            continue  # described by nobody (an old broker, no right): read as Kafka's
        counts = splits.parse_history(history)
        if not counts:
            continue
        begin = start.get(t, {})
        out[t] = [
            [
                (p, begin.get(p, 0), max(begin.get(p, 0), end[t][p]), splits.parent_of(p, counts))
                for p in family
                if p in end[t]
            ]
            for family in splits.families(counts, max(end[t]) + 1)
        ]
    return out


def cut_families(client: WireClient, start: Offsets, end: Offsets, latest: Offsets) -> None:
    """Make rate-limited ``end`` offsets a consistent cut of each split family's log: a child
    whose parent was cut below ``latest`` ends before its first batch appended after the
    parent's end (client/family_reader.py). In place; parents before children."""
    for t, families in split_families(client, start, end).items():
        for family in families:
            for p, s, e, parent in family:
                if parent is None or parent not in end[t]:
                    continue
                if end[t][parent] < latest[t].get(parent, end[t][parent]) and e > s:
                    end[t][p] = child_end(client, t, p, s, e, end[t][parent])


def rate_limit(start: Offsets, latest: Offsets, max_rows: int) -> Offsets:
    """Cap the next batch at ``max_rows`` offsets in total, shared in proportion to what each
    partition has waiting (as Spark's Kafka source does for maxOffsetsPerTrigger)."""
    avail = {
        (t, p): max(0, latest[t][p] - start.get(t, {}).get(p, 0)) for t in latest for p in latest[t]
    }
    total = sum(avail.values())
    if total <= max_rows:
        return latest
    out: Offsets = {t: {} for t in latest}
    for (t, p), n in avail.items():
        s = start.get(t, {}).get(p, 0)
        share = max_rows * n / total
        # As Spark's Kafka source: a share below one offset rounds up, so a small limit spread
        # over many partitions still makes progress.
        take = math.ceil(share) if share < 1 else math.floor(share)
        out[t][p] = s + min(n, take)
    return out


# -- a start resolved once ------------------------------------------------------------------------
START_LOG_TOPIC = "__stratalog_spark_starts"


def options_key(options: Mapping[str, str]) -> str:
    text = json.dumps(sorted((k, str(v)) for k, v in options.items()))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


START_LOG_WAIT_S = 15.0  # how long a new start log may stay unknown to its leader


class StartLog:
    """Where a streaming query's resolved starting offsets are kept, on the broker.

    Spark does not persist a Python source's initial offsets. When a query restarts before its
    first batch committed, Spark calls ``initialOffset`` again and plans batch 0 from that new
    answer to the end it had already recorded, *without* asking ``latestOffset`` first. With
    ``startingOffsets=latest`` the new answer is later than the first one, and the records
    between would never be read. So each query start is logged (options key, a start id, the
    offsets) and so is the end its batch 0 was planned with; a batch 0 planned without our own
    ``latestOffset`` is a restart, and its start is the logged start whose planned end matches.
    """

    def __init__(self, client: WireClient, key: str) -> None:
        self.client = client
        self.key = key

    def _ensure_topic(self) -> None:
        meta = self.client.metadata([START_LOG_TOPIC]).get(START_LOG_TOPIC)
        if meta is None or meta.error_code:
            try:
                self.client.create_topic(
                    START_LOG_TOPIC,
                    1,
                    {"retention.ms": str(7 * 86400000)},
                    replication_factor=self._replication_factor(),
                )
            except WireError as e:
                if e.error_code != 36:  # TOPIC_ALREADY_EXISTS: someone was quicker
                    raise

    def _replication_factor(self) -> int:
        """In a cluster the log is replicated as data would be (up to three copies): a query
        restarted after a broker's loss needs it. Alone, the broker's default."""
        brokers = len(self.client.leaders.brokers)
        return min(3, brokers) if brokers > 1 else -1

    def _append(self, doc: dict) -> None:
        from stratalog.records import build_batch

        self._ensure_topic()
        raw = build_batch([(self.key.encode(), json.dumps(doc).encode(), int(time.time() * 1000))])
        # In a cluster the topic just created may not have reached its leader's copy of the
        # metadata yet: UNKNOWN_TOPIC_OR_PARTITION wrote nothing, and is retried as Kafka's
        # producers retry it.
        deadline = time.monotonic() + START_LOG_WAIT_S
        while True:
            err, _ = self.client.produce(START_LOG_TOPIC, {0: raw}, acks=-1)[0]
            if err != code("UNKNOWN_TOPIC_OR_PARTITION") or time.monotonic() >= deadline:
                break
            time.sleep(0.1)
        if err:
            raise WireError(f"cannot log the query's start (error {err})", err)

    def record_start(self, offsets: Offsets) -> str:
        start_id = uuid.uuid4().hex
        self._append({"id": start_id, "start": to_json_offsets(offsets)})
        return start_id

    def record_planned(self, start_id: str, end: Offsets) -> None:
        self._append({"id": start_id, "planned": to_json_offsets(end)})

    def start_planned_with(self, end: Offsets) -> Offsets | None:
        """The logged start whose batch 0 was planned to ``end`` (the newest such), if any."""
        from stratalog.records import iter_records

        self._ensure_topic()
        lo, _ = self.client.list_offsets(START_LOG_TOPIC, [0], -2)[0]
        hi, _ = self.client.list_offsets(START_LOG_TOPIC, [0], -1)[0]
        starts: dict[str, dict] = {}
        found: str | None = None
        want = to_json_offsets(end)
        offset = lo
        while offset < hi:
            data = self.client.fetch(START_LOG_TOPIC, {0: offset})[0]
            if not data.records:
                break
            from stratalog.storage.batch import parse_header

            pos = 0
            while pos + 61 <= len(data.records):
                h = parse_header(data.records, pos)
                batch = data.records[pos : pos + h.size]
                pos += h.size
                offset = h.last_offset + 1
                for r in iter_records(batch, h):
                    if r.key != self.key.encode() or r.value is None:
                        continue
                    doc = json.loads(r.value)
                    if "start" in doc:
                        starts[doc["id"]] = doc["start"]
                    elif doc.get("planned") == want:
                        found = doc["id"]
        if found is None or found not in starts:
            return None
        return from_json_offsets(starts[found])
