"""The broker's receive path over TLS against plaintext, in CPU seconds per GB.

``python -m stratalog.bench.tls_read_probe [--mb 400] [--rounds 3]`` serves one connection on
uvloop, as the Kafka listener does, and times the server process's own CPU (getrusage) while a
client process pushes size-prefixed frames of 1 MiB at it: through a plain socket, through TLS
into a plain protocol (data_received: the transport's copies), and through TLS into a buffered
protocol (get_buffer/buffer_updated: ``TlsClientConnection``'s way), and, for comparison, through
TLS read by a thread of its own off the event loop (``tls-thread``: a design not in the broker).
Both the process's CPU and the event-loop thread's are reported. The server frames the bytes
with the broker's own ``KafkaConnection`` and touches nothing else, so the figures are the
transport's and TLS's share of a produce, without storage. CPU time, unlike throughput, holds
on a machine shared with other work. Certificates: ``make_test_certificates``; TLS 1.3 with
what OpenSSL negotiates (reported).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import select
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

FRAME = 1 << 20


def _cpu(who: int = resource.RUSAGE_SELF) -> float:
    r = resource.getrusage(who)
    return r.ru_utime + r.ru_stime


class _Sink:
    """Frames the bytes as the broker does and counts them."""

    def __init__(self, done: asyncio.Future, want: int) -> None:
        from stratalog.protocol.connection import NEED_DATA, KafkaConnection

        self._conn = KafkaConnection(2 * FRAME)
        self._need = NEED_DATA
        self._done = done
        self._want = want
        self.frames = 0

    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data) -> None:
        self._conn.receive_data(data)
        while (frame := self._conn.next_frame()) is not self._need:
            self.frames += 1
            del frame
        if self.frames >= self._want and not self._done.done():
            self._done.set_result(None)

    def eof_received(self):
        return None

    def connection_lost(self, exc) -> None:
        if not self._done.done():
            self._done.set_result(None)


class _BufferedSink(_Sink):
    def get_buffer(self, sizehint: int) -> memoryview:
        self._rbuf = bytearray(max(sizehint, 16 * 1024))
        return memoryview(self._rbuf)

    def buffer_updated(self, nbytes: int) -> None:
        buf, self._rbuf = self._rbuf, None
        self.data_received(memoryview(buf)[:nbytes].toreadonly())


_CLIENT = r"""
import socket, ssl, sys
port, frames, ca = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
frame = (1 << 20).to_bytes(4, "big") + bytes(range(256)) * 4096
s = socket.create_connection(("127.0.0.1", port))
if ca:
    s = ssl.create_default_context(cafile=ca).wrap_socket(s, server_hostname="127.0.0.1")
    print(s.version(), s.cipher()[0], flush=True)
for _ in range(frames):
    s.sendall(frame)
s.recv(1)
"""


async def _one(mode: str, mb: int, certs: dict[str, Path]) -> tuple[float, float, str]:
    """(process CPU s per GiB, event-loop thread CPU s per GiB, the client's TLS version and
    cipher)."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future = loop.create_future()
    ctx = None
    if mode != "plaintext":
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(str(certs["broker.pem"]))
    kind = _BufferedSink if mode == "tls-buffered" else _Sink
    server = None
    if mode == "tls-thread":
        listening = socket.create_server(("127.0.0.1", 0))
        port = listening.getsockname()[1]
        sink = kind(done, mb)
        threading.Thread(target=_tls_reader, args=(listening, ctx, loop, sink), daemon=True).start()
    else:
        server = await loop.create_server(lambda: kind(done, mb), "127.0.0.1", 0, ssl=ctx)
        port = server.sockets[0].getsockname()[1]
    ca = str(certs["ca.pem"]) if ctx else ""
    client = subprocess.Popen(
        [sys.executable, "-c", _CLIENT, str(port), str(mb), ca], stdout=subprocess.PIPE
    )
    try:
        await asyncio.sleep(0.3)  # connection and handshake out of the timed part
        t0, l0 = _cpu(), _cpu(resource.RUSAGE_THREAD)
        await asyncio.wait_for(done, 600)
        used, on_loop = _cpu() - t0, _cpu(resource.RUSAGE_THREAD) - l0
    finally:
        if server is not None:
            server.close()
        client.kill()
        out = client.communicate()[0].decode().strip()
    gib = mb / 1024
    return used / gib, on_loop / gib, out


def _tls_reader(listening: socket.socket, ctx, loop, sink: _Sink) -> None:
    """TLS off the event loop: a thread reads the socket through OpenSSL (which releases the
    GIL while it reads and decrypts) and hands the plaintext to the loop."""
    conn, _ = listening.accept()
    listening.close()
    size = 256 * 1024
    with ctx.wrap_socket(conn, server_side=True) as tls:
        while True:
            buf = bytearray(size)
            view = memoryview(buf)
            n = tls.recv_into(view)
            # Fill the buffer with what is there already (one TLS record per recv), so the
            # loop is woken once per buffer, not once per 16 KiB record.
            while n and n < size and (tls.pending() or select.select([tls], [], [], 0)[0]):
                got = tls.recv_into(view[n:])
                if not got:
                    break
                n += got
            if not n:
                break
            loop.call_soon_threadsafe(sink.data_received, view[:n].toreadonly())


def main() -> None:
    import uvloop

    from stratalog.security.certs import make_test_certificates

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=int, default=400, help="MiB per measurement")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        certs = make_test_certificates(Path(d))
        modes = ["plaintext", "tls-copied", "tls-buffered", "tls-thread"]
        got: dict[str, list[tuple[float, float]]] = {m: [] for m in modes}
        cipher = ""
        for _ in range(args.rounds):
            for m in modes:  # in turn, so the machine's noise falls on all alike
                total, on_loop, out = uvloop.run(_one(m, args.mb, certs))
                got[m].append((total, on_loop))
                cipher = out or cipher
        print(f"server CPU s per GiB received ({args.mb} MiB x {args.rounds}, {cipher}); "
              f"load average {os.getloadavg()[0]:.1f}")  # fmt: skip
        base = statistics.median(t for t, _ in got["plaintext"])
        for m in modes:
            med = statistics.median(t for t, _ in got[m])
            lmed = statistics.median(x for _, x in got[m])
            runs = ", ".join(f"{t:.2f}/{x:.2f}" for t, x in got[m])
            print(f"{m:13s} process {med:.3f} ({med / base:.2f}x plaintext), event-loop thread "
                  f"{lmed:.3f} s/GiB; runs (process/loop) {runs}")  # fmt: skip


if __name__ == "__main__":
    main()
