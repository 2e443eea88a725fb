"""The backlog sender's own process: it sends history answers to consumers' sockets.

The broker hands it, over a Unix SEQPACKET socket, each consumer socket once (SCM_RIGHTS) and
then whole Fetch answers: the response's framing bytes and, for the records, the segment files'
descriptors with a position and a size. Here the bytes of each slice are loaded into the page
cache just before they are sent, a small request at a time (storage/backlog_loader.py, as the
broker's read pool would), and sent with ``sendfile``; the broker hears back when an answer is
out or failed. This process runs in the
idle CPU scheduling class and the idle I/O class, so every byte of history it moves waits for
the broker's event loop, the journal and the producers (see broker/backlog_sender.py for why).

Messages are pickled tuples between two processes of the same broker:
  broker -> here: ("open", conn) + [socket fd]; ("send", conn, job, parts) + [segment fds];
                  ("forget", conn)
  here -> broker: ("done", job, bytes sent, error text or "")
With a byte rate (a fixed fetch.backlog.max_bytes_per_sec), turns are small and spaced so that
the bytes of all connections together go out at that rate.
A part is bytes, or (fd index, path, position, size, file size) for a slice of a segment file.
"""

from __future__ import annotations

import os
import pickle
import selectors
import signal
import socket
import sys
import time
from array import array
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stratalog.broker.cpu_isolation import parse_cpus, pin_this_thread
from stratalog.storage.backlog_loader import BacklogLoader
from stratalog.storage.priority import die_with_parent, lower_this_thread
from stratalog.storage.throttle import PACE_SLACK_S, PACED_TURN_BYTES, ByteRate

MAX_FDS = 64  # descriptors in one message: a socket, or an answer's distinct segment files
MAX_MESSAGE = 1 << 20
TURN_BYTES = 1 << 20  # bytes one connection sends before the next connection's turn
# Bytes one system call sends at most. This kernel does not preempt a task inside a system call
# (PREEMPT_NONE, the usual server build): a 1 MiB sendfile into a loopback socket, which also
# runs the receiver's TCP work, holds its core for a millisecond or more, and the broker's loop
# waking there waits for it whatever this process's priority. Small calls return to user space,
# where the scheduler can switch to the loop, every few tens of microseconds.
SEND_BYTES = 64 * 1024


@dataclass
class _File:
    """What the loader needs of a segment: its path and size."""

    data_path: Path
    size: int


@dataclass
class _Job:
    job: int
    parts: list[Any]
    fds: list[int]
    at: int = 0  # the part being sent
    offset: int = 0  # bytes of it already sent
    sent: int = 0
    # Per file (index into fds): the range last loaded into the page cache for this answer.
    loaded: dict[int, tuple[int, int]] = field(default_factory=dict)


@dataclass
class _Conn:
    fd: int
    jobs: deque[_Job] = field(default_factory=deque)
    waiting: bool = False  # registered for writability


class Sender:
    def __init__(self, control: socket.socket, io_bytes: int, rate: int = 0) -> None:
        self.control = control
        self.rate = rate  # bytes per second over all connections; 0: as fast as they take
        self.pace = ByteRate(rate)
        self.loader = BacklogLoader(io_bytes, 1)
        self.conns: dict[int, _Conn] = {}
        self.ready: deque[int] = deque()  # connections with an answer to send and room for it
        self.sel = selectors.DefaultSelector()
        self.sel.register(control, selectors.EVENT_READ, None)

    def run(self) -> None:
        while True:
            timeout = None
            if self.ready:
                timeout = self._ahead()  # 0 when unpaced
            for key, _ in self.sel.select(timeout):
                if key.data is None:
                    if not self._receive():
                        return  # the broker closed its end: it is stopping or gone
                else:
                    conn = self.conns.get(key.data)
                    if conn is not None and conn.waiting:
                        self.sel.unregister(conn.fd)
                        conn.waiting = False
                        self.ready.append(key.data)
            for _ in range(len(self.ready)):
                if self._ahead() > 0:
                    break  # the others wait for the rate, in their order
                cid = self.ready.popleft()
                conn = self.conns.get(cid)
                if conn is not None and conn.jobs and not conn.waiting:
                    self._turn(cid, conn)

    def _ahead(self) -> float:
        """Seconds the next turn must wait for the rate (0: it may go now)."""
        return max(0.0, self.pace.due_in(time.monotonic()) - PACE_SLACK_S)

    # -- from the broker -------------------------------------------------------------------------
    def _receive(self) -> bool:
        while True:
            try:
                # (socket.recv_fds drops its flags argument in Python 3.11.)
                data, ancillary, _flags, _addr = self.control.recvmsg(
                    MAX_MESSAGE, socket.CMSG_SPACE(MAX_FDS * 4), socket.MSG_DONTWAIT
                )
            except BlockingIOError:
                return True
            fds = array("i")
            for level, kind, payload in ancillary:
                if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                    fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
            if not data:
                for fd in fds:
                    os.close(fd)
                return False
            fds = list(fds)
            msg = pickle.loads(data)
            kind, cid = msg[0], msg[1]
            if kind == "open":
                self._forget(cid)
                self.conns[cid] = _Conn(fds[0])
            elif kind == "send":
                conn = self.conns.get(cid)
                job = _Job(msg[2], msg[3], fds)
                if conn is None:
                    self._finish(job, "the connection is not known here")
                    continue
                conn.jobs.append(job)
                if len(conn.jobs) == 1 and not conn.waiting:
                    self.ready.append(cid)
            elif kind == "forget":
                self._forget(cid)

    def _forget(self, cid: int) -> None:
        conn = self.conns.pop(cid, None)
        if conn is None:
            return
        if conn.waiting:
            self.sel.unregister(conn.fd)
        for job in conn.jobs:
            self._finish(job, "the connection was closed")
        os.close(conn.fd)

    # -- to the consumer -------------------------------------------------------------------------
    def _turn(self, cid: int, conn: _Conn) -> None:
        """Send up to a turn's bytes of this connection's answers; then it waits for its next
        turn, or for room in its socket. Under a rate, the next turn of any connection waits
        until the bytes of this one have had their time."""
        turn = PACED_TURN_BYTES if self.rate > 0 else TURN_BYTES
        left = self._send_turn(cid, conn, turn)
        self.pace.reserve(turn - left)

    def _send_turn(self, cid: int, conn: _Conn, budget: int) -> int:
        """The turn's sending; returns the bytes of ``budget`` not used."""
        while conn.jobs and budget > 0:
            job = conn.jobs[0]
            try:
                budget, blocked = self._send(conn.fd, job, budget)
            except OSError as e:
                # Part of the answer may be out: nothing valid can follow on this socket.
                conn.jobs.popleft()
                self._finish(job, f"{type(e).__name__}: {e}")
                for rest in conn.jobs:
                    self._finish(rest, "an earlier answer failed")
                conn.jobs.clear()
                return budget
            if blocked:
                conn.waiting = True
                self.sel.register(conn.fd, selectors.EVENT_WRITE, cid)
                return budget
            if job.at == len(job.parts):
                conn.jobs.popleft()
                self._finish(job, "")
        if conn.jobs:
            self.ready.append(cid)
        return budget

    def _load(self, job: _Job, i: int, path: str, file_size: int, at: int, want: int) -> None:
        """Make sure ``[at, at + want)`` of file ``i`` is in the page cache before it is sent,
        loading from ``at`` one loader request's worth (or ``want``) at a time. Loaded just in
        time, never a whole answer first: that held every other connection's turns for the
        hundreds of milliseconds a large answer takes to read, and under a rate its turns
        waited meanwhile (two readers of 32 MiB answers drained 71-79 MB/s of a 120-150 MB/s
        budget from a 200 MB/s device)."""
        lo, hi = job.loaded.get(i, (0, 0))
        if lo <= at and at + want <= hi:
            return
        end = min(file_size, at + max(want, self.loader.io_bytes))
        self.loader.load(_File(Path(path), file_size), at, end)
        job.loaded[i] = (at, end)

    def _send(self, fd: int, job: _Job, budget: int) -> tuple[int, bool]:
        """Send parts of ``job`` until ``budget`` is spent, the job is done, or the socket is
        full; returns (budget left, whether the socket is full)."""
        parts = job.parts
        while job.at < len(parts) and budget > 0:
            p = parts[job.at]
            try:
                if isinstance(p, tuple):
                    i, path, position, size, file_size = p
                    want = min(size - job.offset, budget, SEND_BYTES)
                    self._load(job, i, path, file_size, position + job.offset, want)
                    n = os.sendfile(fd, job.fds[i], position + job.offset, want)
                    if n == 0:
                        raise OSError(f"segment file ended at {position + job.offset}")
                else:
                    size = len(p)
                    end = job.offset + min(budget, SEND_BYTES)
                    n = os.write(fd, memoryview(p)[job.offset : end])
            except (BlockingIOError, InterruptedError):
                return budget, True
            job.offset += n
            job.sent += n
            budget -= n
            if job.offset == size:
                job.at += 1
                job.offset = 0
        return budget, False

    def _finish(self, job: _Job, error: str) -> None:
        for fd in job.fds:
            os.close(fd)
        job.fds = []
        self.control.sendall(pickle.dumps(("done", job.job, job.sent, error)))


def main(argv: list[str]) -> None:
    control_fd, parent, priority = int(argv[0]), int(argv[1]), argv[2]
    io_bytes, rate = int(argv[3]), int(argv[4])
    cpus = parse_cpus(argv[5]) if len(argv) > 5 else frozenset()
    if not die_with_parent(parent):  # never outlive the broker, even after kill -9
        return
    if cpus:
        pin_this_thread(cpus, "the backlog sender")  # off the broker's own CPUs
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the broker decides when this one stops
    if priority != "normal":
        lower_this_thread(sched_idle=priority == "idle")
    control = socket.socket(fileno=control_fd)
    Sender(control, io_bytes, rate).run()


if __name__ == "__main__":
    main(sys.argv[1:])
