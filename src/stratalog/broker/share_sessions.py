"""Share sessions (KIP-932): what a share consumer fetches, kept between its ShareFetches.

A member opens its session with epoch 0 and the partitions it wants; each later ShareFetch or
ShareAcknowledge carries the next epoch (1, 2, ...) and only the partitions that changed (added
topics, or ``forgotten_topics_data``); epoch -1 is its last request, which closes it. Sans-IO.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field

from stratalog.broker.share_partition import ShareError

OPEN_EPOCH = 0
FINAL_EPOCH = -1
_MAX_EPOCH = 2**31 - 1

TopicPartition = tuple[uuid.UUID, int]


@dataclass
class ShareSession:
    group_id: str
    member_id: str
    epoch: int = 1  # the epoch the next request must carry
    partitions: list[TopicPartition] = field(default_factory=list)
    turn: int = 0  # where the next fetch starts in ``partitions``

    def rotated(self) -> list[TopicPartition]:
        """The partitions, each fetch starting one further, so that a fetch's record limit,
        spent by the first partitions with records, does not starve the last ones."""
        parts = self.partitions
        if not parts:
            return []
        k = self.turn % len(parts)
        self.turn += 1
        return parts[k:] + parts[:k]

    def update(self, added: Iterable[TopicPartition], forgotten: Iterable[TopicPartition]) -> None:
        gone = set(forgotten)
        # A list, not a set: partitions are fetched in turn, in the order the consumer asked.
        self.partitions = [tp for tp in self.partitions if tp not in gone]
        for tp in added:
            if tp not in self.partitions and tp not in gone:
                self.partitions.append(tp)


class ShareSessions:
    def __init__(self, max_sessions: int = 2000) -> None:
        self.sessions: dict[tuple[str, str], ShareSession] = {}
        self.max_sessions = max_sessions

    def begin(
        self,
        group_id: str,
        member_id: str,
        epoch: int,
        added: Iterable[TopicPartition] = (),
        forgotten: Iterable[TopicPartition] = (),
    ) -> ShareSession:
        """The session a request with ``epoch`` continues (or opens, at 0), updated with the
        partitions it adds and forgets; the caller closes it after a FINAL_EPOCH request."""
        key = (group_id, member_id)
        if epoch == OPEN_EPOCH:
            if key not in self.sessions and len(self.sessions) >= self.max_sessions:
                raise ShareError(
                    "SHARE_SESSION_LIMIT_REACHED", "The limit of share sessions is reached."
                )
            s = self.sessions[key] = ShareSession(group_id, member_id)
            s.update(added, ())
            return s
        s = self.sessions.get(key)
        if s is None:
            raise ShareError(
                "SHARE_SESSION_NOT_FOUND", f"Share session for member {member_id} not found."
            )
        if epoch != FINAL_EPOCH:
            if epoch != s.epoch:
                raise ShareError(
                    "INVALID_SHARE_SESSION_EPOCH",
                    f"Share session epoch {epoch} is not the expected {s.epoch}.",
                )
            s.epoch = 1 if s.epoch == _MAX_EPOCH else s.epoch + 1
        s.update(added, forgotten)
        return s

    def close(self, group_id: str, member_id: str) -> None:
        self.sessions.pop((group_id, member_id), None)
