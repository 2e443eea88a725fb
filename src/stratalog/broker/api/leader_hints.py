"""KIP-951: a NOT_LEADER_OR_FOLLOWER answer names the partition's current leader.

Produce (v10+) and Fetch (v16+) carry, for each partition refused that way, the leader's id and
epoch, and once per response the endpoints of the leaders named, so a client moves to the new
leader at once instead of asking for Metadata first. In a cluster the leader is the partition's
virtual log's primary and the epoch is that log's epoch; a primary that is not registered (dead,
or between leases) is named as no leader (-1) with the log's epoch, and has no endpoint. Only the
error path calls this: answers without errors cost nothing more.
"""

from __future__ import annotations

from collections.abc import Iterable

NOT_LEADER = "NOT_LEADER_OR_FOLLOWER"


def current_leader(core, topic: str, index: int) -> tuple[int, int] | None:
    """(leader id, leader epoch) of ``topic``-``index`` as this broker knows it (None: unknown,
    which Kafka leaves out of the answer too)."""
    cluster = core.cluster
    if cluster is None:
        return core.node_id, 0
    v = cluster.vlog_of(topic, index)
    if v is None:
        return None
    return (v.primary if v.primary in cluster.brokers else -1), v.epoch


def endpoints(core, leaders: Iterable[int], conn=None) -> list[tuple[int, str, int]]:
    """(node id, host, port) of each live broker among ``leaders``, by node id (the address of
    the listener ``conn`` came in on)."""
    cluster = core.cluster
    out = []
    for node in sorted(set(leaders)):
        if node < 0:
            continue
        if cluster is None:
            if node == core.node_id:
                out.append((node, *core.endpoint(conn)))
            continue
        b = cluster.brokers.get(node)
        if b is not None:
            out.append((node, *core.broker_endpoint(b, conn)))
    return out


def named_leaders(results: Iterable) -> list[int]:
    """The leader ids that partition results name in ``current_leader``."""
    return [r.current_leader[0] for r in results if r.current_leader is not None]
