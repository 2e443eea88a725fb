"""The machine's own limits, measured before the workloads so their numbers have a ceiling.

:func:`measure_limits` measures, on the filesystem holding ``data_dir`` (in a temporary
subdirectory that is deleted afterwards), with Debian's fio (``/usr/bin/fio``, ``make bench-deps``):

* ``fdatasync_1m``: sequential 1 MiB writes, fdatasync after each (the shape of a log that
  syncs every MiB): MB/s;
* ``direct_write``: sequential 1 MiB O_DIRECT writes (page cache bypassed, fsync at the end):
  MB/s, or ``supported: False`` with the reason when the filesystem refuses O_DIRECT;
* ``write_4k_fdatasync``: 4 KiB write + fdatasync, one at a time: latency and IOPS;
* ``seq_read``: buffered sequential 1 MiB reads of a file dropped from the page cache: MB/s;
* ``fdatasync_under_reads``: the fdatasync latency of the above while a sequential reader keeps
  16 MiB in flight on the same disk, in the default and in the idle I/O class;

and, without fio, ``loopback``: TCP throughput over 127.0.0.1 between two threads (sendall and
recv_into release the GIL) with 1 MiB buffers: GB/s. Plus ``facts`` about the machine.

MB and GB are 10^6 and 10^9 bytes, as in the workload results. Every fio job is bounded by size
and by ``--runtime``, and the process by a hard timeout.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

FIO = Path("/usr/bin/fio")
NO_FIO = "fio is not installed (make bench-deps)"
MIB = 1024 * 1024


def measure_limits(data_dir: Path, quick: bool = False) -> dict[str, Any]:
    """Measure the disk under ``data_dir`` and the loopback; never raises for one failed measure.

    Returns::

        {"data_dir": str, "quick": bool,
         "facts": {"filesystem", "cpu", "cpus", "memory_gib", "kernel", "fio"},
         "fdatasync_1m": {"mb_per_s", "bytes", "seconds"},
         "direct_write": {"supported": True, "mb_per_s", "bytes", "seconds"}
                       | {"supported": False, "error": why},
         "seq_read": {"mb_per_s", "bytes", "seconds"},   # buffered, page cache dropped first
         "write_4k_fdatasync": {"p50_ms", "p99_ms", "p99.9_ms",   # write + fdatasync
                                "iops", "mean_ms", "ops",
                                "write": {"p50_ms", "p99_ms", "p99.9_ms", "mean_ms"},
                                "fdatasync": {same keys}, "note"},
         "fdatasync_under_reads": {"reader_default" | "reader_idle":
                                   {"fdatasync": {"p50_ms", ...}, "read_mb_per_s"}},
         "loopback": {"gb_per_s", "bytes", "seconds"}}

    A measurement that could not run is ``{"error": "..."}`` instead (fio missing: every fio
    entry says ``"fio is not installed (make bench-deps)"``).
    """
    data_dir = Path(data_dir)
    data_dir.mkdir(parents=True, exist_ok=True)
    out: dict[str, Any] = {"data_dir": str(data_dir), "quick": quick}
    out["facts"] = machine_facts(data_dir)
    work = Path(tempfile.mkdtemp(prefix="stratalog-limits-", dir=data_dir))
    try:
        if not FIO.exists():
            for key in (
                "fdatasync_1m",
                "direct_write",
                "write_4k_fdatasync",
                "seq_read",
                "fdatasync_under_reads",
            ):
                out[key] = {"error": NO_FIO}
        else:
            seq = (128 if quick else 1024) * MIB
            runtime = 10 if quick else 60
            out["fdatasync_1m"] = _guard(seq_fdatasync, work, seq, runtime)
            out["direct_write"] = _guard(
                direct_write, work, seq, runtime, out["facts"].get("filesystem", "")
            )
            out["seq_read"] = _guard(seq_read, work, seq, runtime)
            out["write_4k_fdatasync"] = _guard(
                write_4k_fdatasync, work, (4 if quick else 64) * MIB, 5 if quick else 30
            )
            out["fdatasync_under_reads"] = _guard(
                fdatasync_under_reads, work, seq, 3 if quick else 10
            )
        out["loopback"] = _guard(
            loopback_tcp, 1.0 if quick else 3.0, (4 if quick else 32) * 1024 * MIB
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return out


def _guard(fn: Any, *args: Any) -> dict[str, Any]:
    try:
        return fn(*args)
    except Exception as e:  # reported in the result, the other measures still run
        return {"error": f"{type(e).__name__}: {e}"}


# ------------------------------------------------------------------------------------------------
# fio
# ------------------------------------------------------------------------------------------------


class FioError(RuntimeError):
    pass


def run_fio(work: Path, name: str, runtime_s: int, **opts: Any) -> dict[str, Any]:
    """One fio job on a file in ``work``; its JSON "jobs[0]". The file is deleted afterwards."""
    return run_fio_jobs(work, name, runtime_s, **opts)[0]


def run_fio_jobs(
    work: Path, name: str, runtime_s: int, beside: dict[str, Any] | None = None, **opts: Any
) -> list[dict[str, Any]]:
    """``run_fio``, with ``beside``: the options of a second job run at the same time on its
    own file (a load); returns every job's JSON."""
    path = work / f"fio-{name}.dat"
    other = work / f"fio-{name}-beside.dat"
    cmd = [
        str(FIO),
        f"--name={name}",
        f"--filename={path}",
        "--output-format=json",
        f"--runtime={runtime_s}",  # size-bounded job, cut short by time if the disk is slow
        "--ioengine=sync",
        "--iodepth=1",
        "--numjobs=1",
    ]
    cmd += [f"--{k}={v}" for k, v in opts.items()]
    if beside is not None:
        cmd += [f"--name={name}-beside", f"--filename={other}", f"--runtime={runtime_s}"]
        cmd += [f"--{k}={v}" for k, v in beside.items()]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=runtime_s + 120)
    except subprocess.TimeoutExpired as e:
        raise FioError(f"fio {name} did not finish within {runtime_s + 120}s") from e
    finally:
        path.unlink(missing_ok=True)
        other.unlink(missing_ok=True)
    jobs: list[dict[str, Any]] = []
    try:
        # fio may print notes before the JSON document.
        doc = json.loads(proc.stdout[proc.stdout.index("{") :])
        jobs = list(doc["jobs"])
    except (ValueError, KeyError, IndexError):
        pass
    failed = next((j for j in jobs if j.get("error")), None)
    if proc.returncode != 0 or not jobs or failed is not None:
        msg = (proc.stderr or proc.stdout).strip().splitlines()
        detail = msg[-1] if msg else f"status {proc.returncode}"
        if failed is not None:
            detail = f"{detail} (error {failed['error']}: {os.strerror(failed['error'])})"
        raise FioError(f"fio {name} failed: {detail}")
    return jobs


def _rate(job: dict[str, Any], way: str = "write") -> dict[str, Any]:
    w = job[way]
    seconds = w["runtime"] / 1000.0
    return {"mb_per_s": w["bw_bytes"] / 1e6, "bytes": int(w["io_bytes"]), "seconds": seconds}


def seq_fdatasync(work: Path, size: int, runtime_s: int) -> dict[str, Any]:
    job = run_fio(work, "seq-fdatasync", runtime_s, rw="write", bs="1m", size=size, fdatasync=1)
    return _rate(job)


def seq_read(work: Path, size: int, runtime_s: int) -> dict[str, Any]:
    """Buffered sequential read of a file dropped from the page cache first (fio's invalidate),
    in 1 MiB reads: what a catch-up of cold history can read at most."""
    job = run_fio(work, "seq-read", runtime_s, rw="read", bs="1m", size=size, invalidate=1)
    return _rate(job, "read")


def direct_write(work: Path, size: int, runtime_s: int, fstype: str = "") -> dict[str, Any]:
    why = o_direct_refused(work)
    if why:
        return {"supported": False, "error": f"O_DIRECT is refused on {fstype or 'this fs'}: {why}"}
    try:
        job = run_fio(
            work, "direct", runtime_s, rw="write", bs="1m", size=size, direct=1, end_fsync=1
        )
    except FioError as e:
        if "Invalid argument" in str(e) or "error 22" in str(e):
            return {"supported": False, "error": f"O_DIRECT is refused on {fstype}: {e}"}
        raise
    return {"supported": True, **_rate(job)}


def o_direct_refused(work: Path) -> str:
    """Why an aligned O_DIRECT write fails here ("" when it works): tmpfs and some overlay
    filesystems answer EINVAL."""
    import mmap

    flag = getattr(os, "O_DIRECT", 0)
    if not flag:
        return "this platform has no O_DIRECT"
    path = work / "o_direct.probe"
    buf = mmap.mmap(-1, 4096)  # page-aligned memory, as O_DIRECT wants
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | flag, 0o600)
        try:
            os.write(fd, buf)
        finally:
            os.close(fd)
    except OSError as e:
        return e.strerror or str(e)
    finally:
        buf.close()
        path.unlink(missing_ok=True)
    return ""


def _pcts(lat: dict[str, Any]) -> dict[str, float]:
    """p50/p99/p99.9/mean in ms from a fio latency block (ns)."""
    p = lat.get("percentile") or {}
    return {
        "p50_ms": p.get("50.000000", 0) / 1e6,
        "p99_ms": p.get("99.000000", 0) / 1e6,
        "p99.9_ms": p.get("99.900000", 0) / 1e6,
        "mean_ms": float(lat.get("mean", 0.0)) / 1e6,
    }


def write_4k_fdatasync(work: Path, size: int, runtime_s: int) -> dict[str, Any]:
    job = run_fio(
        work,
        "write-4k-fdatasync",
        runtime_s,
        rw="write",
        bs="4k",
        size=size,
        fdatasync=1,
        percentile_list="50:99:99.9",
    )
    w = job["write"]
    write = _pcts(w["clat_ns"])
    sync = _pcts(job["sync"]["lat_ns"])
    ops = int(w["total_ios"])
    # fio times the write and the fdatasync separately; the job's runtime holds both, so IOPS and
    # the mean per operation are exact, while the combined percentiles are sums of the two.
    iops = float(w["iops"])
    return {
        "p50_ms": write["p50_ms"] + sync["p50_ms"],
        "p99_ms": write["p99_ms"] + sync["p99_ms"],
        "p99.9_ms": write["p99.9_ms"] + sync["p99.9_ms"],
        "iops": iops,
        "mean_ms": 1000.0 / iops if iops else 0.0,
        "ops": ops,
        "write": write,
        "fdatasync": sync,
        "note": "write + fdatasync percentiles are the sums of fio's write and sync percentiles",
    }


def fdatasync_under_reads(work: Path, size: int, runtime_s: int) -> dict[str, Any]:
    """4 KiB write + fdatasync latency while a sequential reader keeps 16 MiB of reads in
    flight on the same disk (as a catch-up consumer's read-ahead does), with the reader in the
    default I/O class and then in the idle class (``storage.read_priority=low``)."""
    out: dict[str, Any] = {}
    for label, reader_class in (("reader_default", None), ("reader_idle", 3)):
        reader: dict[str, Any] = dict(
            rw="read", bs="1m", size=size, direct=1, ioengine="libaio", iodepth=16, time_based=1
        )
        if reader_class is not None:
            reader["prioclass"] = reader_class
        jobs = run_fio_jobs(
            work,
            f"sync-{label}",
            runtime_s,
            beside=reader,
            rw="write",
            bs="4k",
            size=16 * MIB,
            fdatasync=1,
            time_based=1,
            percentile_list="50:99:99.9",
        )
        out[label] = {
            "fdatasync": _pcts(jobs[0]["sync"]["lat_ns"]),
            "read_mb_per_s": _rate(jobs[1], "read")["mb_per_s"],
        }
    return out


# ------------------------------------------------------------------------------------------------
# Loopback TCP
# ------------------------------------------------------------------------------------------------


def loopback_tcp(duration_s: float = 3.0, max_bytes: int = 32 * 1024 * MIB) -> dict[str, Any]:
    """One sender and one receiver thread over 127.0.0.1 with 1 MiB buffers, for ``duration_s``
    or ``max_bytes``, whichever comes first; the rate is measured at the receiver."""
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    srv.settimeout(10)
    port = srv.getsockname()[1]
    got: dict[str, Any] = {}

    def receive() -> None:
        try:
            conn, _ = srv.accept()
        except OSError as e:
            got["error"] = str(e)
            return
        with conn:
            conn.settimeout(duration_s + 30)
            buf = memoryview(bytearray(MIB))
            total = 0
            t0 = 0.0
            try:
                while True:
                    n = conn.recv_into(buf)
                    if not n:
                        break
                    if not t0:
                        t0 = time.perf_counter()
                    total += n
            except OSError as e:
                got["error"] = str(e)
            got.update(bytes=total, seconds=time.perf_counter() - t0 if t0 else 0.0)

    rx = threading.Thread(target=receive, daemon=True)
    rx.start()
    payload = os.urandom(MIB)
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            sent = 0
            deadline = time.perf_counter() + duration_s
            while sent < max_bytes and time.perf_counter() < deadline:
                s.sendall(payload)
                sent += MIB
    finally:
        rx.join(duration_s + 40)
        srv.close()
    if "error" in got:
        raise RuntimeError(f"loopback receiver: {got['error']}")
    if not got.get("seconds"):
        raise RuntimeError("loopback: nothing was received")
    return {
        "gb_per_s": got["bytes"] / got["seconds"] / 1e9,
        "bytes": got["bytes"],
        "seconds": got["seconds"],
    }


# ------------------------------------------------------------------------------------------------
# Facts
# ------------------------------------------------------------------------------------------------


def filesystem_of(path: Path) -> str:
    """``<fstype> (<device> on <mount point>)`` for the mount holding ``path``."""
    real = os.path.realpath(path)
    best: tuple[str, str, str] | None = None
    try:
        lines = Path("/proc/mounts").read_text().splitlines()
    except OSError:
        lines = []
    for line in lines:
        parts = line.split()
        if len(parts) < 3:
            continue
        dev, mnt, fstype = parts[0], parts[1].replace("\\040", " "), parts[2]
        inside = real == mnt or real.startswith(mnt.rstrip("/") + "/")
        if inside and (best is None or len(mnt) >= len(best[1])):
            best = (dev, mnt, fstype)
    if best is None:
        try:
            return subprocess.run(
                ["stat", "-f", "-c", "%T", real], capture_output=True, text=True, timeout=10
            ).stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            return "unknown"
    return f"{best[2]} ({best[0]} on {best[1]})"


def machine_facts(data_dir: Path) -> dict[str, Any]:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem_gib = 0.0
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_gib = round(int(line.split()[1]) / (1024 * 1024), 1)
                break
    except OSError:
        pass
    fio = "not installed"
    if FIO.exists():
        try:
            fio = subprocess.run(
                [str(FIO), "--version"], capture_output=True, text=True, timeout=10
            ).stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            fio = "?"
    return {
        "filesystem": filesystem_of(data_dir),
        "cpu": cpu,
        "cpus": len(os.sched_getaffinity(0)),
        "memory_gib": mem_gib,
        "kernel": platform.release(),
        "fio": fio,
    }
