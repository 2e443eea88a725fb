"""Raw Kafka requests over a socket, built and decoded with kio (through stratalog's codec).

Requests are built from plain keyword values (nested entities as dicts, arrays as lists) with
:func:`build`; :func:`request_frame` adds the request header (api key, version, correlation id,
client id, and the tag byte of flexible versions) and the length prefix. :func:`send` writes any
bytes on a fresh connection and reports what came back: a response frame, the connection closed,
or silence. :func:`call` does all of that and decodes the response into plain data
(:func:`plain`), so two brokers' answers compare with ``==`` after :func:`normalise`.
"""

from __future__ import annotations

import dataclasses
import datetime
import enum
import io
import re
import socket
import struct
import time
import typing
import uuid
from dataclasses import dataclass
from typing import Any

from kio.serial import entity_reader, entity_writer

from stratalog.broker.topic_config import TOPIC_SETTINGS
from stratalog.protocol import codec

CLIENT_ID = "conformance"
CORRELATION_ID = 0x0C0FFEE
ZERO_UUID = uuid.UUID(int=0)

# -- building requests ----------------------------------------------------------------------------


def _entity_type(tp: Any) -> type | None:
    """The kio entity class inside an annotation (X, X | None, tuple[X, ...])."""
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        return tp
    for arg in typing.get_args(tp):
        if arg is Ellipsis or arg is type(None):
            continue
        found = _entity_type(arg)
        if found is not None:
            return found
    return None


def make(cls: type, /, **values: Any) -> Any:
    """An instance of kio entity ``cls`` from plain values; keys ``cls`` lacks are ignored.

    Nested entities may be given as dicts (or lists of dicts); durations as milliseconds; error
    codes as ints. Fields left out keep kio's defaults (required ones must be given).
    """
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kw: dict[str, Any] = {}
    for name, value in values.items():
        f = fields.get(name)
        if f is None:
            continue
        inner = _entity_type(f.type)
        if inner is not None and isinstance(value, dict):
            value = make(inner, **value)
        elif isinstance(value, list | tuple):
            value = tuple(
                make(inner, **v) if inner is not None and isinstance(v, dict) else v for v in value
            )
        kw[name] = codec._coerce(f, value)
    return cls(**kw)


def build(api_key: int, version: int, /, **values: Any) -> Any:
    return make(codec.request_class(api_key, version), **values)


def header(
    api_key: int,
    version: int,
    correlation_id: int = CORRELATION_ID,
    client_id: str | None = CLIENT_ID,
    *,
    flexible: bool | None = None,
) -> bytes:
    """Request header v1 (non-flexible) or v2 (flexible: a trailing empty tag buffer)."""
    out = struct.pack(">hhi", api_key, version, correlation_id)
    if client_id is None:
        out += struct.pack(">h", -1)
    else:
        raw = client_id.encode()
        out += struct.pack(">h", len(raw)) + raw
    if flexible is None:
        flexible = codec.is_flexible_request(api_key, version)
    if flexible:
        out += b"\x00"
    return out


def body_bytes(request: Any) -> bytes:
    out = io.BytesIO()
    entity_writer(type(request))(out, request)
    return out.getvalue()


def prefixed(payload: bytes) -> bytes:
    return struct.pack(">i", len(payload)) + payload


def request_frame(
    api_key: int, version: int, request: Any, correlation_id: int = CORRELATION_ID
) -> bytes:
    """The whole request on the wire: length prefix, header, body."""
    return prefixed(header(api_key, version, correlation_id) + body_bytes(request))


# -- talking to a broker --------------------------------------------------------------------------


@dataclass(frozen=True)
class Outcome:
    """What one connection saw after the bytes were sent."""

    kind: str  # "response" (a whole frame), "closed" (EOF or reset), "silent" (still open)
    data: bytes = b""  # the response frame without its length prefix, or bytes before EOF


def _address(bootstrap: str) -> tuple[str, int]:
    host, port = bootstrap.rsplit(":", 1)
    return host, int(port)


def send(
    bootstrap: str, data: bytes, *, timeout: float = 5.0, wait: float | None = None
) -> Outcome:
    """Send ``data`` on a new connection; read one response frame, EOF, or time out.

    ``wait`` (default ``timeout``) is how long silence may last before the outcome is "silent".
    """
    wait = timeout if wait is None else wait
    with socket.create_connection(_address(bootstrap), timeout=timeout) as s:
        s.sendall(data)
        buf = b""
        deadline = time.monotonic() + wait
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return Outcome("silent", buf)
            s.settimeout(remaining)
            try:
                chunk = s.recv(1 << 16)
            except TimeoutError:
                return Outcome("silent", buf)
            except (ConnectionResetError, BrokenPipeError):
                return Outcome("closed", buf)
            if not chunk:
                return Outcome("closed", buf)
            buf += chunk
            if len(buf) >= 4:
                (size,) = struct.unpack_from(">i", buf)
                if len(buf) >= 4 + size:
                    return Outcome("response", buf[4 : 4 + size])


def response_body_offset(api_key: int, version: int) -> int:
    """Where the body starts in a response frame: after the correlation id (and tag byte)."""
    # ApiVersions always answers with response header v0 (KIP-511), flexible or not.
    if api_key != 18 and codec.response_class(api_key, version).__flexible__:
        return 5
    return 4


def decode(api_key: int, version: int, frame: bytes) -> tuple[int, Any]:
    """(correlation id, kio response entity); asserts the body used exactly the frame's bytes."""
    (correlation_id,) = struct.unpack_from(">i", frame)
    pos = response_body_offset(api_key, version)
    body, size = entity_reader(codec.response_class(api_key, version))(frame, pos)
    assert pos + size == len(frame), (
        f"API {api_key} v{version}: response body is {size} bytes but the frame has "
        f"{len(frame) - pos} after the header"
    )
    return correlation_id, body


def call(bootstrap: str, api_key: int, version: int, /, **values: Any) -> dict[str, Any]:
    """One request on a fresh connection; the decoded response as plain data.

    A connection that closed or stayed silent instead is ``{"outcome": "closed"|"silent"}``.
    """
    frame = request_frame(api_key, version, build(api_key, version, **values))
    out = send(bootstrap, frame, timeout=30)
    if out.kind != "response":
        return {"outcome": out.kind}
    correlation_id, body = decode(api_key, version, out.data)
    assert correlation_id == CORRELATION_ID
    return plain(body)


# -- plain data and normalisation -----------------------------------------------------------------


def plain(obj: Any) -> Any:
    """kio entities -> dicts; tuples -> lists; enums, durations, datetimes, UUIDs -> values."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, list | tuple):
        return [plain(x) for x in obj]
    if isinstance(obj, enum.Enum):
        return obj.value
    if isinstance(obj, datetime.timedelta):
        return round(obj.total_seconds() * 1000)
    if isinstance(obj, datetime.datetime):
        return round(obj.timestamp() * 1000)
    if isinstance(obj, uuid.UUID):
        return str(obj)
    return obj


# Fields whose values legitimately differ between two clusters (ids, addresses, throttling) and
# free-text error messages. Everything else in a response is compared.
NODE_FIELDS = {"node_id", "leader_id", "controller_id", "broker_id"}
NODE_LIST_FIELDS = {"replica_nodes", "isr_nodes", "offline_replicas"}
DROPPED_FIELDS = {"throttle_time", "error_message"}
# ApiVersions v3+ finalized/supported features: Kafka reports its feature levels
# (metadata.version, kraft.version, ...), Stratalog has none. Not compared (see compatibility.md).
FEATURE_FIELDS = {
    "supported_features",
    "finalized_features_epoch",
    "finalized_features",
    "zk_migration_ready",
}
# The topic configs Stratalog implements (docs/configuration.md) are compared; Kafka's others
# are not. segment.bytes is left out: its default differs on purpose (deliberate.py).
# late.event.policy is Stratalog's own (Kafka rejects it), tested in tests/test_tiers.py.
STRATALOG_ONLY_CONFIGS = frozenset(
    {"late.event.policy"} | {n for n in TOPIC_SETTINGS if n.startswith("partition.")}
)
COMPARED_CONFIGS = frozenset(TOPIC_SETTINGS) - {"segment.bytes"} - STRATALOG_ONLY_CONFIGS
TOPIC_CONFIG_SOURCE = 1
# Member ids a coordinator generates: "<client id>-<uuid>".
GENERATED_MEMBER = re.compile(r"^.+-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
# Lists whose order carries no meaning are sorted by the first identity key their items have.
IDENTITY_KEYS = (
    "name",
    "topic",
    "group_id",
    "key",
    "resource_name",
    "partition_index",
    "partition",
    "index",
    "api_key",
)


def _sort_key(item: Any) -> Any:
    if isinstance(item, dict):
        for k in IDENTITY_KEYS:
            if k in item:
                return (0, str(item[k]) if not isinstance(item[k], int) else f"{item[k]:012d}")
    return (1, repr(item))


def _listed_name(item: Any) -> str:
    if isinstance(item, dict):
        return str(item.get("name") or item.get("group_id") or "")
    return str(item)


def normalise(obj: Any, *, topic_prefix: str | None = None) -> Any:
    """Replace what legitimately differs between brokers; sort unordered lists.

    ``topic_prefix``: keep only topics (and groups) whose name starts with it in listings of
    everything (Metadata for all topics, ListGroups), so other tests' topics do not count.
    """
    if isinstance(obj, dict):
        out: dict[str, Any] = {}
        for k, v in obj.items():
            if k in DROPPED_FIELDS or k in FEATURE_FIELDS:
                continue
            if k in NODE_FIELDS and isinstance(v, int):
                out[k] = "<node>" if v >= 0 else v
            elif k in NODE_LIST_FIELDS and isinstance(v, list):
                out[k] = ["<node>" for _ in v]
            elif k == "cluster_id" and v is not None:
                out[k] = "<cluster-id>"
            elif k == "host" and v:
                out[k] = "<host>"
            elif k == "port" and isinstance(v, int) and v >= 0:
                out[k] = "<port>"
            elif k == "topic_id" and v is not None:
                out[k] = "<topic-id>" if v != str(ZERO_UUID) else None
            elif k == "config_source" and isinstance(v, int):
                # Whether a topic overrides it, not which kind of default applies: Kafka 4.4
                # reports min.insync.replicas as a cluster-level default (3), not a static one.
                out[k] = "topic" if v == TOPIC_CONFIG_SOURCE else "default"
            elif k == "configs" and isinstance(v, list) and v and isinstance(v[0], dict):
                kept = [c for c in v if c.get("name") in COMPARED_CONFIGS]
                out[k] = normalise(kept, topic_prefix=topic_prefix)
            elif k == "producer_id" and isinstance(v, int) and v >= 0:
                out[k] = "<producer-id>"
            elif k == "transaction_start_time" and isinstance(v, int) and v >= 0:
                out[k] = "<time>"
            elif k in ("member_id", "leader") and isinstance(v, str) and GENERATED_MEMBER.match(v):
                out[k] = "<member-id>"
            elif k in ("topics", "groups") and topic_prefix is not None and isinstance(v, list):
                kept = [x for x in v if _listed_name(x).startswith(topic_prefix)]
                out[k] = normalise(kept, topic_prefix=topic_prefix)
            else:
                out[k] = normalise(v, topic_prefix=topic_prefix)
        return out
    if isinstance(obj, list):
        items = [normalise(x, topic_prefix=topic_prefix) for x in obj]
        if items and all(isinstance(x, dict) for x in items):
            items.sort(key=_sort_key)
        return items
    return obj


def error_names(codes: Any) -> Any:
    """Error codes (int, or nested lists/dicts of them) -> Kafka error names, for messages."""
    from kio.schema.errors import ErrorCode

    if isinstance(codes, int):
        try:
            return ErrorCode(codes).name
        except ValueError:
            return codes
    if isinstance(codes, list | tuple):
        return [error_names(c) for c in codes]
    if isinstance(codes, dict):
        return {k: error_names(v) for k, v in codes.items()}
    return codes


# -- small helpers on top of call() ---------------------------------------------------------------


def create_topic(bootstrap: str, name: str, partitions: int = 1, **configs: str) -> int:
    """CreateTopics v7 for one topic; returns the error code (0 on success)."""
    r = call(
        bootstrap,
        19,
        7,
        topics=[
            {
                "name": name,
                "num_partitions": partitions,
                "replication_factor": 1,
                "assignments": [],
                "configs": [{"name": k, "value": v} for k, v in configs.items()],
            }
        ],
        timeout=15000,
        validate_only=False,
    )
    code = r["topics"][0]["error_code"]
    if code == 0:
        wait_for_topic(bootstrap, name, partitions)
    return code


def metadata(bootstrap: str, *names: str) -> dict[str, Any]:
    return call(
        bootstrap,
        3,
        12,
        topics=[{"name": n, "topic_id": ZERO_UUID} for n in names],
        allow_auto_topic_creation=False,
        include_topic_authorized_operations=False,
    )


def wait_for_topic(bootstrap: str, name: str, partitions: int, timeout: float = 15) -> None:
    """Until Metadata shows the topic with every partition led (Kafka propagates asynchronously)."""
    deadline = time.monotonic() + timeout
    while True:
        t = metadata(bootstrap, name)["topics"][0]
        parts = t["partitions"]
        if (
            t["error_code"] == 0
            and len(parts) == partitions
            and all(p["leader_id"] >= 0 for p in parts)
            # Kafka's metadata can show a leader before the partition takes requests.
            and all(
                list_offset(bootstrap, name, i, -1)["error_code"] == 0 for i in range(partitions)
            )
        ):
            return
        assert time.monotonic() < deadline, f"topic {name} not ready at {bootstrap}: {t}"
        time.sleep(0.05)


def topic_id(bootstrap: str, name: str) -> uuid.UUID:
    return uuid.UUID(metadata(bootstrap, name)["topics"][0]["topic_id"])


def produce(
    bootstrap: str,
    topic: str,
    partition: int,
    records: bytes,
    *,
    version: int = 9,
    acks: int = -1,
    transactional_id: str | None = None,
) -> dict[str, Any]:
    """One Produce of ``records`` (a record batch); the partition's response as plain data."""
    r = call(
        bootstrap,
        0,
        version,
        transactional_id=transactional_id,
        acks=acks,
        timeout=10000,
        topic_data=[{"name": topic, "partition_data": [{"index": partition, "records": records}]}],
    )
    if "outcome" in r:
        return r
    return r["responses"][0]["partition_responses"][0]


def list_offset(bootstrap: str, topic: str, partition: int, timestamp: int) -> dict[str, Any]:
    """ListOffsets v10 for one partition: {error_code, timestamp, offset, leader_epoch}."""
    r = call(
        bootstrap,
        2,
        10,
        replica_id=-1,
        isolation_level=0,
        timeout=5000,
        topics=[
            {
                "name": topic,
                "partitions": [
                    {
                        "partition_index": partition,
                        "current_leader_epoch": -1,
                        "timestamp": timestamp,
                    }
                ],
            }
        ],
    )
    p = r["topics"][0]["partitions"][0]
    return {k: p[k] for k in ("error_code", "timestamp", "offset", "leader_epoch")}


_BATCH_HEADER = struct.Struct(">qiibIhiqqqhii")  # RecordBatch v2 header, 61 bytes


def parse_batches(data: bytes | None) -> list[dict[str, Any]]:
    """The record batches' headers in a Fetch response's records bytes (partial tail dropped)."""
    out: list[dict[str, Any]] = []
    data = data or b""
    pos = 0
    while pos + _BATCH_HEADER.size <= len(data):
        (
            base_offset,
            length,
            leader_epoch,
            magic,
            _crc,
            attributes,
            last_delta,
            base_ts,
            max_ts,
            producer_id,
            producer_epoch,
            base_sequence,
            count,
        ) = _BATCH_HEADER.unpack_from(data, pos)
        if pos + 12 + length > len(data):
            break
        out.append(
            {
                "base_offset": base_offset,
                "partition_leader_epoch": leader_epoch,
                "magic": magic,
                "codec": attributes & 0x07,
                "timestamp_type": "log-append" if attributes & 0x08 else "create",
                "transactional": bool(attributes & 0x10),
                "control": bool(attributes & 0x20),
                "last_offset_delta": last_delta,
                "base_timestamp": base_ts,
                "max_timestamp": max_ts,
                "producer_id": producer_id,
                "producer_epoch": producer_epoch,
                "base_sequence": base_sequence,
                "records": count,
                "bytes": data[pos : pos + 12 + length],
            }
        )
        pos += 12 + length
    return out


def fetch(bootstrap: str, topic: str, partition: int, offset: int, *, max_wait: int = 100):
    """Fetch v12 (by name) of one partition: its response as plain data."""
    r = call(
        bootstrap,
        1,
        12,
        replica_id=-1,
        max_wait=max_wait,
        min_bytes=1,
        max_bytes=16 << 20,
        isolation_level=0,
        session_id=0,
        session_epoch=-1,
        topics=[
            {
                "topic": topic,
                "partitions": [
                    {
                        "partition": partition,
                        "current_leader_epoch": -1,
                        "fetch_offset": offset,
                        "last_fetched_epoch": -1,
                        "log_start_offset": -1,
                        "partition_max_bytes": 8 << 20,
                    }
                ],
            }
        ],
        forgotten_topics_data=[],
        rack_id="",
    )
    return r["responses"][0]["partitions"][0]


def stored_batches(bootstrap: str, topic: str, partition: int) -> list[dict[str, Any]]:
    """Every batch of a partition, from its log start to its high watermark."""
    start = list_offset(bootstrap, topic, partition, -2)["offset"]
    end = list_offset(bootstrap, topic, partition, -1)["offset"]
    out: list[dict[str, Any]] = []
    offset = start
    while offset < end:
        p = fetch(bootstrap, topic, partition, offset)
        assert p["error_code"] == 0, p
        got = [
            b
            for b in parse_batches(p["records"])
            if b["base_offset"] + b["last_offset_delta"] >= offset
        ]
        assert got, f"no batch at offset {offset} of {topic}/{partition}"
        out += got
        offset = got[-1]["base_offset"] + got[-1]["last_offset_delta"] + 1
    return out


def diff(stratalog: Any, kafka: Any, path: str = "") -> list[str]:
    """Where two observables differ, as 'path: stratalog=... kafka=...' lines (for messages)."""
    if isinstance(stratalog, dict) and isinstance(kafka, dict):
        out: list[str] = []
        for k in sorted(set(stratalog) | set(kafka), key=str):
            if k not in stratalog or k not in kafka:
                out.append(
                    f"{path}.{k}: stratalog={stratalog.get(k, '<absent>')!r:.200} "
                    f"kafka={kafka.get(k, '<absent>')!r:.200}"
                )
            else:
                out += diff(stratalog[k], kafka[k], f"{path}.{k}")
        return out
    if (
        isinstance(stratalog, list | tuple)
        and isinstance(kafka, list | tuple)
        and len(stratalog) == len(kafka)
    ):
        out = []
        for i, (a, b) in enumerate(zip(stratalog, kafka, strict=True)):
            out += diff(a, b, f"{path}[{i}]")
        return out
    if stratalog != kafka:
        return [f"{path or '.'}: stratalog={stratalog!r:.300} kafka={kafka!r:.300}"]
    return []


def differences(stratalog: Any, kafka: Any) -> str:
    return "Stratalog differs from Kafka:\n  " + "\n  ".join(diff(stratalog, kafka))


class Connection:
    """One connection for a sequence of requests (state a broker ties to the connection, such
    as a share session, lives as long as it). Use as a context manager."""

    def __init__(self, bootstrap: str, timeout: float = 30.0) -> None:
        self.bootstrap = bootstrap
        self.sock = socket.create_connection(_address(bootstrap), timeout=timeout)
        self.correlation_id = CORRELATION_ID

    def call(self, api_key: int, version: int, /, **values: Any) -> dict[str, Any]:
        """One request on this connection; the decoded response as plain data."""
        self.correlation_id += 1
        body = build(api_key, version, **values)
        self.sock.sendall(request_frame(api_key, version, body, self.correlation_id))
        (size,) = struct.unpack(">i", self._read(4))
        correlation_id, response = decode(api_key, version, self._read(size))
        assert correlation_id == self.correlation_id
        return plain(response)

    def _read(self, n: int) -> bytes:
        buf = b""
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise ConnectionError("the broker closed the connection")
            buf += chunk
        return buf

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
