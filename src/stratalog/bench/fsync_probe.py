"""What an fsync costs the event loop that waits for it: through a thread or through io_uring.

An asyncio loop appends 8 KiB to a file and waits for its ``fdatasync``, again and again, 2 ms
apart, and notes the time from asking to the answer running on the loop, as the broker's group
commit does (storage.fsync_via). Beside it, ``busy`` tasks each hold the loop (and the GIL) for
1 ms at a time with a 0.6 ms pause: one leaves the loop idle a third of the time, two leave it
none. Through a thread the fsync's answer needs the GIL twice (to start, and to report), and a
busy loop gives it up only at the interpreter's switch interval; through the ring the kernel
runs the fsync and the loop reads its completion at its next turn. docs/benchmarks.md (e, "The
group commit through io_uring") has the numbers.

    python -m stratalog.bench.fsync_probe [--dir /tmp] [--fsyncs 300] [--rounds 2]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

from stratalog.storage.fsync_ring import FsyncRing


def _spin(ms: float) -> None:
    end = time.perf_counter() + ms / 1000
    while time.perf_counter() < end:
        sum(range(50))


async def _busy(stop: asyncio.Event) -> None:
    while not stop.is_set():
        _spin(1.0)
        await asyncio.sleep(0.0006)


async def _waits(path: str, via: str, busy: int, fsyncs: int) -> list[float]:
    loop = asyncio.get_running_loop()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    ring = FsyncRing() if via == "io_uring" else None
    pool = ThreadPoolExecutor(1)
    stop = asyncio.Event()
    tasks = [asyncio.create_task(_busy(stop)) for _ in range(busy)]
    waits = []
    try:
        for _ in range(fsyncs):
            os.write(fd, b"x" * 8192)
            t0 = time.perf_counter()
            if ring is not None:
                done: asyncio.Future[int] = loop.create_future()
                ring.sync([fd], done.set_result)
                err = await done
                if err:
                    raise OSError(err, os.strerror(err))
            else:
                await loop.run_in_executor(pool, os.fdatasync, fd)
            waits.append(time.perf_counter() - t0)
            await asyncio.sleep(0.002)
    finally:
        stop.set()
        await asyncio.gather(*tasks)
        pool.shutdown()
        if ring is not None:
            ring.close()
        os.close(fd)
    return sorted(waits)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", default=tempfile.gettempdir(), help="where the file is written")
    ap.add_argument("--fsyncs", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    path = os.path.join(args.dir, f"fsync-probe-{os.getpid()}")
    print("busy tasks | via      | wait p50 (ms) | wait p99 (ms)")
    try:
        for busy in (1, 2):
            for _ in range(args.rounds):
                for via in ("thread", "io_uring"):
                    w = asyncio.run(_waits(path, via, busy, args.fsyncs))
                    p50, p99 = w[len(w) // 2] * 1e3, w[int(0.99 * (len(w) - 1))] * 1e3
                    print(f"{busy:10d} | {via:8s} | {p50:13.2f} | {p99:13.2f}", flush=True)
    finally:
        if os.path.exists(path):
            os.unlink(path)


if __name__ == "__main__":
    main()
