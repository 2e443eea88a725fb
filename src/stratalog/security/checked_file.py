"""A private JSON file whose body carries its CRC-32C (SCRAM credentials, ACLs on one node).

Written whole and durably (temporary name, fsync, rename, directory fsync) with mode 0600, so a
crash leaves the old file or the new one, and a damaged one is told from an empty one.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import crc32c


def body_crc(body: object) -> int:
    """The CRC-32C of ``body`` in a canonical JSON form (key order and spacing fixed)."""
    return crc32c.crc32c(json.dumps(body, sort_keys=True, separators=(",", ":")).encode())


def write(path: Path, key: str, body: object) -> None:
    """Replace ``path`` with ``{key: body, "crc32c": ...}``."""
    data = json.dumps({key: body, "crc32c": body_crc(body)}, indent=1)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    dfd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
