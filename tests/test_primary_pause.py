"""A primary that loses its etcd registration (its lease ended, say while etcd was down) and gets
it back while etcd still names it primary at the same epoch.

It must take no write while unregistered (the controller may be moving the log on), but it must
not close: closing answered the writes in flight NOT_LEADER_OR_FOLLOWER, which librdkafka takes
for "not persisted" and, after a producer-epoch bump, re-sent under a new epoch (the same
records twice in the log), and it made the broker lead again at a new epoch, whose
OffsetForLeaderEpoch validation made librdkafka drop records it had fetched but not handed over
(both found by the fault soak: duplicates, poll-skip). So it pauses, and resumes at the same
epoch with its writes in flight answered as they commit. If etcd names another primary
meanwhile, it closes as before.

The real LogStore and Replicator on real files, in one process; the in-sync backup's
acknowledgement is given by the test, so every step waits for a state, never for time.
"""

from __future__ import annotations

import asyncio

import pytest

from stratalog.cluster.node import BrokerInfo, ClusterNode
from stratalog.cluster.placement import VirtualLogState
from stratalog.cluster.replication import Replicator
from stratalog.storage.log_store import LogStore
from stratalog.storage.replica import NotPrimary

from .test_commit_checkpoint import _replicated
from .test_vlog_replication import LOG, UIDS, Producer, _until

ME, OTHER = 2, 9
VID = int(LOG[1:])
EPOCH = 3


def _leading(store: LogStore) -> tuple[ClusterNode, Replicator]:
    node = ClusterNode([], "t", ME, "127.0.0.1", 0)
    node.brokers = {ME: BrokerInfo(ME, "127.0.0.1", 0, "test")}
    node.vlogs = {VID: VirtualLogState(VID, [ME, OTHER], ME, EPOCH, [ME, OTHER])}
    replicator = Replicator(node, store, 10_000)
    replicator.reconcile()
    assert replicator.leads(VID, EPOCH)
    return node, replicator


def _in_flight(store: LogStore, prod: Producer) -> tuple[int, list[bool]]:
    """One round written but not committed (OTHER has not acknowledged it): its LSN, and the
    outcome its durability callback gives (empty until it gives one)."""
    lsn = prod.round(store)
    outcome: list[bool] = []
    store.partitions[UIDS[0]].when_durable(lsn, outcome.append)
    return lsn, outcome


def test_a_primary_unregistered_then_back_at_the_same_epoch_pauses_and_resumes(tmp_path):
    async def run() -> None:
        store = _replicated(tmp_path / "b")
        node, replicator = _leading(store)
        vlog = store.logs[LOG]
        primary = replicator.primaries[VID]
        prod = Producer(21)
        lsn, outcome = _in_flight(store, prod)
        await _until(lambda: vlog.journal.durable >= lsn)  # durable here, waiting for OTHER
        assert outcome == []

        info = node.brokers.pop(ME)  # its registration went with its lease
        replicator.reconcile()
        assert not replicator.leads(VID, EPOCH)  # Produce and Fetch answer NOT_LEADER
        with pytest.raises(NotPrimary):
            Producer(99).round(store)  # no local write while unregistered
        assert replicator.primaries[VID] is primary and not primary.closed
        assert outcome == []  # the write in flight is not failed

        node.brokers[ME] = info  # registered again; etcd names it at the same epoch
        replicator.reconcile()
        assert replicator.primaries[VID] is primary and replicator.leads(VID, EPOCH)
        assert node.vlogs[VID].epoch == EPOCH  # no new epoch
        vlog.replica_acked(OTHER, lsn)
        await _until(lambda: outcome)
        assert outcome == [True]  # answered as committed, not NOT_LEADER_OR_FOLLOWER
        prod.round(store)  # takes writes again
        await replicator.close()
        await store.close()

    asyncio.run(run())


def test_a_paused_primary_replaced_meanwhile_closes_and_fails_what_was_in_flight(tmp_path):
    async def run() -> None:
        store = _replicated(tmp_path / "b")
        node, replicator = _leading(store)
        primary = replicator.primaries[VID]
        _lsn, outcome = _in_flight(store, Producer(22))
        info = node.brokers.pop(ME)
        replicator.reconcile()
        assert not primary.closed and outcome == []
        # The controller moved the log to OTHER meanwhile.
        node.vlogs[VID] = VirtualLogState(VID, [ME, OTHER], OTHER, EPOCH + 1, [OTHER])
        node.brokers[ME] = info
        replicator.reconcile()
        assert primary.closed and VID not in replicator.primaries
        await _until(lambda: outcome)
        assert outcome == [False]
        await replicator.close()
        await store.close()

    asyncio.run(run())


class _LocalNode(ClusterNode):
    """Etcd's guarded write of a virtual log's state, kept in this process: what is tested is
    the decision the restarted broker writes, not etcd."""

    async def update_vlog(self, vid, change):
        new = change(self.vlogs[vid])
        if new is not None:
            self.vlogs[vid] = new
        return new


def _restarted(store: LogStore, live: list[int]) -> tuple[ClusterNode, Replicator]:
    """A broker that led ``VID`` at ``EPOCH`` before a crash, back and registered before the
    controller moved the log on (etcd still names it primary at that epoch)."""
    node = _LocalNode([], "t", ME, "127.0.0.1", 0)
    node.brokers = {b: BrokerInfo(b, "127.0.0.1", 0, "test") for b in live}
    node.vlogs = {VID: VirtualLogState(VID, [ME, OTHER], ME, EPOCH, [ME, OTHER])}
    return node, Replicator(node, store, 10_000)


@pytest.mark.parametrize("peer_registered", [True, False])
def test_a_primary_back_from_a_crash_hands_its_log_to_an_in_sync_peer(tmp_path, peer_registered):
    async def run() -> None:
        store = _replicated(tmp_path / "b")
        _node, before = _leading(store)  # promises EPOCH durably
        await before.close()
        live = [ME, OTHER] if peer_registered else [ME]
        node, replicator = _restarted(store, live)
        replicator.reconcile()
        await _until(lambda: node.vlogs[VID].epoch == EPOCH + 1)
        st = node.vlogs[VID]
        if peer_registered:
            # As Kafka's controller after an unclean shutdown: the peer leads, the restarted
            # broker leaves the in-sync set until it has caught up as a backup.
            assert (st.primary, st.isr) == (OTHER, [OTHER])
            await _until(lambda: not replicator._restarting)
            assert not replicator.leads(VID, EPOCH + 1) and VID not in replicator.primaries
        else:
            assert (st.primary, st.isr) == (ME, [ME, OTHER])
            await _until(lambda: replicator.leads(VID, EPOCH + 1))
        await replicator.close()
        await store.close()

    asyncio.run(run())
