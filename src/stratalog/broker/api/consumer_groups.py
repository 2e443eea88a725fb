"""ConsumerGroupHeartbeat (68) and ConsumerGroupDescribe (69): the consumer group protocol of
KIP-848 (``group.protocol=consumer``). The state machine is ``broker/consumer_groups.py``; this
module decodes, answers, and keeps the timer that expires silent members."""

from __future__ import annotations

import contextlib
import uuid

from stratalog.broker.assignors import Assignment
from stratalog.broker.consumer_groups import ConsumerGroup, GroupError, Heartbeat, clock_ms
from stratalog.broker.group_timers import keep_expiring_consumer_groups
from stratalog.broker.offset_records import OffsetRecordError
from stratalog.broker.reconciliation import Member
from stratalog.protocol.connection import Request
from stratalog.storage.journal import StorageFailure

from .common import AUTHORIZED_OPS_OMITTED, NONE, authorized, err, reply, sub
from .group_admin import coordinator_error

# What Kafka 4.4 reports allowed on a group without an authorizer: READ, DELETE, DESCRIBE, and
# DESCRIBE_CONFIGS and ALTER_CONFIGS (groups have configs since KIP-848).
CONSUMER_GROUP_OPERATIONS = 3400


_now = clock_ms


def _owned(body) -> dict[uuid.UUID, frozenset[int]] | None:
    if body.topic_partitions is None:
        return None
    return {tp.topic_id: frozenset(tp.partitions) for tp in body.topic_partitions}


async def handle_consumer_group_heartbeat(core, req: Request, conn) -> bytes:
    b = req.body
    groups = core.consumer_groups
    hb = Heartbeat(
        group_id=b.group_id,
        member_id=b.member_id,
        member_epoch=b.member_epoch,
        instance_id=b.instance_id,
        rack_id=b.rack_id,
        rebalance_timeout_ms=int(b.rebalance_timeout.total_seconds() * 1000),
        subscribed_topic_names=b.subscribed_topic_names,
        subscribed_topic_regex=getattr(b, "subscribed_topic_regex", None),
        server_assignor=b.server_assignor,
        owned=_owned(b),
        client_id=req.client_id or "",
        client_host=f"/{conn.peer}",
    )
    try:
        not_here = coordinator_error(core, b.group_id) if b.group_id else None
        if not_here is not None:
            raise GroupError(not_here)
        if req.api_version >= 1 and not b.member_id:
            # From v1 the client makes up its member id (KIP-1082).
            raise GroupError("INVALID_REQUEST", "MemberId can't be empty.")
        if core.share_groups.group(b.group_id) is not None:
            raise GroupError("GROUP_ID_NOT_FOUND", f"Group {b.group_id} is not a consumer group.")
        if core.coordinator.group(b.group_id) is not None:
            if core.coordinator.group(b.group_id).members:
                raise GroupError(
                    "GROUP_ID_NOT_FOUND", f"Group {b.group_id} is not a consumer group."
                )
            core.coordinator.forget(b.group_id)  # an empty classic group gives way
        answer = groups.heartbeat(hb, core.group_topics(), _now())
    except GroupError as e:
        with contextlib.suppress(StorageFailure, OffsetRecordError):
            await core.persist_group_records(b.group_id)  # (a refused rejoin removes a member)
        return heartbeat_refusal(req, e)
    keep_expiring_consumer_groups(core)
    return await persisted_reply(core, req, b.group_id, answer)


async def persisted_reply(core, req: Request, group_id: str, answer) -> bytes:
    """The heartbeat's answer once the records it changed are durable, as Kafka's coordinator
    answers: a new coordinator then knows the epoch and assignment the member has. A failed
    write is NOT_COORDINATOR (the client looks for its coordinator and heartbeats again)."""
    try:
        await core.persist_group_records(group_id)
    except (StorageFailure, OffsetRecordError) as e:
        return heartbeat_refusal(req, GroupError("NOT_COORDINATOR", f"not written: {e}"))
    return heartbeat_reply(req, answer)


def heartbeat_reply(req: Request, answer) -> bytes:
    """A successful Consumer- or ShareGroupHeartbeat answer (the assignment when it is sent)."""
    assignment = None
    if answer.assignment is not None:
        assignment = sub(
            req,
            "Assignment",
            topic_partitions=tuple(
                sub(req, "TopicPartitions", topic_id=tid, partitions=tuple(sorted(ps)))
                for tid, ps in sorted(answer.assignment.items(), key=lambda x: str(x[0]))
            ),
        )
    return reply(
        req,
        error_code=NONE,
        error_message=None,
        member_id=answer.member_id,
        member_epoch=answer.member_epoch,
        heartbeat_interval=answer.heartbeat_interval_ms,
        assignment=assignment,
    )


def heartbeat_refusal(req: Request, e: GroupError) -> bytes:
    return reply(
        req,
        error_code=err(e.error),
        error_message=e.message,
        member_id=None,
        member_epoch=0,
        heartbeat_interval=0,
        assignment=None,
    )


def handle_consumer_group_describe(core, req: Request, conn) -> bytes:
    return describe_groups(
        core,
        req,
        core.consumer_groups.group,
        lambda gid: core.coordinator.group(gid) is not None,
        "consumer",
        _described,
    )


def describe_groups(core, req: Request, find, taken, kind: str, described) -> bytes:
    """Consumer- or ShareGroupDescribe: each group ``find`` knows ``described``; an unknown one
    GROUP_ID_NOT_FOUND ("not a <kind> group" when another kind ``taken`` has the id)."""
    ops = authorized(req.body.include_authorized_operations, CONSUMER_GROUP_OPERATIONS)
    out = []
    for gid in req.body.group_ids:
        error = coordinator_error(core, gid)
        g = find(gid) if error is None else None
        if g is None:
            error = error or "GROUP_ID_NOT_FOUND"
            message = None
            if error == "GROUP_ID_NOT_FOUND":
                message = (
                    f"Group {gid} is not a {kind} group."
                    if taken(gid)
                    else f"Group {gid} not found."
                )
            out.append(missing_group(req, gid, error, message))
            continue
        out.append(described(core, req, g, ops))
    return reply(req, groups=tuple(out))


def missing_group(req: Request, gid: str, error: str, message: str | None):
    """A Consumer- or ShareGroupDescribe entry for a group it cannot describe."""
    return sub(
        req,
        "DescribedGroup",
        error_code=err(error),
        error_message=message,
        group_id=gid,
        group_state="",
        group_epoch=0,
        assignment_epoch=0,
        assignor_name="",
        members=(),
        authorized_operations=AUTHORIZED_OPS_OMITTED,
    )


def described_assignment(core, req: Request):
    """A function from an assignment to a describe answer's Assignment (topics by name too)."""
    names = {t.topic_id: t.name for t in core.metadata.topics.values()}

    def assignment(a: Assignment):
        return sub(
            req,
            "Assignment",
            topic_partitions=tuple(
                sub(
                    req,
                    "TopicPartitions",
                    topic_id=tid,
                    topic_name=names[tid],
                    partitions=tuple(sorted(ps)),
                )
                for tid, ps in sorted(a.items(), key=lambda x: str(x[0]))
                if tid in names
            ),
        )

    return assignment


def described_group(req: Request, g, members: tuple, ops: int):
    """A Consumer- or ShareGroupDescribe entry for a group it knows (``g`` a ConsumerGroup or a
    ShareGroup: both have ids, a state, epochs and an assignor)."""
    return sub(
        req,
        "DescribedGroup",
        error_code=NONE,
        error_message=None,
        group_id=g.group_id,
        group_state=g.state,
        group_epoch=g.group_epoch,
        assignment_epoch=g.assignment_epoch,
        assignor_name=g.assignor,
        members=members,
        authorized_operations=ops,
    )


def member_entry(req: Request, m, assignment, **more):
    """A described member's fields both protocols have (``m`` a Member or a ShareMember)."""
    return sub(
        req,
        "Member",
        member_id=m.member_id,
        rack_id=m.rack_id,
        member_epoch=m.epoch,
        client_id=m.client_id,
        client_host=m.client_host,
        subscribed_topic_names=m.subscribed_topic_names,
        assignment=assignment(m.assigned),
        **more,
    )


def _described(core, req: Request, g: ConsumerGroup, ops: int):
    assignment = described_assignment(core, req)

    def member(m: Member):
        return member_entry(
            req,
            m,
            assignment,
            instance_id=m.instance_id,
            subscribed_topic_regex=m.subscribed_topic_regex or "",  # as Kafka 4.4: "" for none
            target_assignment=assignment(g.target.get(m.member_id, {})),
            member_type=1,  # a member of the consumer protocol (not a classic one)
        )

    return described_group(req, g, tuple(member(m) for m in g.members.values()), ops)
