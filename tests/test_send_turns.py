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


async def _connected() -> tuple[ClientConnection, asyncio.Transport, socket.socket, socket.socket]:
    """The broker's connection on one end of a loopback TCP pair (the server's socket and the
    client's, non-blocking), with buffers that could take a whole answer at once: only the
    connection's own turns hold bytes back."""
    loop = asyncio.get_running_loop()
    with socket.create_server(("127.0.0.1", 0)) as srv:
        b = socket.create_connection(srv.getsockname())
        a, _ = srv.accept()
    for sk, opt in ((a, socket.SO_SNDBUF), (b, socket.SO_RCVBUF)):
        sk.setsockopt(socket.SOL_SOCKET, opt, 8 << 20)
    b.setblocking(False)
    conn = ClientConnection(lambda req, c: None, 1 << 20, lambda c: None)
    transport, _ = await loop.connect_accepted_socket(lambda: conn, sock=a)
    return conn, transport, a, b


async def _receive(b: socket.socket, size: int, first: bytes = b"") -> bytes:
    """Read from the client's end until ``size`` bytes are in, letting the loop run between
    reads (the connection's later turns); gives up after 10,000 turns."""
    out = bytearray(first)
    for _ in range(10_000):
        if len(out) >= size:
            break
        await asyncio.sleep(0)
        try:
            out += b.recv(1 << 20)
        except BlockingIOError:
            pass
    return bytes(out)


def test_a_large_response_is_sent_in_turns_in_order(tmp_path):
    seg = Segment(tmp_path, 0, create=True)
    file_bytes = os.urandom(900_000)
    seg.write([file_bytes])
    head = os.urandom(300_000)  # a memory part larger than one turn's bytes
    tail = b"end"
    expected = head + file_bytes[1000:801_000] + tail
    turn = server._TURN_BYTES

    async def main() -> tuple[int, bytes, bool]:
        conn, transport, _a, b = await _connected()
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
        out = await _receive(b, len(expected), first)
        transport.close()
        b.close()
        return len(first), out, waiting

    first, out, waiting = uvloop.run(main())
    assert 0 < first <= turn
    assert waiting
    assert out == expected
    # The slice's reference was given back exactly once: only the log's own is left.
    assert seg._refs == 1
    seg.close()


def test_an_answer_of_many_slices_is_corked_and_released(tmp_path):
    """A tail Fetch's answer is one file slice per small batch: they go out corked (TCP_CORK), so
    the client gets full segments instead of one per batch, and the cork is always taken off,
    when the answer went out whole and when its turn's bytes ran out in the middle of it (a
    cork left on would hold the rest of the answer back for 200 ms)."""
    seg = Segment(tmp_path, 0, create=True)
    file_bytes = os.urandom(600_000)
    seg.write([file_bytes])
    # Small batches of another partition between each of ours, as in a virtual log.
    small = [(i * 3000, 1000) for i in range(40)]
    large = [(i * 100_000, 90_000) for i in range(6)]  # 540 KB: more than one turn's bytes

    def answer(spans):
        parts, want = [], b""
        for k, (pos, size) in enumerate(spans):
            head = k.to_bytes(4, "big")
            seg.acquire()
            parts += [head, FileSlice(seg, pos, size)]
            want += head + file_bytes[pos : pos + size]
        return parts, want

    async def main() -> list[tuple[bool, int, bool]]:
        conn, transport, a, b = await _connected()
        seen = []
        for spans in (small, large):
            parts, want = answer(spans)
            before = _segments_out(a)
            conn._send_parts(parts)
            sent = _segments_out(a) - before
            # Right after the call, whether the answer is done or waits for its next turn.
            corked = a.getsockopt(socket.IPPROTO_TCP, socket.TCP_CORK)
            waiting = conn._unsent is not None
            out = await _receive(b, len(want))
            seen.append((waiting, corked, out == want, sent))
        transport.close()
        b.close()
        return seen

    whole, turns = uvloop.run(main())
    (whole_waiting, whole_cork, whole_ok, whole_segments) = whole
    (turns_waiting, turns_cork, turns_ok, _) = turns
    assert not whole_waiting and whole_cork == 0 and whole_ok
    # 80 parts, 42 KB: a few full segments when corked (6 measured), one per part (80)
    # when not (the transport sets TCP_NODELAY).
    assert whole_segments <= 20, whole_segments
    assert turns_waiting and turns_cork == 0 and turns_ok
    assert seg._refs == 1
    seg.close()


def _segments_out(sock: socket.socket) -> int:
    """tcpi_segs_out of the socket's struct tcp_info (Linux 4.2 on): segments it has sent."""
    info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 256)
    return int.from_bytes(info[136:140], "little")
