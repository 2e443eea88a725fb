"""History answers sent by a process of their own, at idle priority (fetch.backlog.sender=process).

Why: on the project's two cores a catch-up consumer's answers cost the broker CPU on its event
loop (sendfile of every byte, 18% of the loop's samples in py-spy) and in the read pool (loading
the pages). Sent from threads, the same work still ran at the producers' priority and held the
GIL between syscalls; readers' clients at idle priority changed nothing (docs/benchmarks.md, e).
BookKeeper keeps ledger reads apart from the journal with their own threads and disks; in one
Python process the GIL joins everything, so the nearest thing is a second process that the
kernel schedules only when the broker, the journal and the producers have what they need.

The event loop still decodes each Fetch and looks up its chunks (the chunk index lives here);
the answer's framing and the segment descriptors go to the sender process
(broker/backlog_sender_process.py), which loads and sends the bytes and reports back. Until it
does, the connection sends nothing else, so responses stay in request order. If the process
dies, the answers it held fail (their connections are closed; consumers reconnect and fetch
again, nothing is lost) and later answers are sent by the loop as without it.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import pickle
import socket
import subprocess
import sys
from collections import deque
from typing import Any

from stratalog.broker import metrics
from stratalog.broker.backlog_sender_process import MAX_FDS, MAX_MESSAGE
from stratalog.broker.cpu_isolation import format_cpus
from stratalog.storage.partition import FileSlice

log = logging.getLogger(__name__)

_REPORT_BYTES = 4096  # a report from the process is a few dozen bytes
# An answer whose memory parts (framing, records from the tail cache) exceed this is sent by
# the loop: the sender's messages carry them whole.
MAX_MEMORY_BYTES = 256 * 1024


class BacklogAnswer(list):
    """A Fetch answer of history for the sender process; ``sender`` takes it."""

    __slots__ = ("sender",)

    def __init__(self, parts: list, sender: BacklogSender) -> None:
        super().__init__(parts)
        self.sender = sender


class BacklogSender:
    def __init__(
        self, priority: str, io_bytes: int, rate: int = 0, cpus: frozenset[int] = frozenset()
    ) -> None:
        self.priority = priority
        self.cpus = cpus  # where the process runs (fetch.backlog.sender_cpus); empty: anywhere
        self.rate = rate  # bytes per second the process sends history at; 0: unlimited
        self.io_bytes = io_bytes
        self.proc: subprocess.Popen | None = None
        self._control: socket.socket | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ids = itertools.count(1)
        self._conns: dict[int, int] = {}  # id(connection) -> the id the process knows it by
        self._jobs: dict[int, tuple[asyncio.Future, list[FileSlice]]] = {}
        self._outbox: deque[tuple[bytes, list[int]]] = deque()
        self.alive = False

    # -- life cycle ----------------------------------------------------------------------------
    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        with contextlib.suppress(OSError):
            ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, MAX_MESSAGE * 2)
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "stratalog.broker.backlog_sender_process",
                str(theirs.fileno()),
                str(os.getpid()),
                self.priority,
                str(self.io_bytes),
                str(self.rate),
                format_cpus(self.cpus),
            ],
            pass_fds=[theirs.fileno()],
        )
        theirs.close()
        ours.setblocking(False)
        self._control = ours
        self._loop.add_reader(ours.fileno(), self._receive)
        self.alive = True
        log.info(
            "backlog sender started (pid %d, priority %s, %s)",
            self.proc.pid,
            self.priority,
            f"{self.rate} bytes/s" if self.rate > 0 else "unpaced",
        )

    def close(self) -> None:
        self._stop("the broker is stopping")
        if self.proc is not None:
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.proc = None

    def _stop(self, why: str) -> None:
        if self._control is not None:
            assert self._loop is not None
            with contextlib.suppress(RuntimeError):  # the loop is closed already
                self._loop.remove_reader(self._control.fileno())
                self._loop.remove_writer(self._control.fileno())
            self._control.close()  # the process sees the end of its socket and exits
            self._control = None
        self.alive = False
        self._outbox.clear()
        jobs, self._jobs = self._jobs, {}
        for fut, slices in jobs.values():
            _release(slices)
            if not fut.done():
                fut.set_result(why)
        self._conns.clear()

    # -- answers ---------------------------------------------------------------------------------
    def takes(self, parts: list) -> bool:
        """Whether the process can send this answer: every slice is a local file, the memory
        parts are small, and there are at most MAX_FDS distinct files."""
        if not self.alive:
            return False
        memory = 0
        files = set()
        for p in parts:
            if isinstance(p, FileSlice):
                if p.segment.data_path is None:
                    return False
                files.add(id(p.segment))
            else:
                memory += len(p)
        return memory <= MAX_MEMORY_BYTES and len(files) <= MAX_FDS

    def send(self, conn: Any, sock_fd: int, parts: list) -> asyncio.Future | None:
        """Hand ``parts`` (their slices' references included) to the process; the future's
        result is "" once every byte is out, or why not. None: the process is gone, and the
        caller sends the answer itself."""
        if not self.alive or sock_fd < 0:
            return None
        cid = self._conns.get(id(conn))
        if cid is None:
            cid = self._conns[id(conn)] = next(self._ids)
            self._post(("open", cid), [sock_fd])
        job = next(self._ids)
        fds: list[int] = []
        index: dict[int, int] = {}
        desc: list[Any] = []
        slices: list[FileSlice] = []
        for p in parts:
            if isinstance(p, FileSlice):
                i = index.get(id(p.segment))
                if i is None:
                    try:
                        fd = p.segment.fd
                    except OSError:
                        return None  # sent by the loop, which reports the failure
                    i = index[id(p.segment)] = len(fds)
                    fds.append(fd)
                desc.append((i, str(p.segment.data_path), p.position, p.size, p.segment.size))
                slices.append(p)
            else:
                desc.append(bytes(p))
        fut = self._loop.create_future()  # type: ignore[union-attr]
        self._jobs[job] = (fut, slices)
        self._post(("send", cid, job, desc), fds)
        return fut

    def forget(self, conn: Any) -> None:
        """The connection is closed: the process closes its descriptor of the socket."""
        cid = self._conns.pop(id(conn), None)
        if cid is not None and self.alive:
            self._post(("forget", cid), [])

    # -- the control socket ----------------------------------------------------------------------
    def _post(self, msg: tuple, fds: list[int]) -> None:
        self._outbox.append((pickle.dumps(msg), fds))
        if len(self._outbox) == 1:
            self._drain()

    def _drain(self) -> None:
        control = self._control
        if control is None:
            return
        while self._outbox:
            data, fds = self._outbox[0]
            try:
                socket.send_fds(control, [data], fds)
            except BlockingIOError:
                # The process is behind (it runs at idle priority): the rest waits for room.
                assert self._loop is not None
                self._loop.add_writer(control.fileno(), self._drain)
                return
            except OSError as e:
                self._died(f"cannot reach the backlog sender: {e}")
                return
            self._outbox.popleft()
        if self._loop is not None:
            self._loop.remove_writer(control.fileno())

    def _receive(self) -> None:
        control = self._control
        while control is not None:
            try:
                data = control.recv(_REPORT_BYTES)
            except BlockingIOError:
                return
            except OSError as e:
                self._died(f"backlog sender: {e}")
                return
            if not data:
                self._died("the backlog sender exited")
                return
            _kind, job, sent, error = pickle.loads(data)
            entry = self._jobs.pop(job, None)
            if entry is None:
                continue
            fut, slices = entry
            _release(slices)
            metrics.FETCH_SENDER_BYTES.inc(sent)
            if not fut.done():
                fut.set_result(error)

    def _died(self, why: str) -> None:
        log.error("%s; its answers in flight fail, the event loop sends the next ones", why)
        self._stop(why)


def _release(slices: list[FileSlice]) -> None:
    for s in slices:
        s.release()
