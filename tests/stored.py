"""What a partition log hands a reader, decoded the plain way (no code of the fetch path): the
storage tests' read-back."""

from __future__ import annotations

from collections.abc import Iterator

from stratalog.records import iter_records
from stratalog.storage.partition import FileSlice

_CONTROL = 0x20  # the attributes bit of a control batch (a transaction marker)


def stored_batches(p, start: int | None = None, upto: int | None = None) -> Iterator[bytes]:
    """Each stored batch from ``start`` (the log start if None), as it is on disk."""
    first = p.log_start_offset if start is None else start
    rr = p.read(first, 1 << 30) if upto is None else p.read(first, 1 << 30, upto=upto)
    try:
        data = b"".join(x.read() if isinstance(x, FileSlice) else bytes(x) for x in rr.parts)
    finally:
        rr.release()
    pos = 0
    while pos < len(data):
        size = int.from_bytes(data[pos + 8 : pos + 12], "big") + 12
        yield data[pos : pos + size]
        pos += size


def stored_records(p, start: int | None = None, upto: int | None = None, *, controls=True):
    """Each stored record from ``start``; without ``controls``, markers skipped as consumers
    skip them."""
    for batch in stored_batches(p, start, upto):
        if controls or not batch[22] & _CONTROL:
            yield from iter_records(batch)
