"""The fault proxy against a real echo server on 127.0.0.1: bytes pass both ways; a cut resets
or freezes connections and refuses or holds new ones; heal forwards again."""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from stratalog.faults.proxy import FaultProxy, owner
from stratalog.loopback import free_port


class Echo:
    """An upstream that echoes every byte and counts the connections it accepted."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.address = self.sock.getsockname()
        self.accepted = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            threading.Thread(target=self._echo, args=(conn,), daemon=True).start()

    @staticmethod
    def _echo(conn: socket.socket) -> None:
        with conn:
            try:
                while data := conn.recv(65536):
                    conn.sendall(data)
            except OSError:
                pass

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def echo() -> Iterator[Echo]:
    e = Echo()
    yield e
    e.close()


@pytest.fixture
def proxy(echo: Echo) -> Iterator[FaultProxy]:
    p = FaultProxy(echo.address, name="test-proxy").start()
    yield p
    p.close()


def connect(p: FaultProxy) -> socket.socket:
    s = socket.create_connection(p.address, timeout=5)
    s.settimeout(5)
    return s


def roundtrip(s: socket.socket, data: bytes) -> bytes:
    s.sendall(data)
    got = b""
    while len(got) < len(data):
        chunk = s.recv(len(data) - len(got))
        if not chunk:
            break
        got += chunk
    return got


def silent(s: socket.socket, seconds: float = 0.5) -> bool:
    """Nothing arrives (no bytes, no close, no reset) within ``seconds``."""
    s.settimeout(seconds)
    try:
        s.recv(1)
    except TimeoutError:
        return True
    except OSError:
        return False
    return False


def closed(s: socket.socket) -> bool:
    """The other end closed or reset the connection."""
    s.settimeout(5)
    try:
        return s.recv(1) == b""
    except (ConnectionResetError, BrokenPipeError):
        return True


def test_bytes_pass_both_ways(proxy: FaultProxy) -> None:
    payload = os.urandom(3 * 1024 * 1024)  # more than one chunk and a socket buffer
    with connect(proxy) as a, connect(proxy) as b:
        assert roundtrip(a, payload) == payload
        assert roundtrip(b, b"hello") == b"hello"
    assert proxy.port != 0


def test_refuse_resets_open_connections_refuses_new_ones_and_heal_restores(
    proxy: FaultProxy,
) -> None:
    a = connect(proxy)
    assert roundtrip(a, b"x") == b"x"
    proxy.cut("refuse")
    assert closed(a)
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(proxy.address, timeout=5)
    proxy.heal()
    with connect(proxy) as b:  # the same port again
        assert roundtrip(b, b"back") == b"back"
    a.close()


def test_blackhole_freezes_open_connections_holds_new_ones_and_heal_resets_them(
    proxy: FaultProxy, echo: Echo
) -> None:
    a = connect(proxy)
    assert roundtrip(a, b"x") == b"x"
    proxy.cut("blackhole")
    a.sendall(b"lost in the partition")
    assert silent(a)  # no echo, and no close either
    before = echo.accepted
    b = connect(proxy)  # accepted: a partition sends no refusal
    b.sendall(b"anyone?")
    assert silent(b)
    assert echo.accepted == before  # never forwarded
    assert proxy.connections() == 2
    proxy.heal()
    assert closed(a) and closed(b)  # both ends reconnect after a partition
    with connect(proxy) as c:
        assert roundtrip(c, b"again") == b"again"
    a.close()
    b.close()


def test_a_cut_of_some_sources_leaves_the_others_flowing(echo: Echo) -> None:
    cut_port: list[int] = []
    p = FaultProxy(
        echo.address,
        name="test-sources",
        source=lambda peer: "victim" if peer[1] in cut_port else "other",
    ).start()
    try:
        victim = socket.socket()
        victim.bind(("127.0.0.1", 0))
        cut_port.append(victim.getsockname()[1])
        victim.settimeout(5)
        victim.connect(p.address)
        other = connect(p)
        p.cut("blackhole", sources={"victim"})
        victim.sendall(b"v")
        assert silent(victim)
        assert roundtrip(other, b"still here") == b"still here"
        p.heal()
        assert closed(victim)
        assert roundtrip(other, b"untouched") == b"untouched"
        victim.close()
        other.close()
    finally:
        p.close()


def test_a_dead_upstream_closes_the_path(echo: Echo) -> None:
    p = FaultProxy(("127.0.0.1", free_port()), name="test-dead").start()
    try:
        try:
            s = connect(p)
        except ConnectionResetError:
            return  # the reset came before connect() returned
        with s:
            assert closed(s)
    finally:
        p.close()


def test_owner_finds_the_process_holding_a_connections_client_end(proxy: FaultProxy) -> None:
    with connect(proxy) as s:
        peer = s.getsockname()
        deadline = time.monotonic() + 5
        while proxy.connections() == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert owner(peer, {"parent": os.getppid(), "me": os.getpid()}) == "me"
        assert owner(peer, {"parent": os.getppid()}) is None
