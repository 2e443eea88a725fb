"""ACLs in a cluster: two brokers on one etcd with the authorizer on. An ACL created through one
broker is enforced by the other (the ACLs are in etcd and every broker follows them), and one
deleted through the other stops being enforced on the first; nothing is written to a broker's
data directory.

PLAINTEXT clients are User:ANONYMOUS, the super user here (they create the topic, the SCRAM user
and the ACLs); the user under test logs in with SCRAM over SASL_PLAINTEXT.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from confluent_kafka import Producer

from stratalog import Broker
from stratalog.cluster.etcd_server import EtcdServer

from ..conformance import wire
from ..security.conftest import add_scram_users
from ..security.wire import Conn
from .conftest import in_process_brokers, wait_for

LISTENERS = "PLAINTEXT://127.0.0.1:0,SASL_PLAINTEXT://127.0.0.1:0"
USER, PASSWORD = "acl-user", "acl-pw"
TOPIC_AUTHORIZATION_FAILED = 29


@pytest.fixture(scope="module")
def brokers(etcd: EtcdServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Broker]]:
    config = {
        "listeners": LISTENERS,
        "admin.port": -1,
        "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "super.users": "User:ANONYMOUS",
    }
    started = in_process_brokers(etcd, tmp_path_factory, "acl", config)
    try:
        two = next(started)
        add_scram_users(two[0].bootstrap, {"SCRAM-SHA-256": (USER, PASSWORD)})
        yield two
    finally:
        started.close()


def _metadata_error(broker: Broker, topic: str) -> int | None:
    """Metadata for ``topic`` as the user, from this broker (None: the user cannot log in)."""
    with Conn(broker.bootstraps["SASL_PLAINTEXT"]) as c:
        if c.login("SCRAM-SHA-256", USER, PASSWORD)["error_code"] != 0:
            return None
        out = c.request(3, 12, topics=[{"name": topic, "topic_id": None}],
                        allow_auto_topic_creation=False,
                        include_topic_authorized_operations=False)  # fmt: skip
        return out["topics"][0]["error_code"]


def _acl(topic: str, operation: int) -> dict:
    return {"resource_type": 2, "resource_name": topic, "resource_pattern_type": 3,
            "principal": f"User:{USER}", "host": "*", "operation": operation,
            "permission_type": 3}  # fmt: skip


def _create_topic(brokers: list[Broker], name: str) -> None:
    """Created through the first broker; known to every broker (the leader may be either)."""
    out = wire.call(brokers[0].bootstrap, 19, 7, timeout=10000, validate_only=False, topics=[
        {"name": name, "num_partitions": 1, "replication_factor": 1, "assignments": [],
         "configs": []}])  # fmt: skip
    assert out["topics"][0]["error_code"] == 0, out

    def known_everywhere() -> bool:
        return all(
            wire.metadata(b.bootstrap, name)["topics"][0]["error_code"] == 0 for b in brokers
        )

    assert wait_for(known_everywhere)


def test_an_acl_made_on_one_broker_is_enforced_by_the_other(brokers):
    first, second = brokers
    topic = f"acl-topic-{uuid.uuid4().hex[:6]}"
    _create_topic(brokers, topic)
    assert wait_for(lambda: _metadata_error(second, topic) == TOPIC_AUTHORIZATION_FAILED)
    out = wire.call(first.bootstrap, 30, 3, creations=[_acl(topic, 8)])  # DESCRIBE
    assert out["results"][0]["error_code"] == 0
    assert wait_for(lambda: _metadata_error(second, topic) == 0)
    # Deleted through the second broker: the first stops allowing it.
    flt = dict(resource_type_filter=2, resource_name_filter=topic, pattern_type_filter=3,
               principal_filter=None, host_filter=None, operation=1, permission_type=1)  # fmt: skip
    out = wire.call(second.bootstrap, 31, 3, filters=[flt])
    assert len(out["filter_results"][0]["matching_acls"]) == 1
    assert wait_for(lambda: _metadata_error(first, topic) == TOPIC_AUTHORIZATION_FAILED)
    for b in brokers:
        assert not (b.data_dir / "meta" / "acls.json").exists()


def test_a_client_of_either_broker_is_allowed_once_granted(brokers):
    first, second = brokers
    topic = f"acl-produce-{uuid.uuid4().hex[:6]}"
    _create_topic(brokers, topic)
    conf = {"bootstrap.servers": second.bootstraps["SASL_PLAINTEXT"],
            "security.protocol": "sasl_plaintext", "sasl.mechanism": "SCRAM-SHA-256",
            "sasl.username": USER, "sasl.password": PASSWORD,
            "message.timeout.ms": 15000}  # fmt: skip

    def produce_error():
        errors: list = []
        p = Producer(conf)
        p.produce(topic, b"v", on_delivery=lambda e, _m: errors.append(e))
        p.flush(20)
        return errors[0] if errors else "timed out"

    error = produce_error()
    assert not isinstance(error, str) and error is not None, error
    assert error.code() == TOPIC_AUTHORIZATION_FAILED
    out = wire.call(first.bootstrap, 30, 3, creations=[_acl(topic, 4)])  # WRITE
    assert out["results"][0]["error_code"] == 0
    # Every broker has it (the partition's leader may be either).
    assert wait_for(lambda: all(_metadata_error(b, topic) == 0 for b in brokers))
    assert produce_error() is None


def test_a_transactional_producer_with_its_acls(brokers):
    """A transactional producer as the SCRAM user, allowed WRITE on its transactional id and
    topic: its transaction over partitions of both brokers commits (the markers between brokers
    come as User:ANONYMOUS, the super user here, as Kafka's broker principal)."""
    first, second = brokers
    topic = f"acl-txn-{uuid.uuid4().hex[:6]}"
    out = wire.call(first.bootstrap, 19, 7, timeout=10000, validate_only=False, topics=[
        {"name": topic, "num_partitions": 4, "replication_factor": 1, "assignments": [],
         "configs": []}])  # fmt: skip
    assert out["topics"][0]["error_code"] == 0, out
    tid = f"txn-{topic}"
    acls = [_acl(topic, 4), dict(_acl(tid, 4), resource_type=5)]  # WRITE topic, WRITE txn id
    assert all(
        r["error_code"] == 0 for r in wire.call(first.bootstrap, 30, 3, creations=acls)["results"]
    )
    assert wait_for(lambda: all(_metadata_error(b, topic) == 0 for b in brokers))
    conf = {"bootstrap.servers": second.bootstraps["SASL_PLAINTEXT"],
            "security.protocol": "sasl_plaintext", "sasl.mechanism": "SCRAM-SHA-256",
            "sasl.username": USER, "sasl.password": PASSWORD, "transactional.id": tid,
            "transaction.timeout.ms": 30000}  # fmt: skip
    p = Producer(conf)
    p.init_transactions(30)
    p.begin_transaction()
    for i in range(4):
        p.produce(topic, b"v", partition=i)
    p.commit_transaction(30)
    # Another transactional id is refused.
    q = Producer({**conf, "transactional.id": tid + "-other"})
    with pytest.raises(Exception) as e:
        q.init_transactions(15)
    assert "TRANSACTIONAL_ID_AUTHORIZATION_FAILED" in str(e.value)
