"""The group commit's fdatasyncs through io_uring, completed on the event loop (fsync_ring.py)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time

import pytest
from confluent_kafka import Producer

from stratalog import Broker
from stratalog.records import build_batch
from stratalog.storage.fsync_ring import FsyncRing, available
from stratalog.storage.journal import FsyncPolicy, StorageFailure
from stratalog.storage.log_store import LogStore, StorageConfig

from .conftest import create_topic, scrape_metrics

pytestmark = pytest.mark.skipif(not available(), reason="no io_uring on this machine")


def _files(tmp_path, n: int) -> list[int]:
    fds = []
    for i in range(n):
        fd = os.open(tmp_path / f"f{i}", os.O_RDWR | os.O_CREAT, 0o644)
        os.write(fd, b"x" * 4096 * (i + 1))
        fds.append(fd)
    return fds


def test_groups_beyond_the_rings_room_each_complete_once_on_the_loop(tmp_path):
    fds = _files(tmp_path, 12)

    async def run() -> list[tuple[int, int, int]]:
        ring = FsyncRing(entries=4)  # room for 4 in flight: the rest queue
        assert ring.capacity == 4
        loop_thread = threading.get_ident()
        done: list[tuple[int, int, int]] = []
        finished = asyncio.Event()
        groups = [fds[i : i + 1 + i % 5] for i in range(10)]  # 1 to 5 files each, 29 in all
        for gid, group in enumerate(groups):

            def on_done(err: int, gid: int = gid) -> None:
                done.append((gid, err, threading.get_ident()))
                if len(done) == len(groups):
                    finished.set()

            ring.sync(group, on_done)
        await asyncio.wait_for(finished.wait(), 30)
        await asyncio.sleep(0.05)  # a second completion of any group would land here
        assert not ring.busy
        ring.close()
        return [(g, e, t == loop_thread) for g, e, t in done]

    done = asyncio.run(run())
    assert sorted(g for g, _, _ in done) == list(range(10))
    assert all(err == 0 and on_loop for _, err, on_loop in done), done
    for fd in fds:
        os.close(fd)


@pytest.mark.parametrize("lost", ["consumed", "unwatched"])
def test_completions_no_wake_up_announced_are_taken_by_the_watch(tmp_path, lost):
    """The eventfd's wake-up is lost: consumed behind the loop's back once the completions are
    in the ring (the eventfd not readable), or never serviced (the loop no longer watches it,
    the eventfd stays readable); the ring's watch finds them waiting and finishes the group."""
    fds = _files(tmp_path, 3)

    async def run() -> tuple[int, int]:
        loop = asyncio.get_running_loop()
        ring = FsyncRing()
        finished = loop.create_future()
        ring.sync(fds, finished.set_result)
        loop.remove_reader(ring.eventfd)
        for _ in range(1000):  # until the kernel posted all three
            if ring.completions_waiting >= 3:
                break
            time.sleep(0.01)
        if lost == "consumed":
            os.eventfd_read(ring.eventfd)  # the wake-up, lost
            loop.add_reader(ring.eventfd, ring._complete)
        err = await asyncio.wait_for(finished, 10)
        unnoticed = ring.unnoticed
        ring.close()
        return err, unnoticed

    err, unnoticed = asyncio.run(run())
    assert err == 0
    assert unnoticed == 3
    for fd in fds:
        os.close(fd)


def test_a_failed_fsync_reports_the_kernels_errno(tmp_path):
    good = _files(tmp_path, 1)[0]
    r, w = os.pipe()
    closed = 60_000  # no descriptor (a closed one's number could be taken by the ring's own)
    with pytest.raises(OSError):
        os.fstat(closed)

    async def run() -> dict[str, int]:
        ring = FsyncRing()
        out: dict[str, int] = {}
        futs = []
        for name, fds in (("good", [good]), ("pipe", [good, r]), ("closed", [closed])):
            f = asyncio.get_running_loop().create_future()
            futs.append(f)
            ring.sync(fds, lambda err, f=f, name=name: (out.__setitem__(name, err),
                                                               f.set_result(None)))  # fmt: skip
        await asyncio.wait_for(asyncio.gather(*futs), 30)
        ring.close()
        with pytest.raises(RuntimeError, match="closed"):
            ring.sync([good], lambda err: None)
        return out

    out = asyncio.run(run())
    assert out["good"] == 0
    assert out["pipe"] == 22  # EINVAL: a pipe cannot be synced; its group fails as a whole
    assert out["closed"] == 9  # EBADF
    for fd in (good, r, w):
        os.close(fd)


def _store(tmp_path, fsync_via: str) -> LogStore:
    store = LogStore(
        StorageConfig(
            tmp_path,
            fsync=FsyncPolicy.parse("always"),
            virtual_logs=1,
            group_commit_ms=1,
            fsync_via=fsync_via,
        )
    )
    store.open([("t", 0, 1), ("t", 1, 2)])
    return store


async def _append_durable(store: LogStore, n: int) -> bool:
    loop = asyncio.get_running_loop()
    futs = []
    for i in range(n):
        p = store.partitions[1 + i % 2]
        r = p.append(build_batch([(b"k", b"v%d" % i, 1_700_000_000_000 + i)]))
        f = loop.create_future()
        p.vlog.when_durable(r.lsn, lambda ok, f=f: f.set_result(ok))
        futs.append(f)
        await asyncio.sleep(0.002)  # a group each, or nearly
    return all(await asyncio.wait_for(asyncio.gather(*futs), 30))


def test_the_group_commit_syncs_through_the_ring_without_its_threads(tmp_path):
    async def run() -> None:
        store = _store(tmp_path, "io_uring")
        assert store.fsync_ring is not None
        # No thread is left to run fsyncs: every group must go through the ring, the new
        # segment's first one (its directory entry too) included.
        store.executor.shutdown(wait=True)
        journal = store.logs["v0"].journal
        segment = store.logs["v0"].active
        assert not segment.dir_synced  # a new segment: its directory entry is not durable yet
        assert await _append_durable(store, 40)
        assert journal.syncs > 5
        assert journal.durable == journal.appended
        assert segment.dir_synced
        assert store.partitions[1].high_watermark == 20
        for vlog in store.logs.values():
            await vlog.journal.drain()
        store.fsync_ring.close()

    asyncio.run(run())


def test_a_failed_ring_fsync_stops_the_log_acknowledging(tmp_path):
    async def run() -> None:
        store = _store(tmp_path, "io_uring")
        store.executor.shutdown(wait=True)  # only the ring can sync
        assert await _append_durable(store, 1)
        vlog = store.logs["v0"]
        seg = vlog.active
        real_fd = seg.fd
        r, w = os.pipe()
        try:
            p = store.partitions[1]
            res = p.append(build_batch([(b"k", b"lost?", 1_700_000_000_000)]))
            # Fault injection, after the write and before its group's fsync (a timer on this
            # loop): the segment's descriptor names a pipe, which the kernel refuses to sync
            # (EINVAL), as a disk that fails its writeback would.
            seg.fd = r
            f = asyncio.get_running_loop().create_future()
            p.vlog.when_durable(res.lsn, f.set_result)
            assert await asyncio.wait_for(f, 30) is False
            assert isinstance(vlog.journal.failed, StorageFailure)
            assert "fsync failed" in str(vlog.journal.failed)
            assert p.high_watermark == 1  # the unsynced record never became visible
        finally:
            seg.fd = real_fd
            os.close(r)
            os.close(w)
        store.abandon()

    asyncio.run(run())


def test_fsync_via_names_its_choices(tmp_path):
    with pytest.raises(ValueError, match=r"storage\.fsync_via must be"):
        StorageConfig(tmp_path, fsync_via="aio")
    # The thread path needs no ring; interval fsyncs never use one either.
    assert LogStore(StorageConfig(tmp_path, fsync_via="thread")).fsync_ring is None
    interval = StorageConfig(tmp_path, fsync=FsyncPolicy.parse("interval:100"))
    assert LogStore(interval).fsync_ring is None


def _commits(admin: str) -> dict[str, float]:
    samples = scrape_metrics(admin, "stratalog_group_commits_total")
    return {s.labels["via"]: s.value for s in samples}


@pytest.mark.parametrize("via", ["io_uring", "thread"])
def test_a_broker_acknowledges_produces_after_the_chosen_fsyncs(tmp_path, via):
    with Broker(tmp_path / "d", config={"fsync": "always", "storage.fsync_via": via}) as b:
        admin = b.service.core.admin_address
        create_topic(b.bootstrap, "synced", 2)
        before = _commits(admin)
        p = Producer({"bootstrap.servers": b.bootstrap, "acks": "all", "linger.ms": 1})
        for i in range(300):
            p.produce("synced", value=b"%d" % i, partition=i % 2)
            if i % 50 == 49:
                assert p.flush(10) == 0  # each flush waits for a group commit or more
        after = _commits(admin)
    other = "thread" if via == "io_uring" else "io_uring"
    assert after.get(via, 0) - before.get(via, 0) >= 6
    assert after.get(other, 0) == before.get(other, 0)  # new segments' first syncs included


def test_the_fsync_probe_times_both_ways(tmp_path):
    """The probe behind docs/benchmarks.md's "The group commit through io_uring"
    (stratalog.bench.fsync_probe); here short, only to show both ways run and are timed."""
    out = subprocess.run(
        [sys.executable, "-m", "stratalog.bench.fsync_probe", "--dir", str(tmp_path),
         "--fsyncs", "20", "--rounds", "1"],
        capture_output=True, text=True, timeout=120, check=True,
    ).stdout  # fmt: skip
    rows = [line.split("|") for line in out.splitlines()[1:]]
    assert [(r[0].strip(), r[1].strip()) for r in rows] == [
        ("1", "thread"), ("1", "io_uring"), ("2", "thread"), ("2", "io_uring")
    ]  # fmt: skip
    for r in rows:
        p50, p99 = float(r[2]), float(r[3])
        assert 0 < p50 <= p99, r
    assert list(tmp_path.iterdir()) == []  # its file is gone


_REFUSED = """
import os, resource
from stratalog.storage.fsync_ring import open_ring
# Every descriptor below the soft limit in use: the kernel cannot give io_uring_setup its ring's
# descriptor (EMFILE), a refusal as real as a container's seccomp profile's EPERM.
limit = 64
resource.setrlimit(resource.RLIMIT_NOFILE, (limit, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
held = []
while True:
    try:
        held.append(os.open(os.devnull, os.O_RDONLY))
    except OSError:
        break
fallback = open_ring("auto")
try:
    open_ring("io_uring")
except OSError as e:
    print("refused:", e)
else:
    print("not refused")
print("auto:", fallback)
"""


@pytest.mark.skipif(not available(), reason="io_uring is not available here")
def test_a_refused_ring_is_an_error_when_asked_for_and_the_threads_otherwise():
    out = subprocess.run(
        [sys.executable, "-c", _REFUSED], capture_output=True, text=True, timeout=60, check=True
    ).stdout
    assert "refused: storage.fsync_via=io_uring: io_uring_setup failed:" in out, out
    assert "auto: None" in out, out


def test_fsyncs_the_kernel_never_completes_are_finished_on_a_thread(tmp_path, monkeypatch):
    """A ring that took a group's fsyncs and never completed them (twice seen: completions
    stopped for minutes): once it is out for LATE_S the group is synced on a thread, and the
    ring retired, every later group synced there too. (The kernel's part is simulated: the
    group is counted as taken but never handed over.)"""
    from stratalog.storage import fsync_ring

    monkeypatch.setenv("STRATALOG_FSYNC_RING_LOSE_GROUP", "2")
    monkeypatch.setattr(fsync_ring, "LATE_S", 0.5)
    fds = _files(tmp_path, 2)

    async def run() -> tuple[list[int], list[float], bool, int]:
        loop = asyncio.get_running_loop()
        ring = FsyncRing()
        errors, waits = [], []
        for _ in range(4):
            done = loop.create_future()
            started = time.monotonic()
            ring.sync(fds, done.set_result)
            errors.append(await asyncio.wait_for(done, 10))
            waits.append(time.monotonic() - started)
        retired, on_thread = ring.retired, ring._thread is not None
        ring.close()
        return errors, waits, retired, on_thread

    errors, waits, retired, on_thread = asyncio.run(run())
    assert errors == [0, 0, 0, 0]
    assert waits[1] >= 0.5 and max(waits[0], waits[2], waits[3]) < 0.5, waits
    assert retired and on_thread
    for fd in fds:
        os.close(fd)
