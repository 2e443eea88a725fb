"""The commit point a backup learned, kept across a restart (Kafka's high-watermark checkpoint).

A primary LogStore and a backup LogStore (``replicated``, as in cluster mode) on real files, the
primary's writes shipped through the replication codec (test_vlog_replication's Link). The
backup crashes (nothing flushed: ``abandon``) with a checkpointed commit point older than its
log's end, is opened again and promoted by the real Replicator, with one in-sync backup whose
acknowledgement is given by the test: what consumers may read (the partitions' high
watermarks and their reads) must stop at the checkpointed commit point until then. Each step
waits for a state, never for time, so the outcome does not depend on the machine's speed.
"""

from __future__ import annotations

import asyncio
import json

from stratalog.cluster.node import BrokerInfo, ClusterNode
from stratalog.cluster.placement import VirtualLogState
from stratalog.cluster.replication import Replicator
from stratalog.storage import commit_checkpoint
from stratalog.storage.journal import FsyncPolicy
from stratalog.storage.log_store import LogStore, StorageConfig

from .test_vlog_replication import LOG, UIDS, Producer, _until, _wire

ME, OTHER = 2, 9  # the promoted backup, and its own in-sync backup
VID = int(LOG[1:])


def _replicated(path) -> LogStore:
    config = StorageConfig(
        path, fsync=FsyncPolicy.parse("always"), group_commit_ms=1.0, io_threads=2, replicated=True
    )
    store = LogStore(config)
    store.open([("t", i, uid, LOG) for i, uid in enumerate(UIDS)])
    return store


def _plain(path) -> LogStore:
    store = LogStore(StorageConfig(path, fsync=FsyncPolicy.parse("always"), io_threads=2))
    store.open([("t", i, uid, LOG) for i, uid in enumerate(UIDS)])
    return store


def _visible(store: LogStore) -> dict[int, int]:
    """What a consumer can read of each partition: the offsets a read from 0 returns."""
    out = {}
    for uid in UIDS:
        p = store.partitions[uid]
        rr = p.read(0, 1 << 30)
        try:
            out[uid] = p.high_watermark if rr.size else 0
            assert rr.size == p.chunks.bytes_of_first(p.chunks.count_before(p.high_watermark))
        finally:
            rr.release()
    return out


def test_a_restarted_backup_promoted_before_any_commit_shows_only_the_checkpointed_point(
    tmp_path,
):
    async def run() -> None:
        primary, backup = _plain(tmp_path / "p"), _replicated(tmp_path / "b")
        (link,) = _wire(primary, [backup])
        prod = Producer(11)
        pvlog, bvlog = primary.logs[LOG], backup.logs[LOG]

        # Round 1, committed and told (a Commit), then checkpointed (the periodic write).
        prod.round(primary)
        link.deliver()
        await _until(lambda: pvlog.committed >= pvlog.lsn)
        bvlog.commit_to(*pvlog.position_at(pvlog.committed))
        await _until(lambda: all(backup.partitions[u].high_watermark > 0 for u in UIDS))
        committed = {u: backup.partitions[u].next_offset for u in UIDS}
        await backup.checkpoint()
        saved = json.loads((backup.root / commit_checkpoint.FILE).read_text())["logs"][LOG]
        assert tuple(saved) == bvlog.end

        # Round 2 reaches the backup and is durable there; its checkpoint is not written
        # again before it crashes.
        prod.round(primary)
        prod.round(primary)
        link.deliver()
        await _until(lambda: bvlog.journal.durable >= bvlog.lsn)
        held = {u: backup.partitions[u].next_offset for u in UIDS}
        assert all(held[u] > committed[u] for u in UIDS)
        backup.abandon()

        again = _replicated(tmp_path / "b")
        assert {u: again.partitions[u].next_offset for u in UIDS} == held
        assert _visible(again) == committed  # not everything its log holds

        # Promoted before any Commit: leads at epoch 2 with OTHER in sync.
        node = ClusterNode([], "t", ME, "127.0.0.1", 0)
        node.brokers = {ME: BrokerInfo(ME, "127.0.0.1", 0, "test")}
        node.vlogs = {VID: VirtualLogState(VID, [ME, OTHER], ME, 2, [ME, OTHER])}
        replicator = Replicator(node, again, 10_000)
        replicator.reconcile()
        assert replicator.leads(VID, 2)
        vlog = again.logs[LOG]
        assert vlog.committed < vlog.lsn  # the bytes past the checkpoint wait for OTHER
        await asyncio.sleep(0)  # (whatever was ready to run has run)
        assert _visible(again) == committed
        vlog.replica_acked(OTHER, vlog.lsn - 1)  # all but the last byte: still not all
        assert _visible(again)[UIDS[-1]] <= held[UIDS[-1]]
        vlog.replica_acked(OTHER, vlog.lsn)  # OTHER has everything: committed now
        assert _visible(again) == held
        await replicator.close()
        await again.close()
        await primary.close()

    asyncio.run(run())


def test_a_clean_stop_keeps_the_commit_point_and_a_log_without_one_shows_nothing(tmp_path):
    async def run() -> None:
        primary, backup = _plain(tmp_path / "p"), _replicated(tmp_path / "b")
        (link,) = _wire(primary, [backup])
        prod = Producer(12)
        pvlog, bvlog = primary.logs[LOG], backup.logs[LOG]
        prod.round(primary)
        link.deliver()
        await _until(lambda: pvlog.committed >= pvlog.lsn)
        first = pvlog.position_at(pvlog.committed)
        prod.round(primary)
        link.deliver()
        await _until(lambda: bvlog.journal.durable >= bvlog.lsn)
        bvlog.commit_to(*first)  # the primary committed the first round only
        shown = _visible(backup)
        assert all(shown[u] < backup.partitions[u].next_offset for u in UIDS)
        await backup.close()  # a clean stop writes the checkpoint
        again = _replicated(tmp_path / "b")
        assert _visible(again) == shown
        await again.close()
        # No checkpoint at all (a crash before the first write): nothing is known committed.
        (tmp_path / "b" / "logs" / commit_checkpoint.FILE).unlink()
        bare = _replicated(tmp_path / "b")
        assert _visible(bare) == dict.fromkeys(UIDS, 0)
        await bare.close()
        await primary.close()

    asyncio.run(run())
