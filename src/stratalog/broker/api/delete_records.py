"""DeleteRecords: move partitions' log starts forward, as ``kafka-delete-records`` asks.

Kafka's rules (ReplicaManager.deleteRecords, Partition.deleteRecordsOnLeader): a partition that
does not exist is UNKNOWN_TOPIC_OR_PARTITION, one of an internal topic INVALID_TOPIC_EXCEPTION,
one this broker does not lead NOT_LEADER_OR_FOLLOWER, one of a compacted topic without the
``delete`` cleanup policy POLICY_VIOLATION (an empty policy is no obstacle); offset -1 means
the high watermark, and a negative offset or one past the high watermark is
OFFSET_OUT_OF_RANGE. Otherwise the log start moves to exactly that offset
(never back) and the answer is the new log start, the "low watermark" (-1 with an error).

The move is durable before the answer (the partition state file, LogStore.move_log_starts). In a
cluster it is made on the leader and recorded in etcd (ClusterNode.record_log_starts), from where
every replica of the partition applies it (BrokerCore.apply_cluster_log_starts), so a replica
that becomes leader later answers with the same log start.
"""

from __future__ import annotations

import asyncio

from stratalog.cluster.metadata import INTERNAL_TOPICS
from stratalog.protocol.connection import Request

from .common import err, reply, sub

HIGH_WATERMARK = -1
INVALID_LOW_WATERMARK = -1


def handle_delete_records(core, req: Request, conn):
    body = req.body
    # topic -> partition -> [low watermark, error]; a partition named twice is answered once,
    # for the last offset asked (Kafka collects the request into a map).
    answers: dict[str, dict[int, list]] = {}
    moves: dict[tuple[str, int], int] = {}
    for t in body.topics:
        for rp in t.partitions:
            key = (t.name, rp.partition_index)
            moves.pop(key, None)
            answers.setdefault(t.name, {})[rp.partition_index] = [INVALID_LOW_WATERMARK, "NONE"]
            error = _check(core, t.name, rp.partition_index)
            if error is None:
                p = core.partition(t.name, rp.partition_index)
                target = p.high_watermark if rp.offset == HIGH_WATERMARK else rp.offset
                if target < 0 or target > p.high_watermark:
                    error = "OFFSET_OUT_OF_RANGE"
                else:
                    moves[key] = target
            if error is not None:
                answers[t.name][rp.partition_index][1] = error
    recorded = core.move_log_starts(moves) if moves else None

    def respond(failed: str | None = None) -> bytes:
        for (topic, index), _target in moves.items():
            a = answers[topic][index]
            p = core.partition(topic, index)
            if failed is not None or p is None:
                a[:] = [INVALID_LOW_WATERMARK, failed or "UNKNOWN_TOPIC_OR_PARTITION"]
            else:
                a[0] = p.log_start_offset
        topics = tuple(
            sub(
                req,
                "DeleteRecordsTopicResult",
                name=name,
                partitions=tuple(
                    sub(
                        req,
                        "DeleteRecordsPartitionResult",
                        partition_index=i,
                        low_watermark=low,
                        error_code=err(error),
                    )
                    for i, (low, error) in parts.items()
                ),
            )
            for name, parts in answers.items()
        )
        return reply(req, topics=topics)

    if recorded is None:
        return respond()

    async def in_cluster() -> bytes:
        # Moved here already; answered once etcd holds it, from where the replicas take it
        # (Kafka answers once every in-sync replica moved: REQUEST_TIMED_OUT otherwise).
        timeout = max(body.timeout.total_seconds(), 0.001)
        try:
            await asyncio.wait_for(recorded, timeout)
        except TimeoutError:
            return respond("REQUEST_TIMED_OUT")
        except Exception:
            return respond("REQUEST_TIMED_OUT")
        return respond()

    return in_cluster()


def _check(core, topic: str, index: int) -> str | None:
    """Why ``topic``-``index`` cannot have records deleted here (None: it can)."""
    if not core.partition_exists(topic, index):
        return "UNKNOWN_TOPIC_OR_PARTITION"
    if topic in INTERNAL_TOPICS:
        return "INVALID_TOPIC_EXCEPTION"
    lead = core.leader_error(topic, index)
    if lead is not None:
        return lead
    p = core.partition(topic, index)
    if p is None:
        return "UNKNOWN_TOPIC_OR_PARTITION"
    policy = core.topic_config(core.metadata.topics[topic]).policies()
    if "compact" in policy and "delete" not in policy:
        return "POLICY_VIOLATION"  # as Kafka: a compacted topic without the delete policy
    return None
