"""ListOffsets (earliest, latest, max timestamp, by timestamp) and OffsetForLeaderEpoch."""

from __future__ import annotations

import logging

from stratalog.protocol.connection import Request

from .common import NONE, err, reply, sub

log = logging.getLogger(__name__)

LATEST = -1
EARLIEST = -2
MAX_TIMESTAMP = -3
EARLIEST_LOCAL = -4
LATEST_TIERED = -5


def _lookup(p, ts: int, read_committed: bool = False) -> tuple[int, int]:
    """(timestamp, offset) answered for one partition and target timestamp (the latest offset
    of a read_committed consumer is the last stable offset)."""
    if ts == LATEST:
        return -1, p.last_stable_offset if read_committed else p.high_watermark
    if ts in (EARLIEST, EARLIEST_LOCAL):
        return -1, p.log_start_offset
    if ts == LATEST_TIERED:
        return -1, -1
    found = p.max_timestamp() if ts == MAX_TIMESTAMP else p.offset_for_timestamp(ts)
    if found is None:
        return -1, -1
    offset, stamp = found
    if read_committed and offset >= p.last_stable_offset:
        return -1, -1  # as Kafka: only what a read_committed consumer could fetch
    return stamp, offset


def handle_list_offsets(core, req: Request, conn) -> bytes:
    read_committed = getattr(req.body, "isolation_level", 0) == 1
    topics = []
    for t in req.body.topics:
        parts = []
        for rp in t.partitions:
            lead = core.leader_error(t.name, rp.partition_index)
            p = core.partition(t.name, rp.partition_index) if lead is None else None
            if p is None:
                parts.append(
                    sub(
                        req,
                        "ListOffsetsPartitionResponse",
                        partition_index=rp.partition_index,
                        error_code=err(lead or "UNKNOWN_TOPIC_OR_PARTITION"),
                        timestamp=-1,
                        offset=-1,
                        leader_epoch=-1,
                    )
                )
                continue
            stamp, offset = _lookup(p, rp.timestamp, read_committed)
            parts.append(
                sub(
                    req,
                    "ListOffsetsPartitionResponse",
                    partition_index=rp.partition_index,
                    error_code=NONE,
                    timestamp=stamp,
                    offset=offset,
                    leader_epoch=0 if offset >= 0 else -1,
                )
            )
        topics.append(sub(req, "ListOffsetsTopicResponse", name=t.name, partitions=tuple(parts)))
    return reply(req, topics=tuple(topics))


def handle_offset_for_leader_epoch(core, req: Request, conn) -> bytes:
    topics = []
    for t in req.body.topics:
        parts = []
        for rp in t.partitions:
            lead = core.leader_error(t.topic, rp.partition)
            p = core.partition(t.topic, rp.partition) if lead is None else None
            if p is not None and core.cluster is not None:
                parts.append(_epoch_end(core, req, t.topic, rp, p))
            elif p is None:
                parts.append(
                    sub(
                        req,
                        "EpochEndOffset",
                        error_code=err(lead or "UNKNOWN_TOPIC_OR_PARTITION"),
                        partition=rp.partition,
                        leader_epoch=-1,
                        end_offset=-1,
                    )
                )
            elif rp.leader_epoch < 0:
                parts.append(
                    sub(
                        req,
                        "EpochEndOffset",
                        error_code=NONE,
                        partition=rp.partition,
                        leader_epoch=-1,
                        end_offset=-1,
                    )
                )
            else:
                # One leader epoch (0) for the whole life of a single-node partition.
                parts.append(
                    sub(
                        req,
                        "EpochEndOffset",
                        error_code=NONE,
                        partition=rp.partition,
                        leader_epoch=0,
                        end_offset=p.next_offset,
                    )
                )
        topics.append(
            sub(req, "OffsetForLeaderTopicResult", topic=t.topic, partitions=tuple(parts))
        )
    return reply(req, topics=tuple(topics))


def _epoch_end(core, req: Request, topic: str, rp, p) -> object:
    """In a cluster: the epoch asked for (up to the current one) and where it ends here, or
    FENCED_LEADER_EPOCH / UNKNOWN_LEADER_EPOCH for a stale or future current epoch."""
    v = core.cluster.vlog_of(topic, rp.partition)
    current = getattr(rp, "current_leader_epoch", -1)
    error, epoch, end = "NONE", -1, -1
    if current >= 0 and current < v.epoch:
        error = "FENCED_LEADER_EPOCH"
    elif current > v.epoch:
        error = "UNKNOWN_LEADER_EPOCH"
    elif rp.leader_epoch >= 0:
        # Exact (KIP-101/279): batches carry the epoch they were written in (stamped by the
        # primary), so a consumer's epoch is its records' and a real truncation shows.
        epoch, end = p.epoch_end(rp.leader_epoch)
        if 0 <= end < p.next_offset:
            # A client past ``end`` takes it for a truncation and seeks back there, dropping
            # what it fetched and had not handed over: the one broker answer that moves a
            # consumer (issue 27's poll-skip), so each is logged.
            log.info(
                "OffsetForLeaderEpoch of %s-%d: epoch %d (asked %d, current %d) ends at %d, "
                "log end %d, high watermark %d",
                topic,
                rp.partition,
                epoch,
                rp.leader_epoch,
                v.epoch,
                end,
                p.next_offset,
                p.high_watermark,
            )
    return sub(
        req,
        "EpochEndOffset",
        error_code=err(error),
        partition=rp.partition,
        leader_epoch=epoch,
        end_offset=end,
    )
