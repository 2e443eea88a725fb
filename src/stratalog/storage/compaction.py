"""Log compaction's record work: which records a compacted partition keeps, and its batches
rewritten without the others. Runs in a worker process (cleaner.py plans and switches).

A compacted partition keeps, for every key, the record at its latest offset (Kafka's
``cleanup.policy=compact``). Offsets never change: a rewritten batch keeps its base offset, its
last offset delta, its producer id, epoch and base sequence (so producer state read back from
it is what it was), and its records keep their offset deltas, so a batch may have gaps and a
partition gaps between batches. Records are copied byte for byte; only a batch that gets a
delete horizon has its records' timestamp deltas rewritten (their timestamps stay the same).

Two passes, as Kafka's LogCleaner: the first reads the *dirty* part (offsets from the last
cleaning's end up to the limit) and maps each key to its latest offset; the second rewrites
everything from the partition's start up to the limit, dropping

* a record whose key has a later offset in the map (superseded),
* a record without a key (Kafka refuses them on produce to a compacted topic),
* the records of aborted transactions (they must not supersede a committed value either),
* a tombstone (null value) whose batch's delete horizon has passed (KIP-534: the first cleaning
  that keeps a tombstone stamps its batch with ``now + delete.retention.ms`` in the base
  timestamp and attribute bit 6; a later cleaning past that time drops it).

A batch left empty is dropped, unless it is its producer's last batch in the range: then its
header stays, with no records, so producer state (sequences, epochs) survives a rebuild from the
log, as Kafka keeps it. Control batches (transaction markers) are kept as they are.

The map holds key digests (keys up to 16 bytes as they are, longer ones as a 17-byte BLAKE2b
digest), at most ``max_keys`` of them: when the dirty part has more keys, the limit moves back
to the batch where the map filled, and the rest waits for the next cleaning (Kafka's dedupe
buffer).
"""

from __future__ import annotations

import hashlib
import os
import struct
import time
from array import array
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from crc32c import crc32c

from stratalog.records import _varint, _zigzag, compress, decompress
from stratalog.storage.batch import (
    COMPRESSION_MASK,
    CONTROL_MASK,
    CRC_START,
    HEADER_SIZE,
    LOG_OVERHEAD,
    TIMESTAMP_TYPE_MASK,
    TRANSACTIONAL_MASK,
    BatchHeader,
    CorruptBatchError,
    pack_header,
    parse_header,
)
from stratalog.storage.migration_worker import _start_worker, spans
from stratalog.storage.priority import lower_this_thread
from stratalog.storage.throttle import BlockingPace, SharedRate

DELETE_HORIZON_MASK = 0x40  # KIP-534: the base timestamp is the batch's delete horizon
_XERIAL_MAGIC = b"\x82SNAPPY\x00"
_XERIAL_BLOCK = 32 * 1024
# Tests kill a broker in the middle of a cleaning: STRATALOG_COMPACTION_PAUSE_MS holds the worker
# that long once its segments are written, before the broker commits them.
_PAUSE_S = float(os.environ.get("STRATALOG_COMPACTION_PAUSE_MS", "0")) / 1000
# The two passes' record walk in C (_key_scan.c), where it was built; else in Python.
try:
    from stratalog.storage import _key_scan as _native
except ImportError:  # pragma: no cover (built without a C compiler)
    _native = None
# In a cleaner worker: the rate its broker steers (set by start_cleaner_worker), kept in place
# of a job's fixed rate.
_STEERED: SharedRate | None = None


def start_cleaner_worker(
    broker_pid: int, cpus: frozenset[int], rate: SharedRate, sched_idle: bool = False
) -> None:
    """A cleaner worker's start: a migration worker's (priority, CPUs, dies with the broker),
    and the broker's rate for its reads and writes. ``sched_idle``: in the SCHED_IDLE CPU class
    and the idle I/O class instead, so that it runs only on CPU time nobody else wants (a
    nice +10 process still takes a share of a busy core, and delays the broker's wake-ups)."""
    global _STEERED
    _start_worker(broker_pid, cpus)
    if sched_idle:
        lower_this_thread(sched_idle=True)
    _STEERED = rate


def key_digest(key: bytes) -> bytes:
    """What the offset map keys on: short keys as they are, longer ones by a 128-bit digest
    (17 bytes, so never equal to a short key)."""
    if len(key) <= 16:
        return bytes(key)
    return b"#" + hashlib.blake2b(key, digest_size=16).digest()


@dataclass(slots=True)
class RawRecord:
    """One record of a batch: its bytes (length prefix excluded) and the fields the filter
    reads."""

    body: memoryview
    offset_delta: int
    timestamp_delta: int
    key: bytes | None
    has_value: bool
    after_timestamp: int  # where the offset delta starts in ``body``


def records_of(h: BatchHeader, batch: bytes | memoryview) -> list[RawRecord]:
    """The records of one batch (decompressed if need be)."""
    body = _body(h, batch)
    out: list[RawRecord] = []
    pos = 0
    mv = memoryview(body)
    for _ in range(h.record_count):
        length, pos = _varint(body, pos)
        start, end = pos, pos + length
        if end > len(body) or length < 1:
            raise CorruptBatchError("record runs past its batch")
        p = start + 1  # attributes
        ts_delta, p = _varint(body, p)
        after_ts = p - start
        off_delta, p = _varint(body, p)
        klen, p = _varint(body, p)
        key = None
        if klen >= 0:
            key = bytes(body[p : p + klen])
            p += klen
        vlen, p = _varint(body, p)
        out.append(RawRecord(mv[start:end], off_delta, ts_delta, key, vlen >= 0, after_ts))
        pos = end
    if pos != len(body):
        raise CorruptBatchError("batch has bytes after its last record")
    return out


def _body(h: BatchHeader, batch: bytes | memoryview) -> bytes | memoryview:
    return decompress(h.compression, memoryview(batch)[HEADER_SIZE : h.size])


def _walk(fn, *args):
    """A call into the C walk; its ValueError (a malformed record) is the batch's damage."""
    try:
        return fn(*args)
    except ValueError as e:
        raise CorruptBatchError(str(e)) from None


def remember(
    h: BatchHeader, batch: bytes | memoryview, latest: dict[bytes, int], max_keys: int
) -> bool:
    """Pass 1 for one batch: map each keyed record's key digest to its offset in ``latest``.
    False (and nothing added) if the map holds keys already and the batch's new keys would
    take it over ``max_keys``."""
    if _native is not None:
        return _walk(
            _native.remember,
            _body(h, batch),
            h.record_count,
            h.base_offset,
            latest,
            key_digest,
            max_keys,
        )
    recs = records_of(h, batch)
    if len(latest) + len(recs) > max_keys and len(latest) > 0:
        new = {key_digest(r.key) for r in recs if r.key is not None} - latest.keys()
        if len(latest) + len(new) > max_keys:
            return False
    for r in recs:
        if r.key is not None:
            latest[key_digest(r.key)] = h.base_offset + r.offset_delta
    return True


def survivors(
    h: BatchHeader, batch: bytes | memoryview, latest: dict[bytes, int], expired: bool
) -> tuple[list[RawRecord], bool]:
    """Pass 2 for one batch: the records that stay (a key, no later offset for it in
    ``latest``, not a tombstone past its horizon when ``expired``), and whether one of them is
    a tombstone."""
    if _native is not None:
        body = _body(h, batch)
        spans, tombstones = _walk(
            _native.survivors, body, h.record_count, h.base_offset, latest, key_digest, expired
        )
        mv = memoryview(body)
        # (Key and value are not carried: the rebuild copies each record's bytes whole.)
        kept = [RawRecord(mv[a:b], off, ts, None, True, after) for a, b, off, ts, after in spans]
        return kept, tombstones
    kept: list[RawRecord] = []
    tombstones = False
    for r in records_of(h, batch):
        if r.key is None:
            continue
        offset = h.base_offset + r.offset_delta
        if latest.get(key_digest(r.key), offset) > offset:
            continue  # superseded
        if not r.has_value:
            if expired:
                continue
            tombstones = True
        kept.append(r)
    return kept, tombstones


def keyless_records(h: BatchHeader, batch: bytes | memoryview) -> list[int]:
    """The indexes in the batch of its records without a key (refused by a compacted topic)."""
    if h.attributes & CONTROL_MASK:
        return []
    if _native is not None:
        return _walk(_native.keyless, _body(h, batch), h.record_count)
    return [i for i, r in enumerate(records_of(h, batch)) if r.key is None]


def _frame_xerial(raw: bytes) -> bytes:
    """Snappy in Java's SnappyOutputStream framing (what a Java producer's batches use)."""
    out = bytearray(_XERIAL_MAGIC + struct.pack(">ii", 1, 1))
    for i in range(0, len(raw), _XERIAL_BLOCK):
        block = compress(2, raw[i : i + _XERIAL_BLOCK])
        out += struct.pack(">i", len(block)) + block
    return bytes(out)


def rebuild_batch(
    h: BatchHeader,
    batch: bytes | memoryview,
    kept: list[RawRecord],
    horizon: int | None,
) -> bytes:
    """The batch with only ``kept`` of its records; ``horizon``, if given, becomes its delete
    horizon (the records' timestamp deltas are rewritten so their timestamps stay)."""
    attributes = h.attributes
    base_ts = h.base_timestamp
    parts: list[bytes | memoryview] = []
    if horizon is not None and not attributes & DELETE_HORIZON_MASK:
        attributes |= DELETE_HORIZON_MASK
        for r in kept:
            rest = r.body[r.after_timestamp :]
            rec = b"".join((r.body[:1], _zigzag(base_ts + r.timestamp_delta - horizon), rest))
            parts.append(_zigzag(len(rec)))
            parts.append(rec)
        base_ts = horizon
    else:
        for r in kept:
            parts.append(_zigzag(len(r.body)))
            parts.append(r.body)
    if h.attributes & TIMESTAMP_TYPE_MASK:
        max_ts = h.max_timestamp
    else:
        max_ts = max(h.base_timestamp + r.timestamp_delta for r in kept)
    raw = b"".join(parts)
    codec = h.compression
    if codec:
        original = memoryview(batch)[HEADER_SIZE : HEADER_SIZE + len(_XERIAL_MAGIC)]
        if codec == 2 and bytes(original) == _XERIAL_MAGIC:
            payload = _frame_xerial(raw)
        else:
            payload = compress(codec, raw)
    else:
        payload = raw
    return _assemble(h, attributes, base_ts, max_ts, len(kept), payload)


def empty_batch(h: BatchHeader) -> bytes:
    """The header of a batch whose records are all gone (kept for its producer's state):
    uncompressed, no records, both timestamps its max timestamp, as Kafka writes one."""
    return _assemble(h, h.attributes & ~COMPRESSION_MASK, h.max_timestamp, h.max_timestamp, 0, b"")


def _assemble(
    h: BatchHeader, attributes: int, base_ts: int, max_ts: int, count: int, payload: bytes
) -> bytes:
    head = h._replace(
        batch_length=HEADER_SIZE - LOG_OVERHEAD + len(payload),
        attributes=attributes,
        base_timestamp=base_ts,
        max_timestamp=max_ts,
        record_count=count,
        crc=0,
    )
    out = bytearray(pack_header(head))
    out += payload
    struct.pack_into(">I", out, 17, crc32c(memoryview(out)[CRC_START:]))
    return bytes(out)


# -- the job (in a worker process) ---------------------------------------------------------------
@dataclass
class Source:
    """Batches of the partition to read, in offset order: chunks of a hot segment file
    (``path`` with positions and sizes) or a whole cold segment (``cold``: its name; the
    worker reads its index)."""

    path: str | None = None
    positions: bytes = b""
    sizes: bytes = b""
    cold: dict | None = None  # a ColdSegmentMeta as a dict


@dataclass
class Job:
    uid: int
    location: str  # the store of per-partition segments (ColdStore location, options)
    options: dict | None
    sources: list[Source]
    cleaned: int  # offsets below this were compacted before: not read in the first pass
    limit: int  # the first offset not to clean
    aborted: list[tuple[int, int, int]]  # (producer id, first offset, marker offset)
    now_ms: int
    delete_retention_ms: int
    max_keys: int = 1 << 20
    segment_bytes: int = 64 << 20
    rate: float = 0.0  # bytes per second read and written; 0: unlimited (a cleaner worker
    # keeps its broker's steered rate instead)
    keep_bytes: int = 0  # an unchanged cold segment at least this big is kept, not rewritten


@dataclass
class Result:
    limit: int  # where the cleaning stopped (at most the job's limit)
    # The new segment list, in offset order: ("new", meta, index piece) or ("keep", name).
    segments: list[tuple] = field(default_factory=list)
    read_bytes: int = 0
    written_bytes: int = 0
    records_kept: int = 0
    records_removed: int = 0


class _Reader:
    """Opens a job's sources and iterates their batches."""

    def __init__(self, job: Job, store, pace: BlockingPace) -> None:
        self.job = job
        self.store = store
        self.pace = pace
        self._entries: dict[str, object] = {}

    def cold_entries(self, meta: dict):
        from stratalog.storage.cold_tier import ColdRun, ColdSegment, ColdSegmentMeta

        name = meta["name"]
        if name not in self._entries:
            seg = ColdSegment(self.store, self.job.uid, ColdSegmentMeta(**meta), 0)
            self._entries[name] = ColdRun(seg).entries()
        return self._entries[name]

    def batches(self, src: Source) -> Iterator[tuple[BatchHeader, memoryview]]:
        if src.cold is not None:
            e = self.cold_entries(src.cold)
            pos, size = array("q", e["pos"].tolist()), array("q", e["size"].tolist())
            from stratalog.storage.cold_tier import ColdSegmentMeta

            meta = ColdSegmentMeta(**src.cold)
            if self.store.local:
                fd = os.open(self.store.data_path(self.job.uid, meta), os.O_RDONLY)
                read = lambda p, n: os.pread(fd, n, p)  # noqa: E731
            else:
                fd = -1
                read = lambda p, n: self.store.read_range(self.job.uid, meta, p, n)  # noqa: E731
        else:
            pos, size = array("q"), array("q")
            pos.frombytes(src.positions)
            size.frombytes(src.sizes)
            assert src.path is not None
            fd = os.open(src.path, os.O_RDONLY)
            read = lambda p, n: os.pread(fd, n, p)  # noqa: E731
        try:
            for view in spans(read, pos, size, "compaction", self.pace):
                h = parse_header(view)
                if h.size != len(view) or crc32c(view[CRC_START:]) != h.crc:
                    raise CorruptBatchError(f"batch at {h.base_offset} is damaged")
                yield h, view
        finally:
            if fd >= 0:
                os.close(fd)


def _aborted_lookup(aborted: list[tuple[int, int, int]]) -> Callable[[int, int], bool]:
    by_pid: dict[int, list[tuple[int, int]]] = {}
    for pid, first, last in aborted:
        by_pid.setdefault(pid, []).append((first, last))

    def is_aborted(pid: int, offset: int) -> bool:
        return any(first <= offset < last for first, last in by_pid.get(pid, ()))

    return is_aborted


def clean(job: Job) -> Result:
    """Run one cleaning of partition ``job.uid``: write its new segments (synced, named in no
    manifest yet: the caller commits them) and return their list."""
    from stratalog.storage.cold_tier import ColdStore, entries_index

    store = ColdStore(job.location, job.options)
    pace = BlockingPace(_STEERED if _STEERED is not None else job.rate)
    reader = _Reader(job, store, pace)
    is_aborted = _aborted_lookup(job.aborted)
    result = Result(job.limit)

    # Pass 1: the latest offset of each key in the dirty part, and each producer's last batch.
    latest: dict[bytes, int] = {}
    last_of_producer: dict[int, int] = {}
    limit = job.limit
    full = False
    for src in job.sources:
        if src.cold is not None:
            e = reader.cold_entries(src.cold)
            for base, pid in zip(e["base"].tolist(), e["pid"].tolist(), strict=True):
                if base < limit and pid >= 0:
                    last_of_producer[pid] = base
            if src.cold["last"] < job.cleaned:
                continue  # clean already: its keys are unique there
        if full:
            break
        for h, view in reader.batches(src):
            if h.base_offset >= limit:
                break
            if h.producer_id >= 0:
                last_of_producer[h.producer_id] = h.base_offset
            if h.base_offset < job.cleaned:
                continue
            result.read_bytes += len(view)
            if h.attributes & CONTROL_MASK:
                continue
            if h.attributes & TRANSACTIONAL_MASK and is_aborted(h.producer_id, h.base_offset):
                continue
            if not remember(h, view, latest, job.max_keys):
                limit = h.base_offset  # the map is full: clean up to here this time
                full = True
                break
    if full:
        last_of_producer = {p: b for p, b in last_of_producer.items() if b < limit}
    result.limit = limit

    # Pass 2: rewrite from the start up to the limit.
    out: list[bytes] = []
    out_bytes = 0
    keep_bytes = job.keep_bytes or job.segment_bytes // 2

    def flush() -> None:
        nonlocal out, out_bytes
        if out:
            meta, entries = store.write_segment(job.uid, out, pace)
            result.written_bytes += meta.size
            result.segments.append(("new", meta, entries_index(entries)))
        out, out_bytes = [], 0

    past = False  # a hot chunk at or past the limit was met: the rest stays hot
    for src in job.sources:
        if past:
            break
        mine: list[bytes] = []
        changed = False
        for h, view in reader.batches(src):
            if h.base_offset >= limit:
                if src.cold is None:
                    past = True
                    break
                mine.append(bytes(view))  # a cold segment past the limit: as it is
                continue
            kept = _filter(h, view, latest, last_of_producer, is_aborted, job, result)
            if kept is None:
                changed = True
                continue
            if kept is not view:
                changed = True
            mine.append(bytes(kept))
        if src.cold is not None and not changed and src.cold["size"] >= keep_bytes:
            flush()
            result.segments.append(("keep", src.cold["name"]))
            continue
        for b in mine:
            out.append(b)
            out_bytes += len(b)
            if out_bytes >= job.segment_bytes:
                flush()
    flush()
    if _PAUSE_S:
        time.sleep(_PAUSE_S)  # (tests kill the broker here: segments written, none committed)
    return result


def _filter(
    h: BatchHeader,
    view: memoryview,
    latest: dict[bytes, int],
    last_of_producer: dict[int, int],
    is_aborted: Callable[[int, int], bool],
    job: Job,
    result: Result,
) -> bytes | memoryview | None:
    """The batch as kept (``view`` itself when unchanged), or None when it goes."""
    if h.attributes & CONTROL_MASK:
        return view  # transaction markers stay (see the module docstring)
    aborted = bool(h.attributes & TRANSACTIONAL_MASK) and is_aborted(h.producer_id, h.base_offset)
    has_horizon = bool(h.attributes & DELETE_HORIZON_MASK)
    expired = has_horizon and job.now_ms >= h.base_timestamp
    kept, tombstones = ([], False) if aborted else survivors(h, view, latest, expired)
    removed = h.record_count - len(kept)
    result.records_kept += len(kept)
    result.records_removed += removed
    if not kept:
        if h.producer_id >= 0 and last_of_producer.get(h.producer_id) == h.base_offset:
            return empty_batch(h) if h.record_count else view
        return None
    needs_horizon = tombstones and not has_horizon
    if not removed and not needs_horizon:
        return view
    horizon = job.now_ms + job.delete_retention_ms if needs_horizon else None
    return rebuild_batch(h, view, kept, horizon)
