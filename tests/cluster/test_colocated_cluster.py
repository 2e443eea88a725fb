"""Co-located reads in a cluster: only the leader's files are read, and only what its in-sync
set has committed.

Three brokers on this host, so every partition's leader is co-located: ``find`` must pick the
leader's directory (DescribeLogDirs answered by the leader), never a backup's, whose slots say
they are not readable. With both backups of a partition paused (SIGSTOP), records the leader
has written (acks=1) but not committed are in its segment file and must not be read directly,
exactly as ListOffsets (the high watermark) does not show them; once the backups resume they are.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import pyarrow as pa
import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from stratalog.client.arrow_reader import read_partition
from stratalog.client.colocated import ColocatedPartition, find
from stratalog.client.wire import LATEST, WireClient
from stratalog.cluster.local_cluster import LocalCluster

from .waits import until

TOPIC = "co"
PARTITIONS = 3


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    # Backups paused for a few seconds stay in the in-sync set: the leader cannot commit alone.
    c = LocalCluster(
        tmp_path_factory.mktemp("cluster") / "c",
        brokers=3,
        settings={"replica.lag.time.max.ms": "60000"},
    )
    c.start()
    try:
        yield c
    finally:
        c.stop()


def _produce(bootstrap: str, n: int, partition: int | None = None, acks: str = "all") -> None:
    p = Producer({"bootstrap.servers": bootstrap, "acks": acks, "linger.ms": 2, "batch.size": 4096})
    for i in range(n):
        part = i % PARTITIONS if partition is None else partition
        p.produce(TOPIC, key=b"%d" % i, value=b"record-%d" % i * 10, partition=part)
    assert p.flush(60) == 0


def _end(c: WireClient, partition: int) -> int:
    return c.list_offsets(TOPIC, [partition], LATEST)[partition][0]


def _reach(local: ColocatedPartition, end: int) -> int:
    offset = 0
    while offset < end + 1_000:
        got = local.read(offset, 1 << 20)
        if got is None or not got.records:
            break
        offset = got.next_offset
    return offset


def test_only_the_leaders_committed_records_are_read_directly(cluster: LocalCluster) -> None:
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    admin.create_topics([NewTopic(TOPIC, PARTITIONS, 3)])[TOPIC].result(timeout=30)
    _produce(cluster.bootstrap, 900)
    with WireClient(cluster.bootstrap) as c:
        until(lambda: all(_end(c, p) == 300 for p in range(PARTITIONS)), "every record acked")
        for p in range(PARTITIONS):
            leader = c.leaders.leader(TOPIC, p)
            local = find(c, TOPIC, p)
            assert local is not None
            with local:
                owner = next(b for b in cluster.brokers if b.node_id == leader)
                assert local.root == owner.data_dir / "logs"
                direct = list(read_partition(c, TOPIC, p, 0, 300, colocated=local))
                fetched = list(read_partition(c, TOPIC, p, 0, 300))
                assert pa.Table.from_batches(direct).equals(pa.Table.from_batches(fetched))
                assert sum(r.num_rows for r in fetched) == 300
            for b in cluster.brokers:
                if b.node_id != leader:
                    with ColocatedPartition(b.data_dir / "logs", TOPIC, p) as backup:
                        state = backup.state()
                        assert state is not None and not state.readable
                        assert backup.read(0, 1 << 20) is None

        # Both backups of partition 0 paused: the leader writes, but cannot commit.
        leader = c.leaders.leader(TOPIC, 0)
        owner = next(b for b in cluster.brokers if b.node_id == leader)
        backups = [b for b in cluster.brokers if b.node_id != leader]
        local = find(c, TOPIC, 0)
        assert local is not None
        with local:
            state = local.state()
            assert state is not None
            log_dir = owner.data_dir / "logs" / state.log
            written = sum(f.stat().st_size for f in log_dir.glob("*.log"))
            for b in backups:
                os.kill(b.pid, signal.SIGSTOP)
            try:
                _produce(owner.bootstrap, 50, partition=0, acks="1")
                grown = sum(f.stat().st_size for f in log_dir.glob("*.log"))
                assert grown > written  # the records are in the leader's file ...
                assert _end(c, 0) == 300  # ... not committed ...
                assert _reach(local, 300) == 300  # ... and not read directly
            finally:
                for b in backups:
                    os.kill(b.pid, signal.SIGCONT)
            until(lambda: _end(c, 0) == 350, "the paused records committed")
            assert _reach(local, 350) == 350
