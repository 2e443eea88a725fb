"""How deleting a segment file disturbs the journal's fsyncs on this machine's disk.

A loop of small appends, each followed by ``fdatasync`` (a group commit), runs for a while, and
beside it a thread deletes cached segment-sized files one after another: not at all (the
baseline), with one ``unlink``, or the way the broker's reaper does (``storage/reaper.py``:
renamed, pages dropped, cut a step at a time). On a file system with online discard the
``unlink`` holds the fsyncs that need the journal's next commit; docs/benchmarks.md
("Deleting segments") has the numbers and the command.

    python -m stratalog.bench.deletion_probe --dir /path/on/the/data/disk
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import threading
import time
from pathlib import Path

from stratalog.storage import reaper

MODES = ("none", "unlink", "reaper")


def _make_cached(path: Path, size: int) -> None:
    """A synced file of ``size`` bytes whose pages are in the page cache (a migrated segment)."""
    block = os.urandom(1 << 20)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        left = size
        while left > 0:
            left -= os.write(fd, block[: min(left, len(block))])
        os.fdatasync(fd)
    finally:
        os.close(fd)


def _delete_all(paths: list[Path], mode: str, stop: threading.Event, pause: float) -> None:
    for p in paths:
        if stop.is_set():
            return
        if mode == "unlink":
            p.unlink()
        else:
            reaper._shrink_away(p)
        stop.wait(pause)


def measure(
    directory: Path, mode: str, seconds: float = 8.0, files: int = 12, file_bytes: int = 64 << 20
) -> dict[str, float]:
    """fdatasync latencies (ms) of 16 KiB appends every 2 ms while ``mode`` deletes ``files``
    cached files of ``file_bytes``, one every 0.5 s."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, not {mode!r}")
    with tempfile.TemporaryDirectory(dir=directory) as tmp:
        root = Path(tmp)
        victims = [root / f"{i:020d}.log" for i in range(files if mode != "none" else 0)]
        for p in victims:
            _make_cached(p, file_bytes)
        time.sleep(1.0)  # let the writes settle
        stop = threading.Event()
        deleter = threading.Thread(target=_delete_all, args=(victims, mode, stop, 0.5))
        journal = os.open(root / "journal", os.O_WRONLY | os.O_CREAT, 0o644)
        record = os.urandom(16384)
        lat: list[float] = []
        try:
            deleter.start()
            end = time.monotonic() + seconds
            at = 0
            while time.monotonic() < end:
                at += os.pwrite(journal, record, at)
                t0 = time.perf_counter()
                os.fdatasync(journal)
                lat.append((time.perf_counter() - t0) * 1000)
                time.sleep(0.002)
        finally:
            stop.set()
            deleter.join()
            os.close(journal)
    lat.sort()
    n = len(lat)
    return {
        "fsyncs": n,
        "p50_ms": statistics.median(lat),
        "p99_ms": lat[min(n - 1, int(n * 0.99))],
        "p999_ms": lat[min(n - 1, int(n * 0.999))],
        "max_ms": lat[-1],
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", default=".", help="a directory on the disk to probe")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=8.0)
    args = ap.parse_args(argv)
    print(f"{'mode':8} {'fsyncs':>6} {'p50':>7} {'p99':>7} {'p99.9':>7} {'max':>7}  (ms)")
    for _ in range(args.rounds):
        for mode in MODES:
            r = measure(Path(args.dir), mode, args.seconds)
            print(
                f"{mode:8} {r['fsyncs']:6.0f} {r['p50_ms']:7.2f} {r['p99_ms']:7.2f} "
                f"{r['p999_ms']:7.2f} {r['max_ms']:7.1f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
