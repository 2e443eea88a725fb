"""ReadShareGroupState (84), WriteShareGroupState (85) and DeleteShareGroupState (86): the
share coordinator's inter-broker APIs (KIP-932). In a cluster the broker leading a data
partition keeps its share-partitions and asks the broker leading the key's
``__share_group_state`` partition to read and write their durable state
(``cluster/share_state_client.py``); that broker answers here from ``broker/share_state.py``.

A key this broker does not coordinate is NOT_COORDINATOR (the asker looks again); a write, or a
read, from a leader older than the one that last wrote or read the key is FENCED_LEADER_EPOCH (a
partition's former leader cannot overwrite what the new one wrote, nor load it again); a read
from a newer leader records its epoch before answering (as Kafka's share coordinator does), so
the leader it replaced is fenced from then on; a write not made durable is
COORDINATOR_NOT_AVAILABLE. A read of a key never written answers start offset -1.
"""

from __future__ import annotations

from stratalog.broker.share_state import FencedLeader
from stratalog.broker.share_state_records import ShareState, StateBatch
from stratalog.protocol.connection import Request
from stratalog.storage.journal import StorageFailure

from .common import err, reply, sub


def _not_here(core, key) -> str | None:
    try:
        here = core.share_state.coordinated_here(key)
    except StorageFailure:
        here = None
    if here is None:
        return "COORDINATOR_NOT_AVAILABLE"
    return None if here else "NOT_COORDINATOR"


async def handle_read_share_group_state(core, req: Request, conn) -> bytes:
    b = req.body
    results = []
    for t in b.topics:
        parts = []
        for p in t.partitions:
            key = (b.group_id, t.topic_id, p.partition)
            error = _not_here(core, key)
            state = None
            if error is None:
                try:
                    state = await core.share_state.read_fenced(key, p.leader_epoch)
                except FencedLeader:
                    error = "FENCED_LEADER_EPOCH"
                except StorageFailure:
                    error = "COORDINATOR_NOT_AVAILABLE"
            parts.append(sub(
                req, "PartitionResult", partition=p.partition,
                error_code=err(error or "NONE"), error_message=None,
                state_epoch=state.state_epoch if state is not None else -1,
                start_offset=state.start_offset if state is not None else -1,
                state_batches=tuple(
                    sub(req, "StateBatch", first_offset=s.first_offset,
                        last_offset=s.last_offset, delivery_state=s.delivery_state,
                        delivery_count=s.delivery_count)
                    for s in (state.batches if state is not None else ())
                ),
            ))  # fmt: skip
        results.append(sub(req, "ReadStateResult", topic_id=t.topic_id, partitions=tuple(parts)))
    return reply(req, results=tuple(results))


async def handle_write_share_group_state(core, req: Request, conn) -> bytes:
    b = req.body
    entries = []
    for t in b.topics:
        for p in t.partitions:
            batches = tuple(
                StateBatch(s.first_offset, s.last_offset, s.delivery_state, s.delivery_count)
                for s in p.state_batches
            )
            state = ShareState(p.start_offset, batches, p.state_epoch, p.leader_epoch)
            entries.append(((b.group_id, t.topic_id, p.partition), state))
    return await _write(core, req, entries, "WriteStateResult")


async def handle_delete_share_group_state(core, req: Request, conn) -> bytes:
    b = req.body
    entries = [
        ((b.group_id, t.topic_id, p.partition), None) for t in b.topics for p in t.partitions
    ]
    return await _write(core, req, entries, "DeleteStateResult")


async def _write(core, req: Request, entries, result: str) -> bytes:
    errors = {key: _not_here(core, key) for key, _s in entries}
    todo = [(key, s) for key, s in entries if errors[key] is None]
    try:
        await core.share_state.write(todo, local_only=True)
    except FencedLeader as e:
        for key in e.keys:
            errors[key] = "FENCED_LEADER_EPOCH"
        rest = [(key, s) for key, s in todo if key not in e.keys]
        try:
            await core.share_state.write(rest, local_only=True)
        except StorageFailure:
            errors.update({key: "COORDINATOR_NOT_AVAILABLE" for key, _s in rest})
    except StorageFailure:
        errors.update({key: "COORDINATOR_NOT_AVAILABLE" for key, _s in todo})
    by_topic: dict = {}
    for (_g, tid, index), _s in entries:
        error = errors[(_g, tid, index)]
        by_topic.setdefault(tid, []).append(
            sub(
                req,
                "PartitionResult",
                partition=index,
                error_code=err(error or "NONE"),
                error_message=None,
            )
        )
    return reply(
        req,
        results=tuple(
            sub(req, result, topic_id=tid, partitions=tuple(parts))
            for tid, parts in by_topic.items()
        ),
    )
