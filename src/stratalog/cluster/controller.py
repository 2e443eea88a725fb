"""The controller: one broker, elected through etcd, that moves a dead broker's virtual logs.

Election is a key created under the broker's lease (``/stratalog/<cluster>/controller``): the
broker that creates it is the controller until its lease goes. When a broker's registration
disappears (its lease expired: killed, paused, or cut off from etcd), the controller makes the
first live member of each of its virtual logs' in-sync sets the primary at epoch + 1, and drops
the dead broker from the in-sync set, in one transaction guarded by the log's revision. With no
live in-sync member the log stays without a primary (no unclean election): its partitions answer
LEADER_NOT_AVAILABLE until an in-sync replica returns.

Being controller is not a lock either: two controllers at once (a paused one waking up) can only
race on revision-guarded writes, and the loser re-reads a state that needs nothing.
"""

from __future__ import annotations

import asyncio
import logging

from stratalog.cluster.node import ClusterNode
from stratalog.cluster.placement import VirtualLogState

log = logging.getLogger(__name__)


class Controller:
    def __init__(self, node: ClusterNode) -> None:
        self.node = node
        self.key = node.keys.root + "controller"
        self.active = False
        self._wake = asyncio.Event()
        self._task = asyncio.ensure_future(self._run())

    def changed(self) -> None:
        self._wake.set()

    async def _run(self) -> None:
        node = self.node
        while True:
            try:
                if self.active and (node.lease is None or not node.lease.held):
                    self.active = False  # its key went with the lease: elect again
                if not self.active:
                    assert node.store is not None and node.lease is not None
                    self.active = await node.store.create(
                        self.key, str(node.node_id).encode(), lease=node.lease
                    )
                    if self.active:
                        log.info("node %d is the controller", node.node_id)
                if self.active:
                    await self._fail_over()
            except asyncio.CancelledError:
                raise
            except Exception as e:
                log.warning("controller: %s", e)
                self.active = False
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), 1.0)
            except TimeoutError:
                pass

    async def _fail_over(self) -> None:
        node = self.node
        live = set(node.brokers)
        for vid, st in list(node.vlogs.items()):
            if st.primary in live:
                if any(r not in live for r in st.isr):
                    await self._shrink(vid)
                continue

            def elect(now: VirtualLogState) -> VirtualLogState | None:
                alive = set(node.brokers)
                if now.primary in alive:
                    return None
                isr = [r for r in now.isr if r in alive]
                if not isr:
                    return None  # no unclean election: wait for an in-sync replica
                return VirtualLogState(now.vid, now.replicas, isr[0], now.epoch + 1, isr)

            new = await node.update_vlog(vid, elect)
            if new is not None:
                log.warning(
                    "virtual log g%d: primary %d is gone; %d leads at epoch %d (in sync %s)",
                    vid,
                    st.primary,
                    new.primary,
                    new.epoch,
                    new.isr,
                )

    async def _shrink(self, vid: int) -> None:
        """Drop dead brokers from a live primary's in-sync set (Kafka's controller does so when
        a broker is fenced), so acks=all need not wait for replica.lag.time.max.ms."""
        node = self.node

        def drop(now: VirtualLogState) -> VirtualLogState | None:
            alive = set(node.brokers)
            isr = [r for r in now.isr if r in alive]
            if isr == now.isr or now.primary not in alive:
                return None
            return VirtualLogState(now.vid, now.replicas, now.primary, now.epoch, isr)

        new = await node.update_vlog(vid, drop)
        if new is not None:
            log.warning("virtual log g%d: in sync now %s (dead brokers dropped)", vid, new.isr)

    async def close(self) -> None:
        self._task.cancel()
        try:
            await self._task
        except (asyncio.CancelledError, Exception):
            pass
        if self.active and self.node.store is not None:
            try:
                await self.node.store.delete(self.key)
            except Exception:
                pass
