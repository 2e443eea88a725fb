"""The controller: one broker, elected through etcd, that moves a dead broker's virtual logs.

Election is a key created under the broker's lease (``/stratalog/<cluster>/controller``): the
broker that creates it is the controller until its lease goes. When a broker's registration
disappears (its lease expired: killed, paused, or cut off from etcd), the controller makes the
first live member of each of its virtual logs' in-sync sets the primary at epoch + 1, and drops
the dead broker from the in-sync set, in one transaction guarded by the log's revision. With no
live in-sync member the log stays without a primary (no unclean election): its partitions answer
LEADER_NOT_AVAILABLE until an in-sync replica returns.

A broker absent when a controller's term starts is not taken for dead until a lease's time has
passed: after an etcd outage every broker lost its lease and registers again within moments, and
the first to be back, elected controller, used to move the others' logs and drop them from every
in-sync set (a failover, and NOT_ENOUGH_REPLICAS answers, with nothing dead). Librdkafka met those
answers with a sequence gap on its next request and bumped its producer epoch, re-sending as new
records writes it had been told were not persisted, some of which were: the fault harness's
duplicates. A broker that registered during this term and whose registration then goes is
dead at once: its lease already took its time to expire. So is one a peer proved gone (its port
refuses connections), and a new controller probes the in-sync members absent at its start
itself: the broker killed with the old controller (whose lease a peer revoked, so its
controller key went too) is failed over in a fraction of a second, not after the grace.

Being controller is not a lock either: two controllers at once (a paused one waking up) can only
race on revision-guarded writes, and the loser re-reads a state that needs nothing.
"""

from __future__ import annotations

import asyncio
import logging
import time

from stratalog.cluster.node import ClusterNode
from stratalog.cluster.placement import VirtualLogState

log = logging.getLogger(__name__)


class Controller:
    def __init__(self, node: ClusterNode) -> None:
        self.node = node
        self.key = node.keys.controller
        self.active = False
        self._term_start = 0.0
        self._seen: set[int] = set()  # brokers seen registering during this term
        self._initial: dict[int, int] = {}  # lease of each registration known at its start
        self._probed: set[int] = set()  # absent brokers this term has probed
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
                        self._term_start = time.monotonic()
                        self._seen = set()
                        self._initial = {b: i.lease for b, i in node.brokers.items()}
                        self._probed = set()
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

    def _probe_absent(self) -> None:
        """The grace is for brokers registering again (after an etcd outage); one that is not
        (killed with the old controller) is proven gone by its refused port in a fraction of
        a second, and failed over then. Asked on every pass within the grace, not only at
        election: this node's watched copy may still show the broker registered then."""
        node = self.node
        grace = node.lease.ttl if node.lease is not None else 0
        if time.monotonic() - self._term_start >= grace:
            return
        for b in sorted({r for st in node.vlogs.values() for r in st.isr}):
            if b not in node.brokers and b not in self._probed and b != node.node_id:
                self._probed.add(b)
                log.warning("controller: in-sync broker %d is absent: probing it", b)
                node.suspect(b)

    def alive(self) -> set[int]:
        """Brokers not taken for dead: the registered ones, and those absent since this term
        began that may still be registering again (within a lease's time of its start)."""
        node = self.node
        registered = set(node.brokers)
        # A registration known when the term began may be a stale copy (etcd was away): only one
        # made since proves the broker came back, and its going later means it is gone.
        self._seen |= {b for b, i in node.brokers.items() if self._initial.get(b) != i.lease}
        grace = node.lease.ttl if node.lease is not None else 0
        if time.monotonic() - self._term_start >= grace:
            return registered
        maybe = {r for st in node.vlogs.values() for r in st.isr} - self._seen
        gone = {b for b, at in node.proven_gone.items() if at >= self._term_start - grace}
        return registered | (maybe - gone)

    async def _fail_over(self) -> None:
        node = self.node
        self._probe_absent()
        live = self.alive()
        for vid, st in list(node.vlogs.items()):
            if st.primary in live:
                if any(r not in live for r in st.isr):
                    await self._shrink(vid)
                continue

            def elect(now: VirtualLogState) -> VirtualLogState | None:
                alive = self.alive()
                if now.primary in alive:
                    return None
                # Only a registered broker leads; one still within its grace stays in sync.
                isr = [r for r in now.isr if r in alive]
                leader = next((r for r in isr if r in node.brokers), None)
                if leader is None:
                    return None  # no unclean election: wait for an in-sync replica
                return VirtualLogState(now.vid, now.replicas, leader, now.epoch + 1, isr)

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
            alive = self.alive()
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
