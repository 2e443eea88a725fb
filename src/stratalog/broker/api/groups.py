"""Consumer-group APIs: coordinator lookup, membership, and committed offsets."""

from __future__ import annotations

import time

from stratalog.broker.group_coordinator import DEAD, EMPTY
from stratalog.broker.offset_records import OFFSETS_TOPIC, OffsetRecordError
from stratalog.broker.offset_store import CommittedOffset
from stratalog.broker.txn_records import TRANSACTION_STATE_TOPIC
from stratalog.protocol.connection import Request
from stratalog.storage.journal import StorageFailure

from .common import GROUP_OPERATIONS, NONE, authorized, err, reply, sub

MAX_METADATA_BYTES = 4096  # Kafka's offset.metadata.max.bytes
GROUP_KEY = 0
TRANSACTION_KEY = 1


def handle_find_coordinator(core, req: Request, conn) -> bytes:
    body = req.body
    key_type = getattr(body, "key_type", GROUP_KEY)
    known = key_type in (GROUP_KEY, TRANSACTION_KEY)
    error = NONE if known else err("INVALID_REQUEST")
    message = None if known else f"unknown coordinator key type {key_type}"
    node = core.node_id if known else -1
    host, port = core.endpoint(conn) if known else ("", -1)
    if known:
        # As Kafka: a group's coordinator is the leader of its offsets topic partition, a
        # transactional id's the leader of its transaction log partition, so the first lookup
        # creates __consumer_offsets or __transaction_state (Kafka answers
        # COORDINATOR_NOT_AVAILABLE while it does; here the topic exists before the answer,
        # but in a cluster it is created through etcd and the answer waits for the next
        # lookup).
        try:
            if key_type == GROUP_KEY:
                core.ensure_offsets_topic()
            else:
                core.ensure_txn_state_topic()
        except StorageFailure:
            pass  # COORDINATOR_NOT_AVAILABLE below, until the topic exists
    if core.cluster is not None and known:
        topic = OFFSETS_TOPIC if key_type == GROUP_KEY else TRANSACTION_STATE_TOPIC
        keys = body.coordinator_keys if req.api_version >= 4 else [body.key]
        found = {k: core.cluster_coordinator(k, topic, conn) for k in keys}
        if req.api_version >= 4:
            return reply(req, coordinators=tuple(_coordinator(req, k, found[k]) for k in keys))
        node, host, port = found[body.key] or (-1, "", -1)
        code = NONE if found[body.key] else err("COORDINATOR_NOT_AVAILABLE")
        return reply(req, error_code=code, error_message=None, node_id=node, host=host, port=port)
    if req.api_version >= 4:
        coords = tuple(
            sub(
                req,
                "Coordinator",
                key=k,
                node_id=node,
                host=host,
                port=port,
                error_code=error,
                error_message=message,
            )
            for k in body.coordinator_keys
        )
        return reply(req, coordinators=coords)
    return reply(req, error_code=error, error_message=message, node_id=node, host=host, port=port)


def _coordinator(req: Request, key: str, where: tuple[int, str, int] | None):
    node, host, port = where or (-1, "", -1)
    return sub(
        req,
        "Coordinator",
        key=key,
        node_id=node,
        host=host,
        port=port,
        error_code=NONE if where else err("COORDINATOR_NOT_AVAILABLE"),
        error_message=None,
    )


async def handle_join_group(core, req: Request, conn) -> bytes:
    b = req.body
    rebalance_ms = b.rebalance_timeout if req.api_version >= 1 else b.session_timeout
    if core.consumer_groups.has_members(b.group_id) or core.share_groups.group(b.group_id):
        # A group of the consumer protocol (KIP-848): classic members are not taken into it
        # (Kafka's group.consumer.migration.policy=disabled; docs/compatibility.md); nor into a
        # share group (KIP-932).
        return _join_refused(req, "INCONSISTENT_GROUP_PROTOCOL")
    core.consumer_groups.forget(b.group_id)  # an empty one gives the id to the classic group
    await core.persist_group_records(b.group_id)  # (its records deleted)
    res = await core.coordinator.join(
        b.group_id,
        b.member_id,
        getattr(b, "group_instance_id", None),
        req.client_id or "",
        f"/{conn.peer}",
        int(b.session_timeout.total_seconds() * 1000),
        int(rebalance_ms.total_seconds() * 1000),
        b.protocol_type,
        [(p.name, p.metadata) for p in b.protocols],
        require_known_member_id=req.api_version >= 4,
    )
    members = tuple(
        sub(req, "JoinGroupResponseMember", member_id=mid, group_instance_id=gid, metadata=meta)
        for mid, gid, meta in res.members
    )
    protocol_name = res.protocol_name
    if protocol_name is None and req.api_version < 7:
        protocol_name = ""
    return reply(
        req,
        error_code=err(res.error),
        generation_id=res.generation,
        protocol_type=res.protocol_type,
        protocol_name=protocol_name,
        leader=res.leader,
        skip_assignment=False,
        member_id=res.member_id,
        members=members,
    )


def _join_refused(req: Request, error: str) -> bytes:
    return reply(
        req,
        error_code=err(error),
        generation_id=-1,
        protocol_type=None,
        protocol_name=None if req.api_version >= 7 else "",
        leader="",
        skip_assignment=False,
        member_id=req.body.member_id,
        members=(),
    )


async def handle_sync_group(core, req: Request, conn) -> bytes:
    b = req.body
    assignments = {a.member_id: a.assignment for a in b.assignments}
    error, assignment = await core.coordinator.sync(
        b.group_id, b.generation_id, b.member_id, assignments
    )
    g = core.coordinator.group(b.group_id) if error == "NONE" else None
    return reply(
        req,
        error_code=err(error),
        protocol_type=g.protocol_type if g else None,
        protocol_name=g.protocol_name if g else None,
        assignment=assignment,
    )


def handle_heartbeat(core, req: Request, conn) -> bytes:
    b = req.body
    error = core.coordinator.heartbeat(b.group_id, b.generation_id, b.member_id)
    return reply(req, error_code=err(error))


def handle_leave_group(core, req: Request, conn) -> bytes:
    b = req.body
    if req.api_version < 3:
        error = core.coordinator.leave(b.group_id, b.member_id)
        return reply(req, error_code=err(error))
    out = []
    for m in b.members:
        e = core.coordinator.leave(b.group_id, m.member_id, m.group_instance_id)
        out.append(
            sub(
                req,
                "MemberResponse",
                member_id=m.member_id,
                group_instance_id=m.group_instance_id,
                error_code=err(e),
            )
        )
    return reply(req, error_code=NONE, members=tuple(out))


def offset_writes(core, b, group_error: str) -> tuple[list, list[tuple[str, list[list]]]]:
    """The offsets an OffsetCommit or TxnOffsetCommit asks to store, and each partition's
    answer so far (topic -> [[partition, error]]): ``group_error`` for all when it is one."""
    now = int(time.time() * 1000)
    writes = []
    answers: list[tuple[str, list[list]]] = []
    for t in b.topics:
        parts: list[list] = []
        for p in t.partitions:
            error = group_error
            if error == "NONE":
                if not core.partition_exists(t.name, p.partition_index):
                    error = "UNKNOWN_TOPIC_OR_PARTITION"
                elif (
                    p.committed_metadata is not None
                    and len(p.committed_metadata.encode()) > MAX_METADATA_BYTES
                ):
                    error = "OFFSET_METADATA_TOO_LARGE"
                else:
                    writes.append(
                        (
                            (b.group_id, t.name, p.partition_index),
                            CommittedOffset(
                                p.committed_offset,
                                getattr(p, "committed_leader_epoch", -1),
                                p.committed_metadata or "",  # as Kafka: null is stored as ""
                                now,
                            ),
                        )
                    )
            parts.append([p.partition_index, error])
        answers.append((t.name, parts))
    return writes, answers


def fail_unwritten(answers: list[tuple[str, list[list]]], failed: str) -> None:
    """The write of the offsets failed: every partition not refused already answers ``failed``."""
    for _name, parts in answers:
        for pe in parts:
            if pe[1] == "NONE":
                pe[1] = failed


async def handle_offset_commit(core, req: Request, conn):
    b = req.body
    generation = b.generation_id_or_member_epoch
    # A consumer-protocol group judges the member epoch (KIP-848), else the classic coordinator.
    group_error = core.consumer_groups.validate_commit(
        b.group_id, b.member_id, generation, req.api_version
    ) or core.coordinator.validate_commit(b.group_id, generation, b.member_id)
    writes, answers = offset_writes(core, b, group_error)
    if writes:
        # Durable before the answer: the offsets topic's append waits for its group commit.
        failed = None
        try:
            await core.offsets.write(writes)
        except StorageFailure:
            failed = "NOT_COORDINATOR"  # Kafka's answer to a failed offsets append: retry
        except OffsetRecordError:
            failed = "UNKNOWN_SERVER_ERROR"  # (a group id too long for Kafka's record format)
        if failed is not None:
            fail_unwritten(answers, failed)
    topics = tuple(
        sub(
            req,
            "OffsetCommitResponseTopic",
            name=name,
            partitions=tuple(
                sub(req, "OffsetCommitResponsePartition", partition_index=i, error_code=err(e))
                for i, e in parts
            ),
        )
        for name, parts in answers
    )
    return reply(req, topics=topics)


def _fetch_group_offsets(core, req: Request, group_id: str, topics, names: tuple[str, str]):
    topic_cls, part_cls = names
    out = []
    # require_stable (v7+, KIP-447): an offset a transaction committed but has not settled yet
    # is answered UNSTABLE_OFFSET_COMMIT, and the consumer asks again.
    unstable = core.offsets.unstable(group_id) if getattr(req.body, "require_stable", False) else ()

    if topics is None:
        by_topic: dict[str, list] = {}
        for (t, p), c in sorted(core.offsets.group_offsets(group_id).items()):
            by_topic.setdefault(t, []).append((p, None if (t, p) in unstable else c))
        for t, entries in by_topic.items():
            out.append(
                sub(
                    req,
                    topic_cls,
                    name=t,
                    partitions=tuple(
                        sub(
                            req,
                            part_cls,
                            partition_index=p,
                            committed_offset=c.offset if c else -1,
                            committed_leader_epoch=c.leader_epoch if c else -1,
                            metadata=c.metadata if c else "",
                            error_code=NONE if c else err("UNSTABLE_OFFSET_COMMIT"),
                        )
                        for p, c in entries
                    ),
                )
            )
        return tuple(out)
    for t in topics:
        parts = []
        for p in t.partition_indexes:
            settling = (t.name, p) in unstable
            c = None if settling else core.offsets.get(group_id, t.name, p)
            parts.append(
                sub(
                    req,
                    part_cls,
                    partition_index=p,
                    committed_offset=c.offset if c else -1,
                    committed_leader_epoch=c.leader_epoch if c else -1,
                    metadata=(c.metadata if c else ""),
                    error_code=err("UNSTABLE_OFFSET_COMMIT") if settling else NONE,
                )
            )
        out.append(sub(req, topic_cls, name=t.name, partitions=tuple(parts)))
    return tuple(out)


def handle_offset_fetch(core, req: Request, conn) -> bytes:
    b = req.body
    if req.api_version >= 8:
        return reply(req, groups=tuple(_fetch_group(core, req, g) for g in b.groups))
    topics = _fetch_group_offsets(
        core,
        req,
        b.group_id,
        b.topics,
        ("OffsetFetchResponseTopic", "OffsetFetchResponsePartition"),
    )
    return reply(req, topics=topics, error_code=NONE)


def _fetch_group(core, req: Request, g):
    # v9+ (KIP-848): a member of a consumer-protocol group names itself and its epoch.
    error = core.consumer_groups.validate_fetch(
        g.group_id, getattr(g, "member_id", None), getattr(g, "member_epoch", -1)
    )
    topics = ()
    if error == "NONE":
        names = ("OffsetFetchResponseTopics", "OffsetFetchResponsePartitions")
        topics = _fetch_group_offsets(core, req, g.group_id, g.topics, names)
    return sub(
        req, "OffsetFetchResponseGroup", group_id=g.group_id, error_code=err(error), topics=topics
    )


CLASSIC = "classic"
CONSUMER = "consumer"
SHARE = "share"


def _known_groups(core) -> dict[str, tuple[str, str, str]]:
    """group id -> (state, protocol type, group type) for live groups and offset-only
    groups."""
    out = {}
    with_offsets = set(core.offsets.groups())
    for gid in with_offsets:
        out[gid] = (EMPTY, "", CLASSIC)
    # As Kafka's clean-up: empty groups without offsets go in time.
    core.coordinator.sweep(lambda gid: gid in with_offsets)
    for gid, g in core.coordinator.groups.items():
        out[gid] = (g.state, g.protocol_type or "", CLASSIC)
    for gid, cg in core.consumer_groups.groups.items():
        # Kafka keeps an empty consumer-protocol group (its records are in the log) until
        # DeleteGroups or offset expiry, so it stays listed as one.
        out[gid] = (cg.state, CONSUMER, CONSUMER)
    for gid, sg in core.share_groups.groups.items():
        out[gid] = (sg.state, SHARE, SHARE)
    return out


def handle_list_groups(core, req: Request, conn) -> bytes:
    b = req.body
    states = set(getattr(b, "states_filter", ()) or ())
    types = {t.lower() for t in (getattr(b, "types_filter", ()) or ())}
    groups = []
    for gid, (state, ptype, gtype) in sorted(_known_groups(core).items()):
        if states and state not in states:
            continue
        if types and gtype not in types:
            continue
        groups.append(
            sub(
                req,
                "ListedGroup",
                group_id=gid,
                protocol_type=ptype,
                group_state=state,
                group_type=gtype,
            )
        )
    return reply(req, error_code=NONE, groups=tuple(groups))


def handle_describe_groups(core, req: Request, conn) -> bytes:
    ops = authorized(getattr(req.body, "include_authorized_operations", False), GROUP_OPERATIONS)
    out = []
    known = _known_groups(core)
    for gid in req.body.groups:
        g = core.coordinator.group(gid)
        if g is None or (not g.members and g.state == EMPTY):
            # As Kafka 4.4 (v0-v5): a consumer-protocol group is not a classic one: Dead.
            state = EMPTY if gid in known and known[gid][2] == CLASSIC else DEAD
            out.append(
                sub(
                    req,
                    "DescribedGroup",
                    error_code=NONE,
                    group_id=gid,
                    group_state=state,
                    protocol_type=known[gid][1] if state == EMPTY else "",
                    protocol_data="",
                    members=(),
                    authorized_operations=ops,
                )
            )
            continue
        stable = g.state in ("Stable",)
        members = tuple(
            sub(
                req,
                "DescribedGroupMember",
                member_id=m.member_id,
                group_instance_id=m.group_instance_id,
                client_id=m.client_id,
                client_host=m.client_host,
                member_metadata=m.metadata_for(g.protocol_name or "") if stable else b"",
                member_assignment=m.assignment if stable else b"",
            )
            for m in g.members.values()
        )
        out.append(
            sub(
                req,
                "DescribedGroup",
                error_code=NONE,
                group_id=gid,
                group_state=g.state,
                protocol_type=g.protocol_type or "",
                protocol_data=g.protocol_name or "" if stable else "",
                members=members,
                authorized_operations=ops,
            )
        )
    return reply(req, groups=tuple(out))
