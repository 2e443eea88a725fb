"""The transaction APIs (KIP-98): InitProducerId with a transactional id, AddPartitionsToTxn,
AddOffsetsToTxn, EndTxn, TxnOffsetCommit, WriteTxnMarkers (between brokers), and the ones
``kafka-transactions.sh`` asks: ListTransactions, DescribeTransactions, DescribeProducers.

The coordinator's work is in broker/txn_coordinator.py; these handlers check the request, call
it, and answer in the request's version: PRODUCER_FENCED becomes INVALID_PRODUCER_EPOCH for the
versions from before KIP-588, as Kafka does.
"""

from __future__ import annotations

import datetime

from stratalog.broker.offset_records import OFFSETS_TOPIC, OffsetRecordError, partition_for
from stratalog.broker.txn_coordinator import CoordinatorError
from stratalog.broker.txn_markers import write_markers
from stratalog.protocol.connection import Request
from stratalog.storage.journal import StorageFailure
from stratalog.storage.partition import AppendError
from stratalog.storage.txn_index import is_transactional_producer

from .common import NONE, err, reply, sub
from .groups import fail_unwritten, offset_writes

_STATES = {
    "Empty",
    "Ongoing",
    "PrepareCommit",
    "PrepareAbort",
    "CompleteCommit",
    "CompleteAbort",
    "Dead",
    "PrepareEpochFence",
}


def _stamp(ms: int) -> datetime.datetime:
    """A time field as kio writes it; -1 (none) stays -1 on the wire."""
    return datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC) + datetime.timedelta(milliseconds=ms)


def _fenced(error: str, version: int, first_with_fenced: int) -> str:
    """PRODUCER_FENCED as the request's version knows it (KIP-588)."""
    if error == "PRODUCER_FENCED" and version < first_with_fenced:
        return "INVALID_PRODUCER_EPOCH"
    return error


def _abortable(error: str, version: int, first_with_abortable: int) -> str:
    """TRANSACTION_ABORTABLE as the request's version knows it (KIP-890)."""
    if error == "TRANSACTION_ABORTABLE" and version < first_with_abortable:
        return "INVALID_TXN_STATE"
    return error


# -- InitProducerId -------------------------------------------------------------------------------
async def init_transactional_producer_id(core, req: Request) -> bytes:
    b = req.body
    pid = getattr(b, "producer_id", -1)
    epoch = getattr(b, "producer_epoch", -1)
    timeout = b.transaction_timeout
    timeout_ms = (
        int(timeout.total_seconds() * 1000) if hasattr(timeout, "total_seconds") else timeout
    )
    try:
        pid, epoch = await core.txn.init_producer_id(b.transactional_id, timeout_ms, pid, epoch)
    except CoordinatorError as e:
        error = _fenced(e.error, req.api_version, 4)
        return reply(req, error_code=err(error), producer_id=-1, producer_epoch=-1)
    return reply(req, error_code=NONE, producer_id=pid, producer_epoch=epoch)


# -- AddPartitionsToTxn ---------------------------------------------------------------------------
async def handle_add_partitions_to_txn(core, req: Request, conn) -> bytes:
    b = req.body
    v = req.api_version
    wanted = [(t.name, p) for t in b.v3_and_below_topics for p in t.partitions]
    errors: dict[tuple[str, int], str] = {}
    missing = {tp for tp in wanted if not core.partition_exists(*tp)}
    if missing:
        # As Kafka: nothing is added; the missing ones say so, the others were not attempted.
        errors = {
            tp: "UNKNOWN_TOPIC_OR_PARTITION" if tp in missing else "OPERATION_NOT_ATTEMPTED"
            for tp in wanted
        }
    else:
        error = "NONE"
        try:
            await core.txn.add_partitions(
                b.v3_and_below_transactional_id,
                b.v3_and_below_producer_id,
                b.v3_and_below_producer_epoch,
                set(wanted),
            )
        except CoordinatorError as e:
            error = _abortable(_fenced(e.error, v, 2), v, 5)
        errors = dict.fromkeys(wanted, error)
    by_topic: dict[str, list[tuple[int, str]]] = {}
    for (topic, index), error in errors.items():
        by_topic.setdefault(topic, []).append((index, error))
    results = tuple(
        sub(
            req,
            "AddPartitionsToTxnTopicResult",
            name=topic,
            results_by_partition=tuple(
                sub(
                    req,
                    "AddPartitionsToTxnPartitionResult",
                    partition_index=i,
                    partition_error_code=err(e),
                )
                for i, e in parts
            ),
        )
        for topic, parts in by_topic.items()
    )
    return reply(req, results_by_topic_v3_and_below=results)


# -- AddOffsetsToTxn ------------------------------------------------------------------------------
async def handle_add_offsets_to_txn(core, req: Request, conn) -> bytes:
    b = req.body
    error = "NONE"
    try:
        try:
            t = core.ensure_offsets_topic()
        except StorageFailure:
            raise CoordinatorError("COORDINATOR_NOT_AVAILABLE") from None
        tp = (OFFSETS_TOPIC, partition_for(b.group_id, len(t.partitions)))
        await core.txn.add_partitions(b.transactional_id, b.producer_id, b.producer_epoch, {tp})
    except CoordinatorError as e:
        error = _abortable(_fenced(e.error, req.api_version, 2), req.api_version, 4)
    return reply(req, error_code=err(error))


# -- EndTxn ---------------------------------------------------------------------------------------
async def handle_end_txn(core, req: Request, conn) -> bytes:
    b = req.body
    error = "NONE"
    try:
        await core.txn.end_txn(b.transactional_id, b.producer_id, b.producer_epoch, b.committed)
    except CoordinatorError as e:
        error = _abortable(_fenced(e.error, req.api_version, 2), req.api_version, 4)
    return reply(req, error_code=err(error), producer_id=-1, producer_epoch=-1)


# -- TxnOffsetCommit ------------------------------------------------------------------------------
async def handle_txn_offset_commit(core, req: Request, conn) -> bytes:
    b = req.body
    v = req.api_version
    # As Kafka: the transaction is checked first, then the group.
    group_error = _txn_check(core, b)
    if group_error == "NONE":
        group_error = _group_check(core, b)
    writes, answers = offset_writes(core, b, group_error)
    if writes:
        failed = None
        try:
            await core.offsets.write_txn(b.producer_id, b.producer_epoch, writes)
        except AppendError as e:
            failed = e.error
        except StorageFailure:
            failed = "NOT_COORDINATOR"
        except OffsetRecordError:
            failed = "UNKNOWN_SERVER_ERROR"
        if failed is not None:
            fail_unwritten(answers, failed)
    topics = tuple(
        sub(
            req,
            "TxnOffsetCommitResponseTopic",
            name=name,
            partitions=tuple(
                sub(
                    req,
                    "TxnOffsetCommitResponsePartition",
                    partition_index=i,
                    error_code=err(_abortable(e, v, 4)),
                )
                for i, e in parts
            ),
        )
        for name, parts in answers
    )
    return reply(req, topics=topics)


def _txn_check(core, b) -> str:
    """The producer must be the transaction's current one (checked when this broker
    coordinates the id too). As Kafka 4.4 answers, the group's offsets partition need not be
    in the transaction here (its marker settles the offsets only if AddOffsetsToTxn put it
    there; clients always send that first)."""
    if not is_transactional_producer(b.producer_id):
        return "INVALID_PRODUCER_ID_MAPPING"
    t = core.metadata.topics.get(OFFSETS_TOPIC)
    if t is None:
        return "COORDINATOR_NOT_AVAILABLE"
    tp = (OFFSETS_TOPIC, partition_for(b.group_id, len(t.partitions)))
    error = core.txn.verify(b.transactional_id, b.producer_id, b.producer_epoch, tp)
    if error is None or error == "TRANSACTION_ABORTABLE":
        return "NONE"
    if error == "PRODUCER_FENCED":
        return "INVALID_PRODUCER_EPOCH"
    return error


def _group_check(core, b) -> str:
    """Kafka's validation of a transactional offset commit against the group (KIP-447): a
    commit with a generation (or a member) must come from a current member of that
    generation; one without needs no group, or any group at all when it is empty."""
    generation = getattr(b, "generation_id", -1)
    member = getattr(b, "member_id", "")
    instance = getattr(b, "group_instance_id", None)
    judged = core.consumer_groups.validate_commit(
        b.group_id, member, generation, 9, transactional=True, instance_id=instance
    )
    if judged is not None:  # a consumer-protocol group: the generation is the member epoch
        return judged
    g = core.coordinator.groups.get(b.group_id)
    live = g is not None and bool(g.members)
    exists = (
        live
        or (g is not None and core.coordinator.kept(g))  # emptied lately: still a group
        or b.group_id in core.offsets.groups()
        or bool(core.offsets.unstable(b.group_id))
    )
    if not exists:
        # A group that does not exist: created as a simple group by a commit without a
        # generation, else ILLEGAL_GENERATION.
        return "NONE" if generation < 0 else "ILLEGAL_GENERATION"
    if generation < 0 and not live:
        return "NONE"
    if generation >= 0 or member or instance is not None:
        if g is None or member not in g.members:
            return "UNKNOWN_MEMBER_ID"
        if generation != g.generation:
            return "ILLEGAL_GENERATION"
    return "NONE"


# -- WriteTxnMarkers (between brokers) ------------------------------------------------------------
async def handle_write_txn_markers(core, req: Request, conn) -> bytes:
    """A coordinator on another broker asks for markers in partitions this broker leads."""
    results = []
    for m in req.body.markers:
        wanted = [(t.name, i) for t in m.topics for i in t.partition_indexes]
        errors = await write_markers(
            core, m.producer_id, m.producer_epoch, m.transaction_result, m.coordinator_epoch, wanted
        )
        results.append(
            sub(
                req,
                "WritableTxnMarkerResult",
                producer_id=m.producer_id,
                topics=tuple(
                    sub(
                        req,
                        "WritableTxnMarkerTopicResult",
                        name=t.name,
                        partitions=tuple(
                            sub(
                                req,
                                "WritableTxnMarkerPartitionResult",
                                partition_index=i,
                                error_code=err(errors[(t.name, i)]),
                            )
                            for i in t.partition_indexes
                        ),
                    )
                    for t in m.topics
                ),
            )
        )
    return reply(req, markers=tuple(results))


# -- kafka-transactions.sh ------------------------------------------------------------------------
def handle_list_transactions(core, req: Request, conn) -> bytes:
    b = req.body
    states = set(b.state_filters)
    unknown = tuple(s for s in b.state_filters if s not in _STATES)
    listed = core.txn.listed(
        states,
        set(b.producer_id_filters),
        getattr(b, "duration_filter", -1),
        getattr(b, "transactional_id_pattern", None),
    )
    return reply(
        req,
        error_code=NONE,
        unknown_state_filters=unknown,
        transaction_states=tuple(
            sub(
                req,
                "TransactionState",
                transactional_id=m.transactional_id,
                producer_id=m.producer_id,
                transaction_state=m.state.kafka_name,
            )
            for m in listed
        ),
    )


def handle_describe_transactions(core, req: Request, conn) -> bytes:
    out = []
    for tid in req.body.transactional_ids:
        try:
            m = core.txn.describe(tid)
        except CoordinatorError as e:
            out.append(
                sub(
                    req,
                    "TransactionState",
                    error_code=err(e.error),
                    transactional_id=tid,
                    transaction_state="",
                    transaction_timeout=0,
                    transaction_start_time=_stamp(-1),
                    producer_id=-1,
                    producer_epoch=-1,
                    topics=(),
                )
            )
            continue
        by_topic: dict[str, list[int]] = {}
        for topic, index in sorted(m.partitions):
            by_topic.setdefault(topic, []).append(index)
        out.append(
            sub(
                req,
                "TransactionState",
                error_code=NONE,
                transactional_id=tid,
                transaction_state=m.state.kafka_name,
                transaction_timeout=m.timeout_ms,
                transaction_start_time=_stamp(m.start_ms),
                producer_id=m.producer_id,
                producer_epoch=m.producer_epoch,
                topics=tuple(
                    sub(req, "TopicData", topic=topic, partitions=tuple(indexes))
                    for topic, indexes in by_topic.items()
                ),
            )
        )
    return reply(req, transaction_states=tuple(out))


def handle_describe_producers(core, req: Request, conn) -> bytes:
    topics = []
    for t in req.body.topics:
        parts = []
        for index in t.partition_indexes:
            lead = core.leader_error(t.name, index)
            p = core.partition(t.name, index) if lead is None else None
            if p is None:
                parts.append(
                    sub(
                        req,
                        "PartitionResponse",
                        partition_index=index,
                        error_code=err(lead or "UNKNOWN_TOPIC_OR_PARTITION"),
                        error_message=None,
                        active_producers=(),
                    )
                )
                continue
            producers = []
            for pid, entry in sorted(p.producers.producers.items()):
                last = entry.batches[-1] if entry.batches else None
                producers.append(
                    sub(
                        req,
                        "ProducerState",
                        producer_id=pid,
                        producer_epoch=entry.epoch,
                        last_sequence=last.last_seq if last else -1,
                        last_timestamp=last.timestamp if last else -1,
                        coordinator_epoch=entry.coordinator_epoch,
                        current_txn_start_offset=p.txns.open.get(pid, -1),
                    )
                )
            parts.append(
                sub(
                    req,
                    "PartitionResponse",
                    partition_index=index,
                    error_code=NONE,
                    error_message=None,
                    active_producers=tuple(producers),
                )
            )
        topics.append(sub(req, "TopicResponse", name=t.name, partitions=tuple(parts)))
    return reply(req, topics=tuple(topics))
