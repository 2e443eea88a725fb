"""A TCP fault proxy on 127.0.0.1: the network between two processes, which the nemesis cuts.

A :class:`FaultProxy` listens on a free loopback port and forwards each connection to its
upstream (resolved per connection, so the upstream may start later or move). :meth:`cut`
stands for a partition, in one of two ways:

``blackhole``
    A partition proper, which sends nothing back: open connections freeze (no byte passes
    either way, nothing is closed), new ones are accepted and never forwarded. The processes
    see only silence, and find out by their own timeouts.
``refuse``
    A host that answers with resets: open connections are reset, new ones refused (the
    listening socket is closed; with ``sources``, accepted and reset at once).

``sources`` restricts a cut to connections from some processes (one broker's traffic to a
shared port); :func:`owner` names a connection's process from ``/proc``. :meth:`heal` resets
whatever the cut froze or held, so both ends reconnect, and forwards again.

Each proxy runs its own asyncio loop in a daemon thread; its methods are called from others.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import struct
import threading
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Literal

Mode = Literal["blackhole", "refuse"]
MODES: tuple[Mode, ...] = ("blackhole", "refuse")
Address = tuple[str, int]
HOST = "127.0.0.1"
CHUNK = 256 * 1024


@dataclass(eq=False)
class _Connection:
    client: asyncio.StreamWriter
    source: str | None
    flowing: asyncio.Event = field(default_factory=asyncio.Event)
    upstream: asyncio.StreamWriter | None = None
    tasks: list[asyncio.Task] = field(default_factory=list)


def _reset(writer: asyncio.StreamWriter | None) -> None:
    """Close with an RST (SO_LINGER 0), as a host that drops the connection does."""
    if writer is None:
        return
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


class FaultProxy:
    """Forwards ``127.0.0.1:port`` to ``upstream()``; :meth:`cut` and :meth:`heal` it.

    ``source`` names the process at the other end of an accepted connection (its peer
    address), for cuts restricted to some processes; ``name`` labels the thread.
    """

    def __init__(
        self,
        upstream: Callable[[], Address] | Address,
        *,
        name: str = "proxy",
        source: Callable[[Address], str | None] | None = None,
    ) -> None:
        self._upstream = upstream if callable(upstream) else (lambda: upstream)
        self._source = source
        self.name = name
        self.port = 0
        self.mode: Mode | None = None  # None: healed
        self.sources: frozenset[str] | None = None  # a cut's processes (None: everyone)
        self._conns: set[_Connection] = set()
        self._server: asyncio.Server | None = None
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=name, daemon=True)

    @property
    def address(self) -> Address:
        return (HOST, self.port)

    # -- commands, from any thread -------------------------------------------------------------
    def start(self) -> FaultProxy:
        self._thread.start()
        self._call(self._listen())
        return self

    def cut(self, mode: Mode = "blackhole", sources: Collection[str] | None = None) -> None:
        """Partition: every connection (or those from ``sources``) as ``mode`` says."""
        if mode not in MODES:
            raise ValueError(f"unknown cut mode {mode!r}: {' or '.join(MODES)}")
        self._call(self._cut(mode, None if sources is None else frozenset(sources)))

    def heal(self) -> None:
        """Forward again; what the cut froze or held is reset, so both ends reconnect."""
        self._call(self._heal())

    def close(self) -> None:
        if not self._thread.is_alive():
            return
        with contextlib.suppress(Exception):
            self._call(self._close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        if not self._thread.is_alive():
            self._loop.close()

    def connections(self) -> int:
        """Connections open through the proxy now (held ones included)."""
        return len(self._conns)

    def _call(self, coro, timeout: float = 10):  # type: ignore[no-untyped-def]
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    # -- on the proxy's loop -------------------------------------------------------------------
    async def _listen(self) -> None:
        self._server = await asyncio.start_server(self._accept, HOST, self.port)
        self.port = self._server.sockets[0].getsockname()[1]

    def _cuts(self, source: str | None) -> bool:
        return self.mode is not None and (self.sources is None or source in self.sources)

    async def _cut(self, mode: Mode, sources: frozenset[str] | None) -> None:
        self.mode, self.sources = mode, sources
        for c in list(self._conns):
            if self._cuts(c.source):
                if mode == "refuse":
                    self._drop(c)
                else:
                    c.flowing.clear()
        if mode == "refuse" and sources is None and self._server is not None:
            self._server.close()  # nothing listens: connecting is refused (ECONNREFUSED)
            self._server = None

    async def _heal(self) -> None:
        for c in list(self._conns):
            if not c.flowing.is_set():
                self._drop(c)
        self.mode, self.sources = None, None
        if self._server is None:
            await self._listen()  # the same port (SO_REUSEADDR)

    async def _close(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        for c in list(self._conns):
            self._drop(c)
        # Every accept and pump ends here, not as a "destroyed but pending" task at exit.
        others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for t in others:
            t.cancel()
        await asyncio.gather(*others, return_exceptions=True)

    def _drop(self, c: _Connection) -> None:
        self._conns.discard(c)
        for t in c.tasks:
            t.cancel()
        c.flowing.set()  # a held accept wakes, sees it was dropped, and ends
        _reset(c.client)
        _reset(c.upstream)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        source = self._source(tuple(peer[:2])) if self._source is not None else None
        c = _Connection(writer, source)
        self._conns.add(c)
        if self._cuts(source):
            if self.mode == "refuse":
                self._drop(c)
                return
            # Blackholed: held, unread, never connected upstream, until heal() resets it.
            await c.flowing.wait()
            if c not in self._conns:
                return
        else:
            c.flowing.set()
        try:
            up_reader, c.upstream = await asyncio.open_connection(*self._upstream())
        except OSError:
            self._drop(c)  # the upstream is down: so is the path through us
            return
        c.tasks = [
            asyncio.ensure_future(self._pump(c, reader, c.upstream)),
            asyncio.ensure_future(self._pump(c, up_reader, writer)),
        ]
        await asyncio.wait(c.tasks, return_when=asyncio.FIRST_COMPLETED)
        if c in self._conns:  # one end closed: close the other, after what is on its way
            self._conns.discard(c)
            for t in c.tasks:
                t.cancel()
            c.client.close()
            c.upstream.close()

    async def _pump(
        self, c: _Connection, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        with contextlib.suppress(OSError, ConnectionError):
            while True:
                data = await reader.read(CHUNK)
                # Frozen by a cut: this chunk (or end of stream) waits, and so does the sender.
                await c.flowing.wait()
                if not data:
                    writer.write_eof()
                    return
                writer.write(data)
                await writer.drain()


# -- which process a loopback connection comes from ----------------------------------------------
def _inode(local: Address) -> int | None:
    """The socket inode of the TCP connection whose local end is ``local`` (IPv4)."""
    ip, port = local
    # The kernel prints the address as a host-order word: little-endian on our machines.
    want = f"{socket.inet_aton(ip)[::-1].hex().upper()}:{port:04X}"
    with contextlib.suppress(OSError), open("/proc/net/tcp") as f:
        next(f)
        for line in f:
            fields = line.split()
            # An earlier connection's TIME_WAIT entry may share the address: it has no inode.
            if fields[1] == want and int(fields[9]):
                return int(fields[9])
    return None


def owner(peer: Address, pids: Mapping[str, int | None]) -> str | None:
    """Which of ``pids`` (name -> pid) holds the client end of a connection from ``peer``, by
    its socket's inode in ``/proc``; None for none of them."""
    inode = _inode(peer)
    if inode is None:
        return None
    link = f"socket:[{inode}]"
    for name, pid in pids.items():
        if not pid:
            continue
        fds = f"/proc/{pid}/fd"
        with contextlib.suppress(OSError):
            for fd in os.listdir(fds):
                with contextlib.suppress(OSError):
                    if os.readlink(f"{fds}/{fd}") == link:
                        return name
    return None
