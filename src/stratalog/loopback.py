"""Free loopback ports for listeners that another process (or a later step) binds.

A port free now is only a number: it is released before its listener binds it, so two calls
could name the same port, and two listeners of a cluster then fight over it (a broker's Kafka
port taken by a peer's replication listener, found by the fault soak). Each number is handed
out once per process.
"""

from __future__ import annotations

import socket
import threading

_given: set[int] = set()
_lock = threading.Lock()


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on now and that this process has not handed out before."""
    with _lock:
        for _ in range(1000):
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                s.bind((host, 0))
                port = int(s.getsockname()[1])
            if port not in _given:
                _given.add(port)
                return port
    raise OSError("no loopback port left that was not handed out already")
