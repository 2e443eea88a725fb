"""The tail cache: the newest chunks of every partition, in memory, under one budget per broker.

Each entry is a chunk exactly as a Fetch sends it: its 8-byte base offset followed by the rest of
the batch, in one ``bytes`` object. Consumers at or near the tail are answered from here and
never touch a file.

Nothing in the cache is an object Python's collector walks: a ``bytes`` copy of each chunk
(about 0.1 s of CPU per GB produced) rather than a memoryview of the request's buffer, integer
keys, a plain dict (which the collector stops tracking, as it holds no container) and the
eviction order in arrays. With small batches (linger 1 ms) a 512 MiB cache holds over 250,000
chunks: as memoryviews in an OrderedDict each full collection walked them all and stalled the
event loop for 176 ms, and as bytes in an OrderedDict still for 34 ms.

The budget is the broker's, not a partition's (Redpanda's batch cache): the oldest chunk of the
whole broker is evicted first, so a busy partition may hold most of the cache while idle ones
hold nothing. That matters most with ``storage.direct_io``, where appends skip the page cache
and this cache is the only memory a lagging consumer can be served from.
"""

from __future__ import annotations

from array import array

_SHIFT = 64  # key = uid << 64 | base offset (base offsets are below 2**63)
_COMPACT = 1 << 16


class TailCache:
    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._entries: dict[int, bytes] = {}
        # Keys in append order from _head on; a key may no longer be in _entries (dropped).
        self._order = array("q")
        self._order_uid = array("q")
        self._head = 0
        self.bytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    def put(self, uid: int, base: int, head: bytes, rest: bytes | memoryview) -> None:
        size = len(head) + len(rest)
        if size > self.capacity:
            return  # also when the cache is off (capacity 0)
        key = uid << _SHIFT | base
        entries = self._entries
        old = entries.pop(key, None)
        if old is not None:
            self.bytes -= len(old)
        entries[key] = head + rest
        self._order.append(base)
        self._order_uid.append(uid)
        self.bytes += size
        if self.bytes > self.capacity:
            self._evict()

    def _evict(self) -> None:
        entries, order, uids = self._entries, self._order, self._order_uid
        head = self._head
        while self.bytes > self.capacity:
            old = entries.pop(uids[head] << _SHIFT | order[head], None)
            head += 1
            if old is not None:
                self.bytes -= len(old)
        if head >= _COMPACT and head * 2 >= len(order):
            del order[:head]
            del uids[:head]
            head = 0
        self._head = head

    def get(self, uid: int, base: int) -> bytes | None:
        return self._entries.get(uid << _SHIFT | base)

    def drop(self, uid: int, base: int) -> None:
        e = self._entries.pop(uid << _SHIFT | base, None)
        if e is not None:
            self.bytes -= len(e)

    def drop_many(self, uid: int, bases) -> None:
        if not self._entries:
            return  # the cache is off, or holds nothing: no walk over the chunks
        for base in bases:
            self.drop(uid, base)

    def drop_partition(self, uid: int) -> None:
        """Forget every chunk of a deleted partition (rare: a walk over the whole cache)."""
        for key in [k for k in self._entries if k >> _SHIFT == uid]:
            self.bytes -= len(self._entries.pop(key))
