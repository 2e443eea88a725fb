"""Metadata, DescribeTopicPartitions, DescribeCluster and the topic administration APIs."""

from __future__ import annotations

import dataclasses
import uuid
from typing import Any

from stratalog.cluster.metadata import is_internal
from stratalog.protocol import codec
from stratalog.protocol import versions as v
from stratalog.protocol.connection import Request
from stratalog.security.acls import CLUSTER_NAME
from stratalog.security.acls import Operation as Op
from stratalog.security.acls import ResourceType as R

from ..api.common import AUTHORIZED_OPS_OMITTED, err, reply, sub
from .access import (
    CLUSTER_DENIED,
    GROUP_DENIED,
    MESSAGES,
    TOPIC_DENIED,
    ZERO_UUID,
    Access,
    Handler,
)
from .answers import (
    edited,
    extended,
    per_topic,
    request_entity,
    split,
    topic_denied,
    with_body,
)


def check_metadata(core, req: Request, conn, handler: Handler, a: Access):
    body = req.body
    requested = body.topics
    every = requested is None or (req.api_version == 0 and not requested)
    topic_ops = getattr(body, "include_topic_authorized_operations", False)
    cluster_ops = getattr(body, "include_cluster_authorized_operations", False)
    refused: set[str] = set()
    create_cluster: list[bool] = []

    def may_create(name: str) -> bool:
        # Auto-creation needs CREATE on the cluster or on the topic (and DESCRIBE, checked on
        # the answer), as Kafka's.
        if not create_cluster:
            create_cluster.append(a.cluster(Op.CREATE))
        if create_cluster[0] or a.topic(Op.CREATE, name):
            return True
        refused.add(name)
        return False

    answer = handler(core, req, conn, may_create=may_create)
    if every:
        hidden = any(not a.topic(Op.DESCRIBE, n) for n in core.metadata.topics)
        named: set[str] = set()
    else:
        named = {t.name for t in requested if t.name is not None}
        hidden = any(not a.topic(Op.DESCRIBE, n) for n in named) or len(named) < len(requested)
    if not (hidden or refused or topic_ops or cluster_ops):
        return answer

    def edit(resp):
        topics = []
        for t in resp.topics:
            name = t.name
            if name is None:
                topics.append(t)  # an unknown topic id: nothing to hide
            elif not a.topic(Op.DESCRIBE, name):
                if every:
                    continue
                if name in named:
                    topics.append(_metadata_error(req, name, ZERO_UUID, False))
                else:  # asked for by id
                    topics.append(_metadata_error(req, None, t.topic_id, False))
            elif name in refused:
                topics.append(_metadata_error(req, name, ZERO_UUID, is_internal(name)))
            elif topic_ops and t.error_code == 0:
                topics.append(
                    dataclasses.replace(t, topic_authorized_operations=a.operations(R.TOPIC, name))
                )
            else:
                topics.append(t)
        changes: dict[str, Any] = {"topics": tuple(topics)}
        if cluster_ops and hasattr(resp, "cluster_authorized_operations"):
            changes["cluster_authorized_operations"] = (
                a.operations(R.CLUSTER, CLUSTER_NAME) if a.cluster(Op.DESCRIBE) else 0
            )
        return dataclasses.replace(resp, **changes)

    return edited(req, answer, edit)


def _metadata_error(req: Request, name: str | None, topic_id: uuid.UUID, internal: bool):
    return sub(
        req,
        "MetadataResponseTopic",
        error_code=err(TOPIC_DENIED),
        name=name,
        topic_id=topic_id,
        is_internal=internal,
        partitions=(),
        topic_authorized_operations=AUTHORIZED_OPS_OMITTED,
    )


def check_describe_topic_partitions(core, req: Request, conn, handler: Handler, a: Access):
    body = req.body
    denied: list[str] = []
    if body.topics:
        kept, denied = split([t.name for t in body.topics], lambda n: a.topic(Op.DESCRIBE, n))
    else:
        # Every topic the principal may describe, named: the handler's cursor walks those.
        kept = sorted(n for n in core.metadata.topics if a.topic(Op.DESCRIBE, n))
    extra = [
        sub(req, "DescribeTopicPartitionsResponseTopic", error_code=err(TOPIC_DENIED), name=n,
            topic_id=ZERO_UUID, is_internal=False, partitions=(),
            topic_authorized_operations=AUTHORIZED_OPS_OMITTED)
        for n in denied
    ]  # fmt: skip
    if not kept:
        return reply(req, topics=tuple(extra), next_cursor=None)
    topic_cls = request_entity(req, "TopicRequest")
    answer = handler(
        core, with_body(req, topics=tuple(codec.build(topic_cls, name=n) for n in kept)), conn
    )

    def edit(resp):
        topics = tuple(
            dataclasses.replace(t, topic_authorized_operations=a.operations(R.TOPIC, t.name))
            if t.error_code == 0
            else t
            for t in resp.topics
        )
        return dataclasses.replace(resp, topics=topics + tuple(extra))

    return edited(req, answer, edit)


def check_describe_cluster(core, req: Request, conn, handler: Handler, a: Access):
    answer = handler(core, req, conn)
    if not req.body.include_cluster_authorized_operations:
        return answer
    ops = a.operations(R.CLUSTER, CLUSTER_NAME) if a.cluster(Op.DESCRIBE) else 0
    return edited(
        req, answer, lambda resp: dataclasses.replace(resp, cluster_authorized_operations=ops)
    )


# -- topic administration ---------------------------------------------------------------------
def check_create_topics(core, req: Request, conn, handler: Handler, a: Access):
    topics = req.body.topics
    if a.cluster(Op.CREATE):
        kept, denied = list(topics), []
    else:
        kept, denied = split(topics, lambda t: a.topic(Op.CREATE, t.name))
    hidden_configs = {t.name for t in kept if not a.topic(Op.DESCRIBE_CONFIGS, t.name)}
    if not denied and not (hidden_configs and req.api_version >= 5):
        return handler(core, req, conn)
    answer = handler(core, with_body(req, topics=tuple(kept)), conn)
    extra = [
        sub(req, "CreatableTopicResult", name=t.name, topic_id=ZERO_UUID,
            error_code=err(TOPIC_DENIED), error_message="Authorization failed.",
            topic_config_error_code=0, num_partitions=-1, replication_factor=-1, configs=())
        for t in denied
    ]  # fmt: skip

    def edit(resp):
        out = []
        for t in resp.topics:
            if t.name in hidden_configs and t.error_code == 0 and hasattr(t, "configs"):
                t = dataclasses.replace(t, configs=(), topic_config_error_code=err(TOPIC_DENIED))
            out.append(t)
        return dataclasses.replace(resp, topics=(*out, *extra))

    return edited(req, answer, edit)


def check_delete_topics(core, req: Request, conn, handler: Handler, a: Access):
    def refused(name: str | None) -> bool:
        # Not describable: refused whether it exists or not; describable but missing: the
        # handler says so; there but not deletable: refused.
        if name is None or a.topic(Op.DELETE, name):
            return False
        return not a.topic(Op.DESCRIBE, name) or name in core.metadata.topics

    if req.api_version < 6:
        kept, denied = split(req.body.topic_names, lambda n: not refused(n))
        if not denied:
            return handler(core, req, conn)
        answer = handler(core, with_body(req, topic_names=tuple(kept)), conn)
        extra = [
            sub(req, "DeletableTopicResult", name=n, error_code=err(TOPIC_DENIED),
                error_message=MESSAGES[TOPIC_DENIED])
            for n in denied
        ]  # fmt: skip
        return extended(req, answer, "responses", extra)

    def name_of(t) -> str | None:
        if t.name is not None:
            return t.name
        found = core.topic_by_id(t.topic_id)
        return found.name if found is not None else None

    kept, denied = split(req.body.topics, lambda t: not refused(name_of(t)))
    if not denied:
        return handler(core, req, conn)
    answer = handler(core, with_body(req, topics=tuple(kept)), conn)
    extra = []
    for t in denied:
        name = name_of(t)
        visible = a.topic(Op.DESCRIBE, name)
        found = core.metadata.topics.get(name)
        extra.append(
            sub(
                req, "DeletableTopicResult",
                name=name if visible or t.name is not None else None,
                topic_id=found.topic_id if visible and found is not None else t.topic_id,
                error_code=err(TOPIC_DENIED), error_message=MESSAGES[TOPIC_DENIED],
            )
        )  # fmt: skip
    return extended(req, answer, "responses", extra)


def check_delete_records(core, req: Request, conn, handler: Handler, a: Access):
    return per_topic(
        core, req, conn, handler,
        field="topics", name=lambda t: t.name, answer_field="topics",
        allowed=lambda n: a.topic(Op.DELETE, n),
        entry=lambda t: topic_denied(
            req, ("DeleteRecordsTopicResult", "DeleteRecordsPartitionResult"), {"name": t.name},
            "partition_index", (p.partition_index for p in t.partitions), low_watermark=-1,
        ),
    )  # fmt: skip


def check_create_partitions(core, req: Request, conn, handler: Handler, a: Access):
    return per_topic(
        core, req, conn, handler,
        field="topics", name=lambda t: t.name, answer_field="results",
        allowed=lambda n: a.topic(Op.ALTER, n),
        entry=lambda t: sub(req, "CreatePartitionsTopicResult", name=t.name,
                            error_code=err(TOPIC_DENIED),
                            error_message="The topic authorization is failed."),
    )  # fmt: skip


# Config resource types (ConfigResource.Type) -> the ACL resource and the error when denied.
_TOPIC_CONFIGS, _BROKER, _BROKER_LOGGER, _CLIENT_METRICS, _GROUP_CONFIGS = 2, 4, 8, 16, 32


def _config_access(a: Access, op: Op, rtype: int, name: str) -> str | None:
    """The error for a config resource the principal may not ``op`` (None: allowed, or a type
    the handler answers itself)."""
    if rtype == _TOPIC_CONFIGS:
        return None if a.topic(op, name) else TOPIC_DENIED
    if rtype in (_BROKER, _BROKER_LOGGER, _CLIENT_METRICS):
        return None if a.cluster(op) else CLUSTER_DENIED
    if rtype == _GROUP_CONFIGS:
        return None if a.group(op, name) else GROUP_DENIED
    return None


def _configs_check(op: Op, result: str, answer_field: str, **empty: Any):
    """DescribeConfigs' and AlterConfigs' check: refused resources are answered as ``result``
    entries (with ``empty`` fields) in the answer's ``answer_field``."""

    def check(core, req: Request, conn, handler: Handler, a: Access):
        def denial(r) -> str | None:
            return _config_access(a, op, r.resource_type, r.resource_name)

        kept, denied = split(req.body.resources, lambda r: denial(r) is None)
        if not denied:
            return handler(core, req, conn)
        answer = handler(core, with_body(req, resources=tuple(kept)), conn)
        extra = [
            sub(req, result, error_code=err(denial(r)), error_message=None,
                resource_type=r.resource_type, resource_name=r.resource_name, **empty)
            for r in denied
        ]  # fmt: skip
        return extended(req, answer, answer_field, extra)

    return check


check_describe_configs = _configs_check(
    Op.DESCRIBE_CONFIGS, "DescribeConfigsResult", "results", configs=()
)
check_alter_configs = _configs_check(Op.ALTER_CONFIGS, "AlterConfigsResourceResponse", "responses")


CHECKS = {
    v.METADATA: check_metadata,
    v.DESCRIBE_TOPIC_PARTITIONS: check_describe_topic_partitions,
    v.DESCRIBE_CLUSTER: check_describe_cluster,
    v.CREATE_TOPICS: check_create_topics,
    v.DELETE_TOPICS: check_delete_topics,
    v.DELETE_RECORDS: check_delete_records,
    v.CREATE_PARTITIONS: check_create_partitions,
    v.DESCRIBE_CONFIGS: check_describe_configs,
    v.ALTER_CONFIGS: check_alter_configs,
    v.INCREMENTAL_ALTER_CONFIGS: check_alter_configs,
}
