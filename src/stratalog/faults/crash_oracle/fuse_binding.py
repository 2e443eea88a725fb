"""The one module that imports mfusepy (ctypes bindings for libfuse 3's high-level API).

mfusepy is pinned exactly in pyproject.toml: its callback signatures have changed between
releases (fusepy's float times gave way to nanoseconds), and everything the crash oracle needs
from it is here: the base class of a file system, its error type, and a blocking mount.
"""

from __future__ import annotations

import mfusepy

Operations = mfusepy.Operations
FuseOSError = mfusepy.FuseOSError


def serve(operations: Operations, mountpoint: str, **options: object) -> None:
    """Mount ``operations`` at ``mountpoint`` and serve requests until it is unmounted.

    Single-threaded (``-s``): requests are handled one at a time, in the order the kernel sends
    them, so the file system's own log needs no lock to be in that order.
    """
    mfusepy.FUSE(operations, mountpoint, foreground=True, nothreads=True, **options)
