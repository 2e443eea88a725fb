"""Group commit (BookKeeper's journal) and what consumers may see before an fsync."""

from __future__ import annotations

import asyncio

import pytest

from stratalog.records import build_batch
from stratalog.storage.journal import FsyncPolicy
from stratalog.storage.log_store import LogStore, StorageConfig


def _store(tmp_path, fsync: str, **kw) -> LogStore:
    store = LogStore(StorageConfig(tmp_path, fsync=FsyncPolicy.parse(fsync), **kw))
    store.open([("t", 0, 1), ("t", 1, 2), ("t", 2, 3)])
    return store


def _batch(i: int) -> bytes:
    return build_batch([(b"k", b"v%d" % i, 1_700_000_000_000 + i)] * 5)


async def _durable(store: LogStore, lsns: list[tuple]) -> None:
    futs = []
    loop = asyncio.get_running_loop()
    for vlog, lsn in lsns:
        f = loop.create_future()
        vlog.when_durable(lsn, lambda ok, f=f: f.set_result(ok))
        futs.append(f)
    assert all(await asyncio.gather(*futs))


def test_concurrent_appends_share_one_fsync(tmp_path):
    async def run() -> None:
        store = _store(tmp_path, "always", virtual_logs=1, group_commit_ms=2)
        pending = []
        for i in range(300):
            p = store.partitions[1 + i % 3]
            r = p.append(_batch(i))
            pending.append((p.vlog, r.lsn))
        await _durable(store, pending)
        vlog = store.logs["v0"]
        # 300 appends in one event-loop turn: one group, one fsync.
        assert vlog.journal.syncs == 1
        await store.close()

    asyncio.run(run())


def test_adaptive_group_commit_syncs_a_lone_append_at_once_and_groups_what_waits(tmp_path):
    async def run() -> None:
        store = _store(tmp_path, "always", virtual_logs=1)  # the default: adaptive
        p = store.partitions[1]
        journal = p.vlog.journal
        # A lone append: its sync starts at the end of this loop turn, not after a window
        # (with group_commit_ms=2 nothing would be in flight yet).
        r = p.append(_batch(0))
        assert not journal._flushing  # the rest of this turn may still join
        await asyncio.sleep(0)
        assert journal._flushing
        await _durable(store, [(p.vlog, r.lsn)])
        assert journal.syncs == 1
        # Appends of one turn share one sync; those made while it is in flight are the next
        # group, whatever their number: two syncs for two waves.
        first = [(p.vlog, p.append(_batch(i)).lsn) for i in range(1, 50)]
        await asyncio.sleep(0)
        assert journal._flushing
        second = [(p.vlog, p.append(_batch(i)).lsn) for i in range(50, 300)]
        await _durable(store, first + second)
        assert journal.syncs == 3
        await store.close()

    asyncio.run(run())


def test_group_closes_early_at_group_commit_bytes(tmp_path):
    async def run() -> None:
        store = _store(
            tmp_path, "always", virtual_logs=1, group_commit_ms=60_000, group_commit_bytes=4000
        )
        p = store.partitions[1]
        journal = p.vlog.journal
        p.append(_batch(0))
        assert not journal._flushing  # under the byte threshold: waits for the timer
        while journal.appended < 4000:
            p.append(_batch(1))
        assert journal._flushing  # the threshold closed the group at once
        await store.close()

    asyncio.run(run())


def test_high_watermark_waits_for_fsync_under_always(tmp_path):
    async def run() -> None:
        store = _store(tmp_path, "always", group_commit_ms=1)
        p = store.partitions[1]
        r = p.append(_batch(0))
        assert p.next_offset == 5
        assert p.high_watermark == 0  # appended but not durable: invisible to consumers
        assert p.read(0, 1 << 20).size == 0
        await _durable(store, [(p.vlog, r.lsn)])
        assert p.high_watermark == 5
        assert p.read(0, 1 << 20).size > 0
        await store.close()

    asyncio.run(run())


@pytest.mark.parametrize("policy", ["never", "interval:50"])
def test_high_watermark_moves_at_append_without_fsync_always(tmp_path, policy):
    async def run() -> None:
        store = _store(tmp_path, policy)
        p = store.partitions[2]
        p.append(_batch(0))
        assert p.high_watermark == 5
        if policy.startswith("interval"):
            for _ in range(500):  # the timer syncs it within a few intervals
                if p.vlog.journal.syncs:
                    break
                await asyncio.sleep(0.01)
            assert p.vlog.journal.syncs >= 1
        else:
            await asyncio.sleep(0.1)
            assert p.vlog.journal.syncs == 0
        await store.close()

    asyncio.run(run())


@pytest.mark.parametrize("text", ["sometimes", "interval:", "interval:0", "interval:x", ""])
def test_bad_fsync_policy_is_rejected(text):
    with pytest.raises(ValueError, match="fsync must be"):
        FsyncPolicy.parse(text)
