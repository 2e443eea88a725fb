"""Who leads each partition and where each broker listens, as the last answers said (sans-IO).

The wire client fills a ``LeaderMap`` from Metadata and FindCoordinator answers and asks it
where to send each partition's requests; an answer that says the leadership moved makes it
forget that partition, so the next request asks Metadata again. ``Retries`` bounds how long a
request waits for a moved leader to settle (a failover takes a lease, 3 s, plus the
controller's reaction).
"""

from __future__ import annotations

import time
from collections.abc import Iterable

from stratalog.protocol.errors import code

Address = tuple[str, int]

# Answers that mean "ask someone else": the leader moved (or is being elected). Retried at the
# new leader after a Metadata refresh. Nothing was written when a broker answered them.
LEADER_MOVED = frozenset(
    int(code(name))
    for name in (
        "NOT_LEADER_OR_FOLLOWER",
        "LEADER_NOT_AVAILABLE",
        "FENCED_LEADER_EPOCH",
        "UNKNOWN_LEADER_EPOCH",
    )
)
COORDINATOR_MOVED = frozenset(
    int(code(name))
    for name in ("NOT_COORDINATOR", "COORDINATOR_NOT_AVAILABLE", "COORDINATOR_LOAD_IN_PROGRESS")
)


class LeaderMap:
    """Brokers by node id, partition leaders and group coordinators."""

    def __init__(self) -> None:
        self.brokers: dict[int, Address] = {}
        self._leaders: dict[tuple[str, int], int] = {}
        self._coordinators: dict[str, int] = {}

    def learn_brokers(self, brokers: Iterable[tuple[int, str, int]]) -> None:
        """The live brokers a Metadata answer listed: a broker no longer listed is gone."""
        self.brokers = {node: (host, port) for node, host, port in brokers}

    def learn_leader(self, topic: str, partition: int, leader: int) -> None:
        """A Metadata answer's leader of a partition; -1 (none now) forgets it."""
        if leader >= 0:
            self._leaders[(topic, partition)] = leader
        else:
            self._leaders.pop((topic, partition), None)

    def leader(self, topic: str, partition: int) -> int | None:
        return self._leaders.get((topic, partition))

    def forget_leader(self, topic: str, partition: int) -> None:
        self._leaders.pop((topic, partition), None)

    def forget_node(self, node: int) -> None:
        """A broker's connection failed: whatever it led is to be asked for again."""
        for tp in [tp for tp, n in self._leaders.items() if n == node]:
            del self._leaders[tp]
        for g in [g for g, n in self._coordinators.items() if n == node]:
            del self._coordinators[g]

    def by_leader(self, topic: str, partitions: Iterable[int]) -> dict[int | None, list[int]]:
        """The partitions grouped by their known leader (None: not known)."""
        out: dict[int | None, list[int]] = {}
        for p in partitions:
            out.setdefault(self._leaders.get((topic, p)), []).append(p)
        return out

    def learn_coordinator(self, group: str, node: int, host: str, port: int) -> None:
        self._coordinators[group] = node
        self.brokers.setdefault(node, (host, port))

    def coordinator(self, group: str) -> int | None:
        return self._coordinators.get(group)

    def forget_coordinator(self, group: str) -> None:
        self._coordinators.pop(group, None)

    def address(self, node: int) -> Address | None:
        return self.brokers.get(node)


class Retries:
    """Waits between attempts (50 ms doubling to 1 s) until ``budget`` seconds have passed
    since the first failure."""

    def __init__(self, budget: float) -> None:
        self.deadline = time.monotonic() + budget
        self.delay = 0.05

    def wait(self) -> bool:
        """Sleep before the next attempt; False when the budget is spent (do not retry)."""
        left = self.deadline - time.monotonic()
        if left <= 0:
            return False
        time.sleep(min(self.delay, left))
        self.delay = min(self.delay * 2, 1.0)
        return True
