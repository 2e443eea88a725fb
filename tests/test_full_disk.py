"""A data directory that fills up: writes fail with ENOSPC, are cut back, and the log goes on.

The broker's data directory is a small tmpfs (a real file system with a real size limit, root
only) that a ballast file fills to within a few hundred KiB. An idempotent acks=all producer
(confluent-kafka, 1 KiB records, 3 partitions) then runs into the full disk: the broker must
answer each failed write with KAFKA_STORAGE_ERROR at once and record nothing of it, so the
producer's retries are appended, not taken for duplicates of batches never written. When the
ballast goes, the same broker (no restart) takes every record: each is read back exactly once,
in order.

The oracle is the producer's own delivery reports and the consumer's reads, never the broker's
word: before the fix, a retry of a failed batch was never answered (the producer's flush timed
out) and the log refused every write until a restart.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from .conftest import BrokerProcess, create_topic

FS_BYTES = 24 * 1024 * 1024
LEAVE_FREE = 400 * 1024
RECORDS = 3000
PARTITIONS = 3


@pytest.fixture
def small_fs(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mnt = tmp_path / "fs"
    mnt.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={FS_BYTES}", "tmpfs", str(mnt)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True, timeout=30)


def _fill(path, leave: int) -> None:
    """Write a ballast file until ``leave`` bytes are free."""
    st = os.statvfs(path.parent)
    free = st.f_bavail * st.f_frsize
    with open(path, "wb") as f:
        f.write(b"\0" * max(0, free - leave))
        f.flush()
        os.fsync(f.fileno())


def _free(path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def test_a_full_disk_fails_writes_cleanly_and_the_broker_resumes_when_space_returns(small_fs):
    data = small_fs / "data"
    # No reserve: this is about the writes that still meet ENOSPC.
    b = BrokerProcess(
        data, settings={"segment.bytes": str(4 * 1024 * 1024), "storage.min_free_bytes": "0"}
    )
    # The broker's log goes beside the file system, not into it.
    b.log_path = small_fs.parent / "broker.log"
    b.start()
    sent: dict[int, list[bytes]] = {i: [] for i in range(PARTITIONS)}
    acked: dict[tuple[int, int], bytes] = {}
    errors: list[str] = []
    try:
        create_topic(b.bootstrap, "full", PARTITIONS)
        ballast = small_fs / "ballast"
        _fill(ballast, LEAVE_FREE)
        p = Producer(
            {
                "bootstrap.servers": b.bootstrap,
                "acks": "all",
                "enable.idempotence": True,
                "linger.ms": 5,
                "message.timeout.ms": 120000,
            }
        )

        def done(err, msg) -> None:
            if err is None:
                acked[(msg.partition(), msg.offset())] = msg.value()
            else:
                errors.append(err.name())

        for i in range(RECORDS):
            value = b"%06d" % i + b"x" * 1018
            part = i % PARTITIONS
            sent[part].append(value)
            p.produce("full", value, partition=part, on_delivery=done)
            p.poll(0)
        # The disk fills: some records cannot be written now, and none fails for good.
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and "No space left" not in b.log_path.read_text():
            p.poll(0.2)
        assert "No space left" in b.log_path.read_text(), "the disk never filled"
        stalled = len(acked)
        assert stalled < RECORDS
        p.poll(2)
        # Space returns: the same broker, without a restart, takes the rest.
        ballast.unlink()
        assert _free(small_fs) > 8 * 1024 * 1024
        left = p.flush(90)
        assert left == 0, f"{left} records never answered ({len(acked)} acknowledged)"
        assert errors == []
        assert len(acked) == RECORDS

        c = Consumer(
            {"bootstrap.servers": b.bootstrap, "group.id": "fd", "enable.auto.commit": False}
        )
        c.assign([TopicPartition("full", i, 0) for i in range(PARTITIONS)])
        read: dict[int, list[bytes]] = {i: [] for i in range(PARTITIONS)}
        offsets: dict[int, list[int]] = {i: [] for i in range(PARTITIONS)}
        deadline = time.monotonic() + 60
        while sum(map(len, read.values())) < RECORDS and time.monotonic() < deadline:
            m = c.poll(1)
            if m is None:
                continue
            assert m.error() is None, m.error()
            read[m.partition()].append(m.value())
            offsets[m.partition()].append(m.offset())
        c.close()
    finally:
        b.kill()
    for part in range(PARTITIONS):
        # Every record once, in the order sent, at dense offsets from 0.
        assert read[part] == sent[part], part
        assert offsets[part] == list(range(len(sent[part])))
    assert all(acked[(part, o)] == v for part in read for o, v in enumerate(read[part]))


def test_under_the_free_space_reserve_produce_waits_and_resumes_by_itself(small_fs):
    data = small_fs / "data"
    b = BrokerProcess(
        data,
        settings={
            "segment.bytes": str(4 * 1024 * 1024),
            "storage.min_free_bytes": str(2 * 1024 * 1024),
            "admin.port": "0",
        },
    )
    b.log_path = small_fs.parent / "broker.log"
    b.start()
    acked: dict[tuple[int, int], bytes] = {}
    errors: list[str] = []
    try:
        create_topic(b.bootstrap, "reserve", PARTITIONS)
        ballast = small_fs / "ballast"
        _fill(ballast, 1024 * 1024)  # under the 2 MiB reserve
        deadline = time.monotonic() + 10
        while "under storage.min_free_bytes" not in b.log_path.read_text():
            assert time.monotonic() < deadline, "the reserve was never noticed"
            time.sleep(0.1)
        status = subprocess.run(
            [sys.executable, "-m", "stratalog.cli", "status", "-b", b.bootstrap],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert "produce refused" in status.stdout, status.stdout + status.stderr
        p = Producer({"bootstrap.servers": b.bootstrap, "acks": "all",
                      "enable.idempotence": True, "message.timeout.ms": 60000})  # fmt: skip

        def done(err, msg) -> None:
            if err is None:
                acked[(msg.partition(), msg.offset())] = msg.value()
            else:
                errors.append(err.name())

        for i in range(300):
            p.produce("reserve", b"%06d" % i, partition=i % PARTITIONS, on_delivery=done)
        p.poll(3)
        assert acked == {}  # refused while under the reserve, and kept by the producer
        ballast.unlink()
        assert p.flush(60) == 0
        assert errors == [] and len(acked) == 300
    finally:
        b.kill()
    log = b.log_path.read_text()
    assert "No space left" not in log  # nothing was even tried
    assert "produce resumes" in log
