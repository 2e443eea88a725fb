"""Whether work at idle CPU priority delays a normal-priority thread's wake-ups on this machine.

A thread at normal priority sleeps 2 ms again and again and notes how late it wakes (as the
broker's event loop waits for its next event). Beside it, one process per core runs in
``SCHED_IDLE``, the class the backlog sender and the idle backlog readers use, doing one kind of
work: nothing (the baseline), spinning in user space, or copying over loopback TCP in system
calls of a given size (a sender and a receiver process per core, as the backlog sender and a
reader do). A kernel that preempts inside system calls serves the sleeper at once in every
case; one built ``PREEMPT_NONE`` runs a system call to its end first, so the lateness grows
with the size of the calls. docs/benchmarks.md (e, "History sent by a process of its own")
has the numbers.

    python -m stratalog.bench.preemption_probe [--seconds 8]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import socket
import statistics
import time

MODES = ("none", "spin", "loopback-1m", "loopback-64k")


def _idle() -> None:
    os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))


def _spin(stop) -> None:
    _idle()
    n = 0
    while not stop.is_set():
        for _ in range(100_000):
            n += 1


def _send(stop, sock: socket.socket, chunk: int) -> None:
    _idle()
    data = memoryview(bytes(chunk))
    with sock:
        try:
            while not stop.is_set():
                sock.sendall(data)
        except OSError:
            pass  # the receiver stopped first


def _receive(stop, sock: socket.socket, chunk: int) -> None:
    _idle()
    buf = memoryview(bytearray(chunk))
    with sock:
        sock.settimeout(0.5)
        while not stop.is_set():
            try:
                if sock.recv_into(buf) == 0:
                    return
            except TimeoutError:
                pass


def _loopback_pair() -> tuple[socket.socket, socket.socket]:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    out = socket.create_connection(server.getsockname())
    inp, _ = server.accept()
    server.close()
    return out, inp


def measure(mode: str, seconds: float = 8.0, period: float = 0.002) -> dict[str, float]:
    """How late (ms) a normal thread's ``period`` sleeps end while ``mode`` runs in SCHED_IDLE
    on every core."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, not {mode!r}")
    ctx = multiprocessing.get_context("spawn")
    stop = ctx.Event()
    procs = []
    sockets: list[socket.socket] = []
    if mode != "none":
        for _ in range(os.cpu_count() or 1):
            if mode == "spin":
                procs.append(ctx.Process(target=_spin, args=(stop,), daemon=True))
                continue
            # A sender and a receiver per core, each calling with ``chunk`` bytes at a time.
            chunk = (1 << 20) if mode == "loopback-1m" else (64 << 10)
            out, inp = _loopback_pair()
            procs.append(ctx.Process(target=_send, args=(stop, out, chunk), daemon=True))
            procs.append(ctx.Process(target=_receive, args=(stop, inp, chunk), daemon=True))
            sockets += [out, inp]
        for p in procs:
            p.start()
        for s in sockets:
            s.close()  # the children have their own
        time.sleep(0.5)  # let them start
    late: list[float] = []
    try:
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            t = time.perf_counter()
            time.sleep(period)
            late.append((time.perf_counter() - t - period) * 1000)
    finally:
        stop.set()
        for p in procs:
            p.join(5)
            if p.is_alive():
                p.kill()
                p.join()
    late.sort()
    return {
        "wakeups": len(late),
        "p50_ms": statistics.median(late),
        "p99_ms": late[int(len(late) * 0.99) - 1] if len(late) >= 100 else late[-1],
        "max_ms": late[-1],
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=8.0, help="per kind of work")
    ap.add_argument("--rounds", type=int, default=1, help="rounds over every kind of work")
    args = ap.parse_args(argv)
    print("| round | idle-priority work on every core | wake-ups | late p50 / p99 / max (ms) |")
    print("|---|---|---|---|")
    for r in range(1, args.rounds + 1):
        for mode in MODES:
            m = measure(mode, args.seconds)
            print(
                f"| {r} | {mode} | {m['wakeups']:,} | "
                f"{m['p50_ms']:.3f} / {m['p99_ms']:.3f} / {m['max_ms']:.3f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
