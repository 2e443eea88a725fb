"""Leader elections a client asks for (ElectLeaders, Kafka's API 43), per virtual log.

A partition's leader is its virtual log's primary, so an election moves a whole log: every
partition it carries changes leader together (KerA's shared replicated logs). That never goes
against what a client asked for, since the partitions of one log share one replica list, hence
one preferred replica (placement.py).

* Preferred: the log's first replica leads at epoch + 1, in one revision-guarded etcd
  transaction, when it is registered and in the in-sync set; the in-sync set is kept (the old
  primary stays in it and is fenced at the new epoch like any backup, as the clean hand-over of
  ``Replicator.hand_over`` does). ELECTION_NOT_NEEDED when the first replica already leads,
  PREFERRED_LEADER_NOT_AVAILABLE when it is not alive or not in sync.
* Unclean: a log with a live primary needs none (ELECTION_NOT_NEEDED); one whose primary is gone
  gets the controller's clean failover (a live in-sync replica at epoch + 1); with no live
  in-sync replica it is refused, since a replica outside the in-sync set may lack committed
  records and Stratalog never elects one.

The answers are Kafka's error names with a message for each partition.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from stratalog.cluster.placement import VirtualLogState

if TYPE_CHECKING:  # the single node answers ElectLeaders too, and imports no etcd client
    from stratalog.cluster.node import ClusterNode

PREFERRED = 0
UNCLEAN = 1


@dataclass(frozen=True)
class Outcome:
    error: str  # a Kafka error name: NONE when the log moved
    message: str | None = None


NOT_NEEDED = Outcome("ELECTION_NOT_NEEDED", "Leader election not needed for topic partition.")


def preferred_move(now: VirtualLogState, live: set[int]) -> VirtualLogState | Outcome:
    """The log's state led by its first replica, or why it cannot or need not be."""
    first = now.replicas[0]
    if now.primary == first and first in live:
        return NOT_NEEDED
    if first not in live:
        return Outcome(
            "PREFERRED_LEADER_NOT_AVAILABLE",
            f"the preferred replica {first} is not a live broker",
        )
    if first not in now.isr:
        return Outcome(
            "PREFERRED_LEADER_NOT_AVAILABLE",
            f"the preferred replica {first} is not in sync (in sync: {now.isr})",
        )
    return VirtualLogState(now.vid, now.replicas, first, now.epoch + 1, list(now.isr))


def clean_failover(now: VirtualLogState, live: set[int]) -> VirtualLogState | Outcome:
    """What an unclean election may do here: nothing for a log with a live primary, the
    controller's clean failover for one without, and a refusal where only that would help."""
    if now.primary in live:
        return NOT_NEEDED
    isr = [r for r in now.isr if r in live]
    if not isr:
        return Outcome(
            "ELIGIBLE_LEADERS_NOT_AVAILABLE",
            "unclean leader election is not supported by Stratalog: no in-sync replica of "
            f"this partition is alive (in sync: {now.isr}), and a replica outside the in-sync "
            "set may lack committed records",
        )
    return VirtualLogState(now.vid, now.replicas, isr[0], now.epoch + 1, isr)


MOVES: dict[int, Callable[[VirtualLogState, set[int]], VirtualLogState | Outcome]] = {
    PREFERRED: preferred_move,
    UNCLEAN: clean_failover,
}


async def elect(node: ClusterNode, vids: Iterable[int], kind: int) -> dict[int, Outcome]:
    """Run election ``kind`` on each virtual log in ``vids``; one etcd transaction per log that
    moves, decided on the state etcd holds (re-read on a concurrent change)."""
    move = MOVES[kind]
    out: dict[int, Outcome] = {}
    for vid in dict.fromkeys(vids):
        verdict: Outcome = Outcome("NONE")

        def change(now: VirtualLogState) -> VirtualLogState | None:
            nonlocal verdict
            got = move(now, set(node.brokers))
            if isinstance(got, Outcome):
                verdict = got
                return None
            verdict = Outcome("NONE")
            return got

        try:
            new = await node.update_vlog(vid, change)
        except Exception as e:  # etcd unreachable: nothing moved
            out[vid] = Outcome("REQUEST_TIMED_OUT", f"cannot reach the metadata store: {e}")
            continue
        if new is None and verdict.error == "NONE":
            verdict = Outcome("UNKNOWN_TOPIC_OR_PARTITION", f"virtual log g{vid} is gone")
        out[vid] = verdict
    return out
