"""AlterPartitionReassignments (API 45) and ListPartitionReassignments (API 46), as
kafka-reassign-partitions uses them (KIP-455).

In a cluster a reassignment moves the partition into the virtual log of its new replica list
(cluster/reassignment.py); its state lives in etcd, so any broker takes the request and lists
what is in flight. A single node answers as a one-broker Kafka does: its own id is the only
valid replica list, which is where the partition already is (done at once), nothing is ever in
flight, and a cancel finds nothing to cancel.
"""

from __future__ import annotations

from collections.abc import Awaitable

from stratalog.cluster.reassignment import (
    ACCEPTED,
    NO_REASSIGNMENT,
    Outcome,
    alter,
    check_replicas,
)
from stratalog.protocol.connection import Request

from .common import NONE, err, reply, sub


def _known(core, name: str, index: int) -> Outcome | None:
    t = core.metadata.topics.get(name)
    if t is None:
        return Outcome("UNKNOWN_TOPIC_OR_PARTITION", f"Unable to find topic {name}")
    if not 0 <= index < len(t.partitions):
        return Outcome("UNKNOWN_TOPIC_OR_PARTITION", f"Unable to find partition {name}-{index}")
    return None


def _single_node(core, name: str, index: int, replicas, allow: bool) -> Outcome:
    unknown = _known(core, name, index)
    if unknown is not None:
        return unknown
    if replicas is None:
        return NO_REASSIGNMENT
    refused = check_replicas(list(replicas), {core.node_id}, 1, allow)
    return refused or ACCEPTED  # [this node]: where it is already


def _alter_answer(req: Request, rows: list[tuple[str, list[tuple[int, Outcome]]]]) -> bytes:
    responses = tuple(
        sub(
            req,
            "ReassignableTopicResponse",
            name=name,
            partitions=tuple(
                sub(
                    req,
                    "ReassignablePartitionResponse",
                    partition_index=i,
                    error_code=err(o.error),
                    error_message=o.message,
                )
                for i, o in parts
            ),
        )
        for name, parts in rows
    )
    allow = getattr(req.body, "allow_replication_factor_change", True)
    return reply(
        req,
        error_code=NONE,
        error_message=None,
        allow_replication_factor_change=allow,
        responses=responses,
    )


def handle_alter_partition_reassignments(core, req: Request, conn) -> bytes | Awaitable[bytes]:
    body = req.body
    allow = getattr(body, "allow_replication_factor_change", True)
    asked = [
        (t.name, p.partition_index, None if p.replicas is None else [int(r) for r in p.replicas])
        for t in body.topics
        for p in t.partitions
    ]
    if core.cluster is None:
        rows = [
            (t.name, [(p.partition_index, _single_node(core, t.name, p.partition_index,
                                                         p.replicas, allow))
                      for p in t.partitions])
            for t in body.topics
        ]  # fmt: skip
        return _alter_answer(req, rows)
    cluster = core.cluster

    async def altered() -> bytes:
        outcomes: dict[tuple[str, int], Outcome] = {}
        for name, index, replicas in asked:
            try:
                outcomes[(name, index)] = await alter(cluster, name, index, replicas, allow)
            except Exception as e:  # etcd unreachable: nothing changed
                outcomes[(name, index)] = Outcome(
                    "REQUEST_TIMED_OUT", f"cannot reach the metadata store: {e}"
                )
        rows = [
            (t.name, [(p.partition_index, outcomes[(t.name, p.partition_index)])
                      for p in t.partitions])
            for t in body.topics
        ]  # fmt: skip
        return _alter_answer(req, rows)

    return altered()


def handle_list_partition_reassignments(core, req: Request, conn) -> bytes:
    body = req.body
    ongoing = {}
    if core.cluster is not None:
        ongoing = {k: r for k, r in core.cluster.reassignments.items() if not r.done}
    if body.topics is None:
        wanted = sorted(ongoing)
    else:
        # As Kafka: partitions asked for that do not exist, or are not moving, are left out.
        asked = [(t.name, i) for t in body.topics for i in t.partition_indexes]
        wanted = [key for key in asked if key in ongoing]
    by_topic: dict[str, list] = {}
    for name, index in wanted:
        r = ongoing[(name, index)]
        by_topic.setdefault(name, []).append(
            sub(
                req,
                "OngoingPartitionReassignment",
                partition_index=index,
                replicas=tuple(r.replicas),
                adding_replicas=tuple(r.adding),
                removing_replicas=tuple(r.removing),
            )
        )
    topics = tuple(
        sub(req, "OngoingTopicReassignment", name=name, partitions=tuple(parts))
        for name, parts in by_topic.items()
    )
    return reply(req, error_code=NONE, error_message=None, topics=topics)
