"""Group administration: DeleteGroups and OffsetDelete (``kafka-consumer-groups --delete`` and
``--delete-offsets``; the admin clients' ``delete_consumer_groups`` and
``delete_consumer_group_offsets``).

Kafka's rules (GroupCoordinatorShard.deleteGroups, OffsetMetadataManager.deleteOffsets,
ClassicGroup.validateDeleteGroup / validateOffsetDelete):

* DeleteGroups, per group: GROUP_ID_NOT_FOUND for a group the coordinator does not know (it
  never had members or committed offsets, or was deleted), NON_EMPTY_GROUP while it has
  members; otherwise every committed offset of the group is deleted (tombstones in
  ``__consumer_offsets``) and the group with them.
* OffsetDelete: top-level INVALID_GROUP_ID for an empty group id, GROUP_ID_NOT_FOUND for an
  unknown group, NON_EMPTY_GROUP for a live group whose protocol type is not ``consumer``; per
  partition UNKNOWN_TOPIC_OR_PARTITION for a topic or partition that does not exist,
  GROUP_SUBSCRIBED_TO_TOPIC for a topic a member of the live group subscribes to (read from the
  members' ConsumerProtocol subscriptions; when they cannot be read, every topic counts as
  subscribed, as in Kafka), else the partition's committed offset, if any, is deleted.

Deletions are durable (the tombstones' group commit) before the answer. In a cluster only the
group's coordinator (the leader of its offsets partition) answers; the others say
NOT_COORDINATOR, and the tombstones replicate with the offsets topic.
"""

from __future__ import annotations

import struct

from stratalog.broker.group_records import GroupKey
from stratalog.broker.offset_records import OFFSETS_TOPIC, OffsetRecordError, partition_for
from stratalog.protocol.connection import Request
from stratalog.storage.journal import StorageFailure

from .common import err, reply, sub
from .groups import _known_groups

CONSUMER_PROTOCOL = "consumer"
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")


def coordinator_error(core, group_id: str) -> str | None:
    """In a cluster, NOT_COORDINATOR unless this broker leads the group's offsets partition,
    COORDINATOR_LOAD_IN_PROGRESS while it has not read all of it yet."""
    if core.cluster is None:
        return None
    t = core.metadata.topics.get(OFFSETS_TOPIC)
    if t is None:
        return "COORDINATOR_NOT_AVAILABLE"
    index = partition_for(group_id, len(t.partitions))
    if core.leader_error(OFFSETS_TOPIC, index) is not None:
        return "NOT_COORDINATOR"
    if core.loading(OFFSETS_TOPIC, index):
        return "COORDINATOR_LOAD_IN_PROGRESS"
    return None


def _exists(core, gid: str) -> bool:
    """A group Kafka's coordinator would know: one with committed offsets or members, or one
    whose members all left (Kafka keeps such a group, Empty, until its periodic clean-up)."""
    return gid in _known_groups(core) or core.coordinator.group(gid) is not None


def _failed_write(e: Exception) -> str:
    # As OffsetCommit answers a failed offsets append (groups.py).
    return "NOT_COORDINATOR" if isinstance(e, StorageFailure) else "UNKNOWN_SERVER_ERROR"


async def handle_delete_groups(core, req: Request, conn) -> bytes:
    results: dict[str, str] = {}
    for gid in dict.fromkeys(req.body.groups_names):  # distinct, in order (as Kafka)
        error = coordinator_error(core, gid)
        if error is None:
            g = core.coordinator.group(gid)
            share = core.share_groups.group(gid)
            if (
                (g is not None and g.members)
                or core.consumer_groups.has_members(gid)
                or (share is not None and share.members)
            ):
                error = "NON_EMPTY_GROUP"
            elif not _exists(core, gid):
                error = "GROUP_ID_NOT_FOUND"
        if error is None:
            keys: list = [(gid, t, p) for (t, p) in sorted(core.offsets.group_offsets(gid))]
            if GroupKey(gid) in core.offsets.group_meta:
                keys.append(GroupKey(gid))  # its metadata too: not taken back at a restart
            try:
                await core.offsets.write([(k, None) for k in keys])
                # A share group's durable share-partition state goes too (tombstones), so that
                # a new group of the same name starts afresh.
                await core.share_state.write([(k, None) for k in core.share_state.keys_of(gid)])
                core.coordinator.forget(gid)
                core.consumer_groups.forget(gid)
                core.share_groups.forget(gid)  # its share-partitions' state too
                await core.persist_group_records(gid)  # tombstones: not taken back at a restart
            except (StorageFailure, OffsetRecordError) as e:
                error = _failed_write(e)
        results[gid] = error or "NONE"
    return reply(
        req,
        results=tuple(
            sub(req, "DeletableGroupResult", group_id=gid, error_code=err(e))
            for gid, e in results.items()
        ),
    )


def subscribed_topics(g) -> set[str] | None:
    """The topics a live consumer group's members subscribe to, from their ConsumerProtocol
    subscriptions for the group's protocol (read as version 0, the prefix of every version);
    None when that cannot be known (no protocol chosen yet, or metadata that does not parse)."""
    if g.protocol_name is None:
        return None
    topics: set[str] = set()
    for m in g.members.values():
        data = m.metadata_for(g.protocol_name)
        try:
            pos = _I16.size  # the version
            (n,) = _I32.unpack_from(data, pos)
            pos += _I32.size
            if n < 0 or n > len(data):
                return None
            for _ in range(n):
                (size,) = _I16.unpack_from(data, pos)
                pos += _I16.size
                if size < 0 or pos + size > len(data):
                    return None
                topics.add(bytes(data[pos : pos + size]).decode())
                pos += size
        except (struct.error, UnicodeDecodeError):
            return None
    return topics


async def handle_offset_delete(core, req: Request, conn) -> bytes:
    b = req.body
    gid = b.group_id

    def top(error: str) -> bytes:
        return reply(req, error_code=err(error), topics=())

    if not gid:
        return top("INVALID_GROUP_ID")
    error = coordinator_error(core, gid)
    if error is not None:
        return top(error)
    if not _exists(core, gid):
        return top("GROUP_ID_NOT_FOUND")
    g = core.coordinator.group(gid)
    live = g is not None and bool(g.members)
    subscribed: set[str] | None = set()
    cg = core.consumer_groups.group(gid)
    if cg is not None:
        # A consumer-protocol group: the topics its members subscribe to, by name or regex.
        subscribed = set(cg.subscribed)
    elif live:
        if g.protocol_type != CONSUMER_PROTOCOL:
            return top("NON_EMPTY_GROUP")
        subscribed = subscribed_topics(g)
    answers: dict[str, dict[int, str]] = {}
    deletes = []
    for t in b.topics:
        parts = answers.setdefault(t.name, {})
        known = t.name in core.metadata.topics
        for p in t.partitions:
            i = p.partition_index
            if not known or not core.partition_exists(t.name, i):
                parts[i] = "UNKNOWN_TOPIC_OR_PARTITION"
            elif subscribed is None or t.name in subscribed:
                parts[i] = "GROUP_SUBSCRIBED_TO_TOPIC"
            else:
                parts[i] = "NONE"
                if core.offsets.get(gid, t.name, i) is not None:
                    deletes.append(((gid, t.name, i), None))
    if deletes:
        try:
            await core.offsets.write(deletes)
        except (StorageFailure, OffsetRecordError) as e:
            return top(_failed_write(e))
    return reply(
        req,
        error_code=err("NONE"),
        topics=tuple(
            sub(
                req,
                "OffsetDeleteResponseTopic",
                name=name,
                partitions=tuple(
                    sub(req, "OffsetDeleteResponsePartition", partition_index=i, error_code=err(e))
                    for i, e in parts.items()
                ),
            )
            for name, parts in answers.items()
        ),
    )
