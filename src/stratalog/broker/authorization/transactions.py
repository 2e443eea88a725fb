"""The transaction APIs: WRITE or DESCRIBE on the transactional id, and the group and topics."""

from __future__ import annotations

import dataclasses

from stratalog.cluster.metadata import is_internal
from stratalog.protocol import versions as v
from stratalog.protocol.connection import Request
from stratalog.security.acls import Operation as Op

from ..api.common import err, reply, sub
from .access import CLUSTER_DENIED, GROUP_DENIED, TOPIC_DENIED, TXN_DENIED, Access, Handler
from .answers import edited, extended, split, with_body
from .groups import commit_errors


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
    return edited(
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
    kept, denied = split(req.body.transactional_ids, lambda t: a.txn(Op.DESCRIBE, t))
    answer = handler(core, with_body(req, transactional_ids=tuple(kept)) if denied else req, conn)
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

    return edited(req, answer, edit)


def check_txn_offset_commit(core, req: Request, conn, handler: Handler, a: Access):
    body = req.body
    names = ("TxnOffsetCommitResponseTopic", "TxnOffsetCommitResponsePartition")
    for ok, error in (
        (lambda: a.txn(Op.WRITE, body.transactional_id), TXN_DENIED),
        (lambda: a.group(Op.READ, body.group_id), GROUP_DENIED),
    ):
        if not ok():
            return reply(req, topics=tuple(commit_errors(req, body.topics, error, *names)))
    kept, denied = split(body.topics, lambda t: a.topic(Op.READ, t.name))
    if not denied:
        return handler(core, req, conn)
    answer = handler(core, with_body(req, topics=tuple(kept)), conn)
    return extended(req, answer, "topics", commit_errors(req, denied, TOPIC_DENIED, *names))


CHECKS = {
    v.INIT_PRODUCER_ID: check_init_producer_id,
    v.ADD_PARTITIONS_TO_TXN: check_add_partitions_to_txn,
    v.ADD_OFFSETS_TO_TXN: check_add_offsets_to_txn,
    v.END_TXN: check_end_txn,
    v.TXN_OFFSET_COMMIT: check_txn_offset_commit,
    v.LIST_TRANSACTIONS: check_list_transactions,
    v.DESCRIBE_TRANSACTIONS: check_describe_transactions,
}
