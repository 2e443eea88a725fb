"""The commit point of each replicated virtual log, kept across a restart (Kafka's
replication-offset-checkpoint, its high-watermark checkpoint file).

One small file in the hot tier's root maps each log's name to the position (segment seq, byte
position) before which every byte is known committed: a backup's last word from its primary, a
primary's own. It is rewritten whole (write, fsync, rename) by the index checkpoint's loop and
at a clean stop, so after a crash it may be a few seconds old: older is safe, since bytes past
it only wait for acknowledgements again once the broker leads.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from stratalog.storage.segment import fsync_dir

FILE = "commit-checkpoint.json"
log = logging.getLogger(__name__)


def load(root: Path) -> dict[str, tuple[int, int]]:
    """The checkpointed commit points (empty if there is no readable file)."""
    path = Path(root) / FILE
    try:
        raw = json.loads(path.read_text())
        return {name: (int(p[0]), int(p[1])) for name, p in raw["logs"].items()}
    except FileNotFoundError:
        return {}
    except (OSError, ValueError, KeyError, TypeError, IndexError) as e:
        # Written by rename, so never torn; unreadable means damaged: nothing is known.
        log.error("%s is unreadable (%s): no commit point is known", path, e)
        return {}


def save(root: Path, points: dict[str, tuple[int, int]]) -> None:
    root = Path(root)
    tmp = root / (FILE + ".tmp")
    with open(tmp, "w") as f:
        json.dump({"logs": {name: list(p) for name, p in sorted(points.items())}}, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, root / FILE)
    fsync_dir(root)
