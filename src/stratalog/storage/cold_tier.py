"""The cold tier: contiguous per-partition segments on a slower directory or an object store.

Migration rewrites a partition's chunks out of the interleaved virtual logs into segments of
its own (ChronoGrapher's story files): batches back to back, exactly as stored, so a catch-up
read of history is one sequential range. Each cold segment has an index of fixed-size entries
beside it, and each partition a manifest naming its segments. Files are written once, synced,
and only then named in a new manifest generation (``manifest-<gen>.json``, the highest readable
one wins), which works the same on a local directory and on an object store, where there is no
rename. Files no manifest names are leftovers of an interrupted migration and are removed.

A cold segment's index is read on demand (``ColdRun``, a run of the partition's two-level chunk
index): at start-up the manifest's description of each segment (offsets, chunks, bytes, max
timestamp) is the summary kept in memory. An index file that does not agree with its manifest
entry and its own positions is rebuilt from the segment's batches when read.
"""

from __future__ import annotations

import json
import logging
import os
import struct
import threading
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path

from stratalog.storage import gentle_write
from stratalog.storage.chunk_index import ChunkIndex, Columns
from stratalog.storage.noatime import open_noatime
from stratalog.storage.throttle import BlockingPace
from stratalog.storage.txn_index import is_transactional_producer

log = logging.getLogger(__name__)

# base offset, last delta, position, size, max timestamp, producer id, epoch, base sequence
COLD_ENTRY = struct.Struct("<qiqiqqhi")
READ_AHEAD = 8 * 1024 * 1024
ColdEntry = tuple[int, int, int, int, int, int, int, int]


def entries_index(entries: list[ColdEntry]) -> ChunkIndex:
    """A cold segment's entries as a piece of chunk index (built off the event loop)."""
    return ChunkIndex.from_columns(
        (e[0] for e in entries),
        (e[0] + e[1] for e in entries),
        (e[2] for e in entries),
        (e[3] for e in entries),
        (e[4] for e in entries),
    )


class ColdTierError(OSError):
    """The cold tier cannot be read or written (missing, read-only, unreachable)."""


def entries_of(data: bytes | memoryview) -> list[ColdEntry]:
    """The entries of batches laid back to back (a cold segment's data)."""
    from stratalog.storage.batch import parse_header

    entries: list[ColdEntry] = []
    pos = 0
    while pos < len(data):
        h = parse_header(data, pos)
        entries.append(entry_of(h, pos, h.size))
        pos += h.size
    return entries


def entry_of(h, position: int, size: int) -> ColdEntry:
    """The cold index entry of the batch whose header is ``h``, stored at ``position``."""
    return (
        h.base_offset,
        h.last_offset_delta,
        position,
        size,
        h.max_timestamp,
        h.producer_id,
        h.producer_epoch,
        h.base_sequence,
    )


class ColdRun:
    """A cold segment's entries as a run of the chunk index, read when needed (one read of its
    index file). An index that disagrees with the manifest's description of its segment or
    does not tile the segment is rebuilt from the segment's batches (and, on a local tier,
    written again)."""

    __slots__ = ("segment",)

    def __init__(self, segment: ColdSegment) -> None:
        self.segment = segment

    def entries(self):
        """Every entry (a numpy record array of COLD_ENTRY fields)."""
        import numpy as np

        from stratalog.storage.sealed_index import run_dtype

        seg = self.segment
        meta = seg.meta
        try:
            raw = seg.store.read_index_bytes(seg.uid, meta)
            problem = _index_problem(raw, meta)
        except ColdTierError as e:
            problem = str(e)
        if problem:
            log.error("cold segment %s: %s; rebuilding its index from its batches", seg, problem)
            data = seg.read(0, meta.size)
            if len(data) != meta.size:
                raise ColdTierError(f"cold segment {seg}: short read ({len(data)} B)")
            raw = b"".join(COLD_ENTRY.pack(*e) for e in entries_of(data))
            problem = _index_problem(raw, meta)
            if problem:
                raise ColdTierError(f"cold segment {seg}: its batches disagree: {problem}")
            if seg.store.local:
                try:
                    seg.store._write(seg.store._index_path(seg.uid, meta), raw)
                except ColdTierError as e:
                    log.warning("cannot write the rebuilt index of %s: %s", seg, e)
        return np.frombuffer(raw, dtype=run_dtype())

    def load(self) -> Columns:
        from stratalog.storage.sealed_index import columns_of

        return columns_of(self.entries())


def _index_problem(raw: bytes, meta: ColdSegmentMeta) -> str:
    """What is wrong with a cold index file's bytes for the segment ``meta`` describes."""
    if len(raw) != meta.entries * COLD_ENTRY.size:
        return f"{len(raw)} index bytes for {meta.entries} entries"
    if not meta.entries:
        return ""
    first = COLD_ENTRY.unpack_from(raw, 0)
    last = COLD_ENTRY.unpack_from(raw, len(raw) - COLD_ENTRY.size)
    if first[0] != meta.base or last[0] + last[1] != meta.last or first[2] != 0:
        return "its first or last entry is not the segment's"
    if last[2] + last[3] != meta.size:
        return "its entries do not end where the segment does"
    import numpy as np

    from stratalog.storage.sealed_index import run_dtype

    a = np.frombuffer(raw, dtype=run_dtype())
    if len(a) > 1 and (
        (a["pos"][1:] != a["pos"][:-1] + a["size"][:-1]).any()
        or (a["base"][1:] <= a["base"][:-1] + a["delta"][:-1]).any()
    ):
        return "its entries do not tile the segment in offset order"
    return ""


@dataclass(frozen=True)
class ColdSegmentMeta:
    name: str
    base: int  # first offset
    last: int  # last offset
    size: int
    entries: int
    max_timestamp: int
    # Chunks of transactional producers (start-up reads the index of a segment that has some);
    # None in a manifest written before it was counted: unknown, so read.
    txn: int | None = None
    # The virtual log segment its chunks were migrated from (None: written by compaction, or
    # before it was kept): a split's order marks for cold chunks come from it.
    vseg: int | None = None


class ColdSegment:
    """An immutable cold segment; the same read interface as a hot Segment for file slices."""

    def __init__(self, store: ColdStore, uid: int, meta: ColdSegmentMeta, seq: int) -> None:
        self.store = store
        self.uid = uid
        self.meta = meta
        self.seq = seq
        self._fd: int | None = None
        self._refs = 1
        self._deleted = False
        self._lock = threading.Lock()
        self._ahead: tuple[int, bytes] = (0, b"")
        # A copy in the hot tier's promotion cache (tiers.promote), preferred for reads.
        self.promoted: Path | None = None

    @property
    def local(self) -> bool:
        return self.store.local or self.promoted is not None

    @property
    def size(self) -> int:
        return self.meta.size

    @property
    def data_path(self) -> Path | None:
        """The file behind a local (or promoted) segment; None in an object store."""
        if not self.local:
            return None
        return self.promoted or self.store.data_path(self.uid, self.meta)

    @property
    def fd(self) -> int:
        """A descriptor for sendfile; only local (or promoted) segments have one (else -1)."""
        path = self.data_path
        if path is None:
            return -1
        with self._lock:
            if self._fd is None:
                try:
                    self._fd = open_noatime(path, os.O_RDONLY)
                except OSError as e:
                    raise ColdTierError(f"cold segment {self.meta.name}: {e}") from e
            return self._fd

    def read(self, position: int, size: int) -> bytes:
        if self.local:
            return os.pread(self.fd, size, position)
        # An object store answers each request slowly: read ahead, as catch-up reads are
        # sequential, and serve the next chunks from what came back.
        with self._lock:
            at, buf = self._ahead
        if at <= position and position + size <= at + len(buf):
            return buf[position - at : position - at + size]
        want = min(max(size, READ_AHEAD), self.meta.size - position)
        buf = self.store.read_range(self.uid, self.meta, position, want)
        with self._lock:
            self._ahead = (position, buf)
        return buf[:size]

    def acquire(self) -> ColdSegment:
        with self._lock:
            self._refs += 1
        return self

    def release(self) -> None:
        with self._lock:
            self._refs -= 1
            gone = self._refs == 0
        if gone:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None
            if self._deleted:
                self.store.remove_files(self.uid, self.meta)

    def delete(self) -> None:
        self._deleted = True
        self.release()

    def __repr__(self) -> str:
        return f"ColdSegment(p{self.uid}/{self.meta.name})"


class ColdStore:
    """Cold segments under a local directory or an fsspec URL (s3://bucket/prefix, ...)."""

    def __init__(self, location: str, options: dict | None = None) -> None:
        self.location = location
        self.options = options  # a migration worker process opens the same tier with them
        if "://" in location and not location.startswith("file://"):
            import fsspec

            try:
                self.fs, self.root = fsspec.core.url_to_fs(location, **(options or {}))
            except (ImportError, ValueError) as e:
                raise ColdTierError(f"cannot use the cold tier {location}: {e}") from e
            self.local = False
        else:
            self.fs = None
            self.root = location.removeprefix("file://")
            self.local = True
        self._gen: dict[int, int] = {}
        # Per partition, the offset below which log compaction has cleaned it (cleaner.py):
        # in the manifest, so it changes atomically with the segments it describes.
        self.cleaned: dict[int, int] = {}
        self._commit_lock = threading.Lock()
        # Cluster mode with one cold tier for every broker (tiers.cold.shared): only a log's
        # primary writes here, and other brokers read what it wrote. A broker's view of the
        # manifests may be stale then, and files it does not know of may be another's upload
        # under way: loading removes nothing, and a commit starts after the newest generation
        # there is and tidies up the partition's leftovers itself.
        self.shared = False

    # -- paths ---------------------------------------------------------------------------------
    def _dir(self, uid: int) -> str:
        return f"{self.root.rstrip('/')}/p{uid}"

    def data_path(self, uid: int, meta: ColdSegmentMeta) -> str:
        return f"{self._dir(uid)}/{meta.name}.log"

    def _index_path(self, uid: int, meta: ColdSegmentMeta) -> str:
        return f"{self._dir(uid)}/{meta.name}.idx"

    # -- primitive I/O -------------------------------------------------------------------------
    def _write(
        self,
        path: str,
        data: bytes | list[bytes],
        *,
        gentle: bool = False,
        rate: float | BlockingPace = 0.0,
    ) -> None:
        """Write a whole file (one buffer, or parts back to back), synced. ``gentle``: in small
        requests one at a time (gentle_write.py), for segment data, so the journal's fsyncs
        never queue behind it, spread out to ``rate`` bytes per second if given; its parts are
        never joined into one buffer."""
        parts = [data] if isinstance(data, bytes) else data
        try:
            if self.local:
                if not os.path.isdir(self.root):
                    # Never recreate it: a missing mount would silently fill the wrong disk.
                    raise ColdTierError(f"the cold tier directory {self.root} is not there")
                Path(path).parent.mkdir(parents=True, exist_ok=True)
                if gentle:
                    gentle_write.write_file(path, parts, rate=rate)
                    return
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                try:
                    for part in parts:
                        view = memoryview(part)
                        while view:
                            view = view[os.write(fd, view) :]
                    os.fsync(fd)
                finally:
                    os.close(fd)
            else:
                with self.fs.open(path, "wb") as f:
                    for part in parts:
                        f.write(part)
        except OSError as e:
            raise ColdTierError(f"cannot write {path}: {e.strerror or e}") from e

    def _read(self, path: str) -> bytes:
        try:
            if self.local:
                with open(path, "rb") as f:
                    return f.read()
            return self.fs.cat_file(path)
        except OSError as e:
            raise ColdTierError(f"cannot read {path}: {e.strerror or e}") from e

    def read_range(self, uid: int, meta: ColdSegmentMeta, position: int, size: int) -> bytes:
        path = self.data_path(uid, meta)
        try:
            return self.fs.cat_file(path, start=position, end=position + size)
        except OSError as e:
            raise ColdTierError(f"cannot read {path}: {e}") from e

    def _list(self, uid: int) -> list[str]:
        d = self._dir(uid)
        try:
            if self.local:
                return sorted(os.listdir(d)) if os.path.isdir(d) else []
            if not self.fs.exists(d):
                return []
            return sorted(p.rsplit("/", 1)[-1] for p in self.fs.ls(d, detail=False))
        except OSError as e:
            raise ColdTierError(f"cannot list {d}: {e}") from e

    def _remove(self, path: str) -> None:
        try:
            if self.local:
                os.unlink(path)
            else:
                self.fs.rm_file(path)
        except FileNotFoundError:
            pass

    def _sync_dir(self, uid: int) -> None:
        if self.local:
            fd = os.open(self._dir(uid), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

    def create(self) -> None:
        """Create the cold tier's directory (first start only)."""
        if self.local:
            os.makedirs(self.root, exist_ok=True)

    # -- health --------------------------------------------------------------------------------
    def check(self) -> None:
        """Raise ColdTierError unless the tier is there and writable."""
        probe = f"{self.root.rstrip('/')}/.probe-{uuid.uuid4().hex[:8]}"
        self._write(probe, b"ok")
        self._remove(probe)

    # -- segments ------------------------------------------------------------------------------
    def write_segment(
        self, uid: int, batches: list[bytes], rate: float | BlockingPace = 0.0
    ) -> tuple[ColdSegmentMeta, list[ColdEntry]]:
        """Write whole record batches back to back, with an index, synced (at ``rate`` bytes
        per second if given, or to a job's BlockingPace, on a local tier); return the segment's
        description and entries."""
        from stratalog.storage.batch import parse_header

        entries: list[ColdEntry] = []
        pos = 0
        for data in batches:
            h = parse_header(data)  # (entries_of, for batches in one buffer)
            entries.append(entry_of(h, pos, len(data)))
            pos += len(data)
        base = entries[0][0]
        name = f"{base:020d}-{uuid.uuid4().hex[:8]}"
        last = entries[-1][0] + entries[-1][1]
        txn = sum(is_transactional_producer(e[5]) for e in entries)
        meta = ColdSegmentMeta(name, base, last, pos, len(entries), max(e[4] for e in entries), txn)
        self._write(self.data_path(uid, meta), batches, gentle=True, rate=rate)
        self._write(self._index_path(uid, meta), b"".join(COLD_ENTRY.pack(*e) for e in entries))
        return meta, entries

    def read_entries(self, uid: int, meta: ColdSegmentMeta) -> list[ColdEntry]:
        raw = self.read_index_bytes(uid, meta)
        return [COLD_ENTRY.unpack_from(raw, i) for i in range(0, len(raw), COLD_ENTRY.size)]

    def read_index_bytes(self, uid: int, meta: ColdSegmentMeta) -> bytes:
        return self._read(self._index_path(uid, meta))

    def remove_files(self, uid: int, meta: ColdSegmentMeta) -> None:
        for p in (self.data_path(uid, meta), self._index_path(uid, meta)):
            self._remove(p)

    # -- manifests -----------------------------------------------------------------------------
    def load(self, uid: int) -> list[ColdSegmentMeta]:
        """The partition's cold segments; removes files of interrupted migrations."""
        names = self._list(uid)
        manifests = sorted(n for n in names if n.startswith("manifest-") and n.endswith(".json"))
        metas: list[ColdSegmentMeta] = []
        gen = 0
        for m in reversed(manifests):
            try:
                doc = json.loads(self._read(f"{self._dir(uid)}/{m}"))
                metas = [ColdSegmentMeta(**s) for s in doc["segments"]]
                gen = int(m[len("manifest-") : -len(".json")])
                if "cleaned" in doc:
                    self.cleaned[uid] = int(doc["cleaned"])
                break
            except (ValueError, KeyError, TypeError):
                continue  # a torn manifest write: the previous generation stands
        if manifests and not gen:
            # Every manifest is damaged: never take that for "no segments" and delete the files
            # (they are the partition's history); the tier reports the damage instead.
            raise ColdTierError(
                f"{self._dir(uid)}: no readable manifest among {', '.join(manifests)}"
            )
        self._gen[uid] = gen
        if not self.shared:
            self._tidy(uid, names, metas, gen)
        return metas

    def _tidy(self, uid: int, names: list[str], metas: list[ColdSegmentMeta], gen: int) -> None:
        """Remove the partition's files that manifest ``gen`` does not name."""
        keep = {f"{s.name}.log" for s in metas} | {f"{s.name}.idx" for s in metas}
        keep.add(f"manifest-{gen:012d}.json")
        for n in names:
            if n not in keep:
                self._remove(f"{self._dir(uid)}/{n}")

    def _newest_gen(self, uid: int, names: list[str]) -> int:
        gens = [
            int(n[len("manifest-") : -len(".json")])
            for n in names
            if n.startswith("manifest-") and n.endswith(".json")
        ]
        return max(gens, default=0)

    def commit(self, uid: int, metas: list[ColdSegmentMeta], cleaned: int | None = None) -> None:
        """Make ``metas`` the partition's segment list (a new manifest generation); with
        ``cleaned``, log compaction's new clean point goes with it (else the last one stays)."""
        with self._commit_lock:  # (two writers of one generation would overwrite each other)
            self._commit(uid, metas, cleaned)

    def _commit(self, uid: int, metas: list[ColdSegmentMeta], cleaned: int | None) -> None:
        names = self._list(uid) if self.shared else []
        # Shared: another broker (an earlier primary) may have committed newer generations.
        old = max(self._gen.get(uid, 0), self._newest_gen(uid, names))
        gen = old + 1
        body: dict = {"segments": [asdict(m) for m in metas]}
        if cleaned is None:
            cleaned = self.cleaned.get(uid)
        if cleaned is not None:
            body["cleaned"] = cleaned
        doc = json.dumps(body).encode()
        self._write(f"{self._dir(uid)}/manifest-{gen:012d}.json", doc)
        self._sync_dir(uid)
        self._gen[uid] = gen
        if cleaned is not None:
            self.cleaned[uid] = cleaned
        if self.shared:
            self._tidy(uid, names, metas, gen)  # older manifests and killed uploads
        elif old:
            self._remove(f"{self._dir(uid)}/manifest-{old:012d}.json")

    def drop_partition(self, uid: int) -> None:
        for n in self._list(uid):
            self._remove(f"{self._dir(uid)}/{n}")
        self._gen.pop(uid, None)
        self.cleaned.pop(uid, None)
