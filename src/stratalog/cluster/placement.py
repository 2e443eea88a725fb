"""Where a new partition lives: its replicas, and the virtual log that carries it (KerA).

Replication is by virtual log, not by partition: every partition whose replica list is the
same (same brokers, same preferred primary) shares one replicated virtual log, so a topic of a
thousand partitions on three brokers costs three replicated logs, not a thousand. Replica lists
rotate over the live brokers as Kafka's assignment does, so primaries spread evenly.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class VirtualLogState:
    """One replicated virtual log as etcd holds it: ``primary`` leads it at ``epoch`` (the
    fencing token every replication message carries); ``isr`` are the replicas a commit needs."""

    vid: int
    replicas: list[int]
    primary: int
    epoch: int = 0
    isr: list[int] = field(default_factory=list)

    def to_json(self) -> dict:
        return {
            "replicas": self.replicas,
            "primary": self.primary,
            "epoch": self.epoch,
            "isr": self.isr,
        }

    @classmethod
    def from_json(cls, vid: int, raw: dict) -> VirtualLogState:
        return cls(vid, list(raw["replicas"]), raw["primary"], raw["epoch"], list(raw["isr"]))

    @property
    def log_name(self) -> str:
        """The local directory name of this log on every replica."""
        return f"g{self.vid}"


def replica_lists(
    brokers: list[int], partitions: int, factor: int, first: int = 0
) -> list[list[int]]:
    """Replica lists for ``partitions`` new partitions: partition i's list starts at the
    (first + i)-th live broker and takes the next ``factor - 1`` after it."""
    order = sorted(brokers)
    if not 1 <= factor <= len(order):
        raise ValueError(f"replication factor {factor} with {len(order)} live brokers")
    n = len(order)
    return [[order[(first + i + k) % n] for k in range(factor)] for i in range(partitions)]


def assign_virtual_logs(
    lists: list[list[int]], existing: dict[int, VirtualLogState], next_vid: int
) -> tuple[list[int], dict[int, VirtualLogState], int]:
    """The virtual log of each replica list: an existing one with exactly that list, or a new
    one (led by the list's first broker, alone in sync at first). Returns (vid per partition,
    new logs, next vid)."""
    by_list = {tuple(v.replicas): vid for vid, v in existing.items()}
    new: dict[int, VirtualLogState] = {}
    out = []
    for replicas in lists:
        key = tuple(replicas)
        vid = by_list.get(key)
        if vid is None:
            vid = next_vid
            next_vid += 1
            # In sync: every replica, as Kafka starts a partition (an empty log is caught up
            # everywhere); the primary requires their acknowledgements from its first write.
            # With the primary alone, its loss in the first second left the log leaderless.
            new[vid] = VirtualLogState(vid, list(replicas), replicas[0], 0, list(replicas))
            by_list[key] = vid
        out.append(vid)
    return out, new, next_vid
