"""A small blocking Kafka-protocol client for the few requests Stratalog's tools need.

It fetches *raw* record batches (the bytes the broker stored), which is what the Arrow reader
and the time-range replay decode; librdkafka would decode them into per-record Python objects
first.

In a cluster every partition has a leader and only it answers for the partition. Requests about
partitions (Fetch, ListOffsets, Produce) go to each partition's leader, learned from Metadata
(``client/leaders.py``), over one connection per broker; committed offsets go to the group's
coordinator (FindCoordinator); the rest to any broker. A partition whose leader is not known
yet goes first to the broker the client is connected to, so against a single broker it is one
connection and no extra request, as it always was. An answer that the leadership moved, or a
broker's connection failing while other brokers are known, makes the client ask Metadata again
and retry, for up to ``leader_wait`` seconds. Not thread-safe (one client per thread or task).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

from stratalog.client.connection import Address, BrokerConnection
from stratalog.client.errors import ConnectionLost, WireError
from stratalog.client.leaders import COORDINATOR_MOVED, LEADER_MOVED, LeaderMap, Retries
from stratalog.client.security import ClientSecurity
from stratalog.protocol import codec
from stratalog.protocol.errors import ErrorCode
from stratalog.protocol.fetch import decode_fetch_response

METADATA_V = 12
LIST_OFFSETS_V = 7
FETCH_V = 12
PRODUCE_V = 9
INIT_PRODUCER_ID_V = 4
OFFSET_COMMIT_V = 8
OFFSET_FETCH_V = 8
CREATE_TOPICS_V = 5
FIND_COORDINATOR_V = 3
DESCRIBE_LOG_DIRS_V = 4

EARLIEST = -2
LATEST = -1

__all__ = ["ConnectionLost", "WireClient", "WireError"]

A = TypeVar("A")


@dataclass(frozen=True, slots=True)
class PartitionData:
    partition: int
    error_code: int
    high_watermark: int
    log_start_offset: int
    records: bytes | memoryview  # a view of the response frame when fetched by WireClient
    last_stable_offset: int = -1
    # (producer id, first offset) of the aborted transactions the records overlap
    # (read_committed answers only)
    aborted: list[tuple[int, int]] | None = None
    # A split child's (batch base offset, parent offset) order marks (stratalog.splits)
    order: list[tuple[int, int]] | None = None


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
    """The first address of a bootstrap list."""
    return parse_bootstrap_list(bootstrap)[0]


def parse_bootstrap_list(bootstrap: str) -> list[Address]:
    """``HOST:PORT[,HOST:PORT...]`` -> the addresses, in order."""
    out = []
    for addr in bootstrap.split(","):
        if not addr.strip():
            continue
        hp = split_host_port(addr)
        if hp is None:
            raise ValueError(f"bootstrap address {addr!r} is not of the form HOST:PORT")
        if hp not in out:
            out.append(hp)
    if not out:
        raise ValueError(f"bootstrap address {bootstrap!r} is not of the form HOST:PORT")
    return out


class WireClient:
    def __init__(
        self,
        bootstrap: str,
        *,
        timeout: float = 30.0,
        client_id: str = "stratalog",
        leader_wait: float = 30.0,
        security: ClientSecurity | None = None,
    ) -> None:
        """``security``: TLS and SASL for a secured listener (client/security.py)."""
        self.bootstrap = parse_bootstrap_list(bootstrap)
        self.security = security
        self.address = self.bootstrap[0]
        self.timeout = timeout
        self.client_id = client_id
        self.leader_wait = leader_wait
        self.leaders = LeaderMap()
        self._conns: dict[Address, BrokerConnection] = {}
        # The connection to "some broker" (Metadata, topics, producer ids): the first bootstrap
        # address that answered. With one broker in the cluster, everything goes over it.
        self._home: BrokerConnection | None = None

    # -- connections ---------------------------------------------------------------------------
    def close(self) -> None:
        for conn in self._conns.values():
            conn.close()
        self._conns.clear()
        self._home = None

    def __enter__(self) -> WireClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _any(self) -> BrokerConnection:
        """A connection to some live broker: the one in use, else the bootstrap addresses in
        order, then the brokers Metadata listed (the bootstrap ones may all be gone)."""
        if self._home is not None and self._home.is_open:
            return self._home
        problems = []
        for addr in dict.fromkeys([*self.bootstrap, *self.leaders.brokers.values()]):
            conn = self._conns.get(addr) or self._new_connection(addr)
            try:
                conn.open()
            except ConnectionLost as e:
                problems.append(str(e))
                continue
            self._conns[addr] = self._home = conn
            return conn
        if len(problems) == 1:
            raise ConnectionLost(problems[0])
        raise ConnectionLost("no broker answered: " + "; ".join(problems))

    def _new_connection(self, addr: Address) -> BrokerConnection:
        return BrokerConnection(
            addr, timeout=self.timeout, client_id=self.client_id, security=self.security
        )

    def _connection(self, node: int | None) -> BrokerConnection:
        """The connection to broker ``node`` (None: any broker)."""
        addr = self.leaders.address(node) if node is not None else None
        if addr is None or len(self.leaders.brokers) == 1:
            # One broker: the connection the client has, whatever address it advertises.
            return self._any()
        conn = self._conns.get(addr)
        if conn is None:
            conn = self._conns[addr] = self._new_connection(addr)
        return conn

    def _lost(self, conn: BrokerConnection, node: int | None) -> None:
        conn.close()
        if conn is self._home:
            self._home = None
        if node is not None:
            self.leaders.forget_node(node)

    def _several_brokers(self) -> bool:
        """Whether another broker may take over a lost one's partitions: a lost connection to
        the only broker (given one address, told of one broker) is an error at once, as it
        always was."""
        return len(self.leaders.brokers) > 1 or len(self.bootstrap) > 1

    def leader_address(self, topic: str, partition: int) -> str | None:
        """``HOST:PORT`` of the partition's leader as last learned (a hint for another client:
        put first in its bootstrap list, it spares a wrong first guess)."""
        if len(self.leaders.brokers) < 2:
            return None  # a single broker: the address the client was given is the one
        node = self.leaders.leader(topic, partition)
        addr = self.leaders.address(node) if node is not None else None
        return join_host_port(*addr) if addr is not None else None

    def request(self, api_key: int, version: int, body: Any) -> Any:
        """One request to any broker (another one if its connection fails in a cluster)."""
        conn = self._any()
        try:
            return conn.request(api_key, version, body)
        except ConnectionLost:
            self._lost(conn, None)
            if not self._several_brokers():
                raise
        return self._any().request(api_key, version, body)

    def _refresh(self, topics: list[str] | None, allow_auto_create: bool = False) -> Any:
        """Ask Metadata and learn the brokers and the leaders from the answer."""
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
        self.leaders.learn_brokers((b.node_id, b.host, b.port) for b in resp.brokers)
        for t in resp.topics:
            if t.name is not None and not t.error_code:
                for p in t.partitions:
                    self.leaders.learn_leader(t.name, p.partition_index, p.leader_id)
        return resp

    def _to_leaders(
        self,
        topic: str,
        partitions: Iterable[int],
        send: Callable[[BrokerConnection, list[int], bool], dict[int, A]],
        error_of: Callable[[A], int],
    ) -> dict[int, A]:
        """partition -> the answer of its leader to ``send(connection, partitions, fresh)``.

        Partitions whose answer says the leader moved, or whose leader's connection failed, are
        sent again after a Metadata refresh (at once, then with a backoff) until
        ``leader_wait`` is spent; then their last answer is returned (or the connection's
        failure raised). ``fresh`` is False for a
        connection that already answered in this call: its reused buffer holds that answer.
        """
        out: dict[int, A] = {}
        todo = list(partitions)
        retries: Retries | None = None
        answered: set[int] = set()
        rounds = 0
        while True:
            moved: list[int] = []
            last: dict[int, A] = {}
            lost: ConnectionLost | None = None
            try:
                # The first round sends partitions of unknown leader to the broker the client
                # is connected to: a single node leads them all, so it never needs Metadata;
                # in a cluster a wrong guess costs one NOT_LEADER_OR_FOLLOWER answer.
                if rounds and any(self.leaders.leader(topic, p) is None for p in todo):
                    self._refresh([topic])
                routes = self.leaders.by_leader(topic, todo)
            except ConnectionLost as e:
                routes, lost, moved = {}, e, list(todo)
            for node, parts in routes.items():
                conn = self._connection(node)
                try:
                    got = send(conn, parts, id(conn) not in answered)
                except ConnectionLost as e:
                    self._lost(conn, node)
                    lost = e
                    moved += parts
                    continue
                answered.add(id(conn))
                for p in parts:
                    if p not in got:
                        continue
                    if error_of(got[p]) in LEADER_MOVED:
                        self.leaders.forget_leader(topic, p)
                        moved.append(p)
                        last[p] = got[p]
                    else:
                        out[p] = got[p]
            if not moved:
                return out
            if lost is not None and not self._several_brokers():
                raise lost
            rounds += 1
            todo = moved
            if rounds == 1:
                continue  # at once: the first answer may only say the guess was wrong
            if retries is None:
                retries = Retries(self.leader_wait)
            if not retries.wait():
                for p in moved:
                    if p not in last:
                        assert lost is not None
                        raise lost
                    out[p] = last[p]
                return out

    def _to_coordinator(
        self, group: str, api_key: int, version: int, body: Any, errors: Callable[[Any], set]
    ) -> Any:
        """One request to ``group``'s coordinator, found again while the answers (``errors``
        of them) say it moved, for up to ``leader_wait`` seconds."""
        retries: Retries | None = None
        while True:
            resp = failure = None
            try:
                node = self.leaders.coordinator(group)
                if node is None:
                    node = self._find_coordinator(group)
                if node is not None:
                    conn = self._connection(node)
                    try:
                        resp = conn.request(api_key, version, body)
                    except ConnectionLost:
                        self._lost(conn, node)
                        raise
            except ConnectionLost as e:
                if not self._several_brokers():
                    raise
                failure = e
            if resp is not None and not (errors(resp) & COORDINATOR_MOVED):
                return resp
            self.leaders.forget_coordinator(group)
            if retries is None:
                retries = Retries(self.leader_wait)
            if not retries.wait():
                if resp is not None:
                    return resp
                raise failure or WireError(f"no coordinator for group {group!r}")

    def _find_coordinator(self, group: str) -> int | None:
        resp = self.request(
            10, FIND_COORDINATOR_V, self._new(10, FIND_COORDINATOR_V, key=group, key_type=0)
        )
        if resp.error_code in COORDINATOR_MOVED:
            return None  # not elected yet (the offsets topic is being created): ask again
        if resp.error_code:
            raise WireError(
                f"FindCoordinator {group}: {resp.error_code.name}", int(resp.error_code)
            )
        if not self.leaders.brokers:
            self._refresh([])  # whether it is the only broker: then it is this connection
        self.leaders.learn_coordinator(group, resp.node_id, resp.host, resp.port)
        return resp.node_id

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
        """The topics' partition counts (every topic with None); the leaders are learned."""
        resp = self._refresh(topics, allow_auto_create)
        return {
            t.name: TopicInfo(
                t.name, t.topic_id, len(t.partitions), int(t.error_code), bool(t.is_internal)
            )
            for t in resp.topics
        }

    def leader_log_dir(self, topic: str, partition: int) -> tuple[str, int, str] | None:
        """(cluster id, leader's node id, the leader's log directory holding the partition),
        from Metadata and the leader's DescribeLogDirs; None when the leader does not say."""
        resp = self._refresh([topic])
        node = self.leaders.leader(topic, partition)
        if node is None or node < 0:
            return None
        conn = self._connection(node)
        body = self._new(
            35,
            DESCRIBE_LOG_DIRS_V,
            topics=(
                self._new(
                    35,
                    DESCRIBE_LOG_DIRS_V,
                    "DescribableLogDirTopic",
                    topic=topic,
                    partitions=(partition,),
                ),
            ),
        )
        try:
            answer = conn.request(35, DESCRIBE_LOG_DIRS_V, body)
        except ConnectionLost:
            self._lost(conn, node)
            return None
        for result in answer.results:
            if result.error_code:
                continue
            for t in result.topics:
                if t.name == topic and any(
                    int(p.partition_index) == partition for p in t.partitions
                ):
                    return str(resp.cluster_id), int(node), str(result.log_dir)
        return None

    def list_offsets(
        self, topic: str, partitions: list[int], timestamp: int, *, isolation_level: int = 0
    ) -> dict[int, tuple[int, int]]:
        """partition -> (offset, timestamp) for EARLIEST, LATEST or a timestamp in ms (LATEST
        with ``isolation_level`` 1, read_committed: the last stable offset)."""

        def send(conn: BrokerConnection, parts: list[int], _fresh: bool) -> dict[int, Any]:
            body = self._list_offsets_request(topic, parts, timestamp, isolation_level)
            resp = conn.request(2, LIST_OFFSETS_V, body)
            return {p.partition_index: p for t in resp.topics for p in t.partitions}

        out = {}
        for index, p in self._to_leaders(topic, partitions, send, _error_code).items():
            if p.error_code:
                raise WireError(
                    f"ListOffsets {topic}/{index}: {p.error_code.name}", int(p.error_code)
                )
            out[index] = (p.offset, p.timestamp)
        return out

    def _list_offsets_request(
        self, topic: str, partitions: list[int], timestamp: int, isolation_level: int = 0
    ) -> Any:
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
        return self._new(
            2,
            LIST_OFFSETS_V,
            replica_id=-1,
            isolation_level=isolation_level,
            topics=(
                self._new(2, LIST_OFFSETS_V, "ListOffsetsTopic", name=topic, partitions=parts),
            ),
        )

    def fetch_request(
        self,
        topic: str,
        offsets: dict[int, int],
        *,
        max_bytes: int = 64 * 1024 * 1024,
        partition_max_bytes: int = 16 * 1024 * 1024,
        max_wait_ms: int = 0,
        min_bytes: int = 1,
        isolation_level: int = 0,
    ) -> Any:
        """The body of a Fetch (version FETCH_V) of ``offsets`` (partition -> offset);
        ``isolation_level`` 1 is read_committed."""
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
            isolation_level=isolation_level,
            session_id=0,
            session_epoch=-1,
            topics=(self._new(1, FETCH_V, "FetchTopic", topic=topic, partitions=parts),),
            forgotten_topics_data=(),
            rack_id="",
        )

    def fetch(
        self, topic: str, offsets: dict[int, int], *, reuse_buffer: bool = False, **limits: int
    ) -> dict[int, PartitionData]:
        """One Fetch of ``offsets`` (partition -> offset) of ``topic`` from each leader among
        them (one after the other: a long-poll waits at each); ``limits`` are fetch_request's
        (max_bytes, partition_max_bytes, max_wait_ms, min_bytes, isolation_level).

        With ``reuse_buffer`` the returned records are views of a buffer that the next call on
        this client overwrites: for callers that decode each answer before asking again.
        """

        def send(conn: BrokerConnection, parts: list[int], fresh: bool) -> dict[int, Any]:
            body = self.fetch_request(topic, {p: offsets[p] for p in parts}, **limits)
            return _fetch_from(conn, body, reuse_buffer and fresh)

        return self._to_leaders(topic, offsets, send, _error_code)

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
        """Send one batch per partition to its leader; partition -> (error code, base offset).

        A batch whose leader's connection broke before the answer is sent again: an idempotent
        batch (a producer id and sequences) is then answered as a duplicate if it was written,
        any other may be written twice, as with any Kafka producer that retries."""

        def send(conn: BrokerConnection, parts: list[int], _fresh: bool) -> dict[int, Any]:
            data = tuple(
                self._new(0, PRODUCE_V, "PartitionProduceData", index=p, records=batches[p])
                for p in parts
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
            resp = conn.request(0, PRODUCE_V, body)
            return {
                p.index: (int(p.error_code), p.base_offset)
                for t in resp.responses
                for p in t.partition_responses
            }

        return self._to_leaders(topic, batches, send, lambda answer: answer[0])

    def create_topic(
        self,
        name: str,
        partitions: int,
        configs: dict[str, str] | None = None,
        replication_factor: int = -1,
    ) -> None:
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
            replication_factor=replication_factor,
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
        body = self._new(
            8,
            OFFSET_COMMIT_V,
            group_id=group,
            generation_id_or_member_epoch=-1,
            member_id="",
            group_instance_id=None,
            topics=topics,
        )
        resp = self._to_coordinator(
            group,
            8,
            OFFSET_COMMIT_V,
            body,
            lambda r: {int(p.error_code) for t in r.topics for p in t.partitions},
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
        resp = self._to_coordinator(
            group,
            9,
            OFFSET_FETCH_V,
            self._new(9, OFFSET_FETCH_V, groups=(g,), require_stable=False),
            lambda r: {int(grp.error_code) for grp in r.groups},
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


def _error_code(answer: Any) -> int:
    return int(answer.error_code)


def _fetch_from(conn: BrokerConnection, body: Any, scratch: bool) -> dict[int, PartitionData]:
    # Decoded by hand, not by the codec: the records stay views of the frame instead of being
    # copied (megabytes per call on a catch-up or a Spark read).
    cid, frame = conn.roundtrip(1, FETCH_V, body, scratch)
    try:
        resp = decode_fetch_response(FETCH_V, frame)
    except ValueError as e:
        conn.close()
        raise WireError(str(e)) from None
    conn.check_correlation(resp.correlation_id, cid)
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
                p.last_stable_offset,
                p.aborted,
                p.order,
            )
    return out
