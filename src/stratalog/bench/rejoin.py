"""A rejoining replica's catch-up on a three-broker cluster, against the disk's sequential read.

One trial: stop one broker cleanly (as a rolling restart does), wait until it has left every
in-sync set, write ``rejoin_bytes`` with the lab's producers (``acks=all``: the two others hold
it), drop the live replicas' files from the page cache (a replica that was away for long catches
up from the disk), read a fresh file of the same size once to time the disk, restart the
broker and follow the cluster's metadata until the broker is back in every partition's in-sync
set. The catch-up rate is the bytes written while it was away over the time from the broker's
reappearance in the metadata (it is registered and can fetch) to its return to the in-sync
sets; the rate from the restart command, process start included, is kept beside it.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from stratalog.bench.cluster_targets import ClusterTarget
from stratalog.bench.workload import Workload

Progress = Callable[[str, int, int, int], None]
MIB = 1 << 20
RESTART_TIMEOUT_S = 300.0  # a restart and its catch-up of a few GB, with a JVM's start


def drop_from_page_cache(path: Path) -> str:
    """Make the next read of ``path`` come from the device; returns how. As root the whole page
    cache is dropped (``/proc/sys/vm/drop_caches``); otherwise, or where that file cannot be
    written (a container), the file's pages are dropped with posix_fadvise DONTNEED."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)  # dirty pages cannot be dropped
        if os.geteuid() == 0:
            try:
                os.sync()
                with open("/proc/sys/vm/drop_caches", "w") as f:
                    f.write("1\n")
                return "drop_caches"
            except OSError:
                pass
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        return "fadvise_dontneed"
    finally:
        os.close(fd)


def sequential_read(directory: Path, nbytes: int) -> dict[str, Any]:
    """Write a fresh file of ``nbytes`` under ``directory``, drop it from the page cache, and
    time one plain sequential read of it in 1 MiB reads: the disk's rate for a catch-up."""
    path = directory / "seq-read-probe"
    block = os.urandom(MIB)
    try:
        with open(path, "wb", buffering=0) as f:
            left = nbytes
            while left > 0:
                left -= f.write(block[: min(MIB, left)])
        how = drop_from_page_cache(path)
        buf = bytearray(MIB)
        view = memoryview(buf)
        got = 0
        t0 = time.perf_counter()
        with open(path, "rb", buffering=0) as f:
            while n := f.readinto(view):
                got += n
        secs = time.perf_counter() - t0
    finally:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
    return {"bytes": got, "seconds": secs, "mb_per_s": got / 1e6 / secs, "cache_drop": how}


def run_rejoin(
    w: Workload,
    target: ClusterTarget,
    progress: Progress,
    log: Callable[[str], None],
) -> dict[str, Any]:
    from stratalog.bench.catchup import evict_page_cache
    from stratalog.bench.load import producer_jobs, run_load

    trials: list[dict[str, Any]] = []
    records = max(1, w.rejoin_bytes // w.record_size)
    for i in range(w.rejoin_trials):
        topic = f"bench-{w.name}-{i}"
        target.create_topics([topic], w.partitions)
        target.wait_all_in_sync(topic)
        away = target.brokers[i % len(target.brokers)]
        node = target.node_id(away)
        target.stop_broker(away)
        if target.wait_in_sync(topic, node, want=False, timeout=60) is None:
            raise RuntimeError(f"{target.name}: {away} stayed in the in-sync sets after its stop")
        jobs = producer_jobs(w, [topic], None, records)
        for job in jobs:
            job.extra = {"log_level": 0}  # the stopped broker in the bootstrap list refuses
        load = run_load(
            target,
            jobs,
            [],
            label=f"{w.name} · {target.name} · write {i + 1} while {away} is away",
            progress=progress,
        )
        if load.errors:
            raise RuntimeError("writing while a broker was away failed: " + "; ".join(load.errors))
        written = load.acked_bytes
        live = [target.broker_data_dir(b) for b in target.brokers if b != away]
        assert target.workdir is not None
        disk = sequential_read(target.workdir, written)
        evict_page_cache(live)
        trial = _follow_restart(target, topic, away, node, RESTART_TIMEOUT_S)
        trial.update(trial=i + 1, broker=away, bytes=written, disk=disk)
        if trial["in_sync_s"] is not None:
            catch_up = trial["in_sync_s"] - (trial["listed_s"] or 0.0)
            trial["catch_up_s"] = catch_up
            trial["mb_per_s"] = written / 1e6 / catch_up if catch_up > 0 else None
            trial["mb_per_s_from_restart"] = written / 1e6 / trial["in_sync_s"]
            trial["of_disk"] = trial["mb_per_s"] / disk["mb_per_s"] if trial["mb_per_s"] else None
        trials.append(trial)
        log(
            f"{w.name} {target.name} trial {i + 1}: {written / 1e6:,.0f} MB caught up by {away} "
            f"at {trial.get('mb_per_s') or 0:,.1f} MB/s (disk read {disk['mb_per_s']:,.0f} MB/s)"
        )
    return {"trials": trials}


def _follow_restart(
    target: ClusterTarget, topic: str, name: str, node: int, timeout: float
) -> dict[str, Any]:
    """Restart ``name`` on a thread and follow the metadata here: when the broker is listed
    again, and when it is in every partition's in-sync set (seconds from the restart)."""
    failed: list[BaseException] = []

    def restart() -> None:
        try:
            target.restart(name, timeout=timeout)
        except BaseException as e:  # reported below, with the figures so far
            failed.append(e)

    admin = target.admin()
    t0 = time.monotonic()
    thread = threading.Thread(target=restart, name=f"restart-{name}", daemon=True)
    thread.start()
    listed = in_sync = None
    while time.monotonic() - t0 < timeout and not failed:
        st = target.partition_state(admin, topic, timeout=1)
        now = time.monotonic() - t0
        if st is not None:
            brokers, isrs = st
            if listed is None and node in brokers:
                listed = now
            if isrs and all(node in isr for isr in isrs.values()):
                in_sync = now
                listed = now if listed is None else listed
                break
        time.sleep(0.02)
    thread.join(timeout=timeout)
    if failed:
        raise RuntimeError(f"{target.name}: restarting {name} failed: {failed[0]}")
    return {"listed_s": listed, "in_sync_s": in_sync}
