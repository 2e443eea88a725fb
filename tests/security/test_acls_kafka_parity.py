"""Authorization as Apache Kafka 4.4's StandardAuthorizer does it: a Kafka and a Stratalog with
the same listeners, users, ``super.users`` and ACLs; every API asked the same request by the
same principal (alice, over SASL_PLAINTEXT with PLAIN), and the error codes, the resources
answered and the authorized-operation bit sets compared. kafka-acls.sh lists the same ACLs from
both.

Alice may: everything on ``-open``; READ ``-read``; DESCRIBE ``-desc`` and ``-nocreate``; CREATE
topics beginning ``-mine-``; READ group ``-g-open``; WRITE transactional id ``-tx-open``.
``-closed`` and ``-g-closed`` have ACLs for bob only. ``super.users`` holds User:ANONYMOUS (the
PLAINTEXT listener, which Kafka's controller and inter-broker traffic use too) and User:admin.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from stratalog import Broker
from stratalog.peers.kafka import KafkaBroker, run_tool
from stratalog.records import build_batch

from ..conformance import wire
from ..conformance.conftest import warm_up
from ..conftest import KAFKA_TEST_JVM
from .conftest import PLAIN_USERS, secure_config
from .test_kafka_parity import LISTENERS, kafka_properties
from .wire import Conn

pytestmark = pytest.mark.kafka

AUTHORIZER = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
SUPER_USERS = "User:ANONYMOUS;User:admin"
P = f"acl-{uuid.uuid4().hex[:6]}"
T_OPEN, T_READ, T_DESC, T_CLOSED = f"{P}-open", f"{P}-read", f"{P}-desc", f"{P}-closed"
T_NOCREATE, MINE = f"{P}-nocreate", f"{P}-mine-"
G_OPEN, G_CLOSED = f"{P}-g-open", f"{P}-g-closed"
X_OPEN, X_CLOSED = f"{P}-tx-open", f"{P}-tx-closed"
ALICE = "User:alice"

# (resource type, name, pattern type, principal, operation, permission): Kafka's codes.
TOPIC, GROUP, TXN = 2, 3, 5
LITERAL, PREFIXED = 3, 4
ALL, READ, WRITE, CREATE, DESCRIBE = 2, 3, 4, 5, 8
ALLOW = 3
ACLS = [
    (TOPIC, T_OPEN, LITERAL, ALICE, ALL),
    (TOPIC, T_READ, LITERAL, ALICE, READ),
    (TOPIC, T_DESC, LITERAL, ALICE, DESCRIBE),
    (TOPIC, T_NOCREATE, LITERAL, ALICE, DESCRIBE),
    (TOPIC, MINE, PREFIXED, ALICE, CREATE),
    (TOPIC, T_CLOSED, LITERAL, "User:bob", READ),
    (GROUP, G_OPEN, LITERAL, ALICE, READ),
    (GROUP, G_CLOSED, LITERAL, "User:bob", READ),
    (TXN, X_OPEN, LITERAL, ALICE, WRITE),
    (TXN, X_CLOSED, LITERAL, "User:bob", WRITE),
]


@dataclass
class Pair:
    stratalog: Broker
    kafka: KafkaBroker

    def both(self, scenario: Callable[..., Any], *args: Any) -> tuple[Any, Any]:
        with ThreadPoolExecutor(2) as pool:
            s = pool.submit(scenario, self.stratalog.bootstraps, *args)
            k = pool.submit(scenario, self.kafka.bootstraps, *args)
            return s.result(120), k.result(120)


def _setup(bs: dict[str, str]) -> None:
    """As a super user (PLAINTEXT): the topics, the ACLs, a record, committed offsets."""
    plain = bs["PLAINTEXT"]
    warm_up(plain)
    for t in (T_OPEN, T_READ, T_DESC, T_CLOSED):
        assert wire.create_topic(plain, t) == 0
    out = wire.call(plain, 30, 3, creations=[
        {"resource_type": rt, "resource_name": name, "resource_pattern_type": pt,
         "principal": who, "host": "*", "operation": op, "permission_type": ALLOW}
        for rt, name, pt, who, op in ACLS
    ])  # fmt: skip
    assert [r["error_code"] for r in out["results"]] == [0] * len(ACLS), out
    deadline = time.monotonic() + 30
    while True:  # (Kafka applies ACLs through its metadata log: wait until they are in force)
        listed = wire.call(plain, 29, 3, resource_type_filter=1, resource_name_filter=None,
                           pattern_type_filter=1, principal_filter=None, host_filter=None,
                           operation=1, permission_type=1)  # fmt: skip
        if sum(len(r["acls"]) for r in listed["resources"]) >= len(ACLS):
            break
        assert time.monotonic() < deadline, listed
        time.sleep(0.2)
    for t in (T_OPEN, T_CLOSED):
        batch = build_batch([(b"k", b"v", int(time.time() * 1000))])
        assert wire.produce(plain, t, 0, batch)["error_code"] == 0
    for group in (G_OPEN, G_CLOSED):
        for _attempt in range(100):
            found = wire.call(plain, 10, 6, key_type=0, coordinator_keys=[group])
            if found["coordinators"][0]["error_code"] == 0:
                break
            time.sleep(0.2)
        out = wire.call(plain, 8, 9, group_id=group, generation_id_or_member_epoch=-1,
                        member_id="", group_instance_id=None, topics=[
                            {"name": t, "partitions": [{"partition_index": 0,
                             "committed_offset": 1, "committed_leader_epoch": -1,
                             "committed_metadata": None}]}
                            for t in (T_OPEN, T_CLOSED)])  # fmt: skip
        assert all(p["error_code"] == 0 for t in out["topics"] for p in t["partitions"]), out
    for key in (X_OPEN, X_CLOSED):
        for _attempt in range(100):
            found = wire.call(plain, 10, 6, key_type=1, coordinator_keys=[key])
            if found["coordinators"][0]["error_code"] == 0:
                break
            time.sleep(0.2)


@pytest.fixture(scope="module")
def pair(
    tmp_path_factory: pytest.TempPathFactory, certs: dict[str, Path], plain_users_file: Path
) -> Iterator[Pair]:
    from ..conformance.conftest import start_kafka

    props = kafka_properties(certs) | {
        "authorizer.class.name": AUTHORIZER,
        "super.users": SUPER_USERS,
        "auto.create.topics.enable": "true",
    }
    kafka = start_kafka(lambda: KafkaBroker(props, listeners=LISTENERS, jvm_options=KAFKA_TEST_JVM))
    try:
        config = secure_config(certs, plain_users_file, **{
            "authorizer.class.name": AUTHORIZER, "super.users": SUPER_USERS,
            "auto.create.topics.enable": True,
        })  # fmt: skip
        with Broker(tmp_path_factory.mktemp("acl-parity") / "data", config=config) as strat:
            p = Pair(strat, kafka)
            p.both(_setup)
            yield p
    finally:
        kafka.stop()


# -- what alice is answered -------------------------------------------------------------------
def _p0(**extra: Any) -> list[dict[str, Any]]:
    return [{"partition_index": 0, **extra}]


def _batch(transactional: bool = False) -> bytes:
    ts = int(time.time() * 1000)
    if transactional:
        return build_batch([(b"k", b"v", ts)], producer_id=1, producer_epoch=0, base_sequence=0,
                           transactional=True)  # fmt: skip
    return build_batch([(b"k", b"v", ts)])


def _produce(tid: str | None, transactional: bool, *topics: str) -> tuple:
    return (0, 9, dict(transactional_id=tid, acks=-1, timeout=5000, topic_data=[
        {"name": t, "partition_data": [{"index": 0, "records": _batch(transactional)}]}
        for t in topics
    ]))  # fmt: skip


def _fetch_partition() -> dict[str, Any]:
    return {"partition": 0, "current_leader_epoch": -1, "fetch_offset": 0, "last_fetched_epoch": -1,
            "log_start_offset": -1, "partition_max_bytes": 1 << 20}  # fmt: skip


def _commit(t: str) -> dict[str, Any]:
    return {"name": t, "partitions": _p0(committed_offset=1, committed_leader_epoch=-1,
                                         committed_metadata=None)}  # fmt: skip


def _txn_commit(tid: str, group: str, *topics: str) -> tuple:
    return (28, 4, dict(transactional_id=tid, group_id=group, producer_id=1, producer_epoch=0,
                        generation_id=-1, member_id="", group_instance_id=None,
                        topics=[_commit(t) for t in topics]))  # fmt: skip


_ACL_FILTER = dict(
    resource_type_filter=1, resource_name_filter=None, pattern_type_filter=1,
    principal_filter=None, host_filter=None, operation=1, permission_type=1,
)  # fmt: skip
_NEW = dict(num_partitions=1, replication_factor=1, assignments=[], configs=[])

CASES: dict[str, tuple[int, int, dict[str, Any]]] = {
    "metadata-named": (3, 12, dict(
        topics=[{"name": t, "topic_id": None} for t in
                (T_OPEN, T_READ, T_DESC, T_CLOSED, f"{P}-missing", T_NOCREATE)],
        allow_auto_topic_creation=True, include_topic_authorized_operations=True)),
    "metadata-all": (3, 12, dict(topics=None, allow_auto_topic_creation=False,
                                 include_topic_authorized_operations=False)),
    "metadata-v8-cluster-ops": (3, 8, dict(topics=None, allow_auto_topic_creation=False,
                                           include_cluster_authorized_operations=True,
                                           include_topic_authorized_operations=False)),
    "produce": _produce(None, False, T_OPEN, T_READ, T_CLOSED, f"{P}-missing"),
    "produce-transactional": _produce(X_CLOSED, True, T_OPEN),
    "produce-transactional-without-id": _produce(None, True, T_OPEN),
    "fetch": (1, 12, dict(replica_id=-1, max_wait=0, min_bytes=0, max_bytes=1 << 20,
                          isolation_level=0, session_id=0, session_epoch=-1, topics=[
                              {"topic": t, "partitions": [_fetch_partition()]}
                              for t in (T_OPEN, T_DESC, T_CLOSED)],
                          forgotten_topics_data=[], rack_id="")),
    "list-offsets": (2, 7, dict(replica_id=-1, isolation_level=0, topics=[
        {"name": t, "partitions": _p0(current_leader_epoch=-1, timestamp=-1)}
        for t in (T_OPEN, T_DESC, T_CLOSED)])),
    "offset-for-leader-epoch": (23, 4, dict(replica_id=-1, topics=[
        {"topic": t, "partitions": [{"partition": 0, "current_leader_epoch": -1,
                                     "leader_epoch": 0}]}
        for t in (T_DESC, T_CLOSED)])),
    "create-topics": (19, 7, dict(timeout=10000, validate_only=False, topics=[
        {"name": f"{MINE}1", **_NEW}, {"name": f"{P}-forbidden", **_NEW}])),
    "delete-topics": (20, 6, dict(timeout=10000, topics=[
        {"name": t, "topic_id": wire.ZERO_UUID} for t in (T_READ, T_CLOSED, f"{P}-missing")])),
    "delete-records": (21, 2, dict(timeout=10000, topics=[
        {"name": t, "partitions": _p0(offset=0)} for t in (T_OPEN, T_READ)])),
    "create-partitions": (37, 3, dict(timeout=10000, validate_only=True, topics=[
        {"name": t, "count": 2, "assignments": None} for t in (T_CLOSED, T_READ)])),
    "describe-configs": (32, 4, dict(include_synonyms=False, include_documentation=False,
                                     resources=[
        {"resource_type": 2, "resource_name": T_CLOSED, "configuration_keys": None},
        {"resource_type": 2, "resource_name": T_OPEN, "configuration_keys": ["cleanup.policy"]},
        {"resource_type": 4, "resource_name": "0", "configuration_keys": None}])),
    "alter-configs": (33, 2, dict(validate_only=True, resources=[
        {"resource_type": 2, "resource_name": T_CLOSED,
         "configs": [{"name": "retention.ms", "value": "100000"}]},
        {"resource_type": 4, "resource_name": "", "configs": []}])),
    "incremental-alter-configs": (44, 1, dict(validate_only=True, resources=[
        {"resource_type": 2, "resource_name": t, "configs": [
            {"name": "retention.ms", "config_operation": 0, "value": "100000"}]}
        for t in (T_CLOSED, T_READ, T_OPEN)])),
    "find-coordinator-groups": (10, 6, dict(key_type=0, coordinator_keys=[G_OPEN, G_CLOSED])),
    "find-coordinator-txn": (10, 6, dict(key_type=1, coordinator_keys=[X_OPEN, X_CLOSED])),
    "find-coordinator-v3": (10, 3, dict(key=G_CLOSED, key_type=0)),
    "join-group": (11, 9, dict(group_id=G_CLOSED, session_timeout=10000,
                               rebalance_timeout=10000, member_id="", group_instance_id=None,
                               protocol_type="consumer",
                               protocols=[{"name": "range", "metadata": b""}], reason=None)),
    "sync-group": (14, 5, dict(group_id=G_CLOSED, generation_id=1, member_id="m",
                               group_instance_id=None, protocol_type="consumer",
                               protocol_name="range", assignments=[])),
    "heartbeat": (12, 4, dict(group_id=G_CLOSED, generation_id=1, member_id="m",
                              group_instance_id=None)),
    "leave-group": (13, 5, dict(group_id=G_CLOSED, members=[
        {"member_id": "m", "group_instance_id": None, "reason": None}])),
    "offset-commit-group-denied": (8, 9, dict(
        group_id=G_CLOSED, generation_id_or_member_epoch=-1, member_id="",
        group_instance_id=None, topics=[_commit(T_OPEN)])),
    "offset-commit": (8, 9, dict(group_id=G_OPEN, generation_id_or_member_epoch=-1,
                                 member_id="", group_instance_id=None,
                                 topics=[_commit(t) for t in (T_OPEN, T_DESC, T_CLOSED)])),
    "offset-fetch": (9, 9, dict(require_stable=False, groups=[
        {"group_id": G_OPEN, "member_id": None, "member_epoch": -1, "topics": [
            {"name": t, "partition_indexes": [0]} for t in (T_OPEN, T_CLOSED)]},
        {"group_id": G_CLOSED, "member_id": None, "member_epoch": -1, "topics": None}])),
    "offset-fetch-all-topics": (9, 9, dict(require_stable=False, groups=[
        {"group_id": G_OPEN, "member_id": None, "member_epoch": -1, "topics": None}])),
    "offset-fetch-v7": (9, 7, dict(group_id=G_CLOSED, topics=None, require_stable=False)),
    "offset-fetch-v7-topics": (9, 7, dict(group_id=G_OPEN, require_stable=False, topics=[
        {"name": t, "partition_indexes": [0]} for t in (T_OPEN, T_CLOSED)])),
    "list-groups": (16, 5, dict(states_filter=[], types_filter=[])),
    "describe-groups": (15, 5, dict(groups=[G_OPEN, G_CLOSED],
                                    include_authorized_operations=True)),
    "delete-groups": (42, 2, dict(groups_names=[G_CLOSED, G_OPEN])),
    "consumer-group-heartbeat-denied": (68, 1, dict(
        group_id=G_CLOSED, member_id="m-closed", member_epoch=0, rebalance_timeout=30000,
        subscribed_topic_names=[T_OPEN], topic_partitions=[])),
    "consumer-group-describe": (69, 1, dict(group_ids=[G_OPEN, G_CLOSED, f"{P}-g-missing"],
                                            include_authorized_operations=True)),
    "share-group-heartbeat-denied": (76, 1, dict(
        group_id=G_CLOSED, member_id="AAAAAAAAAAAAAAAAAAAAAg", member_epoch=0,
        subscribed_topic_names=[T_OPEN])),
    "share-group-describe": (77, 1, dict(group_ids=[G_OPEN, G_CLOSED, f"{P}-g-missing"],
                                         include_authorized_operations=True)),
    "share-fetch-denied": (78, 1, dict(
        group_id=G_CLOSED, member_id="AAAAAAAAAAAAAAAAAAAAAw", share_session_epoch=0,
        max_wait=0, min_bytes=1, max_records=10, batch_size=10, topics=[],
        forgotten_topics_data=[])),
    "share-acknowledge-denied": (79, 1, dict(
        group_id=G_CLOSED, member_id="AAAAAAAAAAAAAAAAAAAAAw", share_session_epoch=1,
        topics=[])),
    "describe-share-group-offsets": (90, 1, dict(groups=[
        {"group_id": G_OPEN, "topics": None}, {"group_id": G_CLOSED, "topics": None}])),
    "offset-delete": (47, 0, dict(group_id=G_OPEN, topics=[
        {"name": T_OPEN, "partitions": [{"partition_index": 0}]}])),
    "init-producer-id-transactional": (22, 5, dict(
        transactional_id=X_CLOSED, transaction_timeout=60000, producer_id=-1,
        producer_epoch=-1)),
    "init-producer-id-idempotent": (22, 5, dict(
        transactional_id=None, transaction_timeout=60000, producer_id=-1, producer_epoch=-1)),
    "add-partitions-to-txn-denied": (24, 3, dict(
        v3_and_below_transactional_id=X_CLOSED, v3_and_below_producer_id=1,
        v3_and_below_producer_epoch=0,
        v3_and_below_topics=[{"name": T_OPEN, "partitions": [0]}])),
    "add-partitions-to-txn-topic-denied": (24, 3, dict(
        v3_and_below_transactional_id=X_OPEN, v3_and_below_producer_id=1,
        v3_and_below_producer_epoch=0,
        v3_and_below_topics=[{"name": t, "partitions": [0]} for t in (T_OPEN, T_CLOSED)])),
    "add-offsets-to-txn-denied": (25, 4, dict(transactional_id=X_CLOSED, producer_id=1,
                                              producer_epoch=0, group_id=G_OPEN)),
    "add-offsets-to-txn-group-denied": (25, 4, dict(transactional_id=X_OPEN, producer_id=1,
                                                    producer_epoch=0, group_id=G_CLOSED)),
    "end-txn": (26, 4, dict(transactional_id=X_CLOSED, producer_id=1, producer_epoch=0,
                            committed=True)),
    "txn-offset-commit-denied": _txn_commit(X_CLOSED, G_OPEN, T_OPEN),
    "txn-offset-commit-group-denied": _txn_commit(X_OPEN, G_CLOSED, T_OPEN),
    "txn-offset-commit-topic-denied": _txn_commit(X_OPEN, G_OPEN, T_CLOSED),
    "describe-transactions": (65, 0, dict(transactional_ids=[X_CLOSED])),
    "list-transactions": (66, 1, dict(state_filters=[], producer_id_filters=[])),
    "describe-producers": (61, 0, dict(topics=[
        {"name": t, "partition_indexes": [0]} for t in (T_OPEN, T_DESC, T_CLOSED)])),
    "describe-log-dirs": (35, 4, dict(topics=None)),
    "elect-leaders": (43, 2, dict(election_type=0, timeout=10000, topic_partitions=[
        {"topic": T_OPEN, "partitions": [0]}])),
    "alter-partition-reassignments": (45, 0, dict(timeout=10000, topics=[
        {"name": T_OPEN, "partitions": [{"partition_index": 0, "replicas": None}]}])),
    "list-partition-reassignments": (46, 0, dict(timeout=10000, topics=None)),
    "describe-client-quotas": (48, 1, dict(components=[], strict=False)),
    "alter-client-quotas": (49, 1, dict(validate_only=True, entries=[
        {"entity": [{"entity_type": "user", "entity_name": "alice"}],
         "ops": [{"key": "producer_byte_rate", "value": 1000.0, "remove": False}]}])),
    "describe-user-scram-credentials": (50, 0, dict(users=[{"name": "alice"}])),
    "alter-user-scram-credentials": (51, 0, dict(
        deletions=[{"name": "alice", "mechanism": 1}], upsertions=[])),
    "write-txn-markers": (27, 1, dict(markers=[
        {"producer_id": 1, "producer_epoch": 0, "transaction_result": True,
         "topics": [{"name": T_OPEN, "partition_indexes": [0]}], "coordinator_epoch": 0}])),
    "create-acls": (30, 3, dict(creations=[
        {"resource_type": TOPIC, "resource_name": T_OPEN, "resource_pattern_type": LITERAL,
         "principal": ALICE, "host": "*", "operation": READ, "permission_type": ALLOW}])),
    "describe-acls": (29, 3, _ACL_FILTER),
    "delete-acls": (31, 3, dict(filters=[_ACL_FILTER])),
    "describe-cluster": (60, 1, dict(include_cluster_authorized_operations=True,
                                     endpoint_type=1)),
    "describe-topic-partitions": (75, 0, dict(response_partition_limit=100, cursor=None,
                                              topics=[{"name": t} for t in (T_OPEN, T_CLOSED)])),
    "describe-topic-partitions-all": (75, 0, dict(response_partition_limit=100, cursor=None,
                                                  topics=[])),
}  # fmt: skip

# What is compared: which resources are answered, their error codes and authorized operations.
IDENTITY = {
    "name", "topic", "group_id", "key", "transactional_id", "resource_name", "resource_type",
    "partition_index", "partition", "index", "partition_id", "user",
}  # fmt: skip


def skeleton(obj: Any, listing: bool = False) -> Any:
    if isinstance(obj, dict):
        out = {}
        for k, v in obj.items():
            if k in IDENTITY or k.endswith("error_code") or k.endswith("authorized_operations"):
                out[k] = v
            elif isinstance(v, list) and v and all(isinstance(x, dict) for x in v):
                out[k] = skeleton(v, listing=k in ("topics", "groups", "transaction_states"))
            elif isinstance(v, list) and not v:
                out[k] = []
        return out
    if isinstance(obj, list):
        items = [skeleton(x) for x in obj]
        if listing:  # only this test's resources in listings of everything
            items = [
                x for x in items
                if not isinstance(x, dict) or str(x.get("name") or x.get("group_id") or
                                                  x.get("transactional_id") or P).startswith(P)
            ]  # fmt: skip
        return sorted(items, key=repr)
    return obj


def as_alice(bs: dict[str, str], case: str) -> Any:
    api_key, version, values = CASES[case]
    with Conn(bs["SASL_PLAINTEXT"]) as c:
        assert c.login("PLAIN", "alice", PLAIN_USERS["alice"])["error_code"] == 0
        try:
            return skeleton(c.request(api_key, version, **values))
        except Exception as e:  # (a closed connection is an outcome too)
            return {"outcome": type(e).__name__}


@pytest.mark.parametrize("case", list(CASES))
def test_same_answers_as_kafka(pair, case):
    strat, kafka = pair.both(as_alice, case)
    print(f"{case}: {wire.error_names(kafka)}")
    assert strat == kafka, wire.differences(strat, kafka)


def test_the_denials_are_there(pair):
    """The comparison above would pass if both let alice do everything: check a few answers
    are the refusals they should be (on Stratalog; Kafka's are the same)."""
    codes = {}
    for case in ("produce", "join-group", "create-acls", "init-producer-id-transactional"):
        got = as_alice(pair.stratalog.bootstraps, case)
        codes[case] = got
    produce = {t["name"]: t["partition_responses"][0]["error_code"]
               for t in codes["produce"]["responses"]}  # fmt: skip
    assert produce == {T_OPEN: 0, T_READ: 29, T_CLOSED: 29, f"{P}-missing": 29}
    assert codes["join-group"]["error_code"] == 30
    assert codes["create-acls"]["results"] == [{"error_code": 31}]
    assert codes["init-producer-id-transactional"]["error_code"] == 53


# -- kafka-acls.sh against both ----------------------------------------------------------------
def _acls_list(bs: dict[str, str]) -> list[str]:
    out = run_tool("kafka-acls", "--bootstrap-server", bs["PLAINTEXT"], "--list",
                   "--topic", T_OPEN, timeout=90)  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    return sorted(line.strip() for line in out.stdout.splitlines() if line.strip())


def test_kafka_acls_lists_the_same(pair):
    strat, kafka = pair.both(_acls_list)
    assert strat == kafka
    assert any("principal=User:alice, host=*, operation=ALL" in line for line in strat)


# -- CreateAcls' checks, as a super user --------------------------------------------------------
INVALID = {
    "empty-name": [(TOPIC, "", LITERAL, ALICE, READ, ALLOW)],
    "cluster-other-name": [(4, "other", LITERAL, ALICE, 7, ALLOW)],
    "principal-without-type": [(TOPIC, T_OPEN, LITERAL, "alice", READ, ALLOW)],
    "pattern-match": [(TOPIC, T_OPEN, 2, ALICE, READ, ALLOW)],
    "pattern-any": [(TOPIC, T_OPEN, 1, ALICE, READ, ALLOW)],
    "resource-any": [(1, T_OPEN, LITERAL, ALICE, READ, ALLOW)],
    "operation-any": [(TOPIC, T_OPEN, LITERAL, ALICE, 1, ALLOW)],
    "permission-any": [(TOPIC, T_OPEN, LITERAL, ALICE, READ, 1)],
    "valid-prefixed-wildcard-user": [(TOPIC, f"{P}-any-", PREFIXED, "User:*", READ, ALLOW)],
    "valid-and-empty-name": [(TOPIC, f"{P}-v1", LITERAL, ALICE, READ, ALLOW),
                             (TOPIC, "", LITERAL, ALICE, READ, ALLOW)],
    "valid-and-operation-any": [(TOPIC, f"{P}-v2", LITERAL, ALICE, READ, ALLOW),
                                (TOPIC, T_OPEN, LITERAL, ALICE, 1, ALLOW)],
}  # fmt: skip


def _create(bs: dict[str, str], case: str) -> dict[str, Any]:
    out = wire.call(bs["PLAINTEXT"], 30, 3, creations=[
        {"resource_type": rt, "resource_name": name, "resource_pattern_type": pt,
         "principal": who, "host": "*", "operation": op, "permission_type": perm}
        for rt, name, pt, who, op, perm in INVALID[case]])  # fmt: skip
    results = out.get("results", [])
    made = {c[1] for c, r in zip(INVALID[case], results, strict=False) if r["error_code"] == 0}
    deadline = time.monotonic() + 15
    while True:  # (Kafka applies what it made through its metadata log, a moment later)
        listed = wire.call(bs["PLAINTEXT"], 29, 3, **dict(_ACL_FILTER, resource_type_filter=2))
        names = {r["resource_name"] for r in listed["resources"]} & {
            f"{P}-v1", f"{P}-v2", f"{P}-any-"}  # fmt: skip
        if names >= made or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    return {"results": out.get("results", out), "made": sorted(names)}


@pytest.mark.parametrize("case", list(INVALID))
def test_create_acls_checks_as_kafka(pair, case):
    strat, kafka = pair.both(_create, case)
    print(case, "stratalog:", strat, "kafka:", kafka)
    assert strat == kafka


def _describe_and_delete(bs: dict[str, str]) -> dict[str, Any]:
    """As a super user: two ACLs made, described and deleted, the answers whole."""
    name = f"{P}-whole"
    plain = bs["PLAINTEXT"]
    made = wire.call(plain, 30, 3, creations=[
        {"resource_type": TOPIC, "resource_name": name, "resource_pattern_type": pt,
         "principal": ALICE, "host": "*", "operation": READ, "permission_type": ALLOW}
        for pt in (LITERAL, PREFIXED)])  # fmt: skip
    flt = dict(_ACL_FILTER, resource_type_filter=TOPIC, resource_name_filter=name)
    deadline = time.monotonic() + 15
    while True:
        described = wire.call(plain, 29, 3, **flt)
        if len(described["resources"]) == 2 or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    deleted = wire.call(plain, 31, 3, filters=[flt, dict(flt, pattern_type_filter=PREFIXED)])
    for answer in (made, described, deleted):
        answer.pop("throttle_time", None)
    # (The order of resources and of matching ACLs is a hash map's in Kafka.)
    described["resources"].sort(key=lambda r: r["pattern_type"])
    for r in deleted["filter_results"]:
        r["matching_acls"].sort(key=lambda m: m["pattern_type"])
    return {"made": made, "described": described, "deleted": deleted}


def test_acl_answers_as_kafka(pair):
    strat, kafka = pair.both(_describe_and_delete)
    assert strat == kafka, wire.differences(strat, kafka)


def _fetch_by_id(bs: dict[str, str]) -> Any:
    """Fetch v17 by topic id (the ids are each broker's own): READ is still what counts."""
    ids = {t: wire.topic_id(bs["PLAINTEXT"], t) for t in (T_OPEN, T_DESC, T_CLOSED)}
    with Conn(bs["SASL_PLAINTEXT"]) as c:
        assert c.login("PLAIN", "alice", PLAIN_USERS["alice"])["error_code"] == 0
        out = c.request(1, 17, replica_state={"replica_id": -1, "replica_epoch": -1},
                        max_wait=0, min_bytes=0, max_bytes=1 << 20, isolation_level=0,
                        session_id=0, session_epoch=-1, forgotten_topics_data=[], rack_id="",
                        topics=[{"topic_id": i, "partitions": [_fetch_partition()]}
                                for i in ids.values()])  # fmt: skip
    names = {str(i): t for t, i in ids.items()}
    return sorted(
        (names[str(r["topic_id"])], p["error_code"])
        for r in out["responses"]
        for p in r["partitions"]
    )


def test_fetch_by_topic_id_as_kafka(pair):
    strat, kafka = pair.both(_fetch_by_id)
    assert strat == kafka == [(T_CLOSED, 29), (T_DESC, 29), (T_OPEN, 0)]


def _metadata_by_id(bs: dict[str, str]) -> Any:
    ids = {t: wire.topic_id(bs["PLAINTEXT"], t) for t in (T_OPEN, T_CLOSED)}
    with Conn(bs["SASL_PLAINTEXT"]) as c:
        assert c.login("PLAIN", "alice", PLAIN_USERS["alice"])["error_code"] == 0
        out = c.request(3, 12, topics=[{"name": None, "topic_id": i} for i in ids.values()],
                        allow_auto_topic_creation=False,
                        include_topic_authorized_operations=False)  # fmt: skip
    names = {str(i): t for t, i in ids.items()}
    answers = [
        (t["name"], names.get(str(t["topic_id"]), str(t["topic_id"])), t["error_code"])
        for t in out["topics"]
    ]
    return sorted(answers, key=repr)


def test_metadata_by_topic_id_as_kafka(pair):
    strat, kafka = pair.both(_metadata_by_id)
    print("stratalog:", strat, "kafka:", kafka)
    assert strat == kafka


def _share_by_id(bs: dict[str, str]) -> Any:
    """ShareFetch and ShareAcknowledge in alice's group over topics she may and may not read
    (acknowledgements only of those she may not: what she may read is the protocol's business,
    compared in tests/conformance/test_share_groups.py)."""
    ids = {t: wire.topic_id(bs["PLAINTEXT"], t) for t in (T_OPEN, T_DESC, T_CLOSED)}
    names = {str(i): t for t, i in ids.items()}
    topics = [{"topic_id": i, "partitions": [{"partition_index": 0, "acknowledgement_batches": []}]}
              for i in ids.values()]  # fmt: skip
    member = "AAAAAAAAAAAAAAAAAAAABA"
    with Conn(bs["SASL_PLAINTEXT"]) as c:
        assert c.login("PLAIN", "alice", PLAIN_USERS["alice"])["error_code"] == 0
        fetched = c.request(78, 1, group_id=G_OPEN, member_id=member, share_session_epoch=0,
                            max_wait=500, min_bytes=1, max_records=10, batch_size=10,
                            topics=topics, forgotten_topics_data=[])  # fmt: skip
        acked = c.request(79, 1, group_id=G_OPEN, member_id=member, share_session_epoch=1,
                          topics=[{"topic_id": i, "partitions": [{"partition_index": 0,
                                   "acknowledgement_batches": [{"first_offset": 0,
                                   "last_offset": 0, "acknowledge_types": [1]}]}]}
                                  for t, i in ids.items() if t != T_OPEN])  # fmt: skip

    def answers(r: dict[str, Any]) -> list:
        # The refusals (whether an opening fetch names the readable partition too depends on
        # when Kafka's share-partition finished loading; compared in the conformance suite).
        return sorted(
            (names[str(t["topic_id"])], p["error_code"])
            for t in r["responses"]
            for p in t["partitions"]
            if p["error_code"]
        )

    return {"fetch": (fetched["error_code"], answers(fetched)),
            "acknowledge": (acked["error_code"], answers(acked))}  # fmt: skip


def test_share_fetch_and_acknowledge_as_kafka(pair):
    strat, kafka = pair.both(_share_by_id)
    assert strat == kafka, wire.differences(strat, kafka)
    assert strat["fetch"] == (0, [(T_CLOSED, 29), (T_DESC, 29)])
