"""What a power cut after the first k operations of the log may leave on the disk.

The model is POSIX's promise, taken strictly, not what ext4 happens to do:

* a file's data (its bytes and size) is durable as of its last ``fsync`` or ``fdatasync``
  within the prefix; every write and truncate after that is lost;
* a name (create, mkdir, rename, unlink, rmdir) is durable only once its directory was fsynced
  after it: until then the directory has the entries it had at its previous fsync. A file
  fsynced under a name its directory never synced is therefore gone, and so is a directory
  whose own parent was never synced after the mkdir (ext4 and XFS would usually keep both,
  because their journal commits the name with the file's fsync; nothing in POSIX says so);
* the mount's root directory exists, empty, at the start.

:func:`materialise` writes the image of one crash point into a fresh directory, in one of three
modes: ``strict`` (only what the rules above keep), ``torn`` (strict names, and for each file a
seeded random subset of its writes and truncates since its last fsync applied in order on top
of its durable bytes, as a disk that wrote back some dirty pages and not others), and ``kept``
(everything issued reached the disk: what a ``kill -9`` of the process alone leaves).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from .oplog import Kind, Op, OpLog

Mode = Literal["strict", "torn", "kept"]
ROOT = 0  # the model's id of the mount's root directory


@dataclass
class Node:
    is_dir: bool
    data: bytearray = field(default_factory=bytearray)
    durable_data: bytes = b""
    entries: dict[str, int] = field(default_factory=dict)
    durable_entries: dict[str, int] = field(default_factory=dict)
    unsynced: list[Op] = field(default_factory=list)  # data operations since the last fsync


def _apply_data(data: bytearray, op: Op) -> None:
    if op.kind is Kind.WRITE:
        end = op.b + len(op.data)
        if end > len(data):
            data.extend(bytes(end - len(data)))
        data[op.b : end] = op.data
    else:  # TRUNCATE
        if op.b < len(data):
            del data[op.b :]
        else:
            data.extend(bytes(op.b - len(data)))


class Model:
    """The file system after replaying a prefix of the log: every file's and directory's
    volatile state (what the kernel holds) beside its durable state (what a cut keeps)."""

    def __init__(self) -> None:
        self.nodes: list[Node] = [Node(is_dir=True)]
        # The backing file system's inode number -> the model's node now living under it (a
        # number freed by an unlink may be reused while the old node still has a durable name).
        self.live: dict[int, int] = {}

    def _node(self, inode: int) -> Node:
        return self.nodes[self.live[inode]]

    def apply(self, op: Op) -> None:
        kind = op.kind
        if kind is Kind.ROOT:
            self.live[op.a] = ROOT
        elif kind in (Kind.WRITE, Kind.TRUNCATE):
            node = self._node(op.a)
            _apply_data(node.data, op)
            node.unsynced.append(op)
        elif kind in (Kind.CREATE, Kind.MKDIR):
            self.nodes.append(Node(is_dir=kind is Kind.MKDIR))
            self.live[op.b] = len(self.nodes) - 1
            self._node(op.a).entries[op.name] = len(self.nodes) - 1
        elif kind is Kind.RENAME:
            moved = self._node(op.a).entries.pop(op.name)
            self._node(op.b).entries[op.name2] = moved
        elif kind is Kind.UNLINK:
            self._node(op.a).entries.pop(op.name, None)
        elif kind is Kind.FSYNC:
            node = self._node(op.a)
            node.durable_data = bytes(node.data)
            node.unsynced.clear()
        elif kind is Kind.FSYNCDIR:
            node = self._node(op.a)
            node.durable_entries = dict(node.entries)


def replay(log: OpLog, k: int) -> Model:
    """The model after the first ``k`` operations (the first is always the root's record)."""
    model = Model()
    for op in log.ops[:k]:
        model.apply(op)
    return model


def materialise(model: Model, target: Path, mode: Mode = "strict", seed: int = 0) -> int:
    """Write the crash image into ``target`` (created); return how many files it holds."""
    rng = random.Random(seed)
    target.mkdir(parents=True)
    files = 0
    stack = [(ROOT, target)]
    while stack:
        nid, path = stack.pop()
        node = model.nodes[nid]
        entries = node.entries if mode == "kept" else node.durable_entries
        for name, child_id in sorted(entries.items()):
            child = model.nodes[child_id]
            if child.is_dir:
                (path / name).mkdir()
                stack.append((child_id, path / name))
                continue
            if mode == "kept":
                data = bytes(child.data)
            elif mode == "torn":
                torn = bytearray(child.durable_data)
                for op in child.unsynced:
                    if rng.random() < 0.5:
                        _apply_data(torn, op)
                data = bytes(torn)
            else:
                data = child.durable_data
            (path / name).write_bytes(data)
            files += 1
    return files


def barrier_points(log: OpLog) -> list[int]:
    """Crash points right after each fsync: the prefixes that end in a barrier."""
    return [i + 1 for i, op in enumerate(log.ops) if op.barrier]
