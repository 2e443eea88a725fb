"""ShareGroupHeartbeat (76) and ShareGroupDescribe (77): share groups' membership (KIP-932).
The state machine is ``broker/share_groups.py``; this module decodes, answers, and keeps the
timer that expires silent members and records whose acquisition lock ran out."""

from __future__ import annotations

import uuid

from stratalog.broker.group_coordinator import GroupError
from stratalog.broker.group_timers import keep_expiring_share_groups
from stratalog.broker.share_groups import ShareGroup, ShareHeartbeat, ShareMember
from stratalog.broker.share_partition import ACKNOWLEDGED, ARCHIVED
from stratalog.protocol.connection import Request
from stratalog.storage.journal import StorageFailure

from .common import NONE, err, reply, sub
from .consumer_groups import (
    _now,
    describe_groups,
    described_assignment,
    described_group,
    heartbeat_refusal,
    member_entry,
    persisted_reply,
)
from .group_admin import coordinator_error


def other_group_type(core, group_id: str) -> bool:
    """Whether ``group_id`` is taken by a classic group with members or a consumer group."""
    classic = core.coordinator.group(group_id)
    return (classic is not None and bool(classic.members)) or (
        core.consumer_groups.group(group_id) is not None
    )


async def handle_share_group_heartbeat(core, req: Request, conn) -> bytes:
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
        answer = core.share_groups.heartbeat(hb, core.group_topics(), _now())
    except GroupError as e:
        return heartbeat_refusal(req, e)
    try:
        # The state topic exists before the group's first ShareFetch needs it (in a cluster
        # it is created through etcd, which takes a moment).
        core.share_state_partitions(True)
    except StorageFailure:
        pass
    keep_expiring_share_groups(core)
    return await persisted_reply(core, req, b.group_id, answer)


def handle_share_group_describe(core, req: Request, conn) -> bytes:
    return describe_groups(
        core,
        req,
        core.share_groups.group,
        lambda gid: other_group_type(core, gid),
        "share",
        _described,
    )


def _described(core, req: Request, g: ShareGroup, ops: int):
    assignment = described_assignment(core, req)

    def member(m: ShareMember):
        return member_entry(req, m, assignment)

    return described_group(req, g, tuple(member(m) for m in g.members.values()), ops)


def handle_describe_share_group_offsets(core, req: Request, conn) -> bytes:
    """DescribeShareGroupOffsets (90): each share-partition's start offset (SPSO) and lag, as
    ``kafka-share-groups --describe`` shows them; -1 for a partition whose state was never
    written (nothing acknowledged, released or expired yet; Kafka's view), and for a group that
    does not exist (Kafka answers that without an error too)."""
    out = []
    for rg in req.body.groups:
        error = coordinator_error(core, rg.group_id)
        if error is not None:
            out.append(sub(req, "DescribeShareGroupOffsetsResponseGroup", group_id=rg.group_id,
                           topics=(), error_code=err(error), error_message=None))  # fmt: skip
            continue
        g = core.share_groups.group(rg.group_id)
        out.append(
            sub(
                req,
                "DescribeShareGroupOffsetsResponseGroup",
                group_id=rg.group_id,
                topics=tuple(_offsets_of(core, req, rg.group_id, g, rg.topics)),
                error_code=NONE,
                error_message=None,
            )
        )
    return reply(req, groups=tuple(out))


def _stored(core, group_id: str) -> dict:
    """(topic id, partition) -> (start offset, records done past it) of the group's
    share-partitions whose durable state this broker holds and has not loaded (after a restart,
    before their first ShareFetch)."""
    out = {}
    for _g, tid, index in core.share_state.keys_of(group_id):
        state = core.share_state.read_local((group_id, tid, index))
        if state is not None:
            done = sum(b.last_offset - b.first_offset + 1 for b in state.batches
                       if b.delivery_state in (ACKNOWLEDGED, ARCHIVED))  # fmt: skip
            out[(tid, index)] = (state.start_offset, done)
    return out


def _offsets_of(core, req: Request, group_id: str, g: ShareGroup | None, topics):
    partitions = g.partitions if g is not None else {}
    stored = {k: v for k, v in _stored(core, group_id).items() if k not in partitions}
    wanted: dict[str, list[int]] = {}
    if topics is None:
        by_id = {t.topic_id: t.name for t in core.metadata.topics.values()}
        for tid, index in sorted({*partitions, *stored}, key=lambda x: (str(x[0]), x[1])):
            if tid in by_id:
                wanted.setdefault(by_id[tid], []).append(index)
    else:
        for t in topics:
            wanted.setdefault(t.topic_name, []).extend(t.partitions)
    for name, indexes in wanted.items():
        t = core.metadata.topics.get(name)
        rows = []
        for index in indexes:
            sp = partitions.get((t.topic_id, index)) if t is not None else None
            p = core.partition(name, index) if t is not None else None
            start = lag = -1
            if sp is not None and sp.written and p is not None:
                start = sp.start
                lag = max(0, p.high_watermark - sp.start - sp.done_in_flight())
            elif t is not None and p is not None and (t.topic_id, index) in stored:
                start, done = stored[(t.topic_id, index)]
                lag = max(0, p.high_watermark - start - done)
            rows.append(sub(req, "DescribeShareGroupOffsetsResponsePartition",
                            partition_index=index, start_offset=start, leader_epoch=0, lag=lag,
                            error_code=NONE, error_message=None))  # fmt: skip
        yield sub(
            req,
            "DescribeShareGroupOffsetsResponseTopic",
            topic_name=name,
            topic_id=t.topic_id if t is not None else uuid.UUID(int=0),
            partitions=tuple(rows),
        )
