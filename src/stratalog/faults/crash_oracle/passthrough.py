"""What the FUSE file systems of the fault tools share: a pass-through to a backing directory,
and running one as a child process mounted somewhere.

:class:`PassThroughFS` forwards every operation to the backing directory and nothing else; the
crash oracle's recorder (:mod:`.recorder`) logs what it forwarded, the failing file system
(:mod:`stratalog.faults.failing_fs`) refuses what it is told to. :class:`FuseMount` starts one
as ``python -m <module> BACKING MOUNTPOINT ARGS...``, waits for the mount, and takes it down
again (unmount, then the process by PID) however it is left.
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
from typing import Any, Self

from .fuse_binding import FuseOSError, Operations

# Flags the backing file must not get: the kernel's FUSE client already applied O_APPEND's
# offset and O_DIRECT's alignment, and the backing directory may refuse O_DIRECT (tmpfs).
NOT_PASSED = os.O_DIRECT | os.O_APPEND | os.O_CREAT | os.O_EXCL


class PassThroughFS(Operations):
    use_ns = True  # mfusepy: times as integer nanoseconds

    def __init__(self, backing: Path) -> None:
        self.backing = str(backing)

    def _real(self, path: str) -> str:
        return self.backing + path

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
        return os.open(self._real(path), flags & ~NOT_PASSED)

    def create(self, path: str, mode: int, flags: int) -> int:
        return os.open(self._real(path), (flags & ~NOT_PASSED) | os.O_CREAT, mode)

    def write(self, path: str, data: bytes, offset: int, fh: int) -> int:
        return os.pwrite(fh, data, offset)

    def truncate(self, path: str, length: int, fh: int | None = None) -> int:
        if fh is not None:
            os.ftruncate(fh, length)
        else:
            os.truncate(self._real(path), length)
        return 0

    def fsync(self, path: str, datasync: int, fh: int) -> int:
        return 0  # the backing directory is never synced: nothing below FUSE is modelled

    def flush(self, path: str, fh: int) -> int:
        return 0

    def release(self, path: str, fh: int) -> int:
        os.close(fh)
        return 0

    # -- names ---------------------------------------------------------------------------------
    def mkdir(self, path: str, mode: int) -> int:
        os.mkdir(self._real(path), mode)
        return 0

    def rmdir(self, path: str) -> int:
        os.rmdir(self._real(path))
        return 0

    def unlink(self, path: str) -> int:
        os.unlink(self._real(path))
        return 0

    def rename(self, old: str, new: str) -> int:
        os.rename(self._real(old), self._real(new))
        return 0

    def fsyncdir(self, path: str, datasync: int, fh: int) -> int:
        return 0

    # -- metadata ------------------------------------------------------------------------------
    def chmod(self, path: str, mode: int) -> int:
        os.chmod(self._real(path), mode)
        return 0

    def chown(self, path: str, uid: int, gid: int) -> int:
        os.chown(self._real(path), uid, gid)
        return 0

    def utimens(self, path: str, times: tuple[int, int] | None = None) -> int:
        os.utime(self._real(path), ns=times)
        return 0


class FuseMount:
    """A FUSE file system as a child process (``python -m module BACKING MOUNTPOINT *args``),
    mounted at ``mountpoint`` over ``backing``; a context manager that unmounts and stops it
    (by PID) however it is left."""

    module = ""  # set by subclasses: the module whose main() serves the file system

    def __init__(self, backing: Path, mountpoint: Path, stderr_path: Path) -> None:
        self.backing = backing
        self.mountpoint = mountpoint
        self.proc: subprocess.Popen[bytes] | None = None
        self.stderr_path = stderr_path

    def args(self) -> list[str]:
        """Arguments after BACKING and MOUNTPOINT."""
        return []

    def mounted(self) -> bool:
        # From the mount table, not inferred from stat: a mount whose process died answers
        # with ENOTCONN, and it must still be found to be taken down.
        target = os.path.realpath(self.mountpoint)
        with open("/proc/self/mounts") as f:
            return any(line.split()[1] == target for line in f)

    def start(self, timeout: float = 20) -> Self:
        if shutil.which("fusermount3") is None:
            raise RuntimeError("fusermount3 is missing (Debian package fuse3)")
        self.backing.mkdir(parents=True, exist_ok=True)
        self.mountpoint.mkdir(parents=True, exist_ok=True)
        with open(self.stderr_path, "wb") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", self.module, str(self.backing), str(self.mountpoint),
                 *self.args()],
                stdout=subprocess.DEVNULL,
                stderr=err,
            )  # fmt: skip
        deadline = time.monotonic() + timeout
        while not self.mounted():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the FUSE mount did not come up: {self._stderr()}")
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

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
