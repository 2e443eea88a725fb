"""Which resource each API touches, and what a client may not do answered as Kafka answers it.

With an authorizer configured (``authorizer.class.name``), dispatch.py puts a check in front of
each API's handler (``guarded``); without one nothing here runs and no request pays for it. A
check asks the authorizer (security/authorizer.py) about the request's resources for the
connection's principal and address, then:

* everything allowed: the handler runs on the request as it came (the common case costs one
  cached lookup per resource);
* a resource denied: the handler runs on the request without it, and its answer gets an entry
  for it with TOPIC_AUTHORIZATION_FAILED (29), GROUP_AUTHORIZATION_FAILED (30),
  CLUSTER_AUTHORIZATION_FAILED (31) or TRANSACTIONAL_ID_AUTHORIZATION_FAILED (53), the answer
  decoded and encoded again (the error path only);
* the request's own resource denied (a group, a transactional id, the cluster): it is answered
  with the error alone, shaped as Kafka's ``getErrorResponse`` for that request.

The rules per API are Kafka's (KafkaApis, ControllerApis, KIP-11); docs/security.md lists them.
Metadata, DescribeTopicPartitions, ListGroups, ListTransactions and an OffsetFetch of all of a
group's topics leave out what the principal may not describe, as Kafka does, so a client learns
nothing of topics it may not see; a topic it names but may not describe is answered
TOPIC_AUTHORIZATION_FAILED whether it exists or not.
"""

from __future__ import annotations

import dataclasses
import importlib
import uuid
from collections.abc import Callable, Iterable
from typing import Any

from stratalog.cluster.metadata import is_internal
from stratalog.protocol import codec
from stratalog.protocol import versions as v
from stratalog.protocol.connection import Request
from stratalog.protocol.errors import code
from stratalog.protocol.produce import PartitionProduceResult, encode_produce_response
from stratalog.security.acls import CLUSTER_NAME
from stratalog.security.acls import Operation as Op
from stratalog.security.acls import ResourceType as R
from stratalog.security.authorizer import Authorizer
from stratalog.security.tls import ANONYMOUS
from stratalog.storage.batch import TRANSACTIONAL_MASK

from .api import internal_topics
from .api.common import AUTHORIZED_OPS_OMITTED, err, reply, sub

TOPIC_DENIED = "TOPIC_AUTHORIZATION_FAILED"
GROUP_DENIED = "GROUP_AUTHORIZATION_FAILED"
CLUSTER_DENIED = "CLUSTER_AUTHORIZATION_FAILED"
TXN_DENIED = "TRANSACTIONAL_ID_AUTHORIZATION_FAILED"
# Kafka's messages for these errors (Errors.java), where Kafka's answer carries one.
MESSAGES = {
    TOPIC_DENIED: "Topic authorization failed.",
    GROUP_DENIED: "Group authorization failed.",
    CLUSTER_DENIED: "Cluster authorization failed.",
    TXN_DENIED: "Transactional Id authorization failed.",
}
_ZERO_UUID = uuid.UUID(int=0)
_WRITE, _TOPIC = Op.WRITE, R.TOPIC

Handler = Callable[[Any, Request, Any], Any]


class Access:
    """One request's questions to the authorizer: its connection's principal and address."""

    __slots__ = ("authorizer", "host", "principal")

    def __init__(self, authorizer: Authorizer, conn) -> None:
        self.authorizer = authorizer
        self.principal: str = getattr(conn, "principal", None) or ANONYMOUS
        self.host: str = getattr(conn, "peer", "") or ""

    def topic(self, op: Op, name: str) -> bool:
        return self.authorizer.authorize(self.principal, self.host, op, R.TOPIC, name)

    def group(self, op: Op, name: str) -> bool:
        return self.authorizer.authorize(self.principal, self.host, op, R.GROUP, name)

    def txn(self, op: Op, name: str) -> bool:
        return self.authorizer.authorize(self.principal, self.host, op, R.TRANSACTIONAL_ID, name)

    def cluster(self, op: Op) -> bool:
        return self.authorizer.authorize(self.principal, self.host, op, R.CLUSTER, CLUSTER_NAME)

    def any_topic(self, op: Op) -> bool:
        return self.authorizer.authorize_any(self.principal, self.host, op, R.TOPIC)

    def operations(self, rtype: R, name: str) -> int:
        return self.authorizer.authorized_operations(self.principal, self.host, rtype, name)


def guarded(handlers: dict[int, Handler], authorizer: Authorizer) -> dict[int, Handler]:
    """``handlers`` with each API's check in front of its handler."""
    out = dict(handlers)
    for key, check in CHECKS.items():
        if key in handlers:
            out[key] = _bind(check, handlers[key], authorizer)
    return out


def _bind(check, handler: Handler, authorizer: Authorizer) -> Handler:
    def checked(core, req: Request, conn):
        return check(core, req, conn, handler, Access(authorizer, conn))

    checked.__name__ = handler.__name__
    return checked


# -- answers: the handler's, edited -----------------------------------------------------------
def _then(answer, fn: Callable[[bytes], bytes]):
    """``fn`` applied to a handler's answer (a frame), now or once it is ready."""
    if answer is None:
        return None
    if isinstance(answer, bytes | bytearray):
        return fn(bytes(answer))

    async def later() -> bytes:
        return fn(await answer)

    return later()


def _edit(req: Request, answer, fn: Callable[[Any], Any]):
    """The answer with its decoded body passed through ``fn`` and encoded again."""

    def apply(frame: bytes) -> bytes:
        _cid, body = codec.decode_response(req.api_key, req.api_version, frame[4:])
        return codec.encode_response(req.api_key, req.api_version, req.correlation_id, fn(body))

    return _then(answer, apply)


def _extended(req: Request, answer, field: str, extra: list):
    """The answer with ``extra`` entries after those of its list ``field``."""
    if not extra:
        return answer
    return _edit(
        req,
        answer,
        lambda body: dataclasses.replace(body, **{field: (*getattr(body, field), *extra)}),
    )


def _with(req: Request, **fields: Any) -> Request:
    """The request with some of its body's fields replaced."""
    return Request(
        req.api_key,
        req.api_version,
        req.correlation_id,
        req.client_id,
        dataclasses.replace(req.body, **fields),
        req.size,
        req.throttle_ms,
    )


def _request_entity(req: Request, name: str) -> type:
    """A nested request entity class of the request's version, by name."""
    cls = codec.request_class(req.api_key, req.api_version)
    return getattr(importlib.import_module(cls.__module__), name)


def _split(items: Iterable, allowed: Callable[[Any], bool]) -> tuple[list, list]:
    kept, denied = [], []
    for item in items:
        (kept if allowed(item) else denied).append(item)
    return kept, denied


def _per_topic(
    core,
    req: Request,
    conn,
    handler: Handler,
    *,
    field: str,
    allowed: Callable[[str], bool],
    name: Callable[[Any], str],
    answer_field: str,
    entry: Callable[[Any], Any],
):
    """The usual shape: the request's list ``field`` of per-topic entries; the denied ones are
    left out of the handler's request and answered by ``entry`` in the answer's
    ``answer_field``."""
    items = getattr(req.body, field)
    kept, denied = _split(items, lambda t: allowed(name(t)))
    if not denied:
        return handler(core, req, conn)
    answer = handler(core, _with(req, **{field: tuple(kept)}), conn)
    return _extended(req, answer, answer_field, [entry(t) for t in denied])


# -- data -------------------------------------------------------------------------------------
def check_produce(core, req: Request, conn, handler: Handler, a: Access):
    # The hot path: one pass, one cached lookup per topic, nothing built unless refused.
    body = req.body
    authorize, principal, host = a.authorizer.authorize, a.principal, a.host
    transactional = refused = False
    for td in body.topic_data:
        if not authorize(principal, host, _WRITE, _TOPIC, td.name):
            refused = True
        if not transactional:
            for pd in td.partition_data:
                # A transactional first batch: its attributes' bit 4, at byte 22 of a
                # RecordBatch v2 (Kafka's ProduceRequest looks at each partition's first).
                r = pd.records
                if r is not None and len(r) > 22 and r[22] & TRANSACTIONAL_MASK:
                    transactional = True
                    break
    # Transactional records need WRITE on the transactional id (refused without one, too).
    if transactional:
        tid = body.transactional_id
        if tid is None or not a.txn(Op.WRITE, tid):
            return _produce_refused(req, conn, body.topic_data, [], TXN_DENIED)
    if not refused:
        return handler(core, req, conn)
    kept, denied = _split(body.topic_data, lambda td: a.topic(Op.WRITE, td.name))
    return _produce_refused(req, conn, denied, kept, TOPIC_DENIED, core, handler)


def _produce_refused(req, conn, denied, kept, error, core=None, handler=None):
    results = [
        (td.name, [PartitionProduceResult(pd.index, code(error)) for pd in td.partition_data])
        for td in denied
    ]
    answer = handler(core, _with(req, topic_data=tuple(kept)), conn) if kept else None
    if req.body.acks == 0:
        conn.abort()  # Kafka's answer to a failed acks=0 produce: drop the connection
        return None
    if answer is None:
        return encode_produce_response(req.api_version, req.correlation_id, results)
    return _then(answer, lambda frame: internal_topics.merged(req, frame, results))


def check_fetch(core, req: Request, conn, handler: Handler, a: Access):
    denied = set()
    by_id = req.api_version >= 13
    for ft in req.body.topics:
        if by_id:
            t = core.topic_by_id(ft.topic_id)
            name = t.name if t is not None else None
        else:
            name = ft.topic
        if name is not None and not a.topic(Op.READ, name):
            denied.add(name)
    if not denied:
        return handler(core, req, conn)
    return handler(core, req, conn, denied=frozenset(denied))


def check_list_offsets(core, req: Request, conn, handler: Handler, a: Access):
    return _per_topic(
        core, req, conn, handler,
        field="topics", name=lambda t: t.name, answer_field="topics",
        allowed=lambda n: a.topic(Op.DESCRIBE, n),
        entry=lambda t: sub(
            req, "ListOffsetsTopicResponse", name=t.name,
            partitions=tuple(
                sub(req, "ListOffsetsPartitionResponse", partition_index=p.partition_index,
                    error_code=err(TOPIC_DENIED), timestamp=-1, offset=-1, leader_epoch=-1)
                for p in t.partitions
            ),
        ),
    )  # fmt: skip


def check_offset_for_leader_epoch(core, req: Request, conn, handler: Handler, a: Access):
    return _per_topic(
        core, req, conn, handler,
        field="topics", name=lambda t: t.topic, answer_field="topics",
        allowed=lambda n: a.topic(Op.DESCRIBE, n),
        entry=lambda t: sub(
            req, "OffsetForLeaderTopicResult", topic=t.topic,
            partitions=tuple(
                sub(req, "EpochEndOffset", error_code=err(TOPIC_DENIED), partition=p.partition,
                    leader_epoch=-1, end_offset=-1)
                for p in t.partitions
            ),
        ),
    )  # fmt: skip


def check_describe_producers(core, req: Request, conn, handler: Handler, a: Access):
    return _per_topic(
        core, req, conn, handler,
        field="topics", name=lambda t: t.name, answer_field="topics",
        allowed=lambda n: a.topic(Op.READ, n),
        entry=lambda t: sub(
            req, "TopicResponse", name=t.name,
            partitions=tuple(
                sub(req, "PartitionResponse", partition_index=i, error_code=err(TOPIC_DENIED),
                    error_message=None, active_producers=())
                for i in t.partition_indexes
            ),
        ),
    )  # fmt: skip


# -- metadata ---------------------------------------------------------------------------------
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
                    topics.append(_metadata_error(req, name, _ZERO_UUID, False))
                else:  # asked for by id
                    topics.append(_metadata_error(req, None, t.topic_id, False))
            elif name in refused:
                topics.append(_metadata_error(req, name, _ZERO_UUID, is_internal(name)))
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

    return _edit(req, answer, edit)


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
        kept, denied = _split([t.name for t in body.topics], lambda n: a.topic(Op.DESCRIBE, n))
    else:
        # Every topic the principal may describe, named: the handler's cursor walks those.
        kept = sorted(n for n in core.metadata.topics if a.topic(Op.DESCRIBE, n))
    extra = [
        sub(req, "DescribeTopicPartitionsResponseTopic", error_code=err(TOPIC_DENIED), name=n,
            topic_id=_ZERO_UUID, is_internal=False, partitions=(),
            topic_authorized_operations=AUTHORIZED_OPS_OMITTED)
        for n in denied
    ]  # fmt: skip
    if not kept:
        return reply(req, topics=tuple(extra), next_cursor=None)
    topic_cls = _request_entity(req, "TopicRequest")
    answer = handler(
        core, _with(req, topics=tuple(codec.build(topic_cls, name=n) for n in kept)), conn
    )

    def edit(resp):
        topics = tuple(
            dataclasses.replace(t, topic_authorized_operations=a.operations(R.TOPIC, t.name))
            if t.error_code == 0
            else t
            for t in resp.topics
        )
        return dataclasses.replace(resp, topics=topics + tuple(extra))

    return _edit(req, answer, edit)


def check_describe_cluster(core, req: Request, conn, handler: Handler, a: Access):
    answer = handler(core, req, conn)
    if not req.body.include_cluster_authorized_operations:
        return answer
    ops = a.operations(R.CLUSTER, CLUSTER_NAME) if a.cluster(Op.DESCRIBE) else 0
    return _edit(
        req, answer, lambda resp: dataclasses.replace(resp, cluster_authorized_operations=ops)
    )


# -- topic administration ---------------------------------------------------------------------
def check_create_topics(core, req: Request, conn, handler: Handler, a: Access):
    topics = req.body.topics
    if a.cluster(Op.CREATE):
        kept, denied = list(topics), []
    else:
        kept, denied = _split(topics, lambda t: a.topic(Op.CREATE, t.name))
    hidden_configs = {t.name for t in kept if not a.topic(Op.DESCRIBE_CONFIGS, t.name)}
    if not denied and not (hidden_configs and req.api_version >= 5):
        return handler(core, req, conn)
    answer = handler(core, _with(req, topics=tuple(kept)), conn)
    extra = [
        sub(req, "CreatableTopicResult", name=t.name, topic_id=_ZERO_UUID,
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

    return _edit(req, answer, edit)


def check_delete_topics(core, req: Request, conn, handler: Handler, a: Access):
    def refused(name: str | None) -> bool:
        # Not describable: refused whether it exists or not; describable but missing: the
        # handler says so; there but not deletable: refused.
        if name is None or a.topic(Op.DELETE, name):
            return False
        return not a.topic(Op.DESCRIBE, name) or name in core.metadata.topics

    if req.api_version < 6:
        kept, denied = _split(req.body.topic_names, lambda n: not refused(n))
        if not denied:
            return handler(core, req, conn)
        answer = handler(core, _with(req, topic_names=tuple(kept)), conn)
        extra = [
            sub(req, "DeletableTopicResult", name=n, error_code=err(TOPIC_DENIED),
                error_message=MESSAGES[TOPIC_DENIED])
            for n in denied
        ]  # fmt: skip
        return _extended(req, answer, "responses", extra)

    def name_of(t) -> str | None:
        if t.name is not None:
            return t.name
        found = core.topic_by_id(t.topic_id)
        return found.name if found is not None else None

    kept, denied = _split(req.body.topics, lambda t: not refused(name_of(t)))
    if not denied:
        return handler(core, req, conn)
    answer = handler(core, _with(req, topics=tuple(kept)), conn)
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
    return _extended(req, answer, "responses", extra)


def check_delete_records(core, req: Request, conn, handler: Handler, a: Access):
    return _per_topic(
        core, req, conn, handler,
        field="topics", name=lambda t: t.name, answer_field="topics",
        allowed=lambda n: a.topic(Op.DELETE, n),
        entry=lambda t: sub(
            req, "DeleteRecordsTopicResult", name=t.name,
            partitions=tuple(
                sub(req, "DeleteRecordsPartitionResult", partition_index=p.partition_index,
                    low_watermark=-1, error_code=err(TOPIC_DENIED))
                for p in t.partitions
            ),
        ),
    )  # fmt: skip


def check_create_partitions(core, req: Request, conn, handler: Handler, a: Access):
    return _per_topic(
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


def check_describe_configs(core, req: Request, conn, handler: Handler, a: Access):
    def denial(r) -> str | None:
        return _config_access(a, Op.DESCRIBE_CONFIGS, r.resource_type, r.resource_name)

    kept, denied = _split(req.body.resources, lambda r: denial(r) is None)
    if not denied:
        return handler(core, req, conn)
    answer = handler(core, _with(req, resources=tuple(kept)), conn)
    extra = [
        sub(req, "DescribeConfigsResult", error_code=err(denial(r)), error_message=None,
            resource_type=r.resource_type, resource_name=r.resource_name, configs=())
        for r in denied
    ]  # fmt: skip
    return _extended(req, answer, "results", extra)


def check_alter_configs(core, req: Request, conn, handler: Handler, a: Access):
    def denial(r) -> str | None:
        return _config_access(a, Op.ALTER_CONFIGS, r.resource_type, r.resource_name)

    kept, denied = _split(req.body.resources, lambda r: denial(r) is None)
    if not denied:
        return handler(core, req, conn)
    answer = handler(core, _with(req, resources=tuple(kept)), conn)
    extra = [
        sub(req, "AlterConfigsResourceResponse", error_code=err(denial(r)), error_message=None,
            resource_type=r.resource_type, resource_name=r.resource_name)
        for r in denied
    ]  # fmt: skip
    return _extended(req, answer, "responses", extra)


# -- the cluster ------------------------------------------------------------------------------
def _cluster_check(op: Op, refusal: Callable[[Request], bytes]):
    def check(core, req: Request, conn, handler: Handler, a: Access):
        if a.cluster(op):
            return handler(core, req, conn)
        return refusal(req)

    return check


_MSG = MESSAGES[CLUSTER_DENIED]
_CE = CLUSTER_DENIED


def _refuse_create_acls(req: Request) -> bytes:
    return reply(req, results=tuple(
        sub(req, "AclCreationResult", error_code=err(_CE), error_message=_MSG)
        for _c in req.body.creations
    ))  # fmt: skip


def _refuse_describe_acls(req: Request) -> bytes:
    return reply(req, error_code=err(_CE), error_message=_MSG, resources=())


def _refuse_delete_acls(req: Request) -> bytes:
    return reply(req, filter_results=tuple(
        sub(req, "DeleteAclsFilterResult", error_code=err(_CE), error_message=_MSG,
            matching_acls=())
        for _f in req.body.filters
    ))  # fmt: skip


def _refuse_describe_log_dirs(req: Request) -> bytes:
    return reply(req, error_code=err(_CE), results=())


def _refuse_elect_leaders(req: Request) -> bytes:
    return reply(req, error_code=err(_CE), replica_election_results=tuple(
        sub(req, "ReplicaElectionResult", topic=t.topic, partition_result=tuple(
            sub(req, "PartitionResult", partition_id=p, error_code=err(_CE), error_message=None)
            for p in t.partitions
        ))
        for t in req.body.topic_partitions or ()
    ))  # fmt: skip


def _refuse_alter_reassignments(req: Request) -> bytes:
    return reply(
        req, error_code=err(_CE), error_message=_MSG,
        allow_replication_factor_change=getattr(req.body, "allow_replication_factor_change", True),
        responses=tuple(
            sub(req, "ReassignableTopicResponse", name=t.name, partitions=tuple(
                sub(req, "ReassignablePartitionResponse", partition_index=p.partition_index,
                    error_code=err(_CE), error_message=_MSG)
                for p in t.partitions
            ))
            for t in req.body.topics
        ),
    )  # fmt: skip


def _refuse_list_reassignments(req: Request) -> bytes:
    return reply(req, error_code=err(_CE), error_message=_MSG, topics=())


def _refuse_describe_quotas(req: Request) -> bytes:
    return reply(req, error_code=err(_CE), error_message=_MSG, entries=None)


def _refuse_alter_quotas(req: Request) -> bytes:
    return reply(req, entries=tuple(
        sub(req, "EntryData", error_code=err(_CE), error_message=_MSG, entity=tuple(
            sub(req, "EntityData", entity_type=e.entity_type, entity_name=e.entity_name)
            for e in entry.entity
        ))
        for entry in req.body.entries
    ))  # fmt: skip


def _refuse_describe_scram(req: Request) -> bytes:
    return reply(req, error_code=err(_CE), error_message=_MSG, results=tuple(
        sub(req, "DescribeUserScramCredentialsResult", user="", error_code=err(_CE),
            error_message=_MSG, credential_infos=())
        for _u in req.body.users or ()
    ))  # fmt: skip


def _refuse_alter_scram(req: Request) -> bytes:
    users = sorted({d.name for d in req.body.deletions} | {u.name for u in req.body.upsertions})
    return reply(req, results=tuple(
        sub(req, "AlterUserScramCredentialsResult", user=u, error_code=err(_CE),
            error_message=_MSG)
        for u in users
    ))  # fmt: skip


def _refuse_write_txn_markers(req: Request) -> bytes:
    return reply(req, markers=tuple(
        sub(req, "WritableTxnMarkerResult", producer_id=m.producer_id, topics=tuple(
            sub(req, "WritableTxnMarkerTopicResult", name=t.name, partitions=tuple(
                sub(req, "WritableTxnMarkerPartitionResult", partition_index=i,
                    error_code=err(_CE))
                for i in t.partition_indexes
            ))
            for t in m.topics
        ))
        for m in req.body.markers
    ))  # fmt: skip


# -- groups -----------------------------------------------------------------------------------
def _group_check(op: Op, refusal: Callable[[Request], bytes]):
    def check(core, req: Request, conn, handler: Handler, a: Access):
        if a.group(op, req.body.group_id):
            return handler(core, req, conn)
        return refusal(req)

    return check


def _refuse_join(req: Request) -> bytes:
    return reply(
        req, error_code=err(GROUP_DENIED), generation_id=-1, protocol_type=None,
        protocol_name=None if req.api_version >= 7 else "", leader="", skip_assignment=False,
        member_id=req.body.member_id, members=(),
    )  # fmt: skip


def _refuse_sync(req: Request) -> bytes:
    return reply(req, error_code=err(GROUP_DENIED), protocol_type=None, protocol_name=None,
                 assignment=b"")  # fmt: skip


def _refuse_heartbeat(req: Request) -> bytes:
    return reply(req, error_code=err(GROUP_DENIED))


def _refuse_leave(req: Request) -> bytes:
    return reply(req, error_code=err(GROUP_DENIED), members=())


def _commit_errors(req: Request, topics, error: str, topic_cls: str, part_cls: str) -> list:
    return [
        sub(req, topic_cls, name=t.name, partitions=tuple(
            sub(req, part_cls, partition_index=p.partition_index, error_code=err(error))
            for p in t.partitions
        ))
        for t in topics
    ]  # fmt: skip


def check_offset_commit(core, req: Request, conn, handler: Handler, a: Access):
    body = req.body
    names = ("OffsetCommitResponseTopic", "OffsetCommitResponsePartition")
    if not a.group(Op.READ, body.group_id):
        return reply(req, topics=tuple(_commit_errors(req, body.topics, GROUP_DENIED, *names)))
    kept, denied = _split(body.topics, lambda t: a.topic(Op.READ, t.name))
    if not denied:
        return handler(core, req, conn)
    answer = handler(core, _with(req, topics=tuple(kept)), conn)
    return _extended(req, answer, "topics", _commit_errors(req, denied, TOPIC_DENIED, *names))


def check_txn_offset_commit(core, req: Request, conn, handler: Handler, a: Access):
    body = req.body
    names = ("TxnOffsetCommitResponseTopic", "TxnOffsetCommitResponsePartition")
    for ok, error in (
        (lambda: a.txn(Op.WRITE, body.transactional_id), TXN_DENIED),
        (lambda: a.group(Op.READ, body.group_id), GROUP_DENIED),
    ):
        if not ok():
            return reply(req, topics=tuple(_commit_errors(req, body.topics, error, *names)))
    kept, denied = _split(body.topics, lambda t: a.topic(Op.READ, t.name))
    if not denied:
        return handler(core, req, conn)
    answer = handler(core, _with(req, topics=tuple(kept)), conn)
    return _extended(req, answer, "topics", _commit_errors(req, denied, TOPIC_DENIED, *names))


def _fetched_denied(req: Request, t, names: tuple[str, str], error: str):
    topic_cls, part_cls = names
    return sub(req, topic_cls, name=t.name, partitions=tuple(
        sub(req, part_cls, partition_index=i, committed_offset=-1, committed_leader_epoch=-1,
            metadata="", error_code=err(error))
        for i in t.partition_indexes
    ))  # fmt: skip


def _describable_topics(a: Access, topics) -> tuple:
    return tuple(t for t in topics if a.topic(Op.DESCRIBE, t.name))


def check_offset_fetch(core, req: Request, conn, handler: Handler, a: Access):
    body = req.body
    if req.api_version >= 8:
        return _offset_fetch_groups(core, req, conn, handler, a)
    names = ("OffsetFetchResponseTopic", "OffsetFetchResponsePartition")
    if not a.group(Op.DESCRIBE, body.group_id):
        if req.api_version >= 2:
            return reply(req, error_code=err(GROUP_DENIED), topics=())
        return reply(req, topics=tuple(
            _fetched_denied(req, t, names, GROUP_DENIED) for t in body.topics or ()
        ))  # fmt: skip
    if body.topics is None:
        answer = handler(core, req, conn)
        return _edit(
            req, answer, lambda r: dataclasses.replace(r, topics=_describable_topics(a, r.topics))
        )
    kept, denied = _split(body.topics, lambda t: a.topic(Op.DESCRIBE, t.name))
    if not denied:
        return handler(core, req, conn)
    answer = handler(core, _with(req, topics=tuple(kept)), conn)
    return _extended(
        req, answer, "topics", [_fetched_denied(req, t, names, TOPIC_DENIED) for t in denied]
    )


def _offset_fetch_groups(core, req: Request, conn, handler: Handler, a: Access):
    names = ("OffsetFetchResponseTopics", "OffsetFetchResponsePartitions")
    asked = []  # per group in the request: (group id, allowed, topics denied, all topics)
    kept_groups = []
    for g in req.body.groups:
        if not a.group(Op.DESCRIBE, g.group_id):
            asked.append((g.group_id, False, [], False))
            continue
        if g.topics is None:
            asked.append((g.group_id, True, [], True))
            kept_groups.append(g)
            continue
        kept, denied = _split(g.topics, lambda t: a.topic(Op.DESCRIBE, t.name))
        asked.append((g.group_id, True, denied, False))
        kept_groups.append(dataclasses.replace(g, topics=tuple(kept)) if denied else g)
    if all(ok and not denied and not every for _g, ok, denied, every in asked):
        return handler(core, req, conn)
    answer = handler(core, _with(req, groups=tuple(kept_groups)), conn)

    def edit(resp):
        answered = {g.group_id: g for g in resp.groups}
        out = []
        for gid, ok, denied, every in asked:
            if not ok:
                out.append(sub(req, "OffsetFetchResponseGroup", group_id=gid, topics=(),
                               error_code=err(GROUP_DENIED)))  # fmt: skip
                continue
            g = answered[gid]
            if every:
                g = dataclasses.replace(g, topics=_describable_topics(a, g.topics))
            elif denied:
                extra = tuple(_fetched_denied(req, t, names, TOPIC_DENIED) for t in denied)
                g = dataclasses.replace(g, topics=(*g.topics, *extra))
            out.append(g)
        return dataclasses.replace(resp, groups=tuple(out))

    return _edit(req, answer, edit)


def check_list_groups(core, req: Request, conn, handler: Handler, a: Access):
    answer = handler(core, req, conn)
    if a.cluster(Op.DESCRIBE):
        return answer
    return _edit(
        req,
        answer,
        lambda r: dataclasses.replace(
            r, groups=tuple(g for g in r.groups if a.group(Op.DESCRIBE, g.group_id))
        ),
    )


def check_describe_groups(core, req: Request, conn, handler: Handler, a: Access):
    body = req.body
    want_ops = getattr(body, "include_authorized_operations", False)
    kept, denied = _split(body.groups, lambda g: a.group(Op.DESCRIBE, g))
    if not denied and not want_ops:
        return handler(core, req, conn)
    answer = handler(core, _with(req, groups=tuple(kept)) if denied else req, conn)
    extra = tuple(
        sub(req, "DescribedGroup", error_code=err(GROUP_DENIED), group_id=g, group_state="",
            protocol_type="", protocol_data="", members=(),
            authorized_operations=AUTHORIZED_OPS_OMITTED)
        for g in denied
    )  # fmt: skip

    def edit(resp):
        groups = tuple(
            dataclasses.replace(g, authorized_operations=a.operations(R.GROUP, g.group_id))
            if want_ops
            else g
            for g in resp.groups
        )
        return dataclasses.replace(resp, groups=groups + extra)

    return _edit(req, answer, edit)


def check_delete_groups(core, req: Request, conn, handler: Handler, a: Access):
    kept, denied = _split(req.body.groups_names, lambda g: a.group(Op.DELETE, g))
    if not denied:
        return handler(core, req, conn)
    answer = handler(core, _with(req, groups_names=tuple(kept)), conn)
    extra = [
        sub(req, "DeletableGroupResult", group_id=g, error_code=err(GROUP_DENIED)) for g in denied
    ]
    return _extended(req, answer, "results", extra)


def check_offset_delete(core, req: Request, conn, handler: Handler, a: Access):
    body = req.body
    if not a.group(Op.DELETE, body.group_id):
        return reply(req, error_code=err(GROUP_DENIED), topics=())
    names = ("OffsetDeleteResponseTopic", "OffsetDeleteResponsePartition")
    kept, denied = _split(body.topics, lambda t: a.topic(Op.READ, t.name))
    if not denied:
        return handler(core, req, conn)
    answer = handler(core, _with(req, topics=tuple(kept)), conn)
    return _extended(req, answer, "topics", _commit_errors(req, denied, TOPIC_DENIED, *names))


def check_find_coordinator(core, req: Request, conn, handler: Handler, a: Access):
    body = req.body
    key_type = getattr(body, "key_type", 0)

    def denial(key: str) -> str | None:
        if key_type == 0:
            return None if a.group(Op.DESCRIBE, key) else GROUP_DENIED
        if key_type == 1:
            return None if a.txn(Op.DESCRIBE, key) else TXN_DENIED
        return None  # (an unknown key type: the handler answers INVALID_REQUEST)

    if req.api_version < 4:
        error = denial(body.key)
        if error is None:
            return handler(core, req, conn)
        return reply(req, error_code=err(error), error_message=MESSAGES[error], node_id=-1,
                     host="", port=-1)  # fmt: skip
    kept, denied = _split(body.coordinator_keys, lambda k: denial(k) is None)
    if not denied:
        return handler(core, req, conn)
    answer = handler(core, _with(req, coordinator_keys=tuple(kept)), conn)
    extra = [
        sub(req, "Coordinator", key=k, node_id=-1, host="", port=-1, error_code=err(denial(k)),
            error_message=MESSAGES[denial(k)])
        for k in denied
    ]  # fmt: skip
    return _extended(req, answer, "coordinators", extra)


# -- transactions -----------------------------------------------------------------------------
def check_init_producer_id(core, req: Request, conn, handler: Handler, a: Access):
    tid = req.body.transactional_id
    if tid is not None:
        ok, error = a.txn(Op.WRITE, tid), TXN_DENIED
    else:
        # An idempotent producer: IDEMPOTENT_WRITE on the cluster, or WRITE on some topic.
        ok = a.cluster(Op.IDEMPOTENT_WRITE) or a.any_topic(Op.WRITE)
        error = CLUSTER_DENIED
    if ok:
        return handler(core, req, conn)
    return reply(req, error_code=err(error), producer_id=-1, producer_epoch=-1)


def check_add_partitions_to_txn(core, req: Request, conn, handler: Handler, a: Access):
    body = req.body
    wanted = [(t.name, p) for t in body.v3_and_below_topics for p in t.partitions]
    if not a.txn(Op.WRITE, body.v3_and_below_transactional_id):
        errors = dict.fromkeys(wanted, TXN_DENIED)
    else:
        # As Kafka: internal topics are never added by a client; one refused topic fails the
        # whole request, the others answered as not attempted (or missing).
        denied = {n for n, _p in wanted if is_internal(n) or not a.topic(Op.WRITE, n)}
        if not denied:
            return handler(core, req, conn)
        errors = {
            (n, p): TOPIC_DENIED if n in denied
            else "OPERATION_NOT_ATTEMPTED" if core.partition_exists(n, p)
            else "UNKNOWN_TOPIC_OR_PARTITION"
            for n, p in wanted
        }  # fmt: skip
    by_topic: dict[str, list[tuple[int, str]]] = {}
    for (topic, index), error in errors.items():
        by_topic.setdefault(topic, []).append((index, error))
    return reply(req, results_by_topic_v3_and_below=tuple(
        sub(req, "AddPartitionsToTxnTopicResult", name=topic, results_by_partition=tuple(
            sub(req, "AddPartitionsToTxnPartitionResult", partition_index=i,
                partition_error_code=err(e))
            for i, e in parts
        ))
        for topic, parts in by_topic.items()
    ))  # fmt: skip


def check_add_offsets_to_txn(core, req: Request, conn, handler: Handler, a: Access):
    body = req.body
    if not a.txn(Op.WRITE, body.transactional_id):
        return reply(req, error_code=err(TXN_DENIED))
    if not a.group(Op.READ, body.group_id):
        return reply(req, error_code=err(GROUP_DENIED))
    return handler(core, req, conn)


def check_end_txn(core, req: Request, conn, handler: Handler, a: Access):
    if not a.txn(Op.WRITE, req.body.transactional_id):
        return reply(req, error_code=err(TXN_DENIED))
    return handler(core, req, conn)


def check_list_transactions(core, req: Request, conn, handler: Handler, a: Access):
    answer = handler(core, req, conn)
    return _edit(
        req,
        answer,
        lambda r: dataclasses.replace(
            r,
            transaction_states=tuple(
                s for s in r.transaction_states if a.txn(Op.DESCRIBE, s.transactional_id)
            ),
        ),
    )


def check_describe_transactions(core, req: Request, conn, handler: Handler, a: Access):
    kept, denied = _split(req.body.transactional_ids, lambda t: a.txn(Op.DESCRIBE, t))
    answer = handler(core, _with(req, transactional_ids=tuple(kept)) if denied else req, conn)
    extra = tuple(
        sub(req, "TransactionState", error_code=err(TXN_DENIED), transactional_id=t,
            transaction_state="", transaction_timeout=0, transaction_start_time=0,
            producer_id=0, producer_epoch=0, topics=())
        for t in denied
    )  # fmt: skip

    def edit(resp):
        # The partitions of a described transaction: only those of topics it may describe.
        states = tuple(
            dataclasses.replace(
                s, topics=tuple(t for t in s.topics if a.topic(Op.DESCRIBE, t.topic))
            )
            for s in resp.transaction_states
        )
        return dataclasses.replace(resp, transaction_states=states + extra)

    return _edit(req, answer, edit)


CHECKS = {
    v.PRODUCE: check_produce,
    v.FETCH: check_fetch,
    v.LIST_OFFSETS: check_list_offsets,
    v.OFFSET_FOR_LEADER_EPOCH: check_offset_for_leader_epoch,
    v.DESCRIBE_PRODUCERS: check_describe_producers,
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
    v.CREATE_ACLS: _cluster_check(Op.ALTER, _refuse_create_acls),
    v.DELETE_ACLS: _cluster_check(Op.ALTER, _refuse_delete_acls),
    v.DESCRIBE_ACLS: _cluster_check(Op.DESCRIBE, _refuse_describe_acls),
    v.DESCRIBE_LOG_DIRS: _cluster_check(Op.DESCRIBE, _refuse_describe_log_dirs),
    v.ELECT_LEADERS: _cluster_check(Op.ALTER, _refuse_elect_leaders),
    v.ALTER_PARTITION_REASSIGNMENTS: _cluster_check(Op.ALTER, _refuse_alter_reassignments),
    v.LIST_PARTITION_REASSIGNMENTS: _cluster_check(Op.DESCRIBE, _refuse_list_reassignments),
    v.DESCRIBE_CLIENT_QUOTAS: _cluster_check(Op.DESCRIBE_CONFIGS, _refuse_describe_quotas),
    v.ALTER_CLIENT_QUOTAS: _cluster_check(Op.ALTER_CONFIGS, _refuse_alter_quotas),
    v.DESCRIBE_USER_SCRAM_CREDENTIALS: _cluster_check(Op.DESCRIBE, _refuse_describe_scram),
    v.ALTER_USER_SCRAM_CREDENTIALS: _cluster_check(Op.ALTER, _refuse_alter_scram),
    v.WRITE_TXN_MARKERS: _cluster_check(Op.CLUSTER_ACTION, _refuse_write_txn_markers),
    v.FIND_COORDINATOR: check_find_coordinator,
    v.JOIN_GROUP: _group_check(Op.READ, _refuse_join),
    v.SYNC_GROUP: _group_check(Op.READ, _refuse_sync),
    v.HEARTBEAT: _group_check(Op.READ, _refuse_heartbeat),
    v.LEAVE_GROUP: _group_check(Op.READ, _refuse_leave),
    v.OFFSET_COMMIT: check_offset_commit,
    v.OFFSET_FETCH: check_offset_fetch,
    v.LIST_GROUPS: check_list_groups,
    v.DESCRIBE_GROUPS: check_describe_groups,
    v.DELETE_GROUPS: check_delete_groups,
    v.OFFSET_DELETE: check_offset_delete,
    v.INIT_PRODUCER_ID: check_init_producer_id,
    v.ADD_PARTITIONS_TO_TXN: check_add_partitions_to_txn,
    v.ADD_OFFSETS_TO_TXN: check_add_offsets_to_txn,
    v.END_TXN: check_end_txn,
    v.TXN_OFFSET_COMMIT: check_txn_offset_commit,
    v.LIST_TRANSACTIONS: check_list_transactions,
    v.DESCRIBE_TRANSACTIONS: check_describe_transactions,
}
# What needs no check: ApiVersions and the SASL exchange (before any principal is known).
UNCHECKED = frozenset({v.API_VERSIONS, v.SASL_HANDSHAKE, v.SASL_AUTHENTICATE})
assert set(CHECKS) | UNCHECKED == set(v.SUPPORTED), set(v.SUPPORTED) - set(CHECKS) - UNCHECKED
