"""Tiers in a cluster: which replica of a virtual log migrates what to the cold tier.

Only a log's primary decides, with the single node's rules (threshold, local retention), and
only for segments its in-sync set holds entirely (below its commit point), so nothing that a
failover could take back is ever in the cold tier. Once a segment is migrated the primary tells
its live backups where its hot segments begin now (``Migrated``, at its epoch; again to every
backup that goes live), and each backup moves its own copies of the segments before that:

* with a shared cold tier (``tiers.cold.shared``: every broker has the same directory or
  object store), it uploads nothing: it takes the primary's cold segments into its index from
  the manifests and drops its hot copies (``Migrator._adopt``). A segment the tier does not
  hold yet stays hot. A backup promoted later serves the whole history from there.
* with a cold tier of its own, it copies them itself, as its primary did, so every replica's
  history stays complete.

A backup never picks a segment on its own: segment boundaries are the same on every replica,
and one that migrated by its own thresholds would upload a second copy into a shared tier (or
change its manifests under the primary).
"""

from __future__ import annotations

import logging

from stratalog.cluster.replication import PrimaryLog, Replicator
from stratalog.storage.log_store import LogStore
from stratalog.storage.segment import Segment
from stratalog.storage.tiering import Migrator
from stratalog.storage.virtual_log import VirtualLog

log = logging.getLogger(__name__)


class ClusterTiers:
    """This broker's part: the ``cluster`` role of its Migrator."""

    def __init__(self, replicator: Replicator, store: LogStore, migrator: Migrator) -> None:
        self.replicator = replicator
        self.store = store
        self.shared = store.cold is not None and store.cold.shared
        # Backup logs: the first hot segment their primary last told of.
        self.told: dict[str, int] = {}
        replicator.on_cold = self.told_cold
        migrator.cluster = self

    def _primary(self, name: str) -> PrimaryLog | None:
        return next(
            (p for p in self.replicator.primaries.values() if p.vlog.name == name and not p.closed),
            None,
        )

    def told_cold(self, name: str, first_hot_seq: int) -> None:
        if first_hot_seq > self.told.get(name, -1):
            self.told[name] = first_hot_seq

    def may_choose(self, vlog: VirtualLog, seg: Segment) -> bool:
        return self._primary(vlog.name) is not None and (seg.seq, seg.size) <= vlog.commit_point

    def migrated(self, vlog: VirtualLog) -> None:
        primary = self._primary(vlog.name)
        if primary is not None:
            primary.tell_cold()

    async def follow(self, migrator: Migrator) -> int:
        moved = 0
        for name, before in list(self.told.items()):
            vlog = self.store.logs.get(name)
            if vlog is None or not vlog.opened or vlog.leading:
                continue  # leading it now: its own thresholds decide
            for seq in sorted(vlog.segments):
                seg = vlog.segments.get(seq)
                if seq >= before or seg is None or seg is vlog.active:
                    break
                await migrator.migrate(vlog, seg, copy=not self.shared)
                if vlog.segments.get(seq) is seg:
                    break  # kept hot (not all in the shared tier, or still referenced)
                moved += 1
        return moved
