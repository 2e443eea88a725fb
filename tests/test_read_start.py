"""Where a partition read begins (issue 27, the soak's poll-skip): a read at an offset the index
holds starts with that offset's batch; one at an offset the index lacks (a gap, as compaction
or a reassignment's copy leaves) starts at the next batch, and says so in ``first_offset``, which
the Fetch handler logs, since a consumer moves past the offsets between. On a real store."""

from __future__ import annotations

import asyncio

from stratalog.records import build_batch
from stratalog.storage.journal import FsyncPolicy
from stratalog.storage.log_store import LogStore, StorageConfig

T0 = 1_700_000_000_000


def test_a_read_says_which_batch_it_begins_with(tmp_path):
    async def run() -> None:
        store = LogStore(StorageConfig(tmp_path, fsync=FsyncPolicy.parse("always"), io_threads=2))
        store.open([("t", 0, 1)])
        try:
            p = store.partitions[1]
            # Offsets 0-1, then 5-6 (copied batches keep their offsets: 2-4 are a gap).
            p.append_copy(build_batch([(b"k", b"a", T0), (b"k", b"b", T0)], base_offset=0))
            p.append_copy(build_batch([(b"k", b"c", T0), (b"k", b"d", T0)], base_offset=5))
            deadline = asyncio.get_running_loop().time() + 10
            while p.high_watermark < 7:
                assert asyncio.get_running_loop().time() < deadline
                await asyncio.sleep(0.01)
            for offset, first in [(0, 0), (1, 0), (2, 5), (4, 5), (5, 5), (6, 5)]:
                rr = p.read(offset, 1 << 20)
                try:
                    assert rr.first_offset == first, offset
                    assert rr.next_offset == 7
                finally:
                    rr.release()
            rr = p.read(7, 1 << 20)
            assert rr.size == 0 and rr.first_offset == -1
        finally:
            await store.close()

    asyncio.run(run())
