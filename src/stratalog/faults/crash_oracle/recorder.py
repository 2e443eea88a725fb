"""A pass-through FUSE file system that records what the kernel asked of it (`oplog`).

Mounted over a broker's data directory, it forwards every operation to a backing directory and
appends the ones that matter to a crash to the operation log before it answers. The recording
happens here, in a process of its own, from the requests the kernel sends: nothing the broker
says about its own syncs is believed (the oracle must not trust the code under test).

What reaches this process, and so what the log can see: every ``write(2)``/``pwrite(2)`` (the
mount has no writeback cache, so each one is a FUSE_WRITE before the call returns, O_DIRECT ones
included), every ``fsync``/``fdatasync`` of a file or a directory, from a thread or from an
io_uring (both end in the kernel's ``vfs_fsync_range``, which sends FUSE_FSYNC or
FUSE_FSYNCDIR), and every name operation. The backing directory is never synced: the modelled
disk is the log, not it.

Run: ``python -m stratalog.faults.crash_oracle.recorder BACKING MOUNTPOINT LOG``;
:class:`RecordingMount` does that, waits for the mount, and takes it down again. The
forwarding and the mount's process are shared with the failing file system
(:mod:`.passthrough`).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from .fuse_binding import serve
from .oplog import Kind, LogWriter, Op
from .passthrough import FuseMount, PassThroughFS


class RecordingFS(PassThroughFS):
    def __init__(self, backing: Path, log_path: Path) -> None:
        super().__init__(backing)
        self.log = LogWriter(log_path)
        self.inode_of_fh: dict[int, int] = {}
        self.log.append(Op(Kind.ROOT, os.lstat(self.backing).st_ino))

    # -- helpers -------------------------------------------------------------------------------
    def _ino(self, path: str) -> int:
        return os.lstat(self._real(path)).st_ino

    def _parent(self, path: str) -> tuple[int, str]:
        head, _, name = path.rpartition("/")
        return self._ino(head or "/"), name

    # -- files ---------------------------------------------------------------------------------
    def open(self, path: str, flags: int) -> int:
        fh = super().open(path, flags)
        ino = os.fstat(fh).st_ino
        self.inode_of_fh[fh] = ino
        if flags & os.O_TRUNC:  # libfuse 3 asks for atomic O_TRUNC: no separate truncate comes
            self.log.append(Op(Kind.TRUNCATE, ino, 0))
        return fh

    def create(self, path: str, mode: int, flags: int) -> int:
        existed = os.path.lexists(self._real(path))
        fh = super().create(path, mode, flags)
        ino = os.fstat(fh).st_ino
        self.inode_of_fh[fh] = ino
        if not existed:
            parent, name = self._parent(path)
            self.log.append(Op(Kind.CREATE, parent, ino, name))
        elif flags & os.O_TRUNC:
            self.log.append(Op(Kind.TRUNCATE, ino, 0))
        return fh

    def write(self, path: str, data: bytes, offset: int, fh: int) -> int:
        written = super().write(path, data, offset, fh)
        self.log.append(Op(Kind.WRITE, self.inode_of_fh[fh], offset, data=bytes(data[:written])))
        return written

    def truncate(self, path: str, length: int, fh: int | None = None) -> int:
        super().truncate(path, length, fh)
        ino = self.inode_of_fh[fh] if fh is not None else self._ino(path)
        self.log.append(Op(Kind.TRUNCATE, ino, length))
        return 0

    def fsync(self, path: str, datasync: int, fh: int) -> int:
        self.log.append(Op(Kind.FSYNC, self.inode_of_fh[fh], 1 if datasync else 0))
        return 0

    def release(self, path: str, fh: int) -> int:
        self.inode_of_fh.pop(fh, None)
        return super().release(path, fh)

    # -- names ---------------------------------------------------------------------------------
    def mkdir(self, path: str, mode: int) -> int:
        super().mkdir(path, mode)
        parent, name = self._parent(path)
        self.log.append(Op(Kind.MKDIR, parent, self._ino(path), name))
        return 0

    def rmdir(self, path: str) -> int:
        parent, name = self._parent(path)
        super().rmdir(path)
        self.log.append(Op(Kind.UNLINK, parent, 0, name))
        return 0

    def unlink(self, path: str) -> int:
        parent, name = self._parent(path)
        super().unlink(path)
        self.log.append(Op(Kind.UNLINK, parent, 0, name))
        return 0

    def rename(self, old: str, new: str) -> int:
        src, name = self._parent(old)
        dst, name2 = self._parent(new)
        super().rename(old, new)
        self.log.append(Op(Kind.RENAME, src, dst, name, name2))
        return 0

    def fsyncdir(self, path: str, datasync: int, fh: int) -> int:
        self.log.append(Op(Kind.FSYNCDIR, self._ino(path)))
        return 0

    # chmod, chown, utimens: metadata a crash image does not model, forwarded unrecorded.


def main(argv: list[str]) -> None:
    backing, mountpoint, log_path = (Path(a) for a in argv)
    fs = RecordingFS(backing.resolve(), log_path)
    # The broker's own inode numbers are not needed; fsname names the mount in /proc/mounts.
    serve(fs, str(mountpoint), fsname="stratalog-crash-oracle")


class RecordingMount(FuseMount):
    """The recording file system as a child process, mounted at ``mountpoint`` over
    ``backing``; a context manager that unmounts and stops it (by PID) however it is left."""

    module = __name__

    def __init__(self, backing: Path, mountpoint: Path, log_path: Path) -> None:
        super().__init__(backing, mountpoint, log_path.with_suffix(".stderr"))
        self.log_path = log_path

    def args(self) -> list[str]:
        return [str(self.log_path)]

    def position(self) -> int:
        """The log's size now: every operation already answered on the mount lies before it."""
        return os.stat(self.log_path).st_size

    def start(self, timeout: float = 20) -> RecordingMount:
        super().start(timeout)
        return self


if __name__ == "__main__":
    main(sys.argv[1:])
