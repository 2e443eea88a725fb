"""A replica whose copy holds damaged bytes has them sent again by its primary.

Recovery steps over damaged frames and fences what they held (storage/damage.py): alone, that
range is lost. In a cluster the primary holds the same bytes intact (a virtual log is
replicated byte for byte, positions included), so a backup whose copy has damage cuts it at
the first damaged range (``VirtualLog.first_damage``) and is caught up from there, the path a
lagging backup takes. A damaged primary back from a restart hands its log over first
(``Replicator._restarted``) and is then such a backup.

The cut must never leave an in-sync replica without a committed record (it could be elected
and lose it). So a damaged backup first makes a new epoch with the same primary, without itself
in the in-sync set (one etcd transaction guarded by the state it read): the bump retires
whatever could name it in sync again, the primary's links of older epochs and their joins
still on their way to etcd (guarded by their epoch, they fail). It cuts only when a primary
fences it at that epoch or a later one (each derived from it) and etcd, as this broker sees it,
does not name it in sync; until its copy is cut it completes no Fence, so it acknowledges
nothing and no primary can name it in sync. With no
other in-sync replica registered it keeps its copy as recovery left it (the range lost,
CORRUPT_MESSAGE), as a single broker does.
"""

from __future__ import annotations

import asyncio
import logging

from stratalog.cluster.node import ClusterNode
from stratalog.cluster.placement import VirtualLogState
from stratalog.storage.log_store import LogStore

log = logging.getLogger(__name__)


class DamageRepair:
    """This broker's damaged backup copies: leaving the in-sync set, and the cut at a Fence."""

    def __init__(self, node: ClusterNode, store: LogStore) -> None:
        self.node = node
        self.store = store
        self._leaving: set[int] = set()
        self._cleared: dict[str, int] = {}  # log -> the epoch it made to be cut at
        self._tasks: set[asyncio.Future] = set()

    def damaged(self, name: str) -> tuple[int, int] | None:
        """Where this broker's copy of log ``name`` is to be cut, if it holds damage."""
        vlog = self.store.logs.get(name)
        return None if vlog is None else vlog.first_damage()

    def _ready(self, name: str, st: VirtualLogState) -> bool:
        """Whether the copy may be cut at ``st``: at or after the epoch it made, not in sync."""
        cleared = self._cleared.get(name)
        return cleared is not None and st.epoch >= cleared and self.node.node_id not in st.isr

    def check(self, st: VirtualLogState, then) -> None:
        """For a log this broker backs up: if its copy is damaged, make a new epoch with the
        same primary and without this broker in sync (``then`` runs after, to reconcile)."""
        me = self.node.node_id
        if st.primary == me or st.vid in self._leaving or self._ready(st.log_name, st):
            return
        if self.damaged(st.log_name) is None:
            return
        self._leaving.add(st.vid)

        def leave(now: VirtualLogState) -> VirtualLogState | None:
            primary = now.primary
            if primary == me or self._ready(st.log_name, now):
                return None
            if primary not in now.isr or primary not in self.node.brokers:
                return None  # no one else holds it all: keep the copy as recovery left it
            isr = [r for r in now.isr if r != me]
            return VirtualLogState(now.vid, now.replicas, primary, now.epoch + 1, isr)

        async def run() -> None:
            try:
                new = await self.node.update_vlog(st.vid, leave)
                if new is not None:
                    self._cleared[st.log_name] = new.epoch
                    log.warning(
                        "%s: this copy holds damaged bytes: out of the in-sync set at epoch %d "
                        "to have them sent again by %d",
                        st.log_name,
                        new.epoch,
                        new.primary,
                    )
                    then()  # (only then: a refusal waits for etcd to change, not a loop)
            except Exception as e:
                log.warning("%s: cannot leave the in-sync set: %s", st.log_name, e)
            finally:
                self._leaving.discard(st.vid)

        task = asyncio.ensure_future(run())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _state(self, name: str) -> VirtualLogState | None:
        return next((s for s in self.node.vlogs.values() if s.log_name == name), None)

    def check_log(self, name: str, then) -> None:
        st = self._state(name)
        if st is not None:
            self.check(st, then)

    def cut_at_fence(self, name: str, epoch: int) -> bool:
        """A primary fences this copy at ``epoch``: cut it at its first damage, if any.
        False if it is damaged but not ready to be cut (the Fence is refused, and tried again
        once the new epoch is made)."""
        cut = self.damaged(name)
        if cut is None:
            return True
        st = self._state(name)
        if st is None or st.epoch != epoch or not self._ready(name, st):
            return False
        vlog = self.store.logs[name]
        log.warning(
            "%s: cutting this copy from %s back to its first damaged bytes at %s: the primary "
            "sends the rest again",
            name,
            vlog.end,
            cut,
        )
        self.store.truncate_log(name, *cut)
        self._cleared.pop(name, None)
        return True
