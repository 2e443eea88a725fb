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
:class:`RecordingMount` does that, waits for the mount, and takes it down again.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from .fuse_binding import FuseOSError, Operations, serve
from .oplog import Kind, LogWriter, Op

# Flags the backing file must not get: the kernel's FUSE client already applied O_APPEND's
# offset and O_DIRECT's alignment, and the backing directory may refuse O_DIRECT (tmpfs).
_NOT_PASSED = os.O_DIRECT | os.O_APPEND | os.O_CREAT | os.O_EXCL


class RecordingFS(Operations):
    use_ns = True  # mfusepy: times as integer nanoseconds

    def __init__(self, backing: Path, log_path: Path) -> None:
        self.backing = str(backing)
        self.log = LogWriter(log_path)
        self.inode_of_fh: dict[int, int] = {}
        self.log.append(Op(Kind.ROOT, os.lstat(self.backing).st_ino))

    # -- helpers -------------------------------------------------------------------------------
    def _real(self, path: str) -> str:
        return self.backing + path

    def _ino(self, path: str) -> int:
        return os.lstat(self._real(path)).st_ino

    def _parent(self, path: str) -> tuple[int, str]:
        head, _, name = path.rpartition("/")
        return self._ino(head or "/"), name

    # -- reading -------------------------------------------------------------------------------
    def getattr(self, path: str, fh: int | None = None) -> dict[str, Any]:
        st = os.fstat(fh) if fh is not None else os.lstat(self._real(path))
        keys = ("st_mode", "st_nlink", "st_uid", "st_gid", "st_size", "st_ino", "st_blocks")
        attrs: dict[str, Any] = {k: getattr(st, k) for k in keys}
        attrs.update(st_atime=st.st_atime_ns, st_mtime=st.st_mtime_ns, st_ctime=st.st_ctime_ns)
        return attrs

    def access(self, path: str, amode: int) -> int:
        if not os.access(self._real(path), amode):
            raise FuseOSError(errno.EACCES)
        return 0

    def readdir(self, path: str, fh: int) -> list[str]:
        return [".", "..", *os.listdir(self._real(path))]

    def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
        return os.pread(fh, size, offset)

    def statfs(self, path: str) -> dict[str, int]:
        st = os.statvfs(self._real(path))
        keys = ("f_bsize", "f_frsize", "f_blocks", "f_bfree", "f_bavail", "f_files", "f_ffree")
        return {k: getattr(st, k) for k in (*keys, "f_favail", "f_flag", "f_namemax")}

    # -- files ---------------------------------------------------------------------------------
    def open(self, path: str, flags: int) -> int:
        fh = os.open(self._real(path), flags & ~_NOT_PASSED)
        ino = os.fstat(fh).st_ino
        self.inode_of_fh[fh] = ino
        if flags & os.O_TRUNC:  # libfuse 3 asks for atomic O_TRUNC: no separate truncate comes
            self.log.append(Op(Kind.TRUNCATE, ino, 0))
        return fh

    def create(self, path: str, mode: int, flags: int) -> int:
        real = self._real(path)
        existed = os.path.lexists(real)
        fh = os.open(real, (flags & ~_NOT_PASSED) | os.O_CREAT, mode)
        ino = os.fstat(fh).st_ino
        self.inode_of_fh[fh] = ino
        if not existed:
            parent, name = self._parent(path)
            self.log.append(Op(Kind.CREATE, parent, ino, name))
        elif flags & os.O_TRUNC:
            self.log.append(Op(Kind.TRUNCATE, ino, 0))
        return fh

    def write(self, path: str, data: bytes, offset: int, fh: int) -> int:
        written = os.pwrite(fh, data, offset)
        self.log.append(Op(Kind.WRITE, self.inode_of_fh[fh], offset, data=bytes(data[:written])))
        return written

    def truncate(self, path: str, length: int, fh: int | None = None) -> int:
        if fh is not None:
            os.ftruncate(fh, length)
            ino = self.inode_of_fh[fh]
        else:
            os.truncate(self._real(path), length)
            ino = self._ino(path)
        self.log.append(Op(Kind.TRUNCATE, ino, length))
        return 0

    def fsync(self, path: str, datasync: int, fh: int) -> int:
        self.log.append(Op(Kind.FSYNC, self.inode_of_fh[fh], 1 if datasync else 0))
        return 0

    def flush(self, path: str, fh: int) -> int:
        return 0

    def release(self, path: str, fh: int) -> int:
        self.inode_of_fh.pop(fh, None)
        os.close(fh)
        return 0

    # -- names ---------------------------------------------------------------------------------
    def mkdir(self, path: str, mode: int) -> int:
        os.mkdir(self._real(path), mode)
        parent, name = self._parent(path)
        self.log.append(Op(Kind.MKDIR, parent, self._ino(path), name))
        return 0

    def rmdir(self, path: str) -> int:
        parent, name = self._parent(path)
        os.rmdir(self._real(path))
        self.log.append(Op(Kind.UNLINK, parent, 0, name))
        return 0

    def unlink(self, path: str) -> int:
        parent, name = self._parent(path)
        os.unlink(self._real(path))
        self.log.append(Op(Kind.UNLINK, parent, 0, name))
        return 0

    def rename(self, old: str, new: str) -> int:
        src, name = self._parent(old)
        dst, name2 = self._parent(new)
        os.rename(self._real(old), self._real(new))
        self.log.append(Op(Kind.RENAME, src, dst, name, name2))
        return 0

    def fsyncdir(self, path: str, datasync: int, fh: int) -> int:
        self.log.append(Op(Kind.FSYNCDIR, self._ino(path)))
        return 0

    # -- metadata a crash image does not model -------------------------------------------------
    def chmod(self, path: str, mode: int) -> int:
        os.chmod(self._real(path), mode)
        return 0

    def chown(self, path: str, uid: int, gid: int) -> int:
        os.chown(self._real(path), uid, gid)
        return 0

    def utimens(self, path: str, times: tuple[int, int] | None = None) -> int:
        os.utime(self._real(path), ns=times)
        return 0


def main(argv: list[str]) -> None:
    backing, mountpoint, log_path = (Path(a) for a in argv)
    fs = RecordingFS(backing.resolve(), log_path)
    # The broker's own inode numbers are not needed; fsname names the mount in /proc/mounts.
    serve(fs, str(mountpoint), fsname="stratalog-crash-oracle")


class RecordingMount:
    """The recording file system as a child process, mounted at ``mountpoint`` over
    ``backing``; a context manager that unmounts and stops it (by PID) however it is left."""

    def __init__(self, backing: Path, mountpoint: Path, log_path: Path) -> None:
        self.backing = backing
        self.mountpoint = mountpoint
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None
        self.stderr_path = log_path.with_suffix(".stderr")

    def mounted(self) -> bool:
        # From the mount table, not inferred from stat: a mount whose process died answers
        # with ENOTCONN, and it must still be found to be taken down.
        target = os.path.realpath(self.mountpoint)
        with open("/proc/self/mounts") as f:
            return any(line.split()[1] == target for line in f)

    def position(self) -> int:
        """The log's size now: every operation already answered on the mount lies before it."""
        return os.stat(self.log_path).st_size

    def start(self, timeout: float = 20) -> RecordingMount:
        if shutil.which("fusermount3") is None:
            raise RuntimeError("fusermount3 is missing (Debian package fuse3)")
        self.backing.mkdir(parents=True, exist_ok=True)
        self.mountpoint.mkdir(parents=True, exist_ok=True)
        with open(self.stderr_path, "wb") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", __name__, str(self.backing), str(self.mountpoint),
                 str(self.log_path)],
                stdout=subprocess.DEVNULL,
                stderr=err,
            )  # fmt: skip
        deadline = time.monotonic() + timeout
        while not self.mounted():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the recording mount did not come up: {self._stderr()}")
            time.sleep(0.02)
        return self

    def _stderr(self) -> str:
        with contextlib.suppress(OSError):
            return self.stderr_path.read_text()[-2000:]
        return ""

    def stop(self) -> None:
        """Unmount (lazily if something still holds it) and end the process."""
        if self.mounted():
            done = subprocess.run(["fusermount3", "-u", str(self.mountpoint)], capture_output=True)
            if done.returncode != 0:
                subprocess.run(["fusermount3", "-uz", str(self.mountpoint)], capture_output=True)
        if self.proc is not None:
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
            self.proc = None

    def __enter__(self) -> RecordingMount:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


if __name__ == "__main__":
    main(sys.argv[1:])
