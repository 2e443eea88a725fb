"""A pass-through FUSE file system whose I/O errors are switched at run time.

Mounted over a broker's data directory (the kernel here has no device mapper, so no dm-error or
dm-flakey target), it forwards everything to a backing directory (the crash oracle's
:class:`~stratalog.faults.crash_oracle.passthrough.PassThroughFS`) unless a rule in its control
file says to fail the operation. The control file is JSON, a list of rules::

    [{"op": "read", "path": "/logs/v1/*.log", "errno": "EIO"}, ...]

``op`` is ``read``, ``write`` (data written to a file, and a truncate), ``fsync`` (of a file;
``fsyncdir`` too) or ``modify`` (every operation that changes anything: writes, truncates,
creating, opening for writing, names, metadata: a read-only file system). ``path`` is an
``fnmatch`` pattern over the path inside the mount (``*`` crosses ``/``); ``errno`` is a name
from :mod:`errno`. The file is read again whenever it is replaced (one ``stat`` per operation,
its inode number and modification time), so a test switches faults on and off by renaming a new
one in (:meth:`FailingMount.set`); an operation started after ``set`` returns sees the new
rules.

Mounted with ``direct_io``: the kernel keeps no page cache for its files, so every read of a
file reaches this process and meets the rules, as a read of an uncached block meets a failing
disk.

Run: ``python -m stratalog.faults.failing_fs BACKING MOUNTPOINT CONTROL``. The product never
imports it.
"""

from __future__ import annotations

import errno
import fnmatch
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .crash_oracle.fuse_binding import FuseOSError, serve
from .crash_oracle.passthrough import FuseMount, PassThroughFS

OPS = ("read", "write", "fsync", "modify")
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_TRUNC | os.O_APPEND


@dataclass(frozen=True)
class Rule:
    op: str
    path: str  # fnmatch pattern over the path inside the mount
    errno: int

    def matches(self, op: str, path: str) -> bool:
        return (self.op == op or (self.op == "modify" and op in ("write", "name"))) and (
            fnmatch.fnmatchcase(path, self.path)
        )

    @staticmethod
    def parse(item: dict[str, Any]) -> Rule:
        op = item["op"]
        if op not in OPS:
            raise ValueError(f"unknown op {op!r} (one of {', '.join(OPS)})")
        return Rule(op, item.get("path", "*"), getattr(errno, item.get("errno", "EIO")))


class FailingFS(PassThroughFS):
    def __init__(self, backing: Path, control: Path) -> None:
        super().__init__(backing)
        self.control = str(control)
        self._seen: tuple[int, int] | None = None  # (inode, mtime) of the rules in force
        self.rules: list[Rule] = []
        self.failed = 0  # operations refused, printed at exit for the curious

    def _load(self) -> None:
        try:
            st = os.stat(self.control)
        except FileNotFoundError:
            self.rules, self._seen = [], None
            return
        if (st.st_ino, st.st_mtime_ns) == self._seen:
            return
        with open(self.control) as f:
            self.rules = [Rule.parse(item) for item in json.load(f)]
        self._seen = (st.st_ino, st.st_mtime_ns)

    def _check(self, op: str, path: str) -> None:
        self._load()
        for rule in self.rules:
            if rule.matches(op, path):
                self.failed += 1
                raise FuseOSError(rule.errno)

    # -- reading -------------------------------------------------------------------------------
    def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
        self._check("read", path)
        return super().read(path, size, offset, fh)

    # -- files ---------------------------------------------------------------------------------
    def open(self, path: str, flags: int) -> int:
        if flags & _WRITE_FLAGS:
            self._check("name", path)  # opening for writing on a read-only file system
        return super().open(path, flags)

    def create(self, path: str, mode: int, flags: int) -> int:
        self._check("name", path)
        return super().create(path, mode, flags)

    def write(self, path: str, data: bytes, offset: int, fh: int) -> int:
        self._check("write", path)
        return super().write(path, data, offset, fh)

    def truncate(self, path: str, length: int, fh: int | None = None) -> int:
        self._check("write", path)
        return super().truncate(path, length, fh)

    def fsync(self, path: str, datasync: int, fh: int) -> int:
        self._check("fsync", path)
        return super().fsync(path, datasync, fh)

    def fsyncdir(self, path: str, datasync: int, fh: int) -> int:
        self._check("fsync", path)
        return super().fsyncdir(path, datasync, fh)

    # -- names and metadata --------------------------------------------------------------------
    def mkdir(self, path: str, mode: int) -> int:
        self._check("name", path)
        return super().mkdir(path, mode)

    def rmdir(self, path: str) -> int:
        self._check("name", path)
        return super().rmdir(path)

    def unlink(self, path: str) -> int:
        self._check("name", path)
        return super().unlink(path)

    def rename(self, old: str, new: str) -> int:
        self._check("name", old)
        self._check("name", new)
        return super().rename(old, new)

    def chmod(self, path: str, mode: int) -> int:
        self._check("name", path)
        return super().chmod(path, mode)

    def chown(self, path: str, uid: int, gid: int) -> int:
        self._check("name", path)
        return super().chown(path, uid, gid)

    def utimens(self, path: str, times: tuple[int, int] | None = None) -> int:
        self._check("name", path)
        return super().utimens(path, times)


def main(argv: list[str]) -> None:
    backing, mountpoint, control = (Path(a) for a in argv)
    fs = FailingFS(backing.resolve(), control)
    try:
        serve(fs, str(mountpoint), fsname="stratalog-failing-fs", direct_io=True)
    finally:
        print(f"failing fs: {fs.failed} operations refused", file=sys.stderr)


class FailingMount(FuseMount):
    """The failing file system as a child process; :meth:`set` switches its faults."""

    module = __name__

    def __init__(self, backing: Path, mountpoint: Path, control: Path) -> None:
        super().__init__(backing, mountpoint, control.with_suffix(".stderr"))
        self.control = control

    def args(self) -> list[str]:
        return [str(self.control)]

    def set(self, *rules: dict[str, str]) -> None:
        """Replace the rules (none: everything passes through). Written whole to a new file
        and renamed in: the file system never reads half of it, and the new inode number tells
        it apart from the last one even within one tick of the clock."""
        for item in rules:
            Rule.parse(item)  # refuse a bad rule here, not in the file system's process
        tmp = self.control.with_suffix(".tmp")
        tmp.write_text(json.dumps(list(rules)))
        os.replace(tmp, self.control)

    def clear(self) -> None:
        self.set()

    def start(self, timeout: float = 20) -> FailingMount:
        self.control.write_text("[]")
        super().start(timeout)
        return self


if __name__ == "__main__":
    main(sys.argv[1:])
