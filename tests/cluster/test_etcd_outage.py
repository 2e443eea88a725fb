"""An etcd outage with every broker alive moves no virtual log and shrinks no in-sync set.

During the outage every broker loses its lease; when etcd is back they register again within
moments of each other. The first one back used to become controller, take the others for dead,
move their virtual logs to itself and drop them from every in-sync set: a failover with nothing
dead, and NOT_ENOUGH_REPLICAS answers to acks=all producers, which librdkafka followed with a
producer-epoch bump that re-sent written records as new ones (the fault soak's duplicates). Now
a controller gives a broker absent at the start of its term a lease's time to come back.

Meanwhile each broker, unregistered, still lists itself in Metadata: the empty broker list it
answered made librdkafka drop every broker it knew and wait minutes before bootstrapping again
(the soak's stalled producers).

A real etcd killed with SIGKILL and started again on the same data, three real brokers.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from stratalog.cluster.local_cluster import LocalCluster

from ..conformance import wire
from .waits import until

TOPIC = "outage"
LEASE_TTL = 3  # the brokers' lease (cluster.lease_ttl's default)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    c = LocalCluster(tmp_path_factory.mktemp("outage") / "c", brokers=3, log_level="INFO")
    c.start()
    try:
        yield c
    finally:
        c.stop()


def _placement(bootstrap: str) -> dict[int, tuple[int, int, tuple[int, ...]]]:
    """partition -> (leader, leader epoch, sorted in-sync replicas), as the cluster says."""
    md = wire.metadata(bootstrap, TOPIC)
    return {
        p["partition_index"]: (p["leader_id"], p["leader_epoch"], tuple(sorted(p["isr_nodes"])))
        for p in md["topics"][0]["partitions"]
    }


def _settled(bootstrap: str) -> dict | None:
    md = wire.metadata(bootstrap, TOPIC)
    if len(md["brokers"]) != 3:
        return None
    placed = _placement(bootstrap)
    settled = all(leader >= 0 and len(isr) == 3 for leader, _e, isr in placed.values())
    return placed if settled else None


def test_an_etcd_restart_moves_no_log_and_drops_no_replica(cluster: LocalCluster) -> None:
    bs = cluster.brokers[0].bootstrap
    r = wire.call(
        bs, 19, 7,
        topics=[{"name": TOPIC, "num_partitions": 3, "replication_factor": 3, "assignments": [],
                 "configs": [{"name": "min.insync.replicas", "value": "2"}]}],
        timeout=30000, validate_only=False,
    )  # fmt: skip
    assert r["topics"][0]["error_code"] == 0, r
    before = until(lambda: _settled(bs), "the topic led and fully in sync", timeout=60)

    cluster.etcd.kill()
    time.sleep(LEASE_TTL + 1)  # every broker's lease has run out
    cluster.etcd.start()
    # Until all are back (their old registrations expire first), every answer lists the broker
    # that gives it: an empty broker list made librdkafka forget every broker it knew and stall
    # for minutes.
    missing: list = []
    deadline = time.monotonic() + 60
    while _settled(bs) is None:
        assert time.monotonic() < deadline, "the brokers did not register again"
        for b in cluster.brokers:
            listed = [x["node_id"] for x in wire.metadata(b.bootstrap, TOPIC)["brokers"]]
            if b.node_id not in listed:
                missing.append((b.node_id, listed))
    assert missing == []
    # The controller's grace (a lease's time) is over: whatever it would do, it has done.
    time.sleep(LEASE_TTL + 1)
    after = until(lambda: _settled(bs), "the cluster to stay settled", timeout=30)
    assert after == before, f"an etcd restart changed placements: {before} -> {after}"
    logs = "".join(b.log_path.read_text(errors="replace") for b in cluster.brokers)
    assert "dead brokers dropped" not in logs
    assert "is gone;" not in logs
