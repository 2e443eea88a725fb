"""ShareGroupHeartbeat (76) and ShareGroupDescribe (77): share groups' membership (KIP-932).
The state machine is ``broker/share_groups.py``; this module decodes, answers, and keeps the
timer that expires silent members and records whose acquisition lock ran out."""

from __future__ import annotations

import asyncio

from stratalog.broker.assignors import Assignment
from stratalog.broker.group_coordinator import GroupError
from stratalog.broker.share_groups import ShareGroup, ShareHeartbeat, ShareMember
from stratalog.protocol.connection import Request

from .common import AUTHORIZED_OPS_OMITTED, NONE, authorized, err, reply, sub
from .consumer_groups import CONSUMER_GROUP_OPERATIONS, BrokerTopics, _now
from .group_admin import coordinator_error


def other_group_type(core, group_id: str) -> bool:
    """Whether ``group_id`` is taken by a classic group with members or a consumer group."""
    classic = core.coordinator.group(group_id)
    return (classic is not None and bool(classic.members)) or (
        core.consumer_groups.group(group_id) is not None
    )


def handle_share_group_heartbeat(core, req: Request, conn) -> bytes:
    b = req.body
    hb = ShareHeartbeat(
        group_id=b.group_id,
        member_id=b.member_id,
        member_epoch=b.member_epoch,
        rack_id=b.rack_id,
        subscribed_topic_names=b.subscribed_topic_names,
        client_id=req.client_id or "",
        client_host=f"/{conn.peer}",
    )
    try:
        not_here = coordinator_error(core, b.group_id) if b.group_id else None
        if not_here is not None:
            raise GroupError(not_here)
        if b.group_id and other_group_type(core, b.group_id):
            raise GroupError("GROUP_ID_NOT_FOUND", f"Group {b.group_id} is not a share group.")
        answer = core.share_groups.heartbeat(hb, BrokerTopics(core), _now())
    except GroupError as e:
        return reply(
            req,
            error_code=err(e.error),
            error_message=e.message,
            member_id=None,
            member_epoch=0,
            heartbeat_interval=0,
            assignment=None,
        )
    keep_expiring(core)
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


def keep_expiring(core) -> None:
    """Keep a timer at the next deadline of any share group (a member's session, a record's
    lock); when it fires, expire what is due and wake share fetches waiting for records."""
    deadline = core.share_groups.next_deadline()
    timer = core.share_group_timer
    if deadline is None:
        return
    loop = asyncio.get_running_loop()
    when = deadline / 1000
    if timer is not None:
        if timer.when() <= when:
            return
        timer.cancel()

    def tick() -> None:
        core.share_group_timer = None
        core.share_groups.expire(_now(), BrokerTopics(core))
        wake_share_fetches(core)
        keep_expiring(core)

    core.share_group_timer = loop.call_at(when, tick)


def wake_share_fetches(core) -> None:
    """Records may have become acquirable (released, or a lock ran out)."""
    waiters, core.share_waiters = core.share_waiters, []
    for w in waiters:
        if not w.done():
            w.set_result(None)


def handle_share_group_describe(core, req: Request, conn) -> bytes:
    b = req.body
    ops = authorized(b.include_authorized_operations, CONSUMER_GROUP_OPERATIONS)
    out = []
    for gid in b.group_ids:
        error = coordinator_error(core, gid)
        g = core.share_groups.group(gid) if error is None else None
        if g is None:
            error = error or "GROUP_ID_NOT_FOUND"
            message = None
            if error == "GROUP_ID_NOT_FOUND":
                other = other_group_type(core, gid)
                message = (
                    f"Group {gid} is not a share group." if other else f"Group {gid} not found."
                )
            out.append(
                sub(
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
            )
            continue
        out.append(_described(core, req, g, ops))
    return reply(req, groups=tuple(out))


def _described(core, req: Request, g: ShareGroup, ops: int):
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

    def member(m: ShareMember):
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
        )

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
        members=tuple(member(m) for m in g.members.values()),
        authorized_operations=ops,
    )
