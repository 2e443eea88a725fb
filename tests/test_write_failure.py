"""A segment write that fails (here: the file-size limit, EFBIG) fails the log cleanly.

The broker runs with RLIMIT_FSIZE set, so its segment files cannot grow past 3 MB and writes
start failing mid-load (Python ignores SIGXFSZ, so the write returns EFBIG). Produce requests
that hit it must get KAFKA_STORAGE_ERROR, none may be acknowledged without being written, and
after a restart without the limit every acknowledged record reads back intact.
"""

from __future__ import annotations

import resource
import subprocess
import sys

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from .conftest import BrokerProcess, create_topic

LIMIT = 3_000_000
RECORDS = 16_000
PARTITIONS = 4


def _limited_broker(data_dir, *settings: str) -> tuple[subprocess.Popen, str]:
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (LIMIT, LIMIT))

    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "stratalog.cli",
            "serve",
            "-d",
            str(data_dir),
            "--port",
            "0",
            "--log-level",
            "ERROR",
            *(a for kv in settings for a in ("--set", kv)),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        preexec_fn=limit,
    )
    line = proc.stdout.readline().decode()
    assert "ready at" in line, line
    return proc, line.split()[-1]


@pytest.mark.parametrize("direct", ["false", "true"], ids=["buffered", "direct-io"])
def test_a_failed_segment_write_answers_storage_error_and_loses_no_acknowledged_record(
    tmp_path, direct
):
    data = tmp_path / "data"
    proc, bootstrap = _limited_broker(
        data, f"storage.direct_io={direct}", "storage.direct_min_bytes=0"
    )
    acked: dict[tuple[int, int], bytes] = {}
    errors: set[str] = set()
    try:
        create_topic(bootstrap, "t", PARTITIONS)
        p = Producer(
            {
                "bootstrap.servers": bootstrap,
                "acks": "all",
                "linger.ms": 2,
                "retries": 0,
                "message.timeout.ms": 15000,
            }
        )

        def done(err, msg) -> None:
            if err is None:
                acked[(msg.partition(), msg.offset())] = msg.value()
            else:
                errors.add(err.name())

        for i in range(RECORDS):
            p.produce("t", b"%07d" % i + b"x" * 1000, partition=i % PARTITIONS, on_delivery=done)
            if i % 500 == 0:
                p.poll(0.02)
        assert p.flush(30) == 0
    finally:
        proc.kill()
        proc.wait(timeout=30)
    assert errors == {"KAFKA_STORAGE_ERROR"}
    assert 0 < len(acked) < RECORDS

    b = BrokerProcess(data).start()
    try:
        c = Consumer(
            {"bootstrap.servers": b.bootstrap, "group.id": "wf", "enable.auto.commit": False}
        )
        c.assign([TopicPartition("t", i, 0) for i in range(PARTITIONS)])
        read: dict[tuple[int, int], bytes] = {}
        idle = 0
        while idle < 3:
            m = c.poll(1)
            if m is None:
                idle += 1
                continue
            assert m.error() is None, m.error()
            read[(m.partition(), m.offset())] = m.value()
        c.close()
    finally:
        b.kill()
    missing = [k for k, v in acked.items() if read.get(k) != v]
    assert not missing, missing[:5]
