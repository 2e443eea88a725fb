"""Replicated virtual logs across three broker processes and a real etcd.

The oracles are outside the code under test: the producer's own delivery reports say what was
acknowledged; a consumer reads it back; and the backups' segment files are compared byte for
byte with the primary's (a virtual log is replicated as stored, segment boundaries included).
"""

from __future__ import annotations

import filecmp
import signal
import struct
import time

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from stratalog.cluster.local_cluster import LocalCluster
from stratalog.records import build_batch

from ..conformance import wire

PARTITIONS = 6


@pytest.fixture
def cluster(short_lag_cluster):
    return short_lag_cluster


def _metadata(bootstrap: str, name: str) -> dict:
    md = wire.call(bootstrap, 3, 12, topics=[{"name": name, "topic_id": None}],
                   allow_auto_topic_creation=False,
                   include_topic_authorized_operations=False)  # fmt: skip
    return md["topics"][0]


def _wait_in_sync(bootstrap: str, name: str, size: int, timeout: float = 30) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        t = _metadata(bootstrap, name)
        if t["partitions"] and all(len(p["isr_nodes"]) == size for p in t["partitions"]):
            return t
        assert time.monotonic() < deadline, t
        time.sleep(0.2)


def _create(bootstrap: str, name: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(name, PARTITIONS, 3, config={"min.insync.replicas": "2"})])[
        name
    ].result(timeout=30)


class _Acks:
    def __init__(self) -> None:
        self.acked: dict[tuple[int, int], bytes] = {}
        self.failed: list[str] = []

    def __call__(self, err, msg) -> None:
        if err is None:
            self.acked[(msg.partition(), msg.offset())] = msg.value()
        else:
            self.failed.append(err.name())


def _producer(bootstrap: str) -> Producer:
    return Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "enable.idempotence": True,
            "linger.ms": 2,
            "message.timeout.ms": 60000,
        }
    )


def _read_all(bootstrap: str, name: str, expect: int) -> dict[int, list[tuple[int, bytes]]]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"r-{time.monotonic()}",
                  "enable.auto.commit": False})  # fmt: skip
    c.assign([TopicPartition(name, i, 0) for i in range(PARTITIONS)])
    out: dict[int, list[tuple[int, bytes]]] = {i: [] for i in range(PARTITIONS)}
    n = 0
    deadline = time.monotonic() + 60
    while n < expect and time.monotonic() < deadline:
        m = c.poll(0.5)
        if m is None or m.error() is not None:
            continue
        out[m.partition()].append((m.offset(), m.value()))
        n += 1
    idle = time.monotonic() + 2  # anything past what was acknowledged shows up here
    while time.monotonic() < idle:
        m = c.poll(0.2)
        if m is not None and m.error() is None:
            out[m.partition()].append((m.offset(), m.value()))
    c.close()
    return out


def _check(acked: dict[tuple[int, int], bytes], read: dict[int, list[tuple[int, bytes]]]):
    values = [v for rows in read.values() for _o, v in rows]
    assert len(values) == len(set(values)), "a record was read twice"
    for part, rows in read.items():
        offsets = [o for o, _v in rows]
        assert offsets == sorted(offsets) and len(offsets) == len(set(offsets)), part
    got = {(p, o): v for p, rows in read.items() for o, v in rows}
    lost = [k for k, v in acked.items() if got.get(k) != v]
    assert not lost, f"{len(lost)} acknowledged records lost, e.g. {lost[:3]}"


def _segments_identical(cluster: LocalCluster) -> int:
    """Compare every replicated log's segment files across the brokers that hold it."""
    compared = 0
    logs: dict[str, list] = {}
    for b in cluster.brokers:
        for d in (b.data_dir / "logs").glob("g*"):
            logs.setdefault(d.name, []).append(d)
    for name, dirs in logs.items():
        first = dirs[0]
        for seg in sorted(first.glob("*.log")):
            for other in dirs[1:]:
                assert filecmp.cmp(seg, other / seg.name, shallow=False), (name, seg.name)
                compared += 1
    return compared


def test_backups_hold_the_primarys_bytes_and_join_the_in_sync_set(cluster):
    first = cluster.brokers[0].bootstrap
    _create(first, "rep")
    _wait_in_sync(first, "rep", 3)
    acks = _Acks()
    p = _producer(first)
    for i in range(3000):
        p.produce("rep", b"r%06d" % i + b"." * 200, key=b"%d" % (i % 97), on_delivery=acks)
        if i % 200 == 0:
            p.poll(0)
    assert p.flush(60) == 0
    assert acks.failed == [] and len(acks.acked) == 3000
    _check(acks.acked, _read_all(first, "rep", 3000))
    _wait_in_sync(first, "rep", 3)
    assert _segments_identical(cluster) >= 3  # three logs (one per primary), two backups each


@pytest.mark.parametrize("restart", ["after-failover", "at-once"])
def test_a_killed_primary_is_replaced_and_nothing_acknowledged_is_lost(cluster, restart):
    first = cluster.brokers[0].bootstrap
    _create(first, "fo")
    t = _wait_in_sync(first, "fo", 3)
    acks = _Acks()
    p = _producer(",".join(b.bootstrap for b in cluster.brokers))
    victim_id = t["partitions"][0]["leader_id"]
    victim = next(b for b in cluster.brokers if b.node_id == victim_id)
    survivor = next(b for b in cluster.brokers if b.node_id != victim_id)
    sent = 0
    killed_at = 0.0
    deadline = time.monotonic() + 40
    while sent < 4000 and time.monotonic() < deadline:
        p.produce("fo", b"f%06d" % sent, on_delivery=acks)
        sent += 1
        if sent == 1500:
            cluster.stop_broker(victim, signal.SIGKILL)
            killed_at = time.monotonic()
            if restart == "at-once":
                # Back before its lease expired: it waits for its old registration to go,
                # and leads nothing at its old epoch again.
                cluster.start_broker(victim)
        p.poll(0.001 if sent % 50 else 0.01)
    assert p.flush(60) == 0
    assert killed_at
    assert acks.failed == []
    t = _metadata(survivor.bootstrap, "fo")
    leaders = {x["leader_id"] for x in t["partitions"]}
    assert victim_id not in leaders and -1 not in leaders
    assert all(x["leader_epoch"] >= 1 for x in t["partitions"] if x["partition_index"] == 0)
    _check(acks.acked, _read_all(survivor.bootstrap, "fo", len(acks.acked)))
    _check_leader_epochs(cluster, t)

    # The killed broker comes back, recovers, is cut back or caught up, and is in sync again.
    if restart == "after-failover":
        cluster.start_broker(victim)
    _wait_in_sync(survivor.bootstrap, "fo", 3, timeout=60)
    p2 = _producer(survivor.bootstrap)
    for i in range(200):
        p2.produce("fo", b"g%06d" % i, on_delivery=acks)
    assert p2.flush(60) == 0
    _wait_in_sync(survivor.bootstrap, "fo", 3)
    assert _segments_identical(cluster) >= 3


def _epoch_end(bootstrap: str, partition: int, current: int, epoch: int) -> dict:
    asked = {"partition": partition, "current_leader_epoch": current, "leader_epoch": epoch}
    r = wire.call(bootstrap, 23, 4, replica_id=-1, topics=[{"topic": "fo", "partitions": [asked]}])
    return r["topics"][0]["partitions"][0]


def _check_leader_epochs(cluster: LocalCluster, t: dict) -> None:
    """OffsetForLeaderEpoch on the new leader of partition 0 (KIP-101/KIP-320)."""
    part = t["partitions"][0]
    leader = next(b for b in cluster.brokers if b.node_id == part["leader_id"])
    epoch = part["leader_epoch"]
    assert _epoch_end(leader.bootstrap, 0, epoch - 1, 0)["error_code"] == 74  # FENCED
    assert _epoch_end(leader.bootstrap, 0, epoch + 1, 0)["error_code"] == 75  # UNKNOWN
    now = _epoch_end(leader.bootstrap, 0, epoch, epoch)
    old = _epoch_end(leader.bootstrap, 0, epoch, 0)
    assert now["error_code"] == old["error_code"] == 0
    assert now["leader_epoch"] == epoch and old["leader_epoch"] == 0
    # Every batch carries the epoch it was written in (stamped by the primary), and epoch 0
    # ends exactly where the first batch of a later epoch begins.
    stamped = _batch_epochs(leader.bootstrap, now["end_offset"])
    assert stamped[0] == (0, 0) and [e for _, e in stamped] == sorted(e for _, e in stamped)
    assert stamped[-1][1] <= epoch
    later = [base for base, e in stamped if e > 0]
    assert old["end_offset"] == (later[0] if later else now["end_offset"])


def _batch_epochs(bootstrap: str, end: int) -> list[tuple[int, int]]:
    """(base offset, partitionLeaderEpoch) of each batch of fo-0 below ``end``, as fetched."""
    out: list[tuple[int, int]] = []
    offset = 0
    while offset < end:
        r = wire.call(
            bootstrap, 1, 12, replica_id=-1, max_wait=100, min_bytes=1, max_bytes=8 << 20,
            isolation_level=0, session_id=0, session_epoch=-1,
            topics=[{"topic": "fo", "partitions": [{
                "partition": 0, "current_leader_epoch": -1, "fetch_offset": offset,
                "last_fetched_epoch": -1, "log_start_offset": -1,
                "partition_max_bytes": 8 << 20}]}],
            forgotten_topics_data=[], rack_id="",
        )  # fmt: skip
        part = r["responses"][0]["partitions"][0]
        assert part["error_code"] == 0
        data, at = part["records"], 0
        assert data
        while at + 16 <= len(data):
            base, length, epoch = struct.unpack_from(">qii", data, at)
            out.append((base, epoch))
            at += 12 + length
        offset = _last_offset(data)
    return out


def _last_offset(data: bytes) -> int:
    at = last = 0
    while at + 61 <= len(data):
        base, length = struct.unpack_from(">qi", data, at)
        (delta,) = struct.unpack_from(">i", data, at + 23)
        last = base + delta + 1
        at += 12 + length
    return last


def test_committed_offsets_survive_the_coordinators_death(cluster):
    bootstrap = ",".join(b.bootstrap for b in cluster.brokers)
    _create(bootstrap, "grp")
    _wait_in_sync(cluster.brokers[0].bootstrap, "grp", 3)
    p = _producer(bootstrap)
    for i in range(600):
        p.produce("grp", b"g%04d" % i)
    assert p.flush(30) == 0
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "survivors",
                  "auto.offset.reset": "earliest", "enable.auto.commit": False})  # fmt: skip
    c.subscribe(["grp"])
    seen = 0
    deadline = time.monotonic() + 60
    while seen < 600 and time.monotonic() < deadline:
        m = c.poll(0.5)
        if m is not None and m.error() is None:
            seen += 1
    assert seen == 600
    c.commit(asynchronous=False)
    committed = {tp.partition: tp.offset for tp in c.committed(
        [TopicPartition("grp", i) for i in range(PARTITIONS)], timeout=30)}  # fmt: skip
    c.close()
    # Partitions that got no record have no commit (-1001, OFFSET_INVALID).
    assert sum(o for o in committed.values() if o >= 0) == 600
    found = wire.call(cluster.brokers[0].bootstrap, 10, 4, key_type=0,
                      coordinator_keys=["survivors"])["coordinators"][0]  # fmt: skip
    assert found["error_code"] == 0
    coordinator = next(b for b in cluster.brokers if b.node_id == found["node_id"])
    cluster.stop_broker(coordinator, signal.SIGKILL)
    # Another broker coordinates the group now, with the commits replicated to it.
    c2 = Consumer({"bootstrap.servers": bootstrap, "group.id": "survivors"})
    deadline = time.monotonic() + 60
    again: dict[int, int] = {}
    while time.monotonic() < deadline:
        try:
            tps = c2.committed([TopicPartition("grp", i) for i in range(PARTITIONS)], timeout=10)
            again = {tp.partition: tp.offset for tp in tps}
            if again == committed:
                break
        except Exception:
            pass
        time.sleep(0.5)
    c2.close()
    assert again == committed


def _wait_led_without(bootstrap: str, name: str, victim_id: int) -> None:
    """Until every partition of ``name`` has a leader, and none is ``victim_id``."""
    deadline = time.monotonic() + 30
    while True:
        leaders = {x["leader_id"] for x in _metadata(bootstrap, name)["partitions"]}
        if victim_id not in leaders and -1 not in leaders:
            return
        assert time.monotonic() < deadline, leaders
        time.sleep(0.1)


def test_a_dead_brokers_lease_is_revoked_by_the_peers_that_saw_it_die(cluster):
    """kill -9 closes a broker's sockets at once: the peers whose replication connections to it
    ended probe its Kafka port, find it refusing, and revoke its etcd lease, so the controller
    fails over without waiting for the lease to expire (a paused process still accepts
    connections, so only its lease can end it)."""
    first = cluster.brokers[0].bootstrap
    _create(first, "dd")
    t = _wait_in_sync(first, "dd", 3)
    victim_id = t["partitions"][0]["leader_id"]
    victim = next(b for b in cluster.brokers if b.node_id == victim_id)
    survivors = [b for b in cluster.brokers if b is not victim]
    p = _producer(",".join(b.bootstrap for b in cluster.brokers))
    for i in range(300):
        p.produce("dd", b"d%04d" % i)
    assert p.flush(30) == 0
    cluster.stop_broker(victim, signal.SIGKILL)
    _wait_led_without(survivors[0].bootstrap, "dd", victim_id)
    said = "".join(b.log_path.read_text() for b in survivors)
    assert f"broker {victim_id} is gone" in said and "its lease revoked" in said
    for i in range(100):
        p.produce("dd", b"e%04d" % i)
    assert p.flush(30) == 0


def test_a_new_controller_probes_the_in_sync_brokers_absent_at_its_start(cluster):
    """kill -9 of the broker that is both controller and a leader: a peer revokes its lease,
    which takes the controller key with it. The broker elected next grants a broker absent at
    the start of its term a lease's grace (it may be registering again after an etcd outage),
    unless it proves it gone: it probes those in-sync brokers itself, so the killed one's
    logs move at once instead of after the grace (the benchmark's slowest failovers)."""
    first = cluster.brokers[0].bootstrap
    _create(first, "cc")
    _wait_in_sync(first, "cc", 3)
    victim_id = wire.call(first, 3, 12, topics=[], allow_auto_topic_creation=False,
                          include_topic_authorized_operations=False)["controller_id"]  # fmt: skip
    assert victim_id in {p["leader_id"] for p in _metadata(first, "cc")["partitions"]}
    victim = next(b for b in cluster.brokers if b.node_id == victim_id)
    survivors = [b for b in cluster.brokers if b is not victim]
    cluster.stop_broker(victim, signal.SIGKILL)
    _wait_led_without(survivors[0].bootstrap, "cc", victim_id)
    # The controller logs the failover once its etcd transaction returned, which may be a
    # moment after the brokers' watches (and so the metadata) saw the new primary.
    gone = f"primary {victim_id} is gone"
    for _ in range(100):
        logs = {b.node_id: b.log_path.read_text() for b in survivors}
        if any(gone in text for text in logs.values()):
            break
        time.sleep(0.05)
    probed = [n for n, text in logs.items() if f"in-sync broker {victim_id} is absent" in text]
    assert len(probed) == 1, logs
    assert gone in logs[probed[0]], logs


def test_a_write_committed_by_a_shrunken_in_sync_set_is_not_acknowledged(cluster):
    """acks=all with min.insync.replicas=2: both backups of a partition freeze while a write
    waits for them; once their leases expire the in-sync set is the primary alone, which
    commits the write, and the answer is NOT_ENOUGH_REPLICAS_AFTER_APPEND (Kafka's), not an
    acknowledgement two replicas never gave."""
    first = cluster.brokers[0].bootstrap
    _create(first, "shrink")
    t = _wait_in_sync(first, "shrink", 3)
    leader_id = t["partitions"][0]["leader_id"]
    leader = next(b for b in cluster.brokers if b.node_id == leader_id)
    backups = [b for b in cluster.brokers if b is not leader]
    batch = build_batch([(b"k", b"v", int(time.time() * 1000))])
    data = [{"name": "shrink", "partition_data": [{"index": 0, "records": batch}]}]
    for b in backups:
        cluster.send_signal(b, signal.SIGSTOP)
    try:
        r = wire.call(
            leader.bootstrap, 0, 9, transactional_id=None, acks=-1, timeout=25000, topic_data=data
        )
    finally:
        for b in backups:
            cluster.send_signal(b, signal.SIGCONT)
    part = r["responses"][0]["partition_responses"][0]
    assert part["error_code"] == 20, part  # NOT_ENOUGH_REPLICAS_AFTER_APPEND
    # Written all the same (Kafka's rule too): the backups catch up with it and rejoin.
    _wait_in_sync(leader.bootstrap, "shrink", 3, timeout=60)


def _leader_and_backups(cluster: LocalCluster, name: str):
    _create(cluster.brokers[0].bootstrap, name)
    t = _wait_in_sync(cluster.brokers[0].bootstrap, name, 3)
    leader = next(b for b in cluster.brokers if b.node_id == t["partitions"][0]["leader_id"])
    return leader, [b for b in cluster.brokers if b is not leader]


def _idempotent_writer(bootstrap: str, name: str):
    """A new producer id, and a function sending one of its batches (sequence, value) to
    partition 0 with acks=all; it returns the partition's answer."""
    pid = wire.call(bootstrap, 22, 4, transactional_id=None, transaction_timeout=-1,
                    producer_id=-1, producer_epoch=-1)["producer_id"]  # fmt: skip

    def produce(seq: int, value: bytes) -> dict:
        batch = build_batch([(b"k", value, int(time.time() * 1000))],
                            producer_id=pid, producer_epoch=0, base_sequence=seq)  # fmt: skip
        data = [{"name": name, "partition_data": [{"index": 0, "records": batch}]}]
        r = wire.call(bootstrap, 0, 9, transactional_id=None, acks=-1, timeout=25000,
                      topic_data=data)  # fmt: skip
        return r["responses"][0]["partition_responses"][0]

    return produce


def _values_of_partition_0(bootstrap: str, name: str) -> list[bytes]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": name,
                  "enable.partition.eof": True})  # fmt: skip
    c.assign([TopicPartition(name, 0, 0)])
    values = []
    while True:
        m = c.poll(10)
        assert m is not None, values
        if m.error():
            break  # end of the partition
        values.append(m.value())
    c.close()
    return values


def test_a_retry_of_a_written_batch_is_its_duplicate_while_the_in_sync_set_is_short(cluster):
    """An idempotent batch written and then left with too few in-sync replicas is answered
    NOT_ENOUGH_REPLICAS_AFTER_APPEND; the producer's retry of it, while the set is still short,
    is that batch (answered with its offset once committed), not NOT_ENOUGH_REPLICAS: librdkafka
    takes the latter for "never written" and, after a producer-epoch bump, sends it again as new
    records (the fault soak's duplicates)."""
    leader, backups = _leader_and_backups(cluster, "retry-short")
    produce = _idempotent_writer(leader.bootstrap, "retry-short")
    for b in backups:
        cluster.send_signal(b, signal.SIGSTOP)
    try:
        written = produce(0, b"once")
        retried = produce(0, b"once")
    finally:
        for b in backups:
            cluster.send_signal(b, signal.SIGCONT)
    assert written["error_code"] == 20, written  # NOT_ENOUGH_REPLICAS_AFTER_APPEND
    assert retried["error_code"] == 0, retried  # not 19, NOT_ENOUGH_REPLICAS
    _wait_in_sync(leader.bootstrap, "retry-short", 3, timeout=60)
    assert _values_of_partition_0(leader.bootstrap, "retry-short") == [b"once"]
    assert retried["base_offset"] == 0


def test_the_batches_behind_a_refused_one_are_refused_alike_not_as_a_gap(cluster):
    """A batch refused NOT_ENOUGH_REPLICAS (unwritten) while the in-sync set is short; the set
    is whole again before the producer's next batch comes. That one used to fail the sequence
    check (OUT_OF_ORDER_SEQUENCE_NUMBER), which librdkafka takes for a lost request: it bumps
    its producer epoch and renumbers every unacknowledged record, some already written (the
    fault soak's duplicates). It gets the first one's refusal instead, and the producer's retry
    from the refused batch writes both once."""
    leader, backups = _leader_and_backups(cluster, "refused-window")
    produce = _idempotent_writer(leader.bootstrap, "refused-window")
    for b in backups:
        cluster.send_signal(b, signal.SIGSTOP)
    try:
        shrunk = _wait_in_sync(leader.bootstrap, "refused-window", 1, timeout=30)
        refused = produce(0, b"v0")
    finally:
        for b in backups:
            cluster.send_signal(b, signal.SIGCONT)
    assert refused["error_code"] == 19, (refused, shrunk)  # NOT_ENOUGH_REPLICAS
    _wait_in_sync(leader.bootstrap, "refused-window", 3, timeout=60)
    behind = produce(1, b"v1")
    assert behind["error_code"] == 19, behind  # not 45, OUT_OF_ORDER_SEQUENCE_NUMBER
    assert "sequence 0" in behind["error_message"]
    assert produce(0, b"v0")["error_code"] == 0
    assert produce(1, b"v1")["error_code"] == 0
    assert _values_of_partition_0(leader.bootstrap, "refused-window") == [b"v0", b"v1"]
    # A gap that no refusal here explains is still one.
    assert produce(5, b"v5")["error_code"] == 45
