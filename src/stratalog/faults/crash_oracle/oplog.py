"""The operation log the recording file system keeps: what the kernel asked of it, in order.

One record per operation that changes what a crash could leave behind: data (write, truncate),
names (create, mkdir, rename, unlink, rmdir) and the two barriers (fsync or fdatasync of a file,
fsync of a directory). Files and directories are named by the backing file system's inode
numbers, not by paths, so a rename of an open file or a reused name cannot confuse the replay.

A record is appended with one ``write(2)`` before the file system answers the kernel, so when a
system call on the mount has returned, its record is in the log; the log's size read at any
moment is therefore a position that covers every operation already answered (the test ties each
acknowledgement to the size it saw). The log is never fsynced: the oracle's machine does not
crash, only the modelled one does.
"""

from __future__ import annotations

import bisect
import enum
import os
import struct
from dataclasses import dataclass
from pathlib import Path


class Kind(enum.IntEnum):
    WRITE = 1  # a = inode, b = offset, data
    TRUNCATE = 2  # a = inode, b = new size
    CREATE = 3  # a = directory, b = new inode, name
    MKDIR = 4  # a = directory, b = new inode, name
    RENAME = 5  # a = source directory, b = target directory, name -> name2 (replacing it)
    UNLINK = 6  # a = directory, name (a file or, from rmdir, an empty directory)
    FSYNC = 7  # a = inode, b = 1 for fdatasync
    FSYNCDIR = 8  # a = directory inode
    ROOT = 9  # a = the mount's root directory: the first record, written at mount


# kind, a, b, len(name), len(name2), len(data)
_HEAD = struct.Struct("<BQQHHI")


@dataclass(frozen=True, slots=True)
class Op:
    kind: Kind
    a: int
    b: int = 0
    name: str = ""
    name2: str = ""
    data: bytes = b""

    @property
    def barrier(self) -> bool:
        return self.kind in (Kind.FSYNC, Kind.FSYNCDIR)


def encode(op: Op) -> bytes:
    name, name2 = op.name.encode(), op.name2.encode()
    head = _HEAD.pack(op.kind, op.a, op.b, len(name), len(name2), len(op.data))
    return b"".join((head, name, name2, op.data))


class LogWriter:
    """Appends records to the log file, each with a single write(2)."""

    def __init__(self, path: Path) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)

    def append(self, op: Op) -> None:
        record = encode(op)
        written = os.write(self.fd, record)
        if written != len(record):  # a short append would make every later record garbage
            raise OSError(f"short write to the operation log: {written} of {len(record)}")

    def close(self) -> None:
        os.close(self.fd)


@dataclass
class OpLog:
    """A read log: the operations, and the byte position where each one ends."""

    ops: list[Op]
    ends: list[int]

    def count_at(self, position: int) -> int:
        """How many operations are wholly inside the first ``position`` bytes."""
        return bisect.bisect_right(self.ends, position)


def read_log(path: Path) -> OpLog:
    """Every whole record of the log (a record cut short by a kill is left out)."""
    raw = path.read_bytes()
    ops: list[Op] = []
    ends: list[int] = []
    pos = 0
    while pos + _HEAD.size <= len(raw):
        kind, a, b, n1, n2, nd = _HEAD.unpack_from(raw, pos)
        end = pos + _HEAD.size + n1 + n2 + nd
        if end > len(raw):
            break
        body = pos + _HEAD.size
        name = raw[body : body + n1].decode()
        name2 = raw[body + n1 : body + n1 + n2].decode()
        data = raw[body + n1 + n2 : end]
        ops.append(Op(Kind(kind), a, b, name, name2, data))
        ends.append(end)
        pos = end
    return OpLog(ops, ends)
