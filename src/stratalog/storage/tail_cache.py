"""The tail cache: the newest chunks of every partition, in memory, under one budget per broker.

Each entry is a chunk exactly as a Fetch sends it: its 8-byte base offset and the rest of the
batch, a view of the very buffer the Produce request arrived in (no copy). Consumers at or near
the tail are answered from here and never touch a file.

The budget is the broker's, not a partition's (Redpanda's batch cache): the oldest chunk of the
whole broker is evicted first, so a busy partition may hold most of the cache while idle ones
hold nothing. That matters most with ``storage.direct_io``, where appends skip the page cache
and this cache is the only memory a lagging consumer can be served from.
"""

from __future__ import annotations

from collections import OrderedDict


class TailCache:
    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        # (partition uid, base offset) -> (8-byte offset, rest of the batch, size); in append
        # order, so the first entry is the oldest.
        self._entries: OrderedDict[tuple[int, int], tuple[bytes, memoryview, int]] = OrderedDict()
        self.bytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    def put(self, uid: int, base: int, off8: bytes, rest: memoryview) -> None:
        size = len(rest) + 8
        if size > self.capacity:
            return  # also when the cache is off (capacity 0)
        key = (uid, base)
        old = self._entries.pop(key, None)
        if old is not None:
            self.bytes -= old[2]
        self._entries[key] = (off8, rest, size)
        self.bytes += size
        entries = self._entries
        while self.bytes > self.capacity:
            _, (_, _, s) = entries.popitem(last=False)
            self.bytes -= s

    def get(self, uid: int, base: int) -> tuple[bytes, memoryview, int] | None:
        return self._entries.get((uid, base))

    def drop(self, uid: int, base: int) -> None:
        e = self._entries.pop((uid, base), None)
        if e is not None:
            self.bytes -= e[2]

    def drop_partition(self, uid: int) -> None:
        """Forget every chunk of a deleted partition (rare: a walk over the whole cache)."""
        for key in [k for k in self._entries if k[0] == uid]:
            self.bytes -= self._entries.pop(key)[2]
