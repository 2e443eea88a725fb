"""What the web console shows and changes, as plain data, over the Kafka API.

One ``ConsoleService`` per request, on a thread (every call blocks): it asks a ``WireClient``
what any Kafka admin tool asks (Metadata, ListOffsets, Fetch, ListGroups, DescribeGroups,
OffsetFetch, DescribeConfigs; CreateTopics, DeleteTopics, OffsetCommit), and takes the broker's
``/status`` document (tiers, migration, per-topic sizes and time ranges) and ``/metrics``
text from the callables it is given. Inside the broker the client's requests go to the broker's
own handlers in-process, as the console's user (broker/console_api.py); ``stratalog console``
gives it a client over TCP (console/remote.py). Either way the handlers answer, with their
checks of input and of ACLs.

Bad input raises ``BadRequest`` (HTTP 400); an answer with a Kafka error raises ``WireError``,
which console/routes.py turns into an HTTP status.
"""

from __future__ import annotations

import base64
import time
from collections.abc import Callable
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from stratalog.client import admin
from stratalog.client.errors import WireError
from stratalog.client.wire import EARLIEST, LATEST, WireClient
from stratalog.records import iter_records
from stratalog.storage.batch import HEADER_SIZE, parse_header

MAX_RECORDS = 500  # records one page of the browser asks at most
FETCH_BYTES = 1 << 20
LATENCY_APIS = ("produce", "fetch")
# Errors of a request another broker answers for (NOT_LEADER_OR_FOLLOWER, LEADER_NOT_AVAILABLE)
UNANSWERED = frozenset((6, 5))


class BadRequest(Exception):
    """Input the console cannot act on (HTTP 400), said in one sentence."""


# A Fetch of raw batches: (topic, partition, offset, max bytes) -> bytes of whole batches.
ReadBatches = Callable[[str, int, int, int], bytes]


class ConsoleService:
    def __init__(
        self,
        client: WireClient,
        status: Callable[[], dict | None],
        metrics_text: Callable[[], str | None],
        read_batches: ReadBatches | None = None,
    ) -> None:
        self.client = client
        self._status = status
        self._metrics_text = metrics_text
        self._read = read_batches or self.fetch_batches

    # -- reads ---------------------------------------------------------------------------------
    def overview(self) -> dict[str, Any]:
        """The brokers with their health, and the tiers, migration and disk of the broker
        whose /status is at hand."""
        c = admin.cluster(self.client)
        status = self._status()
        brokers = []
        for node, address in sorted(c.brokers.items()):
            led = [p for parts in c.topics.values() for p in parts if p.leader == node]
            held = [p for parts in c.topics.values() for p in parts if node in p.replicas]
            behind = [p for p in held if node not in p.isr]
            brokers.append({
                "id": node,
                "address": address,
                "controller": node == c.controller,
                "leaders": len(led),
                "replicas": len(held),
                "out_of_sync": len(behind),
                "health": "ok" if not behind else "replicas behind",
            })  # fmt: skip
        under = sum(1 for parts in c.topics.values() for p in parts if len(p.isr) < len(p.replicas))
        offline = sum(1 for parts in c.topics.values() for p in parts if p.leader < 0)
        return {
            "cluster_id": c.cluster_id,
            "controller": c.controller,
            "brokers": brokers,
            "topics": len(c.topics),
            "partitions": sum(len(p) for p in c.topics.values()),
            "under_replicated": under,
            "offline": offline,
            "status": _local_health(status),
        }

    def topics(self) -> list[dict[str, Any]]:
        c = admin.cluster(self.client)
        sizes = (self._status() or {}).get("topics", {})
        out = []
        for name, parts in sorted(c.topics.items()):
            ends = self._offsets(name, parts)
            size = sizes.get(name) or {}
            out.append({
                "name": name,
                "internal": name in c.internal,
                "partitions": len(parts),
                "replication_factor": max((len(p.replicas) for p in parts), default=0),
                "under_replicated": sum(1 for p in parts if len(p.isr) < len(p.replicas)),
                "records": sum(e - s for s, e in ends.values()),
                "hot": _tier(size.get("hot")),
                "cold": _tier(size.get("cold")),
            })  # fmt: skip
        return out

    def topic(self, name: str) -> dict[str, Any]:
        c = admin.cluster(self.client)
        parts = c.topics.get(name)
        if parts is None:
            raise WireError(f"topic {name!r} does not exist", 3)
        ends = self._offsets(name, parts)
        size = ((self._status() or {}).get("topics") or {}).get(name) or {}
        return {
            "name": name,
            "internal": name in c.internal,
            "partitions": [
                {
                    "partition": p.index,
                    "leader": p.leader,
                    "replicas": p.replicas,
                    "isr": p.isr,
                    "error": p.error,
                    "start": ends.get(p.index, (None, None))[0],
                    "end": ends.get(p.index, (None, None))[1],
                }
                for p in parts
            ],
            "hot": _tier(size.get("hot")),
            "cold": _tier(size.get("cold")),
            "configs": admin.topic_configs(self.client, name),
        }

    def records(self, params: dict[str, str]) -> dict[str, Any]:
        """A page of records of one partition from an offset, or from the first record at or
        after a time (ms); keys and values as base64 (the page shows them as text, JSON or
        hex)."""
        topic = params.get("topic") or ""
        if not topic:
            raise BadRequest("give the topic")
        partition = _int(params, "partition", 0, lo=0)
        limit = _int(params, "limit", 50, lo=1, hi=MAX_RECORDS)
        if "offset" in params and "timestamp" in params:
            raise BadRequest("give offset or timestamp, not both")
        (start, end) = self._offsets(topic, None, [partition])[partition]
        if "timestamp" in params:
            ts = _int(params, "timestamp", 0)
            offset = self.client.list_offsets(topic, [partition], ts)[partition][0]
            if offset < 0:
                offset = end  # no record that late
        else:
            offset = _int(params, "offset", start, lo=0)
        offset = min(max(offset, start), end)
        rows: list[dict[str, Any]] = []
        at = offset
        while True:  # at least one read, even of an empty partition: the reader's rights
            data = self._read(topic, partition, at, FETCH_BYTES)
            nxt = _decode(data, at, limit - len(rows), rows)
            if len(rows) >= limit or nxt <= at or nxt >= end:
                break
            at = nxt
        return {
            "topic": topic,
            "partition": partition,
            "from": offset,
            "next": rows[-1]["offset"] + 1 if rows else offset,
            "start": start,
            "end": end,
            "records": rows,
        }

    def groups(self) -> list[dict[str, Any]]:
        brokers = list(admin.cluster(self.client).brokers)
        out = []
        for group, (state, kind) in sorted(admin.list_groups(self.client, brokers).items()):
            committed = self.client.offset_fetch(group)
            ends = self._ends(committed)
            out.append({
                "group": group,
                "state": state,
                "type": kind,
                "partitions": len(committed),
                "lag": sum(max(0, ends[k] - c[0]) for k, c in committed.items() if k in ends),
            })  # fmt: skip
        return out

    def group(self, group: str) -> dict[str, Any]:
        described = admin.describe_group(self.client, group)
        committed = self.client.offset_fetch(group)
        owner = {tp: m.client_id or m.member_id for m in described.members for tp in m.assignment}
        keys = sorted(set(committed) | set(owner))
        ends = self._ends(dict.fromkeys(keys))
        rows = []
        for key in keys:
            c = committed.get(key, (None, None))[0]
            end = ends.get(key)
            rows.append({
                "topic": key[0],
                "partition": key[1],
                "committed": c,
                "end": end,
                "lag": None if c is None or end is None else max(0, end - c),
                "member": owner.get(key),
            })  # fmt: skip
        return {
            "group": group,
            "state": described.state,
            "type": described.protocol_type,
            "assignor": described.assignor,
            "members": [
                {
                    "member_id": m.member_id,
                    "client_id": m.client_id,
                    "host": m.host,
                    "partitions": [f"{t}-{p}" for t, p in sorted(m.assignment)],
                }
                for m in described.members
            ],
            "offsets": rows,
            "lag": sum(r["lag"] or 0 for r in rows),
        }

    def metrics(self) -> dict[str, Any]:
        """Counters the charts turn into rates: bytes produced and fetched, requests, and the
        Produce and Fetch latency histograms (cumulative; the page takes differences)."""
        text = self._metrics_text()
        out: dict[str, Any] = {"time": time.time(), "available": text is not None}
        if text is None:
            return out
        produced = fetched = requests = 0.0
        latency: dict[str, dict[str, Any]] = {
            a: {"buckets": [], "count": 0.0} for a in LATENCY_APIS
        }
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.name == "stratalog_produced_bytes_total":
                    produced += s.value
                elif s.name in (
                    "stratalog_fetch_memory_bytes_total",
                    "stratalog_fetch_sendfile_bytes_total",
                    "stratalog_fetch_copied_bytes_total",
                ):
                    fetched += s.value
                elif s.name == "stratalog_requests_total":
                    requests += s.value
                elif s.name.startswith("stratalog_request_seconds"):
                    api = s.labels.get("api")
                    if api not in latency:
                        continue
                    le = float(s.labels.get("le", "nan"))
                    if s.name.endswith("_bucket") and le != float("inf"):  # (_count has it)
                        latency[api]["buckets"].append([le, s.value])
                    elif s.name.endswith("_count"):
                        latency[api]["count"] = s.value
        out.update(produced_bytes=produced, fetched_bytes=fetched, requests=requests)
        out["latency"] = latency
        return out

    # -- writes --------------------------------------------------------------------------------
    def create_topic(self, body: dict[str, Any]) -> dict[str, Any]:
        name = _str(body, "name")
        partitions = _int(body, "partitions", 1, lo=1, hi=10000)
        factor = _int(body, "replication_factor", -1, lo=-1, hi=100)
        configs = body.get("configs") or {}
        if not isinstance(configs, dict) or not all(
            isinstance(k, str) and isinstance(v, str | int) for k, v in configs.items()
        ):
            raise BadRequest("configs must be an object of names to string values")
        self.client.create_topic(
            name, partitions, {k: str(v) for k, v in configs.items()}, replication_factor=factor
        )
        return {"created": name, "partitions": partitions}

    def delete_topic(self, body: dict[str, Any]) -> dict[str, Any]:
        name = _str(body, "name")
        admin.delete_topic(self.client, name)
        return {"deleted": name}

    def reset_offsets(self, body: dict[str, Any]) -> dict[str, Any]:
        """Commit a group's offsets on a topic to the earliest, the latest, an offset (within
        each partition's range), or the first at or after a time, as ``stratalog groups
        reset-offsets --execute`` does: only while the group has no members (a live group's
        offsets are its members' to commit)."""
        group = _str(body, "group")
        topic = _str(body, "topic")
        to = body.get("to")
        if to not in ("earliest", "latest", "offset", "timestamp"):
            raise BadRequest("'to' must be one of earliest, latest, offset, timestamp")
        parts = admin.cluster(self.client).topics.get(topic)
        if parts is None:
            raise WireError(f"topic {topic!r} does not exist", 3)
        indexes = [p.index for p in parts]
        described = admin.describe_group(self.client, group)
        if described.members:
            raise BadRequest(
                f"group {group!r} has {len(described.members)} active member(s): stop them "
                "first (offsets of a live group are its members' to commit)"
            )
        ends = self._offsets(topic, None, indexes)
        if to == "offset":
            # As kafka-consumer-groups --to-offset: within each partition's range.
            wanted = _int(body, "offset", 0, lo=0)
            target = {i: min(max(wanted, ends[i][0]), ends[i][1]) for i in indexes}
        elif to == "timestamp":
            ts = _int(body, "timestamp", 0)
            found = self.client.list_offsets(topic, indexes, ts)
            target = {i: found[i][0] if found[i][0] >= 0 else ends[i][1] for i in indexes}
        else:
            target = {i: ends[i][0 if to == "earliest" else 1] for i in indexes}
        self.client.offset_commit(group, {(topic, i): (o, "") for i, o in target.items()})
        return {"group": group, "topic": topic, "offsets": {str(i): o for i, o in target.items()}}

    # -- helpers -------------------------------------------------------------------------------
    def _offsets(
        self, topic: str, parts: list | None, indexes: list[int] | None = None
    ) -> dict[int, tuple[int, int]]:
        """partition -> (log start, end) of a topic's partitions."""
        if indexes is None:
            indexes = [p.index for p in parts or []]
        if not indexes:
            return {}
        try:
            first = self.client.list_offsets(topic, indexes, EARLIEST)
            last = self.client.list_offsets(topic, indexes, LATEST)
        except WireError as e:
            if parts is None or e.error_code not in UNANSWERED:
                raise
            # A broker's own console in a secured cluster: the partitions it answers for.
            out = {}
            for i in indexes:
                try:
                    out[i] = self._offsets(topic, None, [i])[i]
                except WireError as one:
                    if one.error_code not in UNANSWERED:
                        raise
            return out
        return {i: (first[i][0], last[i][0]) for i in indexes}

    def _ends(self, keys) -> dict[tuple[str, int], int]:
        by_topic: dict[str, list[int]] = {}
        for t, p in keys:
            by_topic.setdefault(t, []).append(p)
        out = {}
        for t, indexes in by_topic.items():
            try:
                found = self.client.list_offsets(t, sorted(indexes), LATEST)
            except WireError:
                continue  # a deleted topic the group still has offsets of
            out.update({(t, i): o for i, (o, _ts) in found.items()})
        return out

    def fetch_batches(self, topic: str, partition: int, offset: int, max_bytes: int) -> bytes:
        """Whole batches of a partition from ``offset`` by a Fetch to its leader."""
        got = self.client.fetch(
            topic, {partition: offset}, max_bytes=max_bytes, partition_max_bytes=max_bytes
        )[partition]
        if got.error_code:
            raise WireError(f"Fetch {topic}-{partition}: error {got.error_code}", got.error_code)
        return bytes(got.records)


def _decode(data: bytes, offset: int, limit: int, rows: list[dict[str, Any]]) -> int:
    """Append the records at or after ``offset`` in ``data`` (whole batches) to ``rows``, at
    most ``limit``; return the offset after the last batch read (control batches skipped)."""
    mv = memoryview(data)
    pos = 0
    nxt = offset
    while len(mv) - pos >= HEADER_SIZE and limit > 0:
        h = parse_header(mv, pos)
        if len(mv) - pos < h.size:
            break
        if not h.is_control:
            for r in iter_records(mv[pos : pos + h.size], h):
                if r.offset < offset:
                    continue
                rows.append({
                    "offset": r.offset,
                    "timestamp": r.timestamp,
                    "key": _b64(r.key),
                    "value": _b64(r.value),
                    "headers": {k: _b64(v) for k, v in r.headers},
                })  # fmt: skip
                limit -= 1
                if limit == 0:
                    return r.offset + 1
        nxt = h.last_offset + 1
        pos += h.size
    return nxt


def _b64(b: bytes | None) -> str | None:
    return None if b is None else base64.b64encode(b).decode()


def _tier(x: dict | None) -> dict | None:
    if not x:
        return None
    keep = ("bytes", "segments", "oldest_timestamp", "newest_timestamp")
    return {k: x.get(k) for k in keep}


def _local_health(status: dict | None) -> dict | None:
    """The parts of a broker's /status the overview shows: tiers, migration, disk."""
    if status is None:
        return None
    return {k: status.get(k) for k in ("broker", "disk", "tiers", "migration", "compaction")}


def _str(body: dict[str, Any], key: str) -> str:
    v = body.get(key)
    if not isinstance(v, str) or not v.strip():
        raise BadRequest(f"'{key}' must be a non-empty string")
    return v.strip()


def _int(src: dict[str, Any], key: str, default: int, lo: int | None = None, hi: int | None = None):
    v = src.get(key, default)
    if isinstance(v, bool):
        raise BadRequest(f"'{key}' must be an integer")
    try:
        n = int(v)
    except (TypeError, ValueError):
        raise BadRequest(f"'{key}' must be an integer, not {v!r}") from None
    if (lo is not None and n < lo) or (hi is not None and n > hi):
        bounds = f"at least {lo}" if hi is None else f"between {lo} and {hi}"
        raise BadRequest(f"'{key}' must be {bounds}, not {n}")
    return n
