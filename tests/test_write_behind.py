"""Write-behind (``storage.write_behind``, the default under ``fsync=always``): the event loop
reserves and stages each append, and the journal's thread writes a group's appends, in order, just
before the group's fsync (BookKeeper's journal thread). ``acks=1`` then waits for the write."""

from __future__ import annotations

import asyncio
import os
import threading
import time

import pytest
from confluent_kafka import Producer

from stratalog.records import build_batch
from stratalog.storage.journal import FsyncPolicy
from stratalog.storage.log_store import LogStore, StorageConfig
from stratalog.storage.partition import FileSlice
from stratalog.storage.recovery import read_checkpoint

from .conftest import BrokerProcess, create_topic
from .test_crash import _consume_all

PARTS = [("t", 0, 1), ("t", 1, 2), ("t", 2, 3)]


def _store(tmp_path, **kw) -> LogStore:
    kw.setdefault("virtual_logs", 1)
    store = LogStore(StorageConfig(tmp_path, fsync=FsyncPolicy.parse("always"), **kw))
    store.open(PARTS)
    return store


def _batch(i: int, size: int = 40) -> bytes:
    return build_batch([(b"k%d" % i, os.urandom(size), 1_700_000_000_000 + i)] * 3)


def _on_disk(seg) -> int:
    return os.fstat(seg.fd).st_size


async def _wait(register, lsn: int) -> bool:
    fut = asyncio.get_running_loop().create_future()
    register(lsn, lambda ok: fut.done() or fut.set_result(ok))
    return await asyncio.wait_for(fut, 30)


@pytest.mark.parametrize("write_behind", [True, False], ids=["write-behind", "loop-writes"])
def test_the_journal_thread_writes_what_the_loop_staged(tmp_path, write_behind):
    async def run() -> None:
        store = _store(tmp_path, write_behind=write_behind, group_commit_ms=20)
        vlog = store.logs["v0"]
        seg = vlog.active
        lsn = 0
        for i in range(30):
            lsn = store.partitions[1 + i % 3].append(_batch(i)).lsn
        # The same event-loop turn: reserved in the segment, but written only by the loop path.
        assert seg.size == lsn > 0
        if write_behind:
            assert _on_disk(seg) == 0 and seg.unwritten == lsn
        else:
            assert _on_disk(seg) == lsn and seg.unwritten == 0
        assert await _wait(vlog.when_durable, lsn)
        assert _on_disk(seg) == seg.size == seg.written and seg.unwritten == 0
        assert all(p.high_watermark == 30 for p in store.partitions.values())
        await store.close()

    asyncio.run(run())


def test_written_is_reported_before_durable_and_never_before_the_write(tmp_path):
    async def run() -> None:
        store = _store(tmp_path, group_commit_ms=20)
        vlog = store.logs["v0"]
        seen: list[tuple[str, int]] = []
        r = store.partitions[1].append(_batch(0))
        vlog.when_written(r.lsn, lambda ok: seen.append(("written", _on_disk(vlog.active))))
        vlog.when_durable(r.lsn, lambda ok: seen.append(("durable", _on_disk(vlog.active))))
        assert seen == []  # staged only: an acks=1 answer must wait
        assert await _wait(vlog.when_durable, r.lsn)
        assert seen == [("written", r.lsn), ("durable", r.lsn)]
        await store.close()

    asyncio.run(run())


@pytest.mark.parametrize("direct", [False, True], ids=["buffered", "direct-io"])
def test_rolled_segments_are_sealed_after_their_writes_and_everything_reads_back(tmp_path, direct):
    async def run() -> dict[int, list[bytes]]:
        store = _store(
            tmp_path,
            segment_bytes=20_000,
            group_commit_ms=1,
            direct_io=direct,
            direct_min_bytes=0,
        )
        vlog = store.logs["v0"]
        sent: dict[int, list[bytes]] = {1: [], 2: [], 3: []}
        lsn = 0
        for i in range(600):
            uid = 1 + i % 3
            b = _batch(i, 40 + (i * 37) % 900)
            sent[uid].append(b)
            lsn = store.partitions[uid].append(b).lsn
            if i % 50 == 0:
                await asyncio.sleep(0)  # let groups complete between some appends
        assert await _wait(vlog.when_durable, lsn)
        assert len(vlog.segments) > 5
        for seg in vlog.segments.values():
            assert seg.unwritten == 0
            if seg is not vlog.active:
                assert _on_disk(seg) == seg.size  # written, padding cut at the seal
        await store.close()
        return sent

    sent = asyncio.run(run())
    reopened = LogStore(StorageConfig(tmp_path, fsync=FsyncPolicy.parse("always"), virtual_logs=1))
    reopened.open(PARTS)
    try:
        assert reopened.logs["v0"].report.clean
        for uid, batches in sent.items():
            p = reopened.partitions[uid]
            rr = p.read(0, 1 << 30)
            try:
                got = b"".join(x.read() if isinstance(x, FileSlice) else bytes(x) for x in rr.parts)
            finally:
                rr.release()
            # Each batch comes back with its offsets assigned: compare from the 9th byte on.
            want_len = sum(len(b) for b in batches)
            assert len(got) == want_len
            at = 0
            for n, b in enumerate(batches):
                assert int.from_bytes(got[at : at + 8], "big") == 3 * n
                assert got[at + 8 : at + len(b)] == b[8:]
                at += len(b)
    finally:
        reopened.abandon()


def test_a_checkpoint_vouches_only_for_written_bytes(tmp_path):
    async def run() -> None:
        store = _store(tmp_path, group_commit_ms=10_000, group_commit_bytes=1 << 30)
        vlog = store.logs["v0"]
        first = store.partitions[1].append(_batch(0))
        await vlog.journal.drain()  # one group: written and synced
        end = vlog.active.size
        for i in range(20):
            store.partitions[2].append(_batch(i))  # staged; the next group is 10 s away
        assert vlog.active.size > end and _on_disk(vlog.active) == end
        await vlog.checkpoint()
        assert read_checkpoint(vlog.directory) == (vlog.active.seq, end)
        assert first.lsn == end
        await store.close()

    asyncio.run(run())


def test_acks_1_records_survive_a_sigkill(tmp_path):
    """acks=1 is answered once the journal's thread has written the batch (not yet synced), so
    killing the broker process right after the answer loses nothing."""
    bp = BrokerProcess(tmp_path / "data", settings={"fsync": "always", "group_commit_ms": "20"})
    bp.start()
    try:
        create_topic(bp.bootstrap, "a1", 2)
        acked: dict[tuple[int, int], int] = {}
        lock = threading.Lock()

        def done(err, msg) -> None:
            if err is None:
                with lock:
                    acked[(msg.partition(), msg.offset())] = int(msg.value())

        producer = Producer(
            {
                "bootstrap.servers": bp.bootstrap,
                "acks": "1",
                "enable.idempotence": False,
                "linger.ms": 1,
                "message.timeout.ms": 5000,
                "retries": 0,
            }
        )
        stop = threading.Event()

        def produce_loop() -> None:
            i = 0
            while not stop.is_set():
                try:
                    producer.produce("a1", value=str(i).encode(), partition=i % 2, on_delivery=done)
                    i += 1
                except BufferError:
                    producer.poll(0.01)
                if i % 100 == 0:
                    producer.poll(0)
            producer.poll(0)

        t = threading.Thread(target=produce_loop, daemon=True)
        t.start()
        deadline = time.monotonic() + 30
        while len(acked) < 20_000 and time.monotonic() < deadline:
            time.sleep(0.02)
        bp.kill()  # SIGKILL mid-stream
        with lock:
            snapshot = dict(acked)
        stop.set()
        t.join(timeout=30)
        assert len(snapshot) >= 1000, "too few acknowledgements to test"
        bp.start()
        log = _consume_all(bp.bootstrap, "a1", 2)
        present = {(p, off): v for p, rows in log.items() for off, v in rows}
        missing = [k for k, v in snapshot.items() if present.get(k) != v]
        assert not missing, f"{len(missing)} acks=1 records lost, e.g. {missing[:5]}"
    finally:
        bp.kill()
