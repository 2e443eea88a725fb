"""The tail cache: one memory budget for the whole broker (``cache.tail_bytes``).

With ``storage.direct_io`` appends skip the page cache, so the tail cache is the only memory a
lagging consumer can be served from; these tests use direct appends for every write so that a
chunk is either in the cache or read from the file, and check both by the broker's byte counters
while a real consumer reads the records back.
"""

from __future__ import annotations

import os

from prometheus_client import REGISTRY

from stratalog import Broker
from stratalog.storage.tail_cache import TailCache

from .conftest import create_topic
from .test_fetch_paths import N, _consume, _counters, _delta, _produce

DIRECT = {"storage.direct_io": True, "storage.direct_min_bytes": 0}


def _chunk(size: int) -> tuple[bytes, memoryview]:
    return os.urandom(8), memoryview(os.urandom(size - 8))


def _cached_bytes() -> float:
    return REGISTRY.get_sample_value("stratalog_tail_cache_bytes")


def test_the_oldest_chunk_of_the_broker_goes_first():
    cache = TailCache(1000)
    for base in range(3):
        cache.put(1, base, *_chunk(200))  # partition 1: 600 B
    cache.put(2, 0, *_chunk(300))  # partition 2: 300 B, 900 B in all
    assert cache.bytes == 900 and len(cache) == 4
    cache.put(2, 1, *_chunk(400))  # over the budget: partition 1's two oldest chunks go
    assert cache.bytes == 900
    assert cache.get(1, 0) is None and cache.get(1, 1) is None
    assert cache.get(1, 2) is not None and cache.get(2, 0) is not None
    chunk = cache.get(2, 1)
    assert isinstance(chunk, bytes) and len(chunk) == 400

    cache.put(3, 0, *_chunk(1001))  # larger than the whole budget: not cached, nothing evicted
    assert cache.get(3, 0) is None and cache.bytes == 900

    cache.drop(2, 0)
    assert cache.bytes == 600 and cache.get(2, 0) is None
    cache.drop_partition(2)
    assert cache.bytes == 200 and len(cache) == 1

    off = TailCache(0)
    off.put(1, 0, *_chunk(10))
    assert len(off) == 0 and off.bytes == 0


def test_direct_appends_are_read_back_from_the_cache(tmp_path):
    with Broker(tmp_path / "d", config={**DIRECT, "cache.tail_bytes": 64 << 20}) as b:
        create_topic(b.bootstrap, "t")
        values = _produce(b.bootstrap, "t")
        assert _cached_bytes() >= N * 500
        before = _counters()
        assert _consume(b.bootstrap, "t") == values
        memory, sendfile, copied = _delta(before, _counters())
        assert memory >= N * 500 and sendfile == 0 and copied == 0, (memory, sendfile, copied)


def test_one_budget_for_all_partitions(tmp_path):
    # About 1.5 MB per topic and a 2 MiB cache: the first topic fits alone, and the second
    # topic's appends evict the first topic's oldest chunks (a per-partition budget would not).
    with Broker(tmp_path / "d", config={**DIRECT, "cache.tail_bytes": 2 << 20}) as b:
        create_topic(b.bootstrap, "first")
        create_topic(b.bootstrap, "second")
        first = _produce(b.bootstrap, "first")
        before = _counters()
        assert _consume(b.bootstrap, "first") == first
        memory, sendfile, copied = _delta(before, _counters())
        assert sendfile + copied == 0, (memory, sendfile, copied)

        second = _produce(b.bootstrap, "second")
        assert N * 500 < _cached_bytes() <= 2 << 20
        before = _counters()
        assert _consume(b.bootstrap, "first") == first
        memory, sendfile, copied = _delta(before, _counters())
        # Evicted chunks come from the segment files, the rest still from memory.
        assert sendfile + copied >= N * 500 * 0.5, (memory, sendfile, copied)
        assert memory > 0, (memory, sendfile, copied)

        before = _counters()
        assert _consume(b.bootstrap, "second") == second
        memory, sendfile, copied = _delta(before, _counters())
        assert memory >= N * 500 * 0.5, (memory, sendfile, copied)
