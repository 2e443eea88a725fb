"""A large response goes out over several turns of the event loop, never in one go: between its
pieces the loop serves everything else (a Produce, a group commit's completion). Real uvloop, a
real socket pair and a real segment file; the connection under test is the broker's own."""

from __future__ import annotations

import asyncio
import os
import socket

import uvloop

from stratalog.broker import server
from stratalog.broker.server import ClientConnection
from stratalog.storage.partition import FileSlice
from stratalog.storage.segment import Segment


def test_a_large_response_is_sent_in_turns_in_order(tmp_path):
    seg = Segment(tmp_path, 0, create=True)
    file_bytes = os.urandom(900_000)
    seg.write([file_bytes])
    head = os.urandom(300_000)  # a memory part larger than one turn's bytes
    tail = b"end"
    expected = head + file_bytes[1000:801_000] + tail
    turn = server._TURN_BYTES

    async def main() -> tuple[int, bytes, bool]:
        loop = asyncio.get_running_loop()
        # Loopback TCP with buffers that could take the whole response at once: only the
        # turn's budget holds the rest back.
        with socket.create_server(("127.0.0.1", 0)) as srv:
            b = socket.create_connection(srv.getsockname())
            a, _ = srv.accept()
        for sk, opt in ((a, socket.SO_SNDBUF), (b, socket.SO_RCVBUF)):
            sk.setsockopt(socket.SOL_SOCKET, opt, 8 << 20)
        b.setblocking(False)
        conn = ClientConnection(lambda req, c: None, 1 << 20, lambda c: None)
        transport, _ = await loop.connect_accepted_socket(lambda: conn, sock=a)
        seg.acquire()  # the slice's own reference, as a read takes it
        conn._send_parts([head, FileSlice(seg, 1000, 800_000), tail])
        # This turn handed at most one turn's bytes to the socket; the rest waits.
        first = b""
        while True:
            try:
                got = b.recv(1 << 20)
            except BlockingIOError:
                break
            first += got
        waiting = conn._unsent is not None
        out = bytearray(first)
        for _ in range(10_000):
            if len(out) >= len(expected):
                break
            await asyncio.sleep(0)
            try:
                out += b.recv(1 << 20)
            except BlockingIOError:
                pass
        transport.close()
        b.close()
        return len(first), bytes(out), waiting

    first, out, waiting = uvloop.run(main())
    assert 0 < first <= turn
    assert waiting
    assert out == expected
    # The slice's reference was given back exactly once: only the log's own is left.
    assert seg._refs == 1
    seg.close()
