"""Produce, Fetch, ListOffsets, OffsetForLeaderEpoch, DescribeProducers: the records' APIs."""

from __future__ import annotations

from stratalog.protocol import versions as v
from stratalog.protocol.connection import Request
from stratalog.protocol.errors import code
from stratalog.protocol.produce import PartitionProduceResult, encode_produce_response
from stratalog.security.acls import Operation as Op
from stratalog.security.acls import ResourceType as R
from stratalog.storage.batch import TRANSACTIONAL_MASK

from ..api import internal_topics
from .access import TOPIC_DENIED, TXN_DENIED, Access, Handler
from .answers import per_topic, split, then, topic_denied, with_body

_WRITE, _TOPIC = Op.WRITE, R.TOPIC


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
    kept, denied = split(body.topic_data, lambda td: a.topic(Op.WRITE, td.name))
    return _produce_refused(req, conn, denied, kept, TOPIC_DENIED, core, handler)


def _produce_refused(req, conn, denied, kept, error, core=None, handler=None):
    results = [
        (td.name, [PartitionProduceResult(pd.index, code(error)) for pd in td.partition_data])
        for td in denied
    ]
    answer = handler(core, with_body(req, topic_data=tuple(kept)), conn) if kept else None
    if req.body.acks == 0:
        conn.abort()  # Kafka's answer to a failed acks=0 produce: drop the connection
        return None
    if answer is None:
        return encode_produce_response(req.api_version, req.correlation_id, results)
    return then(answer, lambda frame: internal_topics.merged(req, frame, results))


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
    return per_topic(
        core, req, conn, handler,
        field="topics", name=lambda t: t.name, answer_field="topics",
        allowed=lambda n: a.topic(Op.DESCRIBE, n),
        entry=lambda t: topic_denied(
            req, ("ListOffsetsTopicResponse", "ListOffsetsPartitionResponse"), {"name": t.name},
            "partition_index", (p.partition_index for p in t.partitions),
            timestamp=-1, offset=-1, leader_epoch=-1,
        ),
    )  # fmt: skip


def check_offset_for_leader_epoch(core, req: Request, conn, handler: Handler, a: Access):
    return per_topic(
        core, req, conn, handler,
        field="topics", name=lambda t: t.topic, answer_field="topics",
        allowed=lambda n: a.topic(Op.DESCRIBE, n),
        entry=lambda t: topic_denied(
            req, ("OffsetForLeaderTopicResult", "EpochEndOffset"), {"topic": t.topic},
            "partition", (p.partition for p in t.partitions), leader_epoch=-1, end_offset=-1,
        ),
    )  # fmt: skip


def check_describe_producers(core, req: Request, conn, handler: Handler, a: Access):
    return per_topic(
        core, req, conn, handler,
        field="topics", name=lambda t: t.name, answer_field="topics",
        allowed=lambda n: a.topic(Op.READ, n),
        entry=lambda t: topic_denied(
            req, ("TopicResponse", "PartitionResponse"), {"name": t.name},
            "partition_index", t.partition_indexes, error_message=None, active_producers=(),
        ),
    )  # fmt: skip


CHECKS = {
    v.PRODUCE: check_produce,
    v.FETCH: check_fetch,
    v.LIST_OFFSETS: check_list_offsets,
    v.OFFSET_FOR_LEADER_EPOCH: check_offset_for_leader_epoch,
    v.DESCRIBE_PRODUCERS: check_describe_producers,
}
