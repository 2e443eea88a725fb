"""The APIs of the cluster resource: refused as a whole, as Kafka's getErrorResponse answers."""

from __future__ import annotations

from collections.abc import Callable

from stratalog.protocol import versions as v
from stratalog.protocol.connection import Request
from stratalog.security.acls import Operation as Op

from ..api.common import err, reply, sub
from .access import CLUSTER_DENIED, MESSAGES, Access, Handler


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


def _refuse_share_state(result: str, read: bool) -> Callable[[Request], bytes]:
    def refuse(req: Request) -> bytes:
        extra = {"state_epoch": -1, "start_offset": -1, "state_batches": ()} if read else {}
        return reply(req, results=tuple(
            sub(req, result, topic_id=t.topic_id, partitions=tuple(
                sub(req, "PartitionResult", partition=p.partition, error_code=err(_CE),
                    error_message=_MSG, **extra)
                for p in t.partitions
            ))
            for t in req.body.topics
        ))  # fmt: skip

    return refuse


CHECKS = {
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
    # Between brokers only, as Kafka's share coordinator APIs.
    v.READ_SHARE_GROUP_STATE: _cluster_check(
        Op.CLUSTER_ACTION, _refuse_share_state("ReadStateResult", read=True)
    ),
    v.WRITE_SHARE_GROUP_STATE: _cluster_check(
        Op.CLUSTER_ACTION, _refuse_share_state("WriteStateResult", read=False)
    ),
    v.DELETE_SHARE_GROUP_STATE: _cluster_check(
        Op.CLUSTER_ACTION, _refuse_share_state("DeleteStateResult", read=False)
    ),
}
