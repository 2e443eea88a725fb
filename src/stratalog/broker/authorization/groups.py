"""The consumer-group APIs: READ, DESCRIBE or DELETE on the group (and READ on the topics)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from stratalog.protocol import versions as v
from stratalog.protocol.connection import Request
from stratalog.security.acls import Operation as Op
from stratalog.security.acls import ResourceType as R

from ..api.common import AUTHORIZED_OPS_OMITTED, err, reply, sub
from .access import GROUP_DENIED, MESSAGES, TOPIC_DENIED, TXN_DENIED, Access, Handler
from .answers import edited, extended, split, with_body


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


def commit_errors(req: Request, topics, error: str, topic_cls: str, part_cls: str) -> list:
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
        return reply(req, topics=tuple(commit_errors(req, body.topics, GROUP_DENIED, *names)))
    kept, denied = split(body.topics, lambda t: a.topic(Op.READ, t.name))
    if not denied:
        return handler(core, req, conn)
    answer = handler(core, with_body(req, topics=tuple(kept)), conn)
    return extended(req, answer, "topics", commit_errors(req, denied, TOPIC_DENIED, *names))


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
        return edited(
            req, answer, lambda r: dataclasses.replace(r, topics=_describable_topics(a, r.topics))
        )
    kept, denied = split(body.topics, lambda t: a.topic(Op.DESCRIBE, t.name))
    if not denied:
        return handler(core, req, conn)
    answer = handler(core, with_body(req, topics=tuple(kept)), conn)
    return extended(
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
        kept, denied = split(g.topics, lambda t: a.topic(Op.DESCRIBE, t.name))
        asked.append((g.group_id, True, denied, False))
        kept_groups.append(dataclasses.replace(g, topics=tuple(kept)) if denied else g)
    if all(ok and not denied and not every for _g, ok, denied, every in asked):
        return handler(core, req, conn)
    answer = handler(core, with_body(req, groups=tuple(kept_groups)), conn)

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

    return edited(req, answer, edit)


def check_list_groups(core, req: Request, conn, handler: Handler, a: Access):
    answer = handler(core, req, conn)
    if a.cluster(Op.DESCRIBE):
        return answer
    return edited(
        req,
        answer,
        lambda r: dataclasses.replace(
            r, groups=tuple(g for g in r.groups if a.group(Op.DESCRIBE, g.group_id))
        ),
    )


def _describe_check(groups_field: str, denied_entry: Callable[[Request, str], object]):
    """DescribeGroups and ConsumerGroupDescribe: DESCRIBE on each group named; a denied group
    is answered GROUP_AUTHORIZATION_FAILED, and the allowed ones' operations are filled in."""

    def check(core, req: Request, conn, handler: Handler, a: Access):
        body = req.body
        want_ops = getattr(body, "include_authorized_operations", False)
        kept, denied = split(getattr(body, groups_field), lambda g: a.group(Op.DESCRIBE, g))
        if not denied and not want_ops:
            return handler(core, req, conn)
        asked = with_body(req, **{groups_field: tuple(kept)}) if denied else req
        answer = handler(core, asked, conn)
        extra = tuple(denied_entry(req, g) for g in denied)

        def edit(resp):
            # A group answered with an error (one ConsumerGroupDescribe cannot find) carries
            # no operations, as in Kafka.
            groups = tuple(
                dataclasses.replace(g, authorized_operations=a.operations(R.GROUP, g.group_id))
                if want_ops and not g.error_code
                else g
                for g in resp.groups
            )
            return dataclasses.replace(resp, groups=groups + extra)

        return edited(req, answer, edit)

    return check


def _denied_classic(req: Request, g: str):
    return sub(req, "DescribedGroup", error_code=err(GROUP_DENIED), group_id=g, group_state="",
               protocol_type="", protocol_data="", members=(),
               authorized_operations=AUTHORIZED_OPS_OMITTED)  # fmt: skip


def _denied_consumer(req: Request, g: str):
    return sub(req, "DescribedGroup", error_code=err(GROUP_DENIED), group_id=g, group_state="",
               group_epoch=0, assignment_epoch=0, assignor_name="", members=(),
               authorized_operations=AUTHORIZED_OPS_OMITTED)  # fmt: skip


def _refuse_consumer_heartbeat(req: Request) -> bytes:
    return reply(req, error_code=err(GROUP_DENIED), member_id=None, member_epoch=0,
                 heartbeat_interval=0, assignment=None)  # fmt: skip


check_describe_groups = _describe_check("groups", _denied_classic)
check_consumer_group_describe = _describe_check("group_ids", _denied_consumer)
# ShareGroupDescribe's entries have the same fields as ConsumerGroupDescribe's.
check_share_group_describe = _describe_check("group_ids", _denied_consumer)


def check_share_data(core, req: Request, conn, handler: Handler, a: Access):
    """ShareFetch and ShareAcknowledge: READ on the group (else the request is refused), READ
    on each topic (a refused topic's partitions are answered TOPIC_AUTHORIZATION_FAILED, and
    nothing of it is fetched, acknowledged or added to the share session)."""
    body = req.body
    if not a.group(Op.READ, body.group_id or ""):
        return reply(req, error_code=err(GROUP_DENIED), error_message=MESSAGES[GROUP_DENIED],
                     acquisition_lock_timeout=0, responses=(), node_endpoints=())  # fmt: skip

    def allowed(t) -> bool:
        topic = core.topic_by_id(t.topic_id)
        return topic is None or a.topic(Op.READ, topic.name)

    kept, denied = split(body.topics, allowed)
    if not denied:
        return handler(core, req, conn)
    answer = handler(core, with_body(req, topics=tuple(kept)), conn)
    entity = "ShareFetchableTopicResponse" if req.api_key == v.SHARE_FETCH else (
        "ShareAcknowledgeTopicResponse")  # fmt: skip
    leader = sub(req, "LeaderIdAndEpoch", leader_id=-1, leader_epoch=-1)
    extra = [
        sub(req, entity, topic_id=t.topic_id, partitions=tuple(
            sub(req, "PartitionData", partition_index=p.partition_index,
                error_code=err(TOPIC_DENIED), error_message=None, acknowledge_error_code=0,
                acknowledge_error_message=None, current_leader=leader, records=b"",
                acquired_records=())
            for p in t.partitions))
        for t in denied
    ]  # fmt: skip
    return extended(req, answer, "responses", extra)


def check_delete_groups(core, req: Request, conn, handler: Handler, a: Access):
    kept, denied = split(req.body.groups_names, lambda g: a.group(Op.DELETE, g))
    if not denied:
        return handler(core, req, conn)
    answer = handler(core, with_body(req, groups_names=tuple(kept)), conn)
    extra = [
        sub(req, "DeletableGroupResult", group_id=g, error_code=err(GROUP_DENIED)) for g in denied
    ]
    return extended(req, answer, "results", extra)


def check_offset_delete(core, req: Request, conn, handler: Handler, a: Access):
    body = req.body
    if not a.group(Op.DELETE, body.group_id):
        return reply(req, error_code=err(GROUP_DENIED), topics=())
    names = ("OffsetDeleteResponseTopic", "OffsetDeleteResponsePartition")
    kept, denied = split(body.topics, lambda t: a.topic(Op.READ, t.name))
    if not denied:
        return handler(core, req, conn)
    answer = handler(core, with_body(req, topics=tuple(kept)), conn)
    return extended(req, answer, "topics", commit_errors(req, denied, TOPIC_DENIED, *names))


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
    kept, denied = split(body.coordinator_keys, lambda k: denial(k) is None)
    if not denied:
        return handler(core, req, conn)
    answer = handler(core, with_body(req, coordinator_keys=tuple(kept)), conn)
    extra = [
        sub(req, "Coordinator", key=k, node_id=-1, host="", port=-1, error_code=err(denial(k)),
            error_message=MESSAGES[denial(k)])
        for k in denied
    ]  # fmt: skip
    return extended(req, answer, "coordinators", extra)


def check_describe_share_group_offsets(core, req: Request, conn, handler: Handler, a: Access):
    """DESCRIBE on each group named; a denied group is answered GROUP_AUTHORIZATION_FAILED."""
    kept, denied = split(req.body.groups, lambda g: a.group(Op.DESCRIBE, g.group_id))
    if not denied:
        return handler(core, req, conn)
    answer = handler(core, with_body(req, groups=tuple(kept)), conn)
    extra = [
        sub(req, "DescribeShareGroupOffsetsResponseGroup", group_id=g.group_id, topics=(),
            error_code=err(GROUP_DENIED), error_message=MESSAGES[GROUP_DENIED])
        for g in denied
    ]  # fmt: skip
    return extended(req, answer, "groups", extra)


CHECKS = {
    v.FIND_COORDINATOR: check_find_coordinator,
    v.JOIN_GROUP: _group_check(Op.READ, _refuse_join),
    v.SYNC_GROUP: _group_check(Op.READ, _refuse_sync),
    v.HEARTBEAT: _group_check(Op.READ, _refuse_heartbeat),
    v.LEAVE_GROUP: _group_check(Op.READ, _refuse_leave),
    v.OFFSET_COMMIT: check_offset_commit,
    v.OFFSET_FETCH: check_offset_fetch,
    v.LIST_GROUPS: check_list_groups,
    v.DESCRIBE_GROUPS: check_describe_groups,
    v.CONSUMER_GROUP_HEARTBEAT: _group_check(Op.READ, _refuse_consumer_heartbeat),
    v.CONSUMER_GROUP_DESCRIBE: check_consumer_group_describe,
    v.SHARE_GROUP_HEARTBEAT: _group_check(Op.READ, _refuse_consumer_heartbeat),
    v.SHARE_GROUP_DESCRIBE: check_share_group_describe,
    v.SHARE_FETCH: check_share_data,
    v.SHARE_ACKNOWLEDGE: check_share_data,
    v.DESCRIBE_SHARE_GROUP_OFFSETS: check_describe_share_group_offsets,
    v.DELETE_GROUPS: check_delete_groups,
    v.OFFSET_DELETE: check_offset_delete,
}
