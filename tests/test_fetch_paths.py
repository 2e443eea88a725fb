"""Which path a Fetch takes: tail chunks from memory, page-cache chunks by sendfile (zero
copy), cold chunks read on the read pool. Checked through the broker's own byte counters while
a real consumer reads identical data back each way."""

from __future__ import annotations

import os
import time

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from stratalog import Broker
from stratalog.broker import metrics
from stratalog.storage import page_cache
from stratalog.storage.priority import LOW_IOPRIO, LOW_NICE, thread_priority
from stratalog.storage.throttle import PACE_SLACK_S

from .conftest import create_topic

N = 3000


def _produce(bootstrap: str, topic: str) -> list[bytes]:
    values = [b"%06d" % i + os.urandom(500) for i in range(N)]
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for v in values:
        p.produce(topic, value=v)
    assert p.flush(20) == 0
    return values


def _consume(bootstrap: str, topic: str, **conf) -> list[bytes]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "paths", **conf})
    c.assign([TopicPartition(topic, 0, 0)])
    out: list[bytes] = []
    deadline = time.monotonic() + 20
    while len(out) < N and time.monotonic() < deadline:
        out += [m.value() for m in c.consume(1000, 0.5) if m.error() is None]
    c.close()
    return out


def _counters() -> tuple[float, float, float]:
    return (
        metrics.FETCH_MEMORY_BYTES._value.get(),
        metrics.FETCH_SENDFILE_BYTES._value.get(),
        metrics.FETCH_COPIED_BYTES._value.get(),
    )


def _delta(before, after) -> tuple[float, ...]:
    return tuple(a - b for a, b in zip(after, before, strict=True))


def _tail_round_trip(config: dict) -> None:
    """Records read back while still in the in-memory tail: served from memory, no file read."""
    import tempfile

    config = {"cache.tail_bytes": 64 << 20, **config}
    with tempfile.TemporaryDirectory() as d, Broker(d, config=config) as b:
        create_topic(b.bootstrap, "tail")
        values = _produce(b.bootstrap, "tail")
        before = _counters()
        assert _consume(b.bootstrap, "tail") == values
        memory, sendfile, copied = _delta(before, _counters())
        assert memory >= N * 500 and sendfile == 0 and copied == 0


def test_tail_reads_come_from_memory():
    _tail_round_trip({})


def test_page_cache_reads_use_sendfile_and_cold_reads_the_read_pool(tmp_path):
    # The defaults: appends through the page cache, and no tail cache of the broker's own.
    cfg = {"storage.read_priority": "low"}
    with Broker(tmp_path / "d", config=cfg) as b:
        create_topic(b.bootstrap, "warm")
        values = _produce(b.bootstrap, "warm")
        before = _counters()
        assert _consume(b.bootstrap, "warm") == values
        memory, sendfile, copied = _delta(before, _counters())
        assert sendfile >= N * 500 * 0.5 and memory == 0, (memory, sendfile, copied)

        _evict(b.data_dir)  # now every read is cold
        before = _counters()
        requests = b.core.backlog_loader.requests
        assert _consume(b.bootstrap, "warm") == values
        memory, sendfile, copied = _delta(before, _counters())
        # The read pool loaded the cold pages into the page cache in small requests (one 512 KiB
        # request at most per ~0.5 MB here), and they went out with sendfile, not copied.
        loaded = b.core.backlog_loader.requests - requests
        assert 1 <= loaded <= N * 500 // (512 * 1024) + 8, loaded
        assert sendfile >= N * 500 * 0.5 and copied == 0, (memory, sendfile, copied)
        # The cold reads ran on this broker's read pool, whose threads yield to the write path
        # (other brokers of this process may still have read threads of their own).
        readers = list(b.core.read_executor._threads)
        assert readers and all(t.name.startswith("stratalog-read") for t in readers)
        for t in readers:
            nice, io = thread_priority(t.native_id)
            assert nice == LOW_NICE, (t.name, nice)
            assert io is None or io == LOW_IOPRIO == 3 << 13, (t.name, io)  # the idle class


def test_large_fetches_stay_zero_copy_when_the_socket_fills(tmp_path):
    # A Fetch over several partitions is many MB: the socket fills in the middle of a slice.
    # The rest must still go out with sendfile once the socket drains, never be read into memory.
    parts, n = 4, 20000
    with Broker(tmp_path / "d", config={"cache.tail_bytes": 0}) as b:
        create_topic(b.bootstrap, "big", partitions=parts)
        p = Producer({"bootstrap.servers": b.bootstrap, "linger.ms": 5, "batch.size": 1000000})
        values = [b"%06d" % i + os.urandom(1000) for i in range(n)]
        for i, v in enumerate(values):
            p.produce("big", value=v, partition=i % parts)
        assert p.flush(30) == 0
        before = _counters()
        c = Consumer(
            {
                "bootstrap.servers": b.bootstrap,
                "group.id": "big",
                "max.partition.fetch.bytes": 8_000_000,
                "fetch.max.bytes": 50_000_000,
                "socket.receive.buffer.bytes": 65536,
            }
        )
        c.assign([TopicPartition("big", i, 0) for i in range(parts)])
        got: list[bytes] = []
        deadline = time.monotonic() + 30
        while len(got) < n and time.monotonic() < deadline:
            got += [m.value() for m in c.consume(1000, 0.5) if m.error() is None]
        c.close()
        assert sorted(got) == sorted(values)
        memory, sendfile, copied = _delta(before, _counters())
        assert copied == 0 and sendfile >= n * 1000, (memory, sendfile, copied)


def test_backlog_reads_are_held_to_their_budget_and_tail_reads_are_not(tmp_path):
    # 1.5 MB of backlog at 0.5 MB/s, read back from the segment files: every record arrives,
    # and what is paced takes its time. The consumer asks for 64 KiB per partition and fetch;
    # only its last read reaches the high watermark, and that one (at most 1 MiB, the tail)
    # is not paced.
    rate = 500_000
    config = {"cache.tail_bytes": 0, "fetch.backlog.max_bytes_per_sec": rate}
    with Broker(tmp_path / "d", config=config) as b:
        create_topic(b.bootstrap, "slow")
        values = _produce(b.bootstrap, "slow")
        before = _counters()
        paced_before = metrics.FETCH_PACED_BYTES._value.get()
        t0 = time.monotonic()
        got = _consume(b.bootstrap, "slow", **{"max.partition.fetch.bytes": 65536})
        assert got == values
        took = time.monotonic() - t0
        _memory, sendfile, copied = _delta(before, _counters())
        from_files = sendfile + copied
        paced = metrics.FETCH_PACED_BYTES._value.get() - paced_before
        assert from_files >= N * 500
        assert from_files - 1024 * 1024 <= paced <= from_files, (paced, from_files)
        # Each turn of at most 128 KiB waits for its own bytes' time before it goes out (less
        # the slack a paced sender may run ahead by).
        assert took >= paced / rate - PACE_SLACK_S, (took, paced)
    # The same budget with the in-memory tail: nothing is counted against it.
    _tail_round_trip({"fetch.backlog.max_bytes_per_sec": rate})


def test_a_consumer_at_the_tail_is_not_held_to_the_backlog_budget(tmp_path):
    # Tail reads come from the page cache by sendfile here (no tail cache), as history does;
    # a caught-up consumer's reads end at the high watermark and are neither admitted nor
    # paced (BookKeeper serves the tail first), so they never wait behind catch-up readers.
    config = {"cache.tail_bytes": 0, "fetch.backlog.max_bytes_per_sec": 100_000}
    with Broker(tmp_path / "d", config=config) as b:
        create_topic(b.bootstrap, "live")
        c = Consumer({"bootstrap.servers": b.bootstrap, "group.id": "live"})
        c.assign([TopicPartition("live", 0, 0)])
        p = Producer({"bootstrap.servers": b.bootstrap, "linger.ms": 5})
        before = _counters()
        paced_before = metrics.FETCH_PACED_BYTES._value.get()
        sent: list[bytes] = []
        got: list[bytes] = []
        for round_ in range(10):  # 10 x 150 KB: 15 s of budget if it applied
            for i in range(300):
                v = b"%02d%04d" % (round_, i) + os.urandom(500)
                sent.append(v)
                p.produce("live", value=v)
            assert p.flush(20) == 0
            deadline = time.monotonic() + 20
            while len(got) < len(sent) and time.monotonic() < deadline:
                got += [m.value() for m in c.consume(500, 0.2) if m.error() is None]
        c.close()
        assert got == sent
        _memory, sendfile, copied = _delta(before, _counters())
        assert sendfile + copied >= len(sent) * 500  # read from the segment files
        assert metrics.FETCH_PACED_BYTES._value.get() == paced_before


def _evict(data_dir) -> None:
    """Drop the (synced) segment files from the page cache."""
    for seg in (data_dir / "logs").glob("*/*.log"):
        fd = os.open(seg, os.O_RDONLY)
        try:
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def test_a_paced_backlog_fetch_abandoned_by_its_client_releases_its_segments(tmp_path):
    # With a budget, a backlog fetch waits for its bytes' turn partition by partition. A client
    # that leaves meanwhile must not leave the fetch's segment references behind (a held
    # segment can never be deleted by retention or migration).
    config = {"cache.tail_bytes": 0, "fetch.backlog.max_bytes_per_sec": 200_000}
    with Broker(tmp_path / "d", config=config) as b:
        create_topic(b.bootstrap, "paced", partitions=4)
        p = Producer({"bootstrap.servers": b.bootstrap, "linger.ms": 5})
        for i in range(4000):
            p.produce("paced", value=b"%06d" % i + os.urandom(1000), partition=i % 4)
        assert p.flush(20) == 0
        _evict(b.data_dir)

        def refs() -> list[int]:
            segs = [s for v in b.core.store.logs.values() for s in v.segments.values()]
            return [s._refs for s in segs]

        at_rest = b.call(refs)
        assert at_rest and set(at_rest) == {1}  # only each owning log's reference
        c = Consumer({"bootstrap.servers": b.bootstrap, "group.id": "paced"})
        c.assign([TopicPartition("paced", i, 0) for i in range(4)])
        got = 0
        deadline = time.monotonic() + 2
        while time.monotonic() < deadline:
            got += sum(1 for m in c.consume(500, 0.2) if m.error() is None)
        held = b.call(refs)
        c.close()  # while fetches are still waiting for the budget: 4 MB at 0.2 MB/s
        assert got < 4000 and max(held) > 1, (got, held)
        deadline = time.monotonic() + 10
        while b.call(refs) != at_rest and time.monotonic() < deadline:
            time.sleep(0.1)
        assert b.call(refs) == at_rest


def test_the_steered_backlog_budget_follows_the_journals_fsyncs():
    from stratalog.storage.throttle import ByteRate, FsyncGuidedRate

    rate = ByteRate(0)
    pacer = FsyncGuidedRate(rate, target=0.002, floor=1_000_000, ceiling=3_500_000)
    assert rate.rate == 1_000_000  # starts at the floor
    now = 1000.0
    assert pacer.tick(0.0005, now) == 1_000_000  # nobody waits for the budget: no growth
    rate._until = now + 1  # backlog reads are queued behind the budget
    assert pacer.tick(0.0005, now) == 2_000_000
    assert pacer.tick(None, now) == 3_000_000  # no fsync at all: nothing to protect
    assert pacer.tick(0.001, now) == 3_500_000  # capped
    assert pacer.tick(0.004, now) == 1_750_000  # the journal slowed down: halve
    assert pacer.tick(0.1, now) == 1_000_000  # never below the floor
    # A tiny floor still grows by a useful step.
    small = FsyncGuidedRate(ByteRate(0), target=0.002, floor=1, ceiling=10**9)
    small.rate._until = time.monotonic() + 60
    assert small.tick(None) == 1 + FsyncGuidedRate.MIN_STEP
    # The sending of backlog answers follows the reads' budget, and waiting for it counts.
    reads, sends = ByteRate(0), ByteRate(0)
    both = FsyncGuidedRate(reads, target=0.002, floor=1_000_000, ceiling=10**9, followers=(sends,))
    assert sends.rate == 1_000_000
    sends._until = now + 1  # answers are queued behind the send budget only
    assert both.tick(0.0005, now) == 2_000_000
    assert reads.rate == sends.rate == 2_000_000
    assert both.tick(0.004, now) == 1_000_000 and sends.rate == 1_000_000


def test_reserving_bytes_schedules_them_after_those_before():
    from stratalog.storage.throttle import ByteRate

    r = ByteRate(1_000_000)
    assert r.reserve(500_000, now=10.0) == pytest.approx(0.5)
    assert r.reserve(250_000, now=10.1) == pytest.approx(0.65)  # behind the first 0.5 MB
    assert r.reserve(100_000, now=20.0) == pytest.approx(0.1)  # the queue had emptied
    assert ByteRate(0).reserve(10**9) == 0.0  # unlimited


def test_a_lower_rate_reschedules_what_is_queued():
    from stratalog.storage.throttle import ByteRate

    r = ByteRate(1_000_000)
    now = time.monotonic()
    r._until = now + 2.0  # 2 MB queued at 1 MB/s
    r.set_rate(4_000_000)
    assert r._until - now < 0.6  # the same bytes at 4 MB/s
    r.set_rate(500_000)
    assert r._until - now > 0.9


def test_a_steered_backlog_budget_grows_while_history_is_read(tmp_path):
    # No producer runs while the backlog is read, so nothing slows the journal: the budget
    # climbs from its floor, and every record arrives.
    floor = 200_000
    config = {
        "cache.tail_bytes": 0,
        "fetch.backlog.fsync_target_ms": 5.0,
        "fetch.backlog.min_bytes_per_sec": floor,
    }
    with Broker(tmp_path / "d", config=config) as b:
        create_topic(b.bootstrap, "steered")
        values = _produce(b.bootstrap, "steered")
        assert metrics.BACKLOG_RATE._value.get() <= floor * 2
        assert _consume(b.bootstrap, "steered") == values
        assert metrics.BACKLOG_RATE._value.get() > floor


def _resident_pages(path) -> int:
    """How many pages of the file are in the page cache (cachestat: reads nothing)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        pages = page_cache.cached_pages(fd, 0, os.fstat(fd).st_size)
    finally:
        os.close(fd)
    if pages is None:
        pytest.skip("this kernel has no cachestat (Linux 6.5+)")
    return pages


def test_direct_backlog_reads_bypass_the_page_cache(tmp_path):
    # Four partitions share a virtual log, so their chunks interleave and each read window
    # (64 KiB here, against ~1.5 MB of data) serves slices of several partitions.
    cfg = {"fetch.backlog.direct_reads": True, "fetch.read_ahead.bytes": 65536,
           "storage.virtual_logs": 1, "storage.read_priority": "low"}  # fmt: skip
    with Broker(tmp_path / "d", config=cfg) as b:
        create_topic(b.bootstrap, "hist", partitions=4)
        p = Producer({"bootstrap.servers": b.bootstrap, "linger.ms": 5})
        sent = {i: [] for i in range(4)}
        for i in range(N):
            v = b"%06d" % i + os.urandom(500)
            sent[i % 4].append(v)
            p.produce("hist", value=v, partition=i % 4)
        assert p.flush(20) == 0
        _evict(b.data_dir)
        (segment,) = (b.data_dir / "logs").glob("*/*.log")
        before = _counters()
        for part in range(4):
            c = Consumer({"bootstrap.servers": b.bootstrap, "group.id": "direct"})
            c.assign([TopicPartition("hist", part, 0)])
            got: list[bytes] = []
            deadline = time.monotonic() + 20
            while len(got) < len(sent[part]) and time.monotonic() < deadline:
                got += [m.value() for m in c.consume(1000, 0.5) if m.error() is None]
            c.close()
            assert got == sent[part]
        _memory, sendfile, copied = _delta(before, _counters())
        assert copied >= N * 500 and sendfile == 0, (sendfile, copied)
        # Read with O_DIRECT, the history never went through the page cache.
        assert _resident_pages(segment) <= 2, _resident_pages(segment)
