"""Raw frames: the same request bytes to both brokers, the responses compared field by field.

Every version of every API Stratalog advertises (protocol/versions.py; Kafka 4.4 supports all of
them) gets the same request, built with kio; both responses are decoded with kio, which must use
up the whole frame, and compared after normalising what legitimately differs between two clusters
(node ids, host and port, cluster id, topic and producer ids, generated member ids, throttle time,
free-text error messages). Malformed frames (truncated, wrong length prefix, unknown API key or
version, ApiVersions v99) must get the same treatment: the same response, or both brokers close
the connection, or both wait for more bytes.
"""

from __future__ import annotations

import base64
import struct
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from stratalog.protocol.versions import SUPPORTED
from stratalog.records import build_batch

from . import wire
from .conftest import both, unique
from .wire import ZERO_UUID

pytestmark = pytest.mark.kafka

PREFIX = unique("cf-frames")
TOPIC = f"{PREFIX}-topic"
GROUP = f"{PREFIX}-group"
MISSING = f"{PREFIX}-missing"
BASE_TS = int(time.time() * 1000) - 300_000
BATCHES = {
    0: [
        build_batch(
            [(b"k0", b"v0", BASE_TS), (None, b"v1", BASE_TS + 5), (b"k2", None, BASE_TS + 2)],
            headers=[[("h", b"x")], [], [("h", None), ("i", b"")]],
        ),
        build_batch([(b"k3", b"v3" * 50, BASE_TS + 10)], compression=1),
    ],
    1: [build_batch([(b"a", b"b", BASE_TS + 20), (b"c", b"d", BASE_TS + 30)], compression=4)],
}


def _setup(bs: str) -> None:
    assert wire.create_topic(bs, TOPIC, 2) == 0
    for p, batches in BATCHES.items():
        for b in batches:
            r = wire.produce(bs, TOPIC, p, b)
            assert r["error_code"] == 0, r
    r = wire.call(
        bs, 8, 9, group_id=GROUP, generation_id_or_member_epoch=-1, member_id="",
        group_instance_id=None,
        topics=[{"name": TOPIC, "partitions": [
            {"partition_index": 0, "committed_offset": 2, "committed_leader_epoch": -1,
             "committed_metadata": "meta"},
        ]}],
    )  # fmt: skip
    assert r["topics"][0]["partitions"][0]["error_code"] == 0, r


@pytest.fixture(scope="module")
def frames(pair):
    """A topic with the same batches on both brokers, and a group with a committed offset."""
    both(pair, _setup)
    return pair


# -- requests for each API, for any version (fields a version lacks are ignored) ------------------


def _v(name: str, version: int) -> str:
    return f"{PREFIX}-{name}{version}"


def req_produce(bs: str, v: int) -> dict[str, Any]:
    topic = _v("produce", v)
    assert wire.create_topic(bs, topic, 1) == 0
    batch = build_batch([(b"k", b"v", BASE_TS), (b"k2", b"v2", BASE_TS + 1)])
    return dict(
        transactional_id=None, acks=-1, timeout=10000,
        topic_data=[
            {"name": topic, "partition_data": [{"index": 0, "records": batch},
                                               {"index": 3, "records": batch}]},
            {"name": MISSING, "partition_data": [{"index": 0, "records": batch}]},
        ],
    )  # fmt: skip


def req_fetch(bs: str, v: int) -> dict[str, Any]:
    tid = wire.topic_id(bs, TOPIC) if v >= 13 else ZERO_UUID

    def part(p: int, offset: int) -> dict[str, Any]:
        return {
            "partition": p, "current_leader_epoch": -1, "fetch_offset": offset,
            "last_fetched_epoch": -1, "log_start_offset": -1, "partition_max_bytes": 1 << 20,
        }  # fmt: skip

    return dict(
        cluster_id=None, replica_id=-1, replica_state={"replica_id": -1, "replica_epoch": -1},
        max_wait=50, min_bytes=1, max_bytes=1 << 20, isolation_level=0, session_id=0,
        session_epoch=-1,
        topics=[{"topic": TOPIC, "topic_id": tid,
                 "partitions": [part(0, 1), part(1, 0), part(5, 0)]}],
        forgotten_topics_data=[], rack_id="",
    )  # fmt: skip


def req_list_offsets(bs: str, v: int) -> dict[str, Any]:
    def part(p: int, ts: int) -> dict[str, Any]:
        return {"partition_index": p, "current_leader_epoch": -1, "timestamp": ts}

    return dict(
        replica_id=-1, isolation_level=0, timeout=5000,
        topics=[
            {"name": TOPIC, "partitions": [part(0, BASE_TS + 3), part(1, -2), part(4, -1)]},
            {"name": MISSING, "partitions": [part(0, -1)]},
        ],
    )  # fmt: skip


def req_metadata(bs: str, v: int) -> dict[str, Any]:
    return dict(
        topics=[{"name": n, "topic_id": ZERO_UUID} for n in (TOPIC, MISSING, "bad name!")],
        allow_auto_topic_creation=False,
        include_cluster_authorized_operations=False,
        include_topic_authorized_operations=False,
    )


def req_offset_commit(bs: str, v: int) -> dict[str, Any]:
    return dict(
        group_id=_v("commit", v), generation_id_or_member_epoch=-1, member_id="",
        group_instance_id=None, retention_time=-1,
        topics=[
            {"name": TOPIC, "partitions": [
                {"partition_index": 1, "committed_offset": 1, "committed_leader_epoch": -1,
                 "commit_timestamp": -1, "committed_metadata": ""}]},
        ],
    )  # fmt: skip


def req_offset_fetch(bs: str, v: int) -> dict[str, Any]:
    topics = [{"name": TOPIC, "partition_indexes": [0, 1]}]
    return dict(
        group_id=GROUP, topics=topics, require_stable=False,
        groups=[{"group_id": GROUP, "member_id": None, "member_epoch": -1, "topics": topics}],
    )  # fmt: skip


def req_find_coordinator(bs: str, v: int) -> dict[str, Any]:
    return dict(key=GROUP, key_type=0, coordinator_keys=[GROUP])


def req_join_group(bs: str, v: int) -> dict[str, Any]:
    return dict(
        group_id=_v("join", v), session_timeout=10000, rebalance_timeout=10000,
        member_id="not-a-member", group_instance_id=None, protocol_type="consumer",
        protocols=[{"name": "range", "metadata": b""}], reason=None,
    )  # fmt: skip


def req_heartbeat(bs: str, v: int) -> dict[str, Any]:
    return dict(group_id=GROUP, generation_id=1, member_id="not-a-member", group_instance_id=None)


def req_leave_group(bs: str, v: int) -> dict[str, Any]:
    return dict(
        group_id=GROUP, member_id="not-a-member",
        members=[{"member_id": "not-a-member", "group_instance_id": None, "reason": None}],
    )  # fmt: skip


def req_sync_group(bs: str, v: int) -> dict[str, Any]:
    return dict(
        group_id=GROUP, generation_id=1, member_id="not-a-member", group_instance_id=None,
        protocol_type="consumer", protocol_name="range", assignments=[],
    )  # fmt: skip


def req_describe_groups(bs: str, v: int) -> dict[str, Any]:
    return dict(groups=[GROUP, f"{PREFIX}-no-such-group"], include_authorized_operations=False)


def req_list_groups(bs: str, v: int) -> dict[str, Any]:
    return dict(states_filter=[], types_filter=[])


def req_api_versions(bs: str, v: int) -> dict[str, Any]:
    return dict(client_software_name="conformance", client_software_version="1.0")


def req_create_topics(bs: str, v: int) -> dict[str, Any]:
    def topic(name: str, partitions: int, **configs: str) -> dict[str, Any]:
        return {
            "name": name, "num_partitions": partitions, "replication_factor": 1,
            "assignments": [], "configs": [{"name": k, "value": x} for k, x in configs.items()],
        }  # fmt: skip

    return dict(
        topics=[
            topic(_v("create", v), 3, **{"retention.ms": "3600000"}),
            topic(TOPIC, 1),
            topic(_v("create-zero", v), 0),
        ],
        timeout=15000,
        validate_only=False,
    )


def req_delete_topics(bs: str, v: int) -> dict[str, Any]:
    name = _v("delete", v)
    assert wire.create_topic(bs, name, 1) == 0
    return dict(
        topic_names=[name, MISSING],
        topics=[{"name": name, "topic_id": ZERO_UUID}, {"name": MISSING, "topic_id": ZERO_UUID}],
        timeout=15000,
    )


def req_delete_records(bs: str, v: int) -> dict[str, Any]:
    name = _v("delete-records", v)
    assert wire.create_topic(bs, name, 2) == 0
    batch = build_batch([(b"k", b"v", BASE_TS), (b"k2", b"v2", BASE_TS + 1), (b"k3", b"", BASE_TS)])
    assert wire.produce(bs, name, 0, batch)["error_code"] == 0
    return dict(
        topics=[
            {"name": name, "partitions": [{"partition_index": 0, "offset": 1},
                                          {"partition_index": 1, "offset": 1},
                                          {"partition_index": 4, "offset": 0}]},
            {"name": MISSING, "partitions": [{"partition_index": 0, "offset": -1}]},
        ],
        timeout=10000,
    )  # fmt: skip


def req_init_producer_id(bs: str, v: int) -> dict[str, Any]:
    return dict(transactional_id=None, transaction_timeout=60000, producer_id=-1, producer_epoch=-1)


def req_offset_for_leader_epoch(bs: str, v: int) -> dict[str, Any]:
    def part(p: int, epoch: int) -> dict[str, Any]:
        return {"partition": p, "current_leader_epoch": -1, "leader_epoch": epoch}

    return dict(
        replica_id=-1,
        topics=[
            {"topic": TOPIC, "partitions": [part(0, 0), part(1, 0)]},
            {"topic": MISSING, "partitions": [part(0, 0)]},
        ],
    )


COMPARED_CONFIGS = sorted(wire.COMPARED_CONFIGS)


def req_describe_configs(bs: str, v: int) -> dict[str, Any]:
    return dict(
        resources=[
            {"resource_type": 2, "resource_name": TOPIC, "configuration_keys": COMPARED_CONFIGS},
            {"resource_type": 2, "resource_name": MISSING, "configuration_keys": None},
        ],
        include_synonyms=False,
        include_documentation=False,
    )


def req_alter_configs(bs: str, v: int) -> dict[str, Any]:
    name = _v("legacy-alter", v)
    assert wire.create_topic(bs, name, 1, **{"max.message.bytes": "5000"}) == 0
    return dict(
        resources=[
            {"resource_type": 2, "resource_name": name, "configs": [
                {"name": "retention.ms", "value": "100000"}]},
            {"resource_type": 2, "resource_name": MISSING, "configs": [
                {"name": "retention.ms", "value": "100000"}]},
        ],
        validate_only=False,
    )  # fmt: skip


def req_create_partitions(bs: str, v: int) -> dict[str, Any]:
    name = _v("partitions", v)
    assert wire.create_topic(bs, name, 1) == 0
    return dict(
        topics=[
            {"name": name, "count": 3, "assignments": None},
            {"name": TOPIC, "count": 1, "assignments": None},
            {"name": MISSING, "count": 2, "assignments": None},
        ],
        timeout=15000,
        validate_only=False,
    )


def req_incremental_alter_configs(bs: str, v: int) -> dict[str, Any]:
    name = _v("alter", v)
    assert wire.create_topic(bs, name, 1, **{"max.message.bytes": "5000"}) == 0
    return dict(
        resources=[
            {"resource_type": 2, "resource_name": name, "configs": [
                {"name": "retention.ms", "config_operation": 0, "value": "100000"},
                {"name": "max.message.bytes", "config_operation": 1, "value": None}]},
            {"resource_type": 2, "resource_name": MISSING, "configs": [
                {"name": "retention.ms", "config_operation": 0, "value": "100000"}]},
        ],
        validate_only=False,
    )  # fmt: skip


def req_elect_leaders(bs: str, v: int) -> dict[str, Any]:
    # A single node leads every partition it has: no election is needed.
    return dict(
        election_type=0, timeout=10000,
        topic_partitions=[{"topic": TOPIC, "partitions": [0, 1, 7]},
                          {"topic": MISSING, "partitions": [0]}],
    )  # fmt: skip


def _node_id(bs: str) -> int:
    return wire.call(bs, 60, 0, include_cluster_authorized_operations=False)["brokers"][0][
        "broker_id"
    ]


def req_describe_log_dirs(bs: str, v: int) -> dict[str, Any]:
    wanted = [{"topic": TOPIC, "partitions": [0, 1, 7]}, {"topic": MISSING, "partitions": [0]}]
    return dict(topics=wanted)


def req_alter_partition_reassignments(bs: str, v: int) -> dict[str, Any]:
    # A single node: its own id is where every partition is already; nothing to cancel.
    me = _node_id(bs)
    return dict(
        timeout=10000, allow_replication_factor_change=True,
        topics=[{"name": TOPIC, "partitions": [
                    {"partition_index": 0, "replicas": [me]},
                    {"partition_index": 1, "replicas": None},
                    {"partition_index": 7, "replicas": [me]}]},
                {"name": MISSING, "partitions": [{"partition_index": 0, "replicas": [me]}]}],
    )  # fmt: skip


def req_list_partition_reassignments(bs: str, v: int) -> dict[str, Any]:
    return dict(timeout=10000, topics=None)


def req_delete_groups(bs: str, v: int) -> dict[str, Any]:
    group = _v("delete-group", v)
    r = wire.call(
        bs, 8, 9, group_id=group, generation_id_or_member_epoch=-1, member_id="",
        group_instance_id=None,
        topics=[{"name": TOPIC, "partitions": [
            {"partition_index": 0, "committed_offset": 1, "committed_leader_epoch": -1,
             "committed_metadata": ""}]}],
    )  # fmt: skip
    assert r["topics"][0]["partitions"][0]["error_code"] == 0, r
    # One group only: Kafka answers several in the order of their coordinator partitions.
    return dict(groups_names=[group])


def req_offset_delete(bs: str, v: int) -> dict[str, Any]:
    return dict(
        group_id=GROUP,
        topics=[{"name": TOPIC, "partitions": [{"partition_index": 1}, {"partition_index": 8}]},
                {"name": MISSING, "partitions": [{"partition_index": 0}]}],
    )  # fmt: skip


def req_describe_client_quotas(bs: str, v: int) -> dict[str, Any]:
    # Only this test's entity: quotas are broker-wide, and other tests' come and go.
    return dict(
        components=[{"entity_type": "client-id", "match_type": 0, "match": f"{PREFIX}-quota"}],
        strict=False,
    )


def req_alter_client_quotas(bs: str, v: int) -> dict[str, Any]:
    return dict(
        entries=[
            {"entity": [{"entity_type": "client-id", "entity_name": f"{PREFIX}-quota"}],
             "ops": [{"key": "producer_byte_rate", "value": 1e9 + v, "remove": False}]},
            {"entity": [{"entity_type": "client-id", "entity_name": f"{PREFIX}-bad"}],
             "ops": [{"key": "no_such_quota", "value": 1.0, "remove": False}]},
        ],
        validate_only=False,
    )  # fmt: skip


def req_describe_cluster(bs: str, v: int) -> dict[str, Any]:
    return dict(include_cluster_authorized_operations=False, endpoint_type=1)


def req_sasl_handshake(bs: str, v: int) -> dict[str, Any]:
    # On a PLAINTEXT listener: ILLEGAL_SASL_STATE (tests/security/ has the SASL listeners).
    return dict(mechanism="PLAIN")


def req_sasl_authenticate(bs: str, v: int) -> dict[str, Any]:
    return dict(auth_bytes=b"\0user\0password")


def req_describe_user_scram_credentials(bs: str, v: int) -> dict[str, Any]:
    return dict(users=[{"name": f"{PREFIX}-nobody"}])


def req_alter_user_scram_credentials(bs: str, v: int) -> dict[str, Any]:
    return dict(
        deletions=[{"name": f"{PREFIX}-nobody", "mechanism": 2}],
        upsertions=[
            {"name": f"{PREFIX}-user-v{v}", "mechanism": 1, "iterations": 4096,
             "salt": b"0123456789abcdef", "salted_password": bytes(32)},
        ],
    )  # fmt: skip


# -- ACLs: both brokers run without an authorizer, so both answer SECURITY_DISABLED


def _acl_filter(v: int) -> dict[str, Any]:
    return dict(
        resource_type_filter=2, resource_name_filter=TOPIC, pattern_type_filter=3,
        principal_filter=None, host_filter=None, operation=1, permission_type=1,
    )  # fmt: skip


def req_describe_acls(bs: str, v: int) -> dict[str, Any]:
    return _acl_filter(v)


def req_create_acls(bs: str, v: int) -> dict[str, Any]:
    return dict(
        creations=[{"resource_type": 2, "resource_name": TOPIC, "resource_pattern_type": 3,
                    "principal": "User:alice", "host": "*", "operation": 3,
                    "permission_type": 3}],
    )  # fmt: skip


def req_delete_acls(bs: str, v: int) -> dict[str, Any]:
    return dict(filters=[_acl_filter(v)])


def req_describe_topic_partitions(bs: str, v: int) -> dict[str, Any]:
    return dict(
        topics=[{"name": TOPIC}, {"name": MISSING}], response_partition_limit=100, cursor=None
    )


# -- transactions: ids no producer initialised (the coordinator is found first, which creates
# __transaction_state on both brokers, so that the answers are not a coordinator still loading)


def _txn_id(bs: str, name: str) -> str:
    """A transactional id whose coordinator answers (Kafka's loads each partition of
    __transaction_state some time after FindCoordinator finds it: NOT_COORDINATOR until then)."""
    txid = f"{PREFIX}-{name}"
    deadline = time.monotonic() + 30
    while True:
        r = wire.call(bs, 10, 6, key_type=1, coordinator_keys=[txid])
        if r["coordinators"][0]["error_code"] == 0:
            # (EndTxn of an id never initialised: DescribeTransactions would say it better, but
            # its answer carries a start time of -1, which kio does not decode.)
            e = wire.call(bs, 26, 3, transactional_id=txid, producer_id=TXN_PID,
                          producer_epoch=0, committed=True)  # fmt: skip
            if e["error_code"] not in (14, 15, 16):
                return txid
        assert time.monotonic() < deadline, f"no transaction coordinator for {txid}"
        time.sleep(0.2)


TXN_PID = (1 << 61) + 5  # a producer id both brokers could have given (Stratalog's from 2^61)


def req_add_partitions_to_txn(bs: str, v: int) -> dict[str, Any]:
    return dict(
        v3_and_below_transactional_id=_txn_id(bs, f"add{v}"), v3_and_below_producer_id=TXN_PID,
        v3_and_below_producer_epoch=0,
        v3_and_below_topics=[{"name": TOPIC, "partitions": [0, 1]}],
    )  # fmt: skip


def req_add_offsets_to_txn(bs: str, v: int) -> dict[str, Any]:
    return dict(transactional_id=_txn_id(bs, f"offsets{v}"), producer_id=TXN_PID,
                producer_epoch=0, group_id=GROUP)  # fmt: skip


def req_end_txn(bs: str, v: int) -> dict[str, Any]:
    return dict(transactional_id=_txn_id(bs, f"end{v}"), producer_id=TXN_PID, producer_epoch=0,
                committed=True)  # fmt: skip


def req_write_txn_markers(bs: str, v: int) -> dict[str, Any]:
    # Between brokers, but any client may send it: an ABORT marker for a producer the
    # partition never saw, and one for a missing topic.
    name = _v("markers", v)
    assert wire.create_topic(bs, name, 1) == 0
    return dict(markers=[{
        "producer_id": TXN_PID, "producer_epoch": 0, "transaction_result": False,
        "coordinator_epoch": 0,
        "topics": [{"name": name, "partition_indexes": [0]},
                   {"name": MISSING, "partition_indexes": [0]}]}])  # fmt: skip


def req_txn_offset_commit(bs: str, v: int) -> dict[str, Any]:
    return dict(
        transactional_id=_txn_id(bs, f"commit{v}"), group_id=_v("txn-commit", v),
        producer_id=TXN_PID, producer_epoch=0, generation_id=-1, member_id="",
        group_instance_id=None,
        topics=[{"name": TOPIC, "partitions": [
            {"partition_index": 0, "committed_offset": 1, "committed_leader_epoch": -1,
             "committed_metadata": ""}]}],
    )  # fmt: skip


def req_describe_producers(bs: str, v: int) -> dict[str, Any]:
    return dict(topics=[{"name": TOPIC, "partition_indexes": [0, 1, 7]},
                        {"name": MISSING, "partition_indexes": [0]}])  # fmt: skip


def req_describe_transactions(bs: str, v: int) -> dict[str, Any]:
    # An ongoing transaction (an id with no transaction has a start time of -1, which kio
    # cannot decode) over the topic's two partitions.
    txid = _txn_id(bs, f"describe{v}")
    r = wire.call(bs, 22, 4, transactional_id=txid, transaction_timeout=60000, producer_id=-1,
                  producer_epoch=-1)  # fmt: skip
    assert r["error_code"] == 0, r
    added = wire.call(
        bs, 24, 3, v3_and_below_transactional_id=txid, v3_and_below_producer_id=r["producer_id"],
        v3_and_below_producer_epoch=r["producer_epoch"],
        v3_and_below_topics=[{"name": TOPIC, "partitions": [0, 1]}],
    )  # fmt: skip
    assert (
        added["results_by_topic_v3_and_below"][0]["results_by_partition"][0]["partition_error_code"]
        == 0
    ), added
    return dict(transactional_ids=[txid])


def req_list_transactions(bs: str, v: int) -> dict[str, Any]:
    return dict(state_filters=["Ongoing", "Bogus"], producer_id_filters=[TXN_PID],
                duration_filter=-1, transactional_id_pattern=None)  # fmt: skip


def req_consumer_group_heartbeat(bs: str, v: int) -> dict[str, Any]:
    # A join asking for an assignor neither broker has: UNSUPPORTED_ASSIGNOR, the same message.
    # (A join's epochs and assignment depend on when Kafka's assignor runs; the differential
    # test in test_consumer_group_protocol.py compares joins once they settle.)
    return dict(group_id=_v("cg-heartbeat", v), member_id=str(uuid.UUID(int=v + 1)),
                member_epoch=0, rebalance_timeout=30000, subscribed_topic_names=[TOPIC],
                server_assignor="no-such-assignor", topic_partitions=[])  # fmt: skip


def req_consumer_group_describe(bs: str, v: int) -> dict[str, Any]:
    return dict(group_ids=[_v("cg-describe", v)], include_authorized_operations=True)


def _kafka_uuid(n: int) -> str:
    """A member id as Kafka's clients make them: a Uuid in URL-safe base64 (Kafka's ShareFetch
    parses it)."""
    return base64.urlsafe_b64encode(uuid.UUID(int=n).bytes).decode().rstrip("=")


def req_share_group_heartbeat(bs: str, v: int) -> dict[str, Any]:
    # A join without topics: INVALID_REQUEST (the protocol itself in test_share_groups.py).
    return dict(group_id=_v("share-heartbeat", v), member_id=_kafka_uuid(v + 1),
                member_epoch=0, subscribed_topic_names=[])  # fmt: skip


def req_share_group_describe(bs: str, v: int) -> dict[str, Any]:
    return dict(group_ids=[_v("share-describe", v)], include_authorized_operations=True)


def req_share_fetch(bs: str, v: int) -> dict[str, Any]:
    # A session epoch that no share session has: SHARE_SESSION_NOT_FOUND.
    return dict(group_id=_v("share-fetch", v), member_id=_kafka_uuid(v + 1),
                share_session_epoch=5, max_wait=0, min_bytes=1, max_records=10, batch_size=10,
                topics=[{"topic_id": wire.topic_id(bs, TOPIC), "partitions": [
                    {"partition_index": 0, "acknowledgement_batches": []}]}],
                forgotten_topics_data=[])  # fmt: skip


def req_share_acknowledge(bs: str, v: int) -> dict[str, Any]:
    # Acknowledgements cannot open a share session: INVALID_SHARE_SESSION_EPOCH.
    batch = {"first_offset": 0, "last_offset": 0, "acknowledge_types": [1]}
    partition = {"partition_index": 0, "acknowledgement_batches": [batch]}
    topics = [{"topic_id": wire.topic_id(bs, TOPIC), "partitions": [partition]}]
    return dict(group_id=_v("share-ack", v), member_id=_kafka_uuid(v + 1),
                share_session_epoch=0, topics=topics)  # fmt: skip


def req_describe_share_group_offsets(bs: str, v: int) -> dict[str, Any]:
    return dict(groups=[{"group_id": _v("share-offsets", v),
                         "topics": [{"topic_name": TOPIC, "partitions": [0]}]}])  # fmt: skip


REQUESTS: dict[int, Callable[[str, int], dict[str, Any]]] = {
    0: req_produce,
    1: req_fetch,
    2: req_list_offsets,
    3: req_metadata,
    8: req_offset_commit,
    9: req_offset_fetch,
    10: req_find_coordinator,
    11: req_join_group,
    12: req_heartbeat,
    13: req_leave_group,
    14: req_sync_group,
    15: req_describe_groups,
    16: req_list_groups,
    18: req_api_versions,
    19: req_create_topics,
    20: req_delete_topics,
    21: req_delete_records,
    22: req_init_producer_id,
    23: req_offset_for_leader_epoch,
    24: req_add_partitions_to_txn,
    25: req_add_offsets_to_txn,
    26: req_end_txn,
    27: req_write_txn_markers,
    28: req_txn_offset_commit,
    32: req_describe_configs,
    33: req_alter_configs,
    35: req_describe_log_dirs,
    37: req_create_partitions,
    42: req_delete_groups,
    43: req_elect_leaders,
    44: req_incremental_alter_configs,
    45: req_alter_partition_reassignments,
    46: req_list_partition_reassignments,
    47: req_offset_delete,
    48: req_describe_client_quotas,
    49: req_alter_client_quotas,
    60: req_describe_cluster,
    61: req_describe_producers,
    65: req_describe_transactions,
    66: req_list_transactions,
    68: req_consumer_group_heartbeat,
    69: req_consumer_group_describe,
    75: req_describe_topic_partitions,
    76: req_share_group_heartbeat,
    77: req_share_group_describe,
    78: req_share_fetch,
    79: req_share_acknowledge,
    90: req_describe_share_group_offsets,
    17: req_sasl_handshake,
    36: req_sasl_authenticate,
    50: req_describe_user_scram_credentials,
    51: req_alter_user_scram_credentials,
    29: req_describe_acls,
    30: req_create_acls,
    31: req_delete_acls,
}

CASES = [(k, v) for k, (lo, hi) in sorted(SUPPORTED.items()) for v in range(lo, hi + 1)]


def exchange(bs: str, api_key: int, version: int) -> dict[str, Any]:
    """Build the request on this broker (it may need the broker's topic ids), send, decode."""
    values = REQUESTS[api_key](bs, version)
    frame = wire.request_frame(api_key, version, wire.build(api_key, version, **values))
    out = wire.send(bs, frame, timeout=30)
    if out.kind != "response":
        return {"outcome": out.kind}
    correlation_id, body = wire.decode(api_key, version, out.data)
    return {"correlation_id": correlation_id, "size": len(out.data), "body": wire.plain(body)}


def _api_versions_ranges(strat: dict, kafka: dict) -> dict[int, Any]:
    """APIs Stratalog advertises that Kafka does not, or with another minimum or a higher maximum.

    Kafka may support newer versions than Stratalog; the minimum is what a client negotiating
    down relies on (librdkafka checks Produce v0, which Kafka 4.x advertises for that reason).
    """
    s = {a["api_key"]: (a["min_version"], a["max_version"]) for a in strat["api_keys"]}
    k = {a["api_key"]: (a["min_version"], a["max_version"]) for a in kafka["api_keys"]}
    return {
        key: {"stratalog": s[key], "kafka": k.get(key)}
        for key in s
        if key not in k or s[key][0] != k[key][0] or s[key][1] > k[key][1]
    }


def test_all_advertised_apis_are_swept():
    assert set(REQUESTS) == set(SUPPORTED)


@pytest.mark.parametrize(("api_key", "version"), CASES, ids=[f"api{k}-v{v}" for k, v in CASES])
def test_request_versions(frames, api_key, version):
    strat, kafka = both(frames, exchange, api_key, version)
    assert strat.get("outcome") is None and kafka.get("outcome") is None, (strat, kafka)
    assert strat["correlation_id"] == kafka["correlation_id"] == wire.CORRELATION_ID
    s, k = strat["body"], kafka["body"]
    if api_key == 18:
        assert _api_versions_ranges(s, k) == {}
        s, k = dict(s, api_keys="<compared above>"), dict(k, api_keys="<compared above>")
    if api_key == 35:  # each broker's own directory and disk
        for body in (s, k):
            for r in body["results"]:
                r.update(log_dir="<dir>", total_bytes="<disk>", usable_bytes="<disk>")
    raw_messages = (_messages(s), _messages(k))
    s, k = wire.normalise(s, topic_prefix=PREFIX), wire.normalise(k, topic_prefix=PREFIX)
    assert s == k, wire.differences(s, k)
    # Same fields, same free text: then the same number of bytes, or something kio skipped
    # (an unknown tagged field, say) differs. ApiVersions, CreateTopics and DescribeConfigs
    # legitimately carry different lists (Kafka's newer APIs, Kafka's other configs), and
    # ListGroups lists every group on the broker, of which only this test's are compared.
    if api_key not in (16, 18, 19, 32, 35) and raw_messages[0] == raw_messages[1]:
        assert strat["size"] == kafka["size"], "same decoded response, different frame sizes"


def _messages(obj: Any) -> list[Any]:
    """Every error_message in a response, in order (the free text that normalise drops)."""
    if isinstance(obj, dict):
        out = [obj["error_message"]] if "error_message" in obj else []
        for v in obj.values():
            out += _messages(v)
        return out
    if isinstance(obj, list):
        return [m for x in obj for m in _messages(x)]
    return []


# -- malformed and unsupported frames -------------------------------------------------------------


def _metadata_v12() -> bytes:
    req = wire.build(3, 12, topics=None, allow_auto_topic_creation=False,
                     include_topic_authorized_operations=False)  # fmt: skip
    return wire.header(3, 12) + wire.body_bytes(req)


def _api_versions_v3() -> bytes:
    req = wire.build(18, 3, client_software_name="conformance", client_software_version="1.0")
    return wire.header(18, 3) + wire.body_bytes(req)


def _produce_v9() -> bytes:
    batch = build_batch([(b"k", b"v", BASE_TS)])
    req = wire.build(
        0, 9, transactional_id=None, acks=-1, timeout=5000,
        topic_data=[{"name": MISSING, "partition_data": [{"index": 0, "records": batch}]}],
    )  # fmt: skip
    return wire.header(0, 9) + wire.body_bytes(req)


_MD = _metadata_v12()
_AV = _api_versions_v3()
_PR = _produce_v9()

MALFORMED: dict[str, bytes] = {
    # a well-formed control case
    "metadata-v12": wire.prefixed(_MD),
    # the body is cut short, the length prefix agreeing with what was sent
    "truncated-body": wire.prefixed(_MD[:-2]),
    "truncated-produce-records": wire.prefixed(_PR[:-10]),
    "header-only": wire.prefixed(wire.header(3, 12)),
    "short-header": wire.prefixed(struct.pack(">hhh", 18, 0, 7)),
    "client-id-past-end": wire.prefixed(struct.pack(">hhih", 18, 0, 7, 50) + b"abc"),
    "zero-length": struct.pack(">i", 0),
    # the length prefix disagrees with the bytes that follow
    "length-longer-than-data": struct.pack(">i", len(_MD) + 16) + _MD,
    "length-negative": struct.pack(">i", -1) + _MD,
    "length-huge": struct.pack(">i", 0x7FFFFFFF) + _MD,
    # bytes after a complete body
    "trailing-bytes": wire.prefixed(_MD + b"\x00\x01\x02\x03"),
    # unknown API keys and versions
    "unknown-api-key": wire.prefixed(wire.header(999, 0, flexible=False)),
    "unknown-api-key-negative": wire.prefixed(wire.header(-5, 0, flexible=False)),
    "metadata-v99": wire.prefixed(struct.pack(">hhi", 3, 99, 7) + _MD[8:]),
    "produce-v2-below-minimum": wire.prefixed(
        wire.header(0, 2, flexible=False) + struct.pack(">hii", -1, 5000, 0)
    ),
    # ApiVersions with a version the broker does not know: v3+ use request header v2, so a
    # client's v99 request carries the flexible header (KIP-511)
    "api-versions-v99": wire.prefixed(
        wire.header(18, 99, flexible=True) + _AV[len(wire.header(18, 3)) :]
    ),
    "api-versions-v99-empty-body": wire.prefixed(wire.header(18, 99, flexible=True)),
    # ...and the same without the header's tag buffer: a truncated request header v2
    "api-versions-v99-header-v1": wire.prefixed(wire.header(18, 99, flexible=False)),
    "api-versions-v3-truncated": wire.prefixed(_AV[:-3]),
    "garbage": wire.prefixed(uuid.UUID(int=0x0123456789ABCDEF0123456789ABCDEF).bytes * 3),
}


def send_malformed(bs: str, case: str) -> dict[str, Any]:
    out = wire.send(bs, MALFORMED[case], timeout=5, wait=1.5)
    if out.kind != "response":
        return {"outcome": out.kind}
    (key, version) = struct.unpack_from(">hh", MALFORMED[case], 4)
    if key == 18 and version > 4:  # answered in the v0 format (UNSUPPORTED_VERSION)
        version = 0
    correlation_id, body = wire.decode(key, version, out.data)
    body = wire.plain(body)
    if key == 18:
        # Kafka lists only ApiVersions itself in an UNSUPPORTED_VERSION answer; compare that entry.
        body["api_keys"] = [
            a for a in body["api_keys"] if a["api_key"] == 18 or body["error_code"] == 0
        ]
        if body["error_code"] == 0:
            body["api_keys"] = "<compared in test_request_versions>"
        else:
            body["api_keys"] = [dict(a, max_version="<max>") for a in body["api_keys"]]
    return {
        "outcome": "response",
        "correlation_id": correlation_id,
        "body": wire.normalise(body, topic_prefix=PREFIX),
    }


@pytest.mark.parametrize("case", list(MALFORMED))
def test_malformed_frames(pair, case):
    strat, kafka = both(pair, send_malformed, case)
    assert strat == kafka, wire.differences(strat, kafka)
