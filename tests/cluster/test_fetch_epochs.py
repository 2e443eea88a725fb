"""KIP-320 on Fetch in a cluster: the leader serves a Fetch only at its own leader epoch.

A Fetch whose current leader epoch is older gets FENCED_LEADER_EPOCH (with the current leader,
KIP-951), a newer one UNKNOWN_LEADER_EPOCH, and neither any record; -1 is not checked. Serving
stale-epoch fetches is the likely cause of the soak's poll-skip (issue 27): a consumer that
learned of a new epoch while a fetch was in flight validated a position that fetch then moved,
took the leader's answer for a truncation and seeked forward over records it had fetched but
not handed over. Three `stratalog serve` processes, real etcd, confluent-kafka, raw requests.
"""

from __future__ import annotations

import time

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from ..conformance import wire
from .waits import until

TOPIC = "fenced"
FENCED_LEADER_EPOCH = 74
UNKNOWN_LEADER_EPOCH = 75


def _partition(bootstrap: str) -> dict:
    md = wire.call(
        bootstrap, 3, 12, topics=[{"name": TOPIC, "topic_id": None}],
        allow_auto_topic_creation=False, include_topic_authorized_operations=False,
    )  # fmt: skip
    return md["topics"][0]["partitions"][0]


def _settled(bootstrap: str, epoch_above: int = -1) -> dict:
    def check():
        p = _partition(bootstrap)
        ok = p["leader_id"] >= 0 and len(p["isr_nodes"]) == 3 and p["leader_epoch"] > epoch_above
        return p if ok else None

    return until(check, f"{TOPIC} to settle", timeout=60)


def _fetch(bootstrap: str, current_epoch: int, version: int = 16) -> dict:
    r = wire.call(
        bootstrap, 1, version, cluster_id=None, replica_id=-1,
        replica_state={"replica_id": -1, "replica_epoch": -1},
        max_wait=100, min_bytes=1, max_bytes=1 << 20, isolation_level=1, session_id=0,
        session_epoch=-1,
        topics=[{"topic": TOPIC, "topic_id": wire.topic_id(bootstrap, TOPIC), "partitions": [{
            "partition": 0, "current_leader_epoch": current_epoch, "fetch_offset": 0,
            "last_fetched_epoch": -1, "log_start_offset": -1, "partition_max_bytes": 1 << 20}]}],
        forgotten_topics_data=[], rack_id="",
    )  # fmt: skip
    return r["responses"][0]["partitions"][0]


def _produce(bootstrap: str, values: range) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True})
    for v in values:
        p.produce(TOPIC, value=str(v).encode(), partition=0)
    assert p.flush(30) == 0


def _read(c: Consumer, n: int) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    deadline = time.monotonic() + 60
    while len(out) < n and time.monotonic() < deadline:
        out += [(m.offset(), int(m.value())) for m in c.consume(100, 0.5) if m.error() is None]
    return out


def test_a_fetch_at_another_leader_epoch_is_refused_and_a_consumer_goes_on(cluster):
    bootstrap = cluster.brokers[0].bootstrap  # (raw requests take one address)
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    admin.create_topics([NewTopic(TOPIC, 1, 3)])[TOPIC].result(timeout=30)
    before = _settled(bootstrap)
    _produce(cluster.bootstrap, range(50))
    c = Consumer(
        {
            "bootstrap.servers": cluster.bootstrap,
            "group.id": "fenced",
            "enable.auto.commit": False,
            "topic.metadata.refresh.interval.ms": 60_000,  # it learns the new epoch when fenced
        }
    )
    try:
        c.assign([TopicPartition(TOPIC, 0, 0)])
        assert _read(c, 50) == [(i, i) for i in range(50)]  # it holds the first epoch now

        # A clean stop hands the log to an in-sync peer at a new epoch; back, it follows.
        leader = next(b for b in cluster.brokers if b.node_id == before["leader_id"])
        cluster.stop_broker(leader)
        cluster.start_broker(leader)
        now = _settled(bootstrap, epoch_above=before["leader_epoch"])
        at = next(b for b in cluster.brokers if b.node_id == now["leader_id"]).bootstrap
        epoch = now["leader_epoch"]

        stale = _fetch(at, epoch - 1)
        assert stale["error_code"] == FENCED_LEADER_EPOCH
        assert not stale["records"]
        assert stale["current_leader"] == {"leader_id": now["leader_id"], "leader_epoch": epoch}
        newer = _fetch(at, epoch + 1)
        assert newer["error_code"] == UNKNOWN_LEADER_EPOCH and not newer["records"]
        for current in (epoch, -1):  # its own epoch, or none given: served
            part = _fetch(at, current)
            assert part["error_code"] == 0 and part["records"], current

        # The consumer still on the old epoch is fenced, learns the new one and reads on.
        _produce(cluster.bootstrap, range(50, 100))
        assert _read(c, 50) == [(i, i) for i in range(50, 100)]
    finally:
        c.close()
