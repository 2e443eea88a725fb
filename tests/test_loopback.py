"""Free loopback ports are handed out once per process: a released port is only a number, and
two listeners of one cluster given the same number fight over it (a fault-soak finding)."""

from __future__ import annotations

import socket

from stratalog.loopback import free_port


def test_no_port_is_handed_out_twice_and_each_can_be_bound():
    ports = [free_port() for _ in range(2000)]
    assert len(set(ports)) == len(ports)
    for p in ports[-20:]:
        with socket.socket() as s:
            s.bind(("127.0.0.1", p))
