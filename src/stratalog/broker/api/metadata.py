"""Metadata, DescribeCluster and DescribeTopicPartitions: what the cluster looks like.

A single node leads every partition at leader epoch 0 and is its only replica. In a cluster a
partition's leader is its virtual log's primary, its leader epoch the log's epoch, and the
brokers listed are the live ones registered in etcd. The advertised host and port are what
clients reconnect to, so they must be reachable from the client.
"""

from __future__ import annotations

import uuid

from stratalog.cluster.metadata import MetadataError, TopicMeta, is_internal, validate_topic_name
from stratalog.protocol.connection import Request

from .common import (
    AUTHORIZED_OPS_OMITTED,
    CLUSTER_OPERATIONS,
    NONE,
    TOPIC_OPERATIONS,
    authorized,
    err,
    reply,
    sub,
)

_ZERO_UUID = uuid.UUID(int=0)


def _placement(core, t: TopicMeta, i: int, named) -> tuple[str, int, int, tuple, tuple]:
    """(error, leader, leader epoch, replicas, in-sync replicas) of partition ``i`` of a cluster:
    its virtual log's primary (if ``named`` to clients), epoch, replicas and in-sync set."""
    v = core.cluster.vlog_of(t.name, i)
    if v is None:
        return "LEADER_NOT_AVAILABLE", -1, -1, (), ()
    leader = v.primary if v.primary in named else -1
    error = "NONE" if leader >= 0 else "LEADER_NOT_AVAILABLE"
    return error, leader, v.epoch, tuple(v.replicas), tuple(v.isr)


def _partitions(core, req: Request, t: TopicMeta, cls_name: str) -> tuple:
    if core.cluster is not None:
        out = []
        live = core.cluster.leaders_named()
        for i in range(len(t.partitions)):
            error, leader, epoch, replicas, isr = _placement(core, t, i, live)
            out.append(
                sub(
                    req,
                    cls_name,
                    error_code=err(error),
                    partition_index=i,
                    leader_id=leader,
                    leader_epoch=epoch,
                    replica_nodes=replicas,
                    isr_nodes=isr,
                    offline_replicas=tuple(r for r in replicas if r not in live),
                    eligible_leader_replicas=(),
                    last_known_elr=(),
                )
            )
        return tuple(out)
    node = core.node_id
    return tuple(
        sub(
            req,
            cls_name,
            error_code=NONE,
            partition_index=i,
            leader_id=node,
            leader_epoch=0,
            replica_nodes=(node,),
            isr_nodes=(node,),
            offline_replicas=(),
            eligible_leader_replicas=(),
            last_known_elr=(),
        )
        for i in range(len(t.partitions))
    )


def _topic(core, req: Request, t: TopicMeta, ops: int = AUTHORIZED_OPS_OMITTED) -> object:
    return sub(
        req,
        "MetadataResponseTopic",
        error_code=NONE,
        name=t.name,
        topic_id=t.topic_id,
        is_internal=is_internal(t.name),
        partitions=_partitions(core, req, t, "MetadataResponsePartition"),
        topic_authorized_operations=ops,
    )


def _missing(req: Request, name: str | None, topic_id: uuid.UUID | None, error: str) -> object:
    return sub(
        req,
        "MetadataResponseTopic",
        error_code=err(error),
        name=name,
        topic_id=topic_id or _ZERO_UUID,
        is_internal=is_internal(name),  # as Kafka: by name, even for a missing topic
        partitions=(),
        topic_authorized_operations=AUTHORIZED_OPS_OMITTED,
    )


def handle_metadata(core, req: Request, conn, may_create=None) -> bytes:
    """``may_create``: with the authorizer on, whether this client may auto-create a topic
    (broker/authorization/); one it may not is answered as missing, and that check answers
    it TOPIC_AUTHORIZATION_FAILED."""
    body = req.body
    v = req.api_version
    requested = body.topics
    ops = authorized(getattr(body, "include_topic_authorized_operations", False), TOPIC_OPERATIONS)
    if requested is None or (v == 0 and not requested):
        topics = [_topic(core, req, t, ops) for t in core.metadata.topics.values()]
    else:
        allow_auto = getattr(body, "allow_auto_topic_creation", True)
        topics = []
        for rt in requested:
            name = rt.name
            tid = getattr(rt, "topic_id", None)
            if name is None and tid is not None and tid != _ZERO_UUID:
                t = core.topic_by_id(tid)
                topics.append(
                    _topic(core, req, t, ops) if t else _missing(req, None, tid, "UNKNOWN_TOPIC_ID")
                )
                continue
            try:
                validate_topic_name(name)
            except MetadataError:
                topics.append(_missing(req, name, None, "INVALID_TOPIC_EXCEPTION"))
                continue
            t = core.metadata.topics.get(name)
            if t is None and allow_auto and (may_create is None or may_create(name)):
                t = core.auto_create(name)
            if t is None:
                topics.append(_missing(req, name, None, "UNKNOWN_TOPIC_OR_PARTITION"))
            else:
                topics.append(_topic(core, req, t, ops))
    brokers = tuple(
        sub(req, "MetadataResponseBroker", node_id=n, host=h, port=p, rack=None)
        for n, h, p in _brokers(core, conn)
    )
    return reply(
        req,
        brokers=brokers,
        cluster_id=core.metadata.cluster_id,
        controller_id=_controller(core),
        topics=tuple(topics),
        cluster_authorized_operations=authorized(
            getattr(body, "include_cluster_authorized_operations", False), CLUSTER_OPERATIONS
        ),
    )


def _brokers(core, conn) -> list[tuple[int, str, int]]:
    """(node id, host, port) of every live broker: this one alone, or the cluster's (with any
    leader whose registration went, see ClusterNode.leaders_named); the address of the listener
    the client connected to, as Kafka answers."""
    if core.cluster is None:
        return [(core.node_id, *core.endpoint(conn))]
    named = core.cluster.leaders_named()
    listed = [(b.node_id, *core.broker_endpoint(b, conn)) for _n, b in sorted(named.items())]
    if core.node_id not in named:
        # Unregistered (etcd away, or its lease just lost): it answers, so it lists itself. A
        # list without it, empty in an etcd outage, made librdkafka drop every broker it knew
        # and wait minutes to bootstrap again (its producers stalled in the fault soak).
        listed.append((core.node_id, *core.endpoint(conn)))
        listed.sort()
    return listed


def _controller(core) -> int:
    if core.cluster is None or not core.cluster.brokers:
        return core.node_id
    elected = core.cluster.controller_id
    if elected in core.cluster.brokers:
        return elected
    # None elected yet (or its registration went first): the lowest live node id stands for it.
    return min(core.cluster.brokers)


def handle_describe_cluster(core, req: Request, conn) -> bytes:
    brokers = tuple(
        sub(req, "DescribeClusterBroker", broker_id=n, host=h, port=p, rack=None)
        for n, h, p in _brokers(core, conn)
    )
    return reply(
        req,
        error_code=NONE,
        error_message=None,
        endpoint_type=getattr(req.body, "endpoint_type", 1),
        cluster_id=core.metadata.cluster_id,
        controller_id=_controller(core),
        brokers=brokers,
        cluster_authorized_operations=authorized(
            req.body.include_cluster_authorized_operations, CLUSTER_OPERATIONS
        ),
    )


def handle_describe_topic_partitions(core, req: Request, conn) -> bytes:
    body = req.body
    names = [t.name for t in body.topics] if body.topics else sorted(core.metadata.topics)
    limit = max(1, body.response_partition_limit or 2000)
    start_topic = body.cursor.topic_name if body.cursor is not None else None
    start_part = body.cursor.partition_index if body.cursor is not None else 0
    if start_topic is not None:
        names = [n for n in sorted(names) if n >= start_topic]
    out = []
    budget = limit
    next_cursor = None
    for name in names:
        t = core.metadata.topics.get(name)
        if t is None:
            out.append(
                sub(
                    req,
                    "DescribeTopicPartitionsResponseTopic",
                    error_code=err("UNKNOWN_TOPIC_OR_PARTITION"),
                    name=name,
                    topic_id=_ZERO_UUID,
                    is_internal=is_internal(name),
                    partitions=(),
                    topic_authorized_operations=TOPIC_OPERATIONS,
                )
            )
            continue
        if budget <= 0:
            next_cursor = sub(req, "Cursor", topic_name=name, partition_index=0)
            break
        first = start_part if name == start_topic else 0
        parts = _partitions(core, req, t, "DescribeTopicPartitionsResponsePartition")[first:]
        if len(parts) > budget:
            next_cursor = sub(req, "Cursor", topic_name=name, partition_index=first + budget)
            parts = parts[:budget]
        budget -= len(parts)
        out.append(
            sub(
                req,
                "DescribeTopicPartitionsResponseTopic",
                error_code=NONE,
                name=name,
                topic_id=t.topic_id,
                is_internal=is_internal(name),
                partitions=parts,
                topic_authorized_operations=TOPIC_OPERATIONS,
            )
        )
        if next_cursor is not None:
            break
    return reply(req, topics=tuple(out), next_cursor=next_cursor)
