"""A small blocking Kafka-protocol client for the few requests Stratalog's tools need.

It fetches *raw* record batches (the bytes the broker stored), which is what the Arrow reader
and the time-range replay decode; librdkafka would decode them into per-record Python objects
first. One connection per client; not thread-safe (one per thread or task).
"""

from __future__ import annotations

import itertools
import socket
import struct
import uuid
from dataclasses import dataclass
from typing import Any

from stratalog.protocol import codec
from stratalog.protocol.errors import ErrorCode
from stratalog.protocol.fetch import decode_fetch_response

_I32 = struct.Struct(">i")

METADATA_V = 12
LIST_OFFSETS_V = 7
FETCH_V = 12
PRODUCE_V = 9
INIT_PRODUCER_ID_V = 4
OFFSET_COMMIT_V = 8
OFFSET_FETCH_V = 8
CREATE_TOPICS_V = 5

EARLIEST = -2
LATEST = -1


class WireError(Exception):
    """A Kafka error code in an answer, or a broken connection."""

    def __init__(self, message: str, error_code: int = -1) -> None:
        super().__init__(message)
        self.error_code = error_code


@dataclass(frozen=True, slots=True)
class PartitionData:
    partition: int
    error_code: int
    high_watermark: int
    log_start_offset: int
    records: bytes | memoryview  # a view of the response frame when fetched by WireClient


@dataclass(frozen=True, slots=True)
class TopicInfo:
    name: str
    topic_id: uuid.UUID
    partitions: int
    error_code: int
    internal: bool = False  # Kafka's internal topics (__consumer_offsets)


def split_host_port(addr: str) -> tuple[str, int] | None:
    """``HOST:PORT`` or ``[IPv6]:PORT`` -> (host, port); None if it is neither."""
    host, _, port = addr.strip().rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not host or not port.isdigit():
        return None
    return host, int(port)


def join_host_port(host: str, port: int) -> str:
    """The address clients are given: an IPv6 literal in brackets, as Kafka clients expect."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def parse_bootstrap(bootstrap: str) -> tuple[str, int]:
    hp = split_host_port(bootstrap.split(",")[0])
    if hp is None:
        raise ValueError(f"bootstrap address {bootstrap!r} is not of the form HOST:PORT")
    return hp


class WireClient:
    def __init__(self, bootstrap: str, *, timeout: float = 30.0, client_id: str = "stratalog"):
        self.address = parse_bootstrap(bootstrap)
        self.timeout = timeout
        self.client_id = client_id
        self._sock: socket.socket | None = None
        self._ids = itertools.count(1)
        # Receive buffer reused by fetch(reuse_buffer=True): a fresh 8 MiB bytearray per Fetch
        # costs a memset and, once glibc maps it afresh, a page fault per 4 KiB (a tenth of a
        # Spark reader's CPU per row, measured with py-spy).
        self._scratch = bytearray()

    # -- plumbing ------------------------------------------------------------------------------
    def _connect(self) -> socket.socket:
        if self._sock is None:
            try:
                s = socket.create_connection(self.address, timeout=self.timeout)
            except OSError as e:
                raise WireError(
                    f"cannot reach a broker at {self.address[0]}:"
                    f"{self.address[1]}: {e.strerror or e}"
                ) from None
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._sock = s
        return self._sock

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def __enter__(self) -> WireClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _recv_exactly(self, n: int, scratch: bool = False) -> memoryview:
        # A read-only view of the buffer, not bytes(buf): a Fetch response is megabytes, and the
        # codec copies out the fields it keeps anyway.
        sock = self._connect()
        if scratch:
            if len(self._scratch) < n:
                # Views of the old buffer handed out earlier keep it alive; it is not resized.
                self._scratch = bytearray(n)
            view = memoryview(self._scratch)[:n]
        else:
            view = memoryview(bytearray(n))
        got = 0
        while got < n:
            k = sock.recv_into(view[got:])
            if k == 0:
                self.close()
                raise WireError("the broker closed the connection")
            got += k
        return view.toreadonly()

    def _roundtrip(
        self, api_key: int, version: int, body: Any, scratch: bool = False
    ) -> tuple[int, memoryview]:
        """Send one request; (its correlation id, the response frame without length prefix).
        With ``scratch`` the frame lives in the client's reused buffer, valid until the next
        call."""
        cid = next(self._ids) & 0x7FFFFFFF
        frame = codec.encode_request(api_key, version, cid, self.client_id, body)
        try:
            self._connect().sendall(frame)
            (size,) = _I32.unpack(self._recv_exactly(4))
            return cid, self._recv_exactly(size, scratch)
        except OSError as e:
            self.close()
            raise WireError(f"connection to the broker failed: {e}") from None

    def _check_correlation(self, got: int, cid: int) -> None:
        if got != cid:
            self.close()
            raise WireError(f"correlation id {got} does not match request {cid}")

    def request(self, api_key: int, version: int, body: Any) -> Any:
        cid, data = self._roundtrip(api_key, version, body)
        got, resp = codec.decode_response(api_key, version, data)
        self._check_correlation(got, cid)
        return resp

    def _new(self, api_key: int, version: int, entity: str | None = None, /, **fields: Any) -> Any:
        cls = codec.request_class(api_key, version)
        if entity is not None:
            import importlib

            cls = getattr(importlib.import_module(cls.__module__), entity)
        return codec.build(cls, **fields)

    # -- requests ------------------------------------------------------------------------------
    def api_keys(self) -> set[int]:
        """The API keys the broker serves (ApiVersions v0)."""
        resp = self.request(18, 0, self._new(18, 0))
        if resp.error_code:
            raise WireError(f"ApiVersions failed with error {resp.error_code}", resp.error_code)
        return {k.api_key for k in resp.api_keys}

    def metadata(
        self, topics: list[str] | None = None, allow_auto_create: bool = False
    ) -> dict[str, TopicInfo]:
        req_topics = None
        if topics is not None:
            req_topics = tuple(
                self._new(3, METADATA_V, "MetadataRequestTopic", name=t, topic_id=None)
                for t in topics
            )
        resp = self.request(
            3,
            METADATA_V,
            self._new(
                3,
                METADATA_V,
                topics=req_topics,
                allow_auto_topic_creation=allow_auto_create,
                include_topic_authorized_operations=False,
            ),
        )
        return {
            t.name: TopicInfo(
                t.name, t.topic_id, len(t.partitions), int(t.error_code), bool(t.is_internal)
            )
            for t in resp.topics
        }

    def list_offsets(
        self, topic: str, partitions: list[int], timestamp: int
    ) -> dict[int, tuple[int, int]]:
        """partition -> (offset, timestamp) for EARLIEST, LATEST or a timestamp in ms."""
        parts = tuple(
            self._new(
                2,
                LIST_OFFSETS_V,
                "ListOffsetsPartition",
                partition_index=p,
                current_leader_epoch=-1,
                timestamp=timestamp,
            )
            for p in partitions
        )
        body = self._new(
            2,
            LIST_OFFSETS_V,
            replica_id=-1,
            isolation_level=0,
            topics=(
                self._new(2, LIST_OFFSETS_V, "ListOffsetsTopic", name=topic, partitions=parts),
            ),
        )
        resp = self.request(2, LIST_OFFSETS_V, body)
        out = {}
        for t in resp.topics:
            for p in t.partitions:
                if p.error_code:
                    raise WireError(
                        f"ListOffsets {topic}/{p.partition_index}: {p.error_code.name}",
                        int(p.error_code),
                    )
                out[p.partition_index] = (p.offset, p.timestamp)
        return out

    def fetch_request(
        self,
        topic: str,
        offsets: dict[int, int],
        *,
        max_bytes: int = 64 * 1024 * 1024,
        partition_max_bytes: int = 16 * 1024 * 1024,
        max_wait_ms: int = 0,
        min_bytes: int = 1,
    ) -> Any:
        """The body of a Fetch (version FETCH_V) of ``offsets`` (partition -> offset)."""
        parts = tuple(
            self._new(
                1,
                FETCH_V,
                "FetchPartition",
                partition=p,
                current_leader_epoch=-1,
                fetch_offset=o,
                last_fetched_epoch=-1,
                log_start_offset=-1,
                partition_max_bytes=partition_max_bytes,
            )
            for p, o in offsets.items()
        )
        return self._new(
            1,
            FETCH_V,
            replica_id=-1,
            max_wait=max_wait_ms,
            min_bytes=min_bytes,
            max_bytes=max_bytes,
            isolation_level=0,
            session_id=0,
            session_epoch=-1,
            topics=(self._new(1, FETCH_V, "FetchTopic", topic=topic, partitions=parts),),
            forgotten_topics_data=(),
            rack_id="",
        )

    def fetch(
        self, topic: str, offsets: dict[int, int], *, reuse_buffer: bool = False, **limits: int
    ) -> dict[int, PartitionData]:
        """One Fetch of ``offsets`` (partition -> offset) of ``topic``; ``limits`` are
        fetch_request's (max_bytes, partition_max_bytes, max_wait_ms, min_bytes).

        With ``reuse_buffer`` the returned records are views of a buffer that the next call on
        this client overwrites: for callers that decode each answer before asking again.
        """
        body = self.fetch_request(topic, offsets, **limits)
        # Decoded by hand, not by the codec: the records stay views of the frame instead of
        # being copied (megabytes per call on a catch-up or a Spark read).
        cid, frame = self._roundtrip(1, FETCH_V, body, reuse_buffer)
        try:
            resp = decode_fetch_response(FETCH_V, frame)
        except ValueError as e:
            self.close()
            raise WireError(str(e)) from None
        self._check_correlation(resp.correlation_id, cid)
        if resp.error_code:
            raise WireError(f"Fetch: {ErrorCode(resp.error_code).name}", resp.error_code)
        out = {}
        for _, partitions in resp.topics:
            for p in partitions:
                out[p.index] = PartitionData(
                    p.index,
                    p.error_code,
                    p.high_watermark,
                    p.log_start_offset,
                    p.records if p.records is not None else b"",
                )
        return out

    def init_producer_id(self) -> tuple[int, int]:
        resp = self.request(
            22,
            INIT_PRODUCER_ID_V,
            self._new(
                22,
                INIT_PRODUCER_ID_V,
                transactional_id=None,
                transaction_timeout=60000,
                producer_id=-1,
                producer_epoch=-1,
            ),
        )
        if resp.error_code:
            raise WireError(f"InitProducerId: {resp.error_code.name}", int(resp.error_code))
        return resp.producer_id, resp.producer_epoch

    def produce(
        self, topic: str, batches: dict[int, bytes], *, acks: int = -1, timeout_ms: int = 30000
    ) -> dict[int, tuple[int, int]]:
        """Send one batch per partition; partition -> (error code, base offset)."""
        data = tuple(
            self._new(0, PRODUCE_V, "PartitionProduceData", index=p, records=b)
            for p, b in batches.items()
        )
        body = self._new(
            0,
            PRODUCE_V,
            transactional_id=None,
            acks=acks,
            timeout=timeout_ms,
            topic_data=(
                self._new(0, PRODUCE_V, "TopicProduceData", name=topic, partition_data=data),
            ),
        )
        resp = self.request(0, PRODUCE_V, body)
        out = {}
        for t in resp.responses:
            for p in t.partition_responses:
                out[p.index] = (int(p.error_code), p.base_offset)
        return out

    def create_topic(self, name: str, partitions: int, configs: dict[str, str] | None = None):
        cfgs = tuple(
            self._new(19, CREATE_TOPICS_V, "CreatableTopicConfig", name=k, value=v)
            for k, v in (configs or {}).items()
        )
        topic = self._new(
            19,
            CREATE_TOPICS_V,
            "CreatableTopic",
            name=name,
            num_partitions=partitions,
            replication_factor=-1,
            assignments=(),
            configs=cfgs,
        )
        resp = self.request(
            19,
            CREATE_TOPICS_V,
            self._new(19, CREATE_TOPICS_V, topics=(topic,), timeout=30000, validate_only=False),
        )
        r = resp.topics[0]
        if r.error_code:
            raise WireError(
                f"CreateTopics {name}: {r.error_code.name}: {r.error_message}", int(r.error_code)
            )

    def offset_commit(self, group: str, offsets: dict[tuple[str, int], tuple[int, str]]) -> None:
        """Commit (topic, partition) -> (offset, metadata) outside any group generation."""
        by_topic: dict[str, list] = {}
        for (t, p), (o, meta) in sorted(offsets.items()):
            by_topic.setdefault(t, []).append(
                self._new(
                    8,
                    OFFSET_COMMIT_V,
                    "OffsetCommitRequestPartition",
                    partition_index=p,
                    committed_offset=o,
                    committed_leader_epoch=-1,
                    committed_metadata=meta,
                )
            )
        topics = tuple(
            self._new(8, OFFSET_COMMIT_V, "OffsetCommitRequestTopic", name=t, partitions=tuple(ps))
            for t, ps in by_topic.items()
        )
        resp = self.request(
            8,
            OFFSET_COMMIT_V,
            self._new(
                8,
                OFFSET_COMMIT_V,
                group_id=group,
                generation_id_or_member_epoch=-1,
                member_id="",
                group_instance_id=None,
                topics=topics,
            ),
        )
        for t in resp.topics:
            for p in t.partitions:
                if p.error_code:
                    raise WireError(
                        f"OffsetCommit {group} {t.name}-{p.partition_index}: {p.error_code.name}",
                        int(p.error_code),
                    )

    def offset_fetch(self, group: str) -> dict[tuple[str, int], tuple[int, str | None]]:
        """Every committed (topic, partition) -> (offset, metadata) of ``group``."""
        g = self._new(9, OFFSET_FETCH_V, "OffsetFetchRequestGroup", group_id=group, topics=None)
        resp = self.request(
            9, OFFSET_FETCH_V, self._new(9, OFFSET_FETCH_V, groups=(g,), require_stable=False)
        )
        out = {}
        for grp in resp.groups:
            if grp.error_code:
                raise WireError(f"OffsetFetch {group}: {grp.error_code.name}", int(grp.error_code))
            for t in grp.topics:
                for p in t.partitions:
                    if p.committed_offset >= 0:
                        out[(t.name, p.partition_index)] = (p.committed_offset, p.metadata)
        return out
