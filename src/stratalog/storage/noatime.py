"""Opening storage files without access-time updates."""

from __future__ import annotations

import os
from pathlib import Path


def open_noatime(path: str | Path, flags: int, mode: int = 0o644) -> int:
    """``os.open`` without access-time updates: a read of a file written since its last access
    would otherwise change the inode, and that change waits for the file system's journal to
    commit; on a busy disk the event loop's reads waited hundreds of ms for it
    (docs/benchmarks.md, e). O_NOATIME needs the file's owner; others open it plainly."""
    try:
        return os.open(path, flags | os.O_NOATIME, mode)
    except PermissionError:
        return os.open(path, flags, mode)
