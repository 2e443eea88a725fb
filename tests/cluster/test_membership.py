"""Brokers joining a cluster through a real etcd: what clients see, and what is refused.

A LocalCluster (one etcd, three `stratalog serve` processes on 127.0.0.1) is what
`stratalog cluster up` starts. Kafka clients are given one broker's address and must find the
others: Metadata lists every live broker, and each partition's leader is the primary of the
virtual log that carries it (KerA: partitions with the same replica list share one log).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections import Counter

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from stratalog.cluster.local_cluster import LocalCluster

from ..conformance import wire
from .etcd_gateway import etcd_delete, etcd_value


def _metadata(bootstrap: str, topics=None) -> dict:
    return wire.call(
        bootstrap,
        3,
        12,
        topics=topics,
        allow_auto_topic_creation=False,
        include_topic_authorized_operations=False,
    )


def _create(bootstrap: str, name: str, partitions: int, factor: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(name, partitions, factor)])[name].result(timeout=30)


def _wait_topic(bootstrap: str, name: str, partitions: int) -> dict:
    """Metadata of ``name`` from ``bootstrap`` once every partition has a leader."""
    deadline = time.monotonic() + 20
    while True:
        md = _metadata(bootstrap, [{"name": name, "topic_id": None}])
        t = md["topics"][0]
        if len(t["partitions"]) == partitions and all(p["leader_id"] >= 0 for p in t["partitions"]):
            return md
        assert time.monotonic() < deadline, md
        time.sleep(0.1)


def test_every_broker_lists_the_whole_cluster(cluster):
    for b in cluster.brokers:
        md = _metadata(b.bootstrap)
        listed = sorted((x["node_id"], x["port"]) for x in md["brokers"])
        assert listed == [(x.node_id, x.port) for x in cluster.brokers]
        assert md["controller_id"] in {x.node_id for x in cluster.brokers}
        assert md["cluster_id"]
    ids = {_metadata(b.bootstrap)["cluster_id"] for b in cluster.brokers}
    assert len(ids) == 1


def test_a_replicated_topic_spreads_leaders_over_virtual_logs(cluster):
    first = cluster.brokers[0].bootstrap
    _create(first, "spread", 12, 3)
    for b in cluster.brokers:  # every broker learns of it through its etcd watch
        md = _wait_topic(b.bootstrap, "spread", 12)
        parts = md["topics"][0]["partitions"]
        assert all(sorted(p["replica_nodes"]) == [1, 2, 3] for p in parts)
        assert all(p["leader_id"] == p["replica_nodes"][0] for p in parts)
        assert all(p["leader_id"] in p["isr_nodes"] for p in parts)
        # Three replica orders, so three virtual logs, one led by each broker.
        assert Counter(p["leader_id"] for p in parts) == {1: 4, 2: 4, 3: 4}


def test_clients_given_one_broker_produce_to_and_consume_from_the_leaders(cluster):
    first = cluster.brokers[0].bootstrap
    _create(first, "routed", 6, 2)
    _wait_topic(first, "routed", 6)
    p = Producer({"bootstrap.servers": first, "acks": "all", "enable.idempotence": True})
    acked: dict[tuple[int, int], bytes] = {}

    def done(err, msg) -> None:
        assert err is None, err
        acked[(msg.partition(), msg.offset())] = msg.value()

    for i in range(600):
        p.produce("routed", b"v%d" % i, key=b"k%d" % i, on_delivery=done)
    assert p.flush(30) == 0
    assert len(acked) == 600
    c = Consumer({"bootstrap.servers": first, "group.id": "routed-g", "enable.auto.commit": False})
    c.assign([TopicPartition("routed", i, 0) for i in range(6)])
    read: dict[tuple[int, int], bytes] = {}
    deadline = time.monotonic() + 30
    while len(read) < 600 and time.monotonic() < deadline:
        m = c.poll(0.5)
        if m is not None and m.error() is None:
            read[(m.partition(), m.offset())] = m.value()
    c.close()
    assert read == acked


def test_a_broker_that_does_not_lead_a_partition_says_so(cluster):
    first = cluster.brokers[0].bootstrap
    _create(first, "lead", 3, 3)
    md = _wait_topic(first, "lead", 3)
    part = md["topics"][0]["partitions"][0]
    other = next(b for b in cluster.brokers if b.node_id != part["leader_id"])
    # The other broker's copy of etcd may lag the first's for a moment after the creation.
    deadline = time.monotonic() + 15
    while (got := wire.list_offset(other.bootstrap, "lead", part["partition_index"], -1))[
        "error_code"
    ] != 6 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert got["error_code"] == 6  # NOT_LEADER_OR_FOLLOWER


def test_a_replication_factor_beyond_the_brokers_is_refused(cluster):
    admin = AdminClient({"bootstrap.servers": cluster.brokers[0].bootstrap})
    f = admin.create_topics([NewTopic("too-many", 1, 4)])["too-many"]
    with pytest.raises(Exception) as e:
        f.result(timeout=30)
    assert "INVALID_REPLICATION_FACTOR" in str(e.value)


def _serve(data_dir, etcd: str, node_id: int) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "stratalog.cli", "serve", "--data-dir", str(data_dir),
         "--port", "0", "--node-id", str(node_id), "--etcd", etcd],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def test_a_duplicate_node_id_is_refused_with_a_clear_error(cluster, tmp_path):
    done = _serve(tmp_path / "dup", cluster.etcd.endpoint, 2)
    assert done.returncode != 0
    assert "node id 2 is already registered" in done.stderr


def test_an_unreachable_etcd_is_refused_with_a_clear_error(tmp_path):
    done = _serve(tmp_path / "lonely", "http://127.0.0.1:1", 1)
    assert done.returncode != 0
    assert "cannot join the cluster" in done.stderr
    assert "127.0.0.1:1" in done.stderr


def test_a_data_directory_of_another_cluster_is_refused(cluster, tmp_path):
    # A data directory that already belongs to a cluster (here: a single node's own).
    other = LocalCluster(tmp_path / "other", brokers=1)
    other.start()
    other.stop()
    done = _serve(other.brokers[0].data_dir, cluster.etcd.endpoint, 7)
    assert done.returncode != 0
    assert "belongs to cluster" in done.stderr


def test_cluster_up_and_down_from_the_command_line(tmp_path):
    root = tmp_path / "cli"
    up = subprocess.run(
        [sys.executable, "-m", "stratalog.cli", "cluster", "up", "--brokers", "2",
         "--data-dir", str(root)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    try:
        assert up.returncode == 0, up.stderr
        lines = up.stdout.splitlines()
        bootstrap = next(x.split(": ", 1)[1] for x in lines if x.startswith("bootstrap"))
        md = _metadata(bootstrap.split(",")[1])
        assert len(md["brokers"]) == 2
        state = json.loads((root / "cluster-state.json").read_text())
        pids = [b["pid"] for b in state["brokers"]] + [state["etcd"]["pid"]]
    finally:
        down = subprocess.run(
            [sys.executable, "-m", "stratalog.cli", "cluster", "down", "--data-dir", str(root)],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    assert down.returncode == 0, down.stderr
    assert down.stdout.count("stopped") == 3
    for pid in pids:
        assert not _alive(pid)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except OSError:
        return False


def test_kafka_topics_and_kcat_describe_the_cluster(cluster):
    from stratalog.peers.kafka import run_tool

    first = cluster.brokers[0].bootstrap
    _create(first, "tools", 3, 3)
    _wait_topic(first, "tools", 3)
    time.sleep(1)  # the backups join the in-sync set once they have caught up
    done = run_tool("kafka-topics", "--bootstrap-server", first, "--describe", "--topic", "tools")
    assert done.returncode == 0, done.stderr
    rows = [line for line in done.stdout.splitlines() if "Partition:" in line]
    assert len(rows) == 3
    for row in rows:
        pairs = (part.split(":", 1) for part in row.split("\t") if ":" in part)
        fields = {k.strip(): v.strip() for k, v in pairs}
        assert fields["Leader"] in {"1", "2", "3"}
        assert sorted(fields["Replicas"].split(",")) == ["1", "2", "3"]
        assert fields["Leader"] in fields["Isr"].split(",")
    listed = subprocess.run(
        ["kcat", "-b", first, "-L", "-J"], capture_output=True, text=True, timeout=30
    )
    assert listed.returncode == 0, listed.stderr
    md = json.loads(listed.stdout)
    assert sorted(b["id"] for b in md["brokers"]) == [1, 2, 3]


def test_metadata_names_the_controller_etcd_elected(cluster):
    """Last in the module: it takes the controller key from under the first controller, so
    another broker is elected (two think they control from then on, which only races on
    guarded writes) and Metadata must follow etcd, not name the lowest node id."""
    key = "/stratalog/stratalog/controller"

    def elected() -> int | None:
        raw = etcd_value(cluster.etcd.endpoint, key)
        return int(raw) if raw else None

    deadline = time.monotonic() + 15
    while elected() is None:
        assert time.monotonic() < deadline, "no controller key in etcd"
        time.sleep(0.1)
    first = elected()
    etcd_delete(cluster.etcd.endpoint, key)
    while elected() in (None, first):
        assert time.monotonic() < deadline, f"no broker but {first} took the controller key"
        time.sleep(0.1)
    now = elected()
    # Each broker learns it from its watch of etcd, a moment later under load.
    for b in cluster.brokers:
        while (named := _metadata(b.bootstrap)["controller_id"]) != now:
            assert time.monotonic() < deadline + 15, f"broker {b.node_id} names {named}, not {now}"
            time.sleep(0.1)
