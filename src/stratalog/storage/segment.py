"""Segment files: the unit a log is rolled, synced, migrated and deleted by.

A segment is a pair of files named by a sequence number within its log:

* ``<seq>.log`` holds frames: an 8-byte frame header (partition uid, CRC-32C of the uid and the
  batch's first 21 bytes, which the batch CRC does not cover) followed by the batch as received.
* ``<seq>.idx`` holds one fixed-size entry per frame, appended lazily; recovery trusts it only up
  to the log's checkpoint and rebuilds the rest by scanning.

A segment is reference-counted so a Fetch that still holds a slice of it can finish sending after
retention deleted it.
"""

from __future__ import annotations

import logging
import mmap
import os
import struct
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from crc32c import crc32c

from stratalog.colocated_format import ENTRY, ENTRY_SIZE, FRAME
from stratalog.colocated_format import FRAME_SIZE as FRAME_SIZE  # (storage imports it here)
from stratalog.colocated_format import segment_name as segment_name
from stratalog.storage import reaper
from stratalog.storage.noatime import open_noatime

_UID = struct.Struct("<I")
# O_DIRECT writes (storage.direct_io) are whole blocks at block offsets from aligned memory; 4 KiB
# satisfies every logical block size in use.
BLOCK = 4096
_DIRECT_BUFFER = 4 * 1024 * 1024
# Smaller appends still go through the page cache: a direct write waits for the device on the
# event loop, which costs a small request more than the copy it saves (docs/benchmarks.md, b).
# The default of storage.direct_min_bytes.
DIRECT_MIN_BYTES = 128 * 1024

log = logging.getLogger(__name__)

# Tests simulate a power cut by truncating every segment to the size it had at its last fsync;
# when STRATALOG_SYNC_LOG names a file, each fsync appends "<path> <size>" to it.
_SYNC_LOG = os.environ.get("STRATALOG_SYNC_LOG")
# Tests kill a broker while it seals segments: STRATALOG_SEAL_PAUSE_MS widens each step of a seal
# (sealed index and producer snapshot written, not yet renamed) so that a kill lands inside one.
_SEAL_PAUSE_S = float(os.environ.get("STRATALOG_SEAL_PAUSE_MS", "0")) / 1000


def seal_pause() -> None:
    if _SEAL_PAUSE_S:
        time.sleep(_SEAL_PAUSE_S)


def write_whole(path: Path, data: bytes) -> None:
    """Write a file of a seal whole: a temporary name, synced, renamed over (no directory sync:
    the caller's). The temporary name is its writer's own (a seal and a recovery may write the
    same file at once); start-up sweeps those a kill left."""
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}-{threading.get_ident()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fdatasync(fd)
    finally:
        os.close(fd)
    seal_pause()
    os.replace(tmp, path)


def uid_crc(uid: int) -> int:
    """CRC-32C of the uid's 4 bytes: where every frame CRC of that partition starts from."""
    return crc32c(_UID.pack(uid))


def frame_crc(uid: int, batch_head: bytes | memoryview) -> int:
    return crc32c(batch_head[:21], uid_crc(uid))


def frame_header(uid: int, batch: bytes | memoryview) -> bytes:
    return FRAME.pack(uid, frame_crc(uid, batch))


@dataclass(frozen=True, slots=True)
class IndexEntry:
    uid: int
    base_offset: int
    last_offset_delta: int
    position: int
    size: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int

    def pack(self) -> bytes:
        return ENTRY.pack(
            self.uid,
            self.base_offset,
            self.last_offset_delta,
            self.position,
            self.size,
            self.max_timestamp,
            self.producer_id,
            self.producer_epoch,
            self.base_sequence,
        )

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta


def fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def mkdir_durable(directory: Path) -> None:
    """``mkdir -p`` whose new names survive a power cut: POSIX makes a new directory's entry
    durable only by an fsync of its parent, so each one created here is followed by one (an
    existing tree costs a stat; the crash oracle, tests/test_crash_oracle.py, found meta/ and
    logs/ missing from every strict power-cut image without this)."""
    missing: list[Path] = []
    d = directory
    while not d.exists():
        missing.append(d)
        d = d.parent
    for d in reversed(missing):
        try:
            d.mkdir()
        except FileExistsError:
            continue
        fsync_dir(d.parent)


def list_segments(directory: Path) -> list[int]:
    return sorted(int(p.stem) for p in directory.glob("*.log") if p.stem.isdigit())


class Segment:
    """One open segment: appends go through a file descriptor, reads use pread or sendfile."""

    def __init__(self, directory: Path, seq: int, *, create: bool = False) -> None:
        self.directory = directory
        self.seq = seq
        self.data_path = directory / f"{segment_name(seq)}.log"
        self.index_path = directory / f"{segment_name(seq)}.idx"
        # Its sealed index (sealed_index.py): written when it is sealed, read lazily.
        self.pix_path = directory / f"{segment_name(seq)}.pix"
        if create:
            # One left by an earlier segment of this number (a crash between deletions).
            self.pix_path.unlink(missing_ok=True)
        flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
        self.fd = open_noatime(self.data_path, flags)
        self.index_fd = open_noatime(self.index_path, os.O_RDWR | os.O_CREAT)
        self.size = os.fstat(self.fd).st_size
        self.index_size = os.fstat(self.index_fd).st_size
        os.lseek(self.index_fd, self.index_size, os.SEEK_SET)
        self.created = time.time() if create else os.stat(self.data_path).st_mtime
        # A new file's directory entry must be durable before data in it is acknowledged.
        self.dir_synced = not create
        self.sealed = False
        self._index_buf = bytearray()
        self._refs = 1  # the owning log's reference
        self._deleted = False
        self._reap = True  # delete its files on the reaper thread (see delete)
        # storage.direct_io: an O_DIRECT descriptor and an aligned buffer holding the file from
        # the block at _tail_start to the end (see enable_direct).
        self._dfd: int | None = None
        self._tail: mmap.mmap | None = None
        self._tail_start = 0
        self._direct_min = DIRECT_MIN_BYTES

    # -- writing -------------------------------------------------------------------------------
    def enable_direct(self, min_bytes: int = DIRECT_MIN_BYTES) -> bool:
        """Append through O_DIRECT from now on, bypassing the page cache (storage.direct_io);
        appends under ``min_bytes`` still take the page cache.

        Under write-back load a buffered append here costs ten times the CPU of an idle one,
        nearly all of it copying into page-cache pages (perf: ``copy_folio_from_iter_atomic``,
        67% of the broker's CPU in workload b); an O_DIRECT write costs a memcpy into this
        buffer. The file's last block is rewritten by each append and zero-padded past the end,
        so between appends the file may be up to one block longer than ``size``: the padding is
        cut at seal and close, and recovery knows it. Reads keep using the buffered descriptor
        (the kernel drops cached pages a direct write replaces); fresh data is served from the
        broker's tail cache. Returns False, leaving buffered writes, where the file system
        refuses O_DIRECT (tmpfs).
        """
        if self._dfd is not None:
            return True
        tail = mmap.mmap(-1, _DIRECT_BUFFER)
        try:
            self._dfd = os.open(self.data_path, os.O_WRONLY | os.O_DIRECT)
        except OSError as e:
            tail.close()
            log.warning("%s: O_DIRECT refused (%s); buffered writes", self.data_path, e)
            return False
        self._direct_min = min_bytes
        self._tail = tail
        self._load_tail()
        return True

    def _load_tail(self) -> None:
        assert self._tail is not None
        self._tail_start = self.size - self.size % BLOCK
        head = os.pread(self.fd, self.size - self._tail_start, self._tail_start)
        self._tail[: len(head)] = head

    @property
    def direct(self) -> bool:
        return self._dfd is not None

    def finish_direct(self) -> None:
        """Stop direct writes and cut the file to ``size`` (the last block's padding)."""
        if self._dfd is None:
            return
        os.close(self._dfd)
        self._dfd = None
        assert self._tail is not None
        self._tail.close()
        self._tail = None
        try:
            # Only ever shorter: after a failed write ``size`` may lie past what was written.
            if os.fstat(self.fd).st_size > self.size:
                os.ftruncate(self.fd, self.size)
        except OSError as e:  # recovery cuts it instead; closing must go on
            log.warning("%s: cannot cut the O_DIRECT padding: %s", self.data_path, e)

    def _write_direct(self, parts: list[bytes | memoryview], total: int) -> int:
        assert self._tail is not None and self._dfd is not None
        start, end = self.size, self.size + total
        base = self._tail_start
        if end - base > len(self._tail):
            # Keep only the partial block the next write rewrites; grow for a larger append.
            new_base = start - start % BLOCK
            keep = bytes(self._tail[new_base - base : start - base])
            need = end - new_base + BLOCK
            if need > len(self._tail):
                grown = mmap.mmap(-1, -(-need // _DIRECT_BUFFER) * _DIRECT_BUFFER)
                self._tail.close()
                self._tail = grown
            self._tail[: len(keep)] = keep
            base = self._tail_start = new_base
        buf = self._tail
        pos = start - base
        for p in parts:
            n = len(p)
            buf[pos : pos + n] = p
            pos += n
        if total < self._direct_min:
            self._write_buffered(parts, start, total)
            self.size = end
            return start
        stop = -(-pos // BLOCK) * BLOCK
        buf[pos:stop] = bytes(stop - pos)  # recovery reads zeros past the end as padding
        first = (start - base) - (start - base) % BLOCK
        view = memoryview(buf)
        try:
            done = first
            while done < stop:
                n = os.pwrite(self._dfd, view[done:stop], base + done)
                if n <= 0:
                    raise OSError(f"short O_DIRECT write to {self.data_path}")
                done += n
        finally:
            view.release()
        self.size = end
        return start

    def write(self, parts: list[bytes | memoryview], total: int = -1) -> int:
        """Append ``parts`` (``total`` bytes, if the caller knows) contiguously; return the
        position they start at."""
        start = self.size
        if total < 0:
            total = sum(len(p) for p in parts)
        if self._dfd is not None:
            return self._write_direct(parts, total)
        self._write_buffered(parts, start, total)
        self.size += total
        return start

    def _write_buffered(self, parts: list[bytes | memoryview], start: int, total: int) -> None:
        """Write ``parts`` at ``start`` through the page cache (by position: the descriptor's
        own offset is never used, so direct and buffered writes can follow each other)."""
        written = os.pwritev(self.fd, parts, start)
        if written < total:  # rare for regular files, but legal
            rest = memoryview(b"".join(bytes(p) for p in parts))
            while written < total:
                written += os.pwrite(self.fd, rest[written:], start + written)

    def add_index(self, entry: IndexEntry) -> None:
        self._index_buf += entry.pack()

    def add_index_fields(
        self,
        uid: int,
        base_offset: int,
        last_offset_delta: int,
        position: int,
        size: int,
        max_timestamp: int,
        producer_id: int,
        producer_epoch: int,
        base_sequence: int,
    ) -> None:
        """``add_index`` without building an IndexEntry (the append path, once per batch)."""
        self._index_buf += ENTRY.pack(
            uid,
            base_offset,
            last_offset_delta,
            position,
            size,
            max_timestamp,
            producer_id,
            producer_epoch,
            base_sequence,
        )

    def flush_index(self, sync: bool = False) -> None:
        if self._index_buf:
            os.write(self.index_fd, self._index_buf)
            self.index_size += len(self._index_buf)
            self._index_buf.clear()
        if sync:
            os.fdatasync(self.index_fd)

    def sync(self) -> None:
        size = self.size
        os.fdatasync(self.fd)
        if not self.dir_synced:
            fsync_dir(self.directory)
            self.dir_synced = True
        self.synced(size)

    def synced(self, size: int) -> None:
        """The first ``size`` bytes are durable (an fdatasync of ``fd`` returned)."""
        if _SYNC_LOG:
            with open(_SYNC_LOG, "a") as f:
                f.write(f"{self.data_path} {size}\n")

    def truncate(self, size: int) -> None:
        self.pix_path.unlink(missing_ok=True)  # describes the bytes being cut
        os.ftruncate(self.fd, size)
        self.size = size
        os.fsync(self.fd)
        if self._tail is not None:
            self._load_tail()

    def rewrite_index(self, entries: list[IndexEntry]) -> None:
        self._index_buf.clear()
        data = b"".join(e.pack() for e in entries)
        os.ftruncate(self.index_fd, 0)
        os.pwrite(self.index_fd, data, 0)
        os.lseek(self.index_fd, len(data), os.SEEK_SET)
        self.index_size = len(data)
        os.fsync(self.index_fd)

    # -- reading -------------------------------------------------------------------------------
    def read(self, position: int, size: int) -> bytes:
        return os.pread(self.fd, size, position)

    def read_index(self) -> list[IndexEntry]:
        self.flush_index()
        raw = os.pread(self.index_fd, self.index_size, 0)
        whole = len(raw) - len(raw) % ENTRY_SIZE
        return [IndexEntry(*e) for e in ENTRY.iter_unpack(raw[:whole])]

    # -- life cycle ----------------------------------------------------------------------------
    def acquire(self) -> Segment:
        self._refs += 1
        return self

    def release(self) -> None:
        self._refs -= 1
        if self._refs == 0:
            self._close_files()
            if self._deleted:
                self._unlink()

    def delete(self, *, background: bool = True) -> None:
        """Drop the log's reference; files go once no reader holds a slice of them, on the
        reaper's thread unless ``background`` is false (recovery: a later segment may take the
        same name)."""
        self._deleted = True
        self._reap = background
        self.release()

    def discard(self) -> None:
        """Delete now as far as the log can tell (a truncation): the files are renamed out of
        the way at once, so a new segment may take the name and recovery never finds them,
        and go once no reader holds the segment."""
        self._index_buf.clear()
        for attr in ("data_path", "index_path", "pix_path"):
            path = getattr(self, attr)
            gone = path.with_name(path.name + reaper.DELETING)
            try:
                os.rename(path, gone)
            except FileNotFoundError:
                if attr != "pix_path":  # (a segment not sealed has none)
                    raise
            setattr(self, attr, gone)
        self.delete()

    def close(self) -> None:
        self.flush_index()
        self.finish_direct()
        self.release()

    def _close_files(self) -> None:
        if self._dfd is not None:
            self.finish_direct()
        for fd in (self.fd, self.index_fd):
            try:
                os.close(fd)
            except OSError:
                pass

    def _unlink(self) -> None:
        # The sealed index first: one that outlived its segment is never believed (its frame
        # check fails), but goes with it anyway.
        self.pix_path.unlink(missing_ok=True)
        if self._reap:
            # Off the loop, and a step at a time (no descriptor is left): see reaper.py.
            reaper.unlink(self.data_path, self.index_path)
            return
        for p in (self.data_path, self.index_path):
            try:
                p.unlink()
            except FileNotFoundError:
                pass

    def age_seconds(self) -> float:
        return time.time() - self.created

    def __repr__(self) -> str:
        return f"Segment({self.directory.name}/{segment_name(self.seq)}, {self.size} B)"
