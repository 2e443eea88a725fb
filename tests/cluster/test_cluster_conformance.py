"""Differential conformance of a three-broker Stratalog cluster against a three-node Apache Kafka
4.4 KRaft cluster (``peers/kafka_cluster.py``): the same scenario on both, the answers compared
field by field once node ids, hosts, ports and ids are normalised (``conformance.wire``).

Node ids are 1-3 on both, but which broker a partition lands on is each cluster's own choice, so
placement is compared through relations that must hold on both (the leader is the first replica,
the in-sync set is every replica, leaders spread one per broker, a hint names the leader that
Metadata names) rather than by id. Where Stratalog differs on purpose (leadership per virtual
log: an election moves every partition sharing the log; backups do not serve consumers'
fetches), the test asserts the documented difference on each side.
"""

from __future__ import annotations

import re
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition

from stratalog.cluster.local_cluster import LocalCluster
from stratalog.peers.kafka import run_tool
from stratalog.peers.kafka_cluster import KafkaCluster
from stratalog.records import build_batch

from ..conformance import wire
from ..conformance.deliberate import check_deliberate
from .waits import until

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(900)]

NOT_LEADER = 6
ELECTION_NOT_NEEDED = 84
OFFSETS_TOPIC = "__consumer_offsets"


@dataclass
class Target:
    """One cluster as the scenarios see it: node id -> port, and a way to stop and restart."""

    name: str
    ports: dict[int, int]
    stop_node: Callable[[int], None]
    start_node: Callable[[int], None]

    @property
    def bootstrap(self) -> str:
        return ",".join(f"127.0.0.1:{p}" for p in self.ports.values())

    def at(self, node: int) -> str:
        return f"127.0.0.1:{self.ports[node]}"

    @property
    def any(self) -> str:
        return self.at(min(self.ports))


@pytest.fixture(scope="module")
def stratalog(tmp_path_factory) -> Target:
    # The offsets topic as the Kafka cluster has it: 3 partitions, replication factor 3.
    c = LocalCluster(
        tmp_path_factory.mktemp("stratalog"),
        brokers=3,
        settings={"offsets.topic.num.partitions": "3"},
    )
    c.start()
    by_id = {b.node_id: b for b in c.brokers}
    try:
        yield Target(
            "stratalog",
            {b.node_id: b.port for b in c.brokers},
            lambda n: c.stop_broker(by_id[n]),
            lambda n: c.start_broker(by_id[n]),
        )
    finally:
        c.stop()


@pytest.fixture(scope="module")
def kafka(tmp_path_factory) -> Target:
    k = KafkaCluster(tmp_path_factory.mktemp("kafka"))
    k.start()
    try:
        yield Target(
            "kafka",
            {n.node_id: n.port for n in k.nodes},
            lambda n: k.stop_node(k.node(n)),
            lambda n: k.start_node(k.node(n)),
        )
    finally:
        k.stop()


@pytest.fixture(scope="module")
def pair(stratalog, kafka) -> tuple[Target, Target]:
    return stratalog, kafka


def both(pair, scenario: Callable[..., Any], *args: Any) -> tuple[Any, Any]:
    """``scenario(target, *args)`` on both clusters at once: (stratalog, kafka)."""
    with ThreadPoolExecutor(2) as pool:
        fs = [pool.submit(scenario, t, *args) for t in pair]
        return fs[0].result(600), fs[1].result(600)


def same(s: Any, k: Any) -> None:
    assert s == k, wire.differences(s, k)


# -- helpers -----------------------------------------------------------------------------------


def metadata(bootstrap: str, topics: list[str] | None, version: int = 12) -> dict:
    return wire.call(
        bootstrap, 3, version,
        topics=None if topics is None else [{"name": n, "topic_id": None} for n in topics],
        allow_auto_topic_creation=False, include_topic_authorized_operations=False,
        include_cluster_authorized_operations=False,
    )  # fmt: skip


def partitions(bootstrap: str, topic: str) -> list[dict]:
    t = metadata(bootstrap, [topic])["topics"][0]
    return sorted(t["partitions"], key=lambda p: p["partition_index"])


def create(t: Target, name: str, count: int, factor: int, version: int = 7) -> dict:
    return wire.call(
        t.any, 19, version,
        topics=[{"name": name, "num_partitions": count, "replication_factor": factor,
                 "assignments": [], "configs": []}],
        timeout=30000, validate_only=False,
    )  # fmt: skip


def settled(t: Target, topic: str, count: int, factor: int = 3) -> list[dict]:
    """Metadata of ``topic`` once every partition is led, fully in sync, and its leader takes
    requests (ListOffsets answered by the leader)."""

    def check():
        ps = partitions(t.any, topic)
        if len(ps) != count or not all(
            p["error_code"] == 0 and p["leader_id"] >= 0 and len(p["isr_nodes"]) == factor
            for p in ps
        ):
            return None
        for p in ps:
            got = wire.list_offset(t.at(p["leader_id"]), topic, p["partition_index"], -1)
            if got["error_code"] != 0:
                return None
        return ps

    return until(check, f"{topic} to settle on {t.name}", timeout=90, every=0.2)


def relations(md: dict, topic: str) -> dict:
    """What must hold of a replicated topic's placement on any cluster, by node id."""
    brokers = {b["node_id"] for b in md["brokers"]}
    t = next(x for x in md["topics"] if x["name"] == topic)
    ps = t["partitions"]
    return {
        "brokers": len(brokers),
        "distinct_ports": len({b["port"] for b in md["brokers"]}),
        "controller_listed": md.get("controller_id", -1) in brokers,
        "leader_is_first_replica": all(p["leader_id"] == p["replica_nodes"][0] for p in ps),
        "replicas_are_all_brokers": all(set(p["replica_nodes"]) == brokers for p in ps),
        "isr_is_replicas": all(set(p["isr_nodes"]) == set(p["replica_nodes"]) for p in ps),
        "epochs_present": all(p.get("leader_epoch", 0) >= 0 for p in ps),  # v7+
        "leaders_per_broker": sorted(Counter(p["leader_id"] for p in ps).values()),
    }


def epochs_present(obj: Any) -> Any:
    """Leader epochs differ in value (a virtual log's epoch counts every move of the log)."""
    if isinstance(obj, dict):
        return {
            k: ("<epoch>" if k == "leader_epoch" and v >= 0 else epochs_present(v))
            for k, v in obj.items()
        }
    if isinstance(obj, list):
        return [epochs_present(x) for x in obj]
    return obj


def batch() -> bytes:
    return build_batch([(b"k", b"v", int(time.time() * 1000))])


# -- scenarios ---------------------------------------------------------------------------------

TOPIC = "cc-replicated"


def replicated_topic(t: Target) -> dict:
    created = create(t, TOPIC, 3, 3)
    settled(t, TOPIC, 3)
    return created


def test_a_replicated_topic_is_created_and_described_alike(pair):
    s, k = both(pair, replicated_topic)
    # Created alike; the configs each broker reports are compared in tests/conformance.
    same(*[wire.normalise({**x, "topics": [dict(x["topics"][0], configs=[])]}) for x in (s, k)])
    for version in (1, 9, 12):
        ms, mk = both(pair, lambda t, v=version: metadata(t.any, [TOPIC], v))
        same(relations(ms, TOPIC), relations(mk, TOPIC))
        same(
            wire.normalise(epochs_present(ms)),
            wire.normalise(epochs_present(mk)),
        )
    assert relations(ms, TOPIC) == {
        "brokers": 3, "distinct_ports": 3, "controller_listed": True,
        "leader_is_first_replica": True, "replicas_are_all_brokers": True,
        "isr_is_replicas": True, "epochs_present": True, "leaders_per_broker": [1, 1, 1],
    }  # fmt: skip


def test_describe_cluster(pair):
    s, k = both(pair, lambda t: wire.call(
        t.any, 60, 1, include_cluster_authorized_operations=False, endpoint_type=1))  # fmt: skip
    for r, t in ((s, pair[0]), (k, pair[1])):
        assert r["error_code"] == 0
        assert {b["broker_id"]: b["port"] for b in r["brokers"]} == t.ports
        assert r["controller_id"] in t.ports
    same(wire.normalise(s), wire.normalise(k))


@pytest.mark.parametrize("version", [2, 5, 7])
def test_a_replication_factor_beyond_the_brokers_is_refused(pair, version):
    s, k = both(pair, lambda t: create(t, f"cc-too-many-v{version}", 1, 4, version))
    assert s["topics"][0]["error_code"] == 38  # INVALID_REPLICATION_FACTOR
    same(wire.normalise(s), wire.normalise(k))
    gone = both(pair, lambda t: metadata(t.any, [f"cc-too-many-v{version}"])["topics"][0])
    same(*[wire.normalise(g) for g in gone])


def committed_group(t: Target) -> dict:
    """A group commits an offset; then the offsets topic, as Metadata of all topics lists it."""
    c = Consumer({"bootstrap.servers": t.bootstrap, "group.id": "cc-group",
                  "enable.auto.commit": False})  # fmt: skip
    try:
        until(
            lambda: c.commit(offsets=[TopicPartition(TOPIC, 0, 0)], asynchronous=False) or True,
            "a commit",
            timeout=90,
        )
    finally:
        c.close()
    settled(t, OFFSETS_TOPIC, 3)
    md = metadata(t.any, None)
    listed = [x for x in md["topics"] if x["name"] == OFFSETS_TOPIC]
    assert len(listed) == 1
    return {"relations": relations(md, OFFSETS_TOPIC), "topic": epochs_present(listed[0])}


def test_the_offsets_topic_is_listed_as_internal_once_a_group_committed(pair):
    s, k = both(pair, committed_group)
    assert s["topic"]["is_internal"] is True
    same(s["relations"], k["relations"])
    same(wire.normalise(s["topic"]), wire.normalise(k["topic"]))


def produce_to_a_follower(t: Target, version: int) -> dict:
    p = partitions(t.any, TOPIC)[0]
    follower = next(r for r in p["replica_nodes"] if r != p["leader_id"])
    r = wire.call(
        t.at(follower), 0, version, transactional_id=None, acks=-1, timeout=10000,
        topic_data=[{"name": TOPIC, "partition_data": [{"index": 0, "records": batch()}]}],
    )  # fmt: skip
    part = r["responses"][0]["partition_responses"][0]
    facts = {"error_code": part["error_code"]}
    if version >= 10:
        facts["hint_is_the_leader"] = part["current_leader"] == {
            "leader_id": p["leader_id"],
            "leader_epoch": p["leader_epoch"],
        }
        facts["endpoints"] = [
            (e["node_id"] == p["leader_id"], e["host"], e["port"] == t.ports[p["leader_id"]])
            for e in r["node_endpoints"]
        ]
    return {"facts": facts, "response": epochs_present(r)}


@pytest.mark.parametrize("version", [9, 10, 11, 12])
def test_produce_to_a_follower_names_the_leader(pair, version):
    s, k = both(pair, produce_to_a_follower, version)
    assert s["facts"]["error_code"] == NOT_LEADER
    if version >= 10:
        assert s["facts"]["hint_is_the_leader"] is True
        assert s["facts"]["endpoints"] == [(True, "127.0.0.1", True)]
    same(s["facts"], k["facts"])
    same(wire.normalise(s["response"]), wire.normalise(k["response"]))


def fetch_from_a_follower(t: Target, version: int) -> dict:
    p = partitions(t.any, TOPIC)[0]
    follower = next(r for r in p["replica_nodes"] if r != p["leader_id"])
    tid = wire.topic_id(t.any, TOPIC) if version >= 13 else wire.ZERO_UUID
    r = wire.call(
        t.at(follower), 1, version, cluster_id=None, replica_id=-1,
        replica_state={"replica_id": -1, "replica_epoch": -1},
        max_wait=10, min_bytes=0, max_bytes=1 << 20, isolation_level=0, session_id=0,
        session_epoch=-1,
        topics=[{"topic": TOPIC, "topic_id": tid, "partitions": [{
            "partition": 0, "current_leader_epoch": -1, "fetch_offset": 0,
            "last_fetched_epoch": -1, "log_start_offset": -1, "partition_max_bytes": 1 << 20}]}],
        forgotten_topics_data=[], rack_id="",
    )  # fmt: skip
    part = r["responses"][0]["partitions"][0]
    return {
        "error_code": part["error_code"],
        "hint_is_the_leader": part.get("current_leader")
        == {"leader_id": p["leader_id"], "leader_epoch": p["leader_epoch"]},
        "endpoints": [e["node_id"] == p["leader_id"] for e in r.get("node_endpoints", [])],
    }


@pytest.mark.parametrize("version", [16, 17])
def test_fetch_from_a_follower(pair, version):
    """Kafka's followers serve consumers' fetches from v11 (KIP-392); Stratalog's backups refuse
    them with NOT_LEADER_OR_FOLLOWER, naming the leader (KIP-951)."""
    s, k = both(pair, fetch_from_a_follower, version)
    check_deliberate(
        "cluster.backups-refuse-consumer-fetches",
        s,
        k,
        documented={"error_code": NOT_LEADER, "hint_is_the_leader": True, "endpoints": [True]},
    )
    assert k["error_code"] == 0, k


def elect(bootstrap: str, version: int, kind: int, wanted: dict[str, list[int]] | None) -> dict:
    return wire.call(
        bootstrap, 43, version, election_type=kind, timeout=30000,
        topic_partitions=None if wanted is None
        else [{"topic": n, "partitions": ps} for n, ps in wanted.items()],
    )  # fmt: skip


# ElectLeaders v0 has only preferred elections.
ELECTIONS = [(0, 0), (1, 0), (2, 0), (1, 1), (2, 1)]


@pytest.mark.parametrize(
    ("version", "kind"),
    ELECTIONS,
    ids=[f"v{v}-{('preferred', 'unclean')[k]}" for v, k in ELECTIONS],
)
def test_elections_not_needed(pair, version, kind):
    wanted = {TOPIC: [0, 1, 2, 9], "cc-no-such-topic": [0]}
    s, k = both(pair, lambda t: elect(t.any, version, kind, wanted))
    codes = {p["partition_id"]: p["error_code"] for p in s["replica_election_results"][0][
        "partition_result"]}  # fmt: skip
    assert codes == {0: ELECTION_NOT_NEEDED, 1: ELECTION_NOT_NEEDED, 2: ELECTION_NOT_NEEDED, 9: 3}
    same(wire.normalise(s), wire.normalise(k))


def _shape(key: str, value: str) -> str:
    """A value of kafka-topics' output with ids, numbers and configs replaced."""
    if key == "Configs":
        return "<configs>"
    value = re.sub(r"^[0-9A-Za-z_-]{22}$", "<id>", value)  # a topic id
    return re.sub(r"\d+", "#", value)


def describe_with_the_tool(t: Target) -> list[str]:
    done = run_tool("kafka-topics", "--bootstrap-server", t.any, "--describe", "--topic", TOPIC)
    assert done.returncode == 0, done.stderr
    lines = []
    for line in done.stdout.splitlines():
        fields = [f.split(":", 1) for f in line.strip().split("\t") if ":" in f]
        shape = {k.strip(): v.strip() for k, v in fields}
        if "Replicas" in shape:
            replicas = shape["Replicas"].split(",")
            assert shape["Leader"] == replicas[0], line
            assert sorted(shape["Isr"].split(",")) == sorted(replicas), line
        # The shape: which fields, in which order; values of ids and addresses replaced.
        lines.append(" | ".join(f"{k.strip()}={_shape(k.strip(), v.strip())}" for k, v in fields))
    return lines


def test_kafka_topics_describe_has_kafkas_shape(pair):
    s, k = both(pair, describe_with_the_tool)
    assert len(s) == 4  # the topic line and one per partition
    same(s, k)


MOVES = "cc-moves"


def election_after_a_restart(t: Target) -> dict:
    """The preferred leader of partition 0 stops and comes back; it leads again only once a
    preferred election is asked for."""
    assert create(t, MOVES, 6, 3)["topics"][0]["error_code"] == 0
    before = settled(t, MOVES, 6)
    preferred = before[0]["replica_nodes"][0]
    other = next(n for n in t.ports if n != preferred)
    t.stop_node(preferred)
    until(
        lambda: partitions(t.at(other), MOVES)[0]["leader_id"] not in (-1, preferred),
        "a move",
        timeout=90,
    )
    t.start_node(preferred)
    back = settled(t, MOVES, 6)
    time.sleep(3)
    back = partitions(t.any, MOVES)
    answer = elect(t.at(other), 2, 0, {MOVES: [0]})
    after = until(
        lambda: (ps := partitions(t.any, MOVES))[0]["leader_id"] == preferred and ps,
        "the election to show in Metadata",
        timeout=30,
    )
    siblings = [
        p["partition_index"]
        for p in before[1:]
        if p["replica_nodes"][0] == preferred
        and back[p["partition_index"]]["leader_id"] != preferred
    ]
    return {
        "led_by_preferred_before": back[0]["leader_id"] == preferred,
        "answer": answer,
        "epoch_grew": after[0]["leader_epoch"] > back[0]["leader_epoch"],
        "siblings": siblings,
        "siblings_moved": [after[i]["leader_id"] == preferred for i in siblings],
        "tool": run_tool(
            "kafka-leader-election", "--bootstrap-server", t.any, "--election-type",
            "PREFERRED", "--topic", MOVES, "--partition", "0", timeout=120,
        ).stdout,
        # Every leader back at its preferred replica, for whatever runs next.
        "restored": elect(t.any, 2, 0, None),
    }  # fmt: skip


def test_a_restarted_broker_leads_again_only_through_an_election(pair):
    s, k = both(pair, election_after_a_restart)
    for r in (s, k):
        assert r["led_by_preferred_before"] is False
        assert r["epoch_grew"] is True
        assert r["tool"].strip() == f"Valid replica already elected for partitions {MOVES}-0"
    same(wire.normalise(s["answer"]), wire.normalise(k["answer"]))
    assert s["answer"]["replica_election_results"][0]["partition_result"][0]["error_code"] == 0
    # Stratalog moves the whole virtual log: the other partitions with the same replica list
    # (hence the same preferred replica) move with partition 0; Kafka moves only partition 0.
    assert s["siblings"] and k["siblings"], (s, k)
    check_deliberate(
        "cluster.election-moves-the-virtual-log",
        s["siblings_moved"],
        k["siblings_moved"],
        documented=[True] * len(s["siblings"]),
    )


def reassignment_errors(t: Target) -> dict:
    create(t, "cc-reassign-errors", 3, 2)
    settled(t, "cc-reassign-errors", 3, 2)
    n = sorted(t.ports)
    altered = wire.call(
        t.any, 45, 1, timeout=30000, allow_replication_factor_change=True,
        topics=[{"name": "cc-reassign-errors", "partitions": [
                    {"partition_index": 0, "replicas": [n[0], 999]},
                    {"partition_index": 1, "replicas": [n[0], n[0]]},
                    {"partition_index": 2, "replicas": None},
                    {"partition_index": 9, "replicas": [n[0], n[1]]}]},
                {"name": "cc-no-such-topic", "partitions": [
                    {"partition_index": 0, "replicas": [n[0]]}]}],
    )  # fmt: skip
    listed = wire.call(t.any, 46, 0, timeout=30000, topics=None)
    return {"altered": altered, "listed": listed}


def test_reassignment_errors(pair):
    s, k = both(pair, reassignment_errors)
    codes = {
        (r["name"], p["partition_index"]): p["error_code"]
        for r in s["altered"]["responses"]
        for p in r["partitions"]
    }
    assert codes == {
        ("cc-reassign-errors", 0): 39,  # INVALID_REPLICA_ASSIGNMENT
        ("cc-reassign-errors", 1): 39,
        ("cc-reassign-errors", 2): 85,  # NO_REASSIGNMENT_IN_PROGRESS
        ("cc-reassign-errors", 9): 3,  # UNKNOWN_TOPIC_OR_PARTITION
        ("cc-no-such-topic", 0): 3,
    }
    same(wire.normalise(s), wire.normalise(k))


def reassigned(t: Target) -> dict:
    """Partition 0 moved to the broker that had no replica of it (leading) and one that had."""
    create(t, "cc-reassigned", 1, 2)
    (before,) = settled(t, "cc-reassigned", 1, 2)
    old = before["replica_nodes"]
    target = [next(n for n in sorted(t.ports) if n not in old), old[0]]
    altered = wire.call(
        t.any, 45, 0, timeout=30000,
        topics=[{"name": "cc-reassigned", "partitions": [
            {"partition_index": 0, "replicas": target}]}],
    )  # fmt: skip

    def done():
        p = partitions(t.any, "cc-reassigned")[0]
        listed = wire.call(t.any, 46, 0, timeout=30000, topics=None)
        moved = p["replica_nodes"] == target
        synced = sorted(p["isr_nodes"]) == sorted(target)
        return moved and synced and not listed["topics"] and p

    after = until(done, f"{t.name}: the reassignment to finish", timeout=60)
    return {
        "altered": altered,
        # Kafka keeps a leader that stays a replica; Stratalog's new virtual log is led by its
        # first replica (docs/compatibility.md).
        "leader": "first" if after["leader_id"] == target[0] else "kept",
        "epoch_went_up": after["leader_epoch"] > before["leader_epoch"],
        "listed": wire.call(t.any, 46, 0, timeout=30000, topics=None),
    }


def test_a_reassignment_completes_alike(pair):
    s, k = both(pair, reassigned)
    assert s["altered"]["responses"][0]["partitions"][0]["error_code"] == 0
    assert s["epoch_went_up"] is True
    check_deliberate(
        "cluster.reassigned-partition-led-by-first-replica",
        s.pop("leader"),
        k.pop("leader"),
        documented="first",
    )
    same(wire.normalise(s), wire.normalise(k))
