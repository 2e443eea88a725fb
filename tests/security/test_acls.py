"""Authorization with real clients: a broker with the ACL authorizer on and SASL users, ACLs
managed with confluent-kafka's AdminClient and Kafka's own kafka-acls.sh, and what a client
without the ACLs it needs is answered (TOPIC_AUTHORIZATION_FAILED, GROUP_AUTHORIZATION_FAILED,
CLUSTER_AUTHORIZATION_FAILED), what Metadata hides, what a super user may do, and that the ACLs
are still there after a restart.

One broker for the module: all four listeners (PLAINTEXT clients are User:ANONYMOUS, who is no
super user here), PLAIN users alice and admin from the JAAS file, ``super.users=User:admin``.
Each test names its own topics and groups. test_acls_kafka_parity.py compares the error codes
of every API with Apache Kafka's StandardAuthorizer.
"""

from __future__ import annotations

import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    NewTopic,
    ResourcePatternType,
    ResourceType,
)

from stratalog import Broker

from .conftest import PLAIN_USERS, secure_config
from .wire import Conn

AUTHORIZER = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
TOPIC_AUTHORIZATION_FAILED = 29
GROUP_AUTHORIZATION_FAILED = 30
CLUSTER_AUTHORIZATION_FAILED = 31
TOOL_TIMEOUT = 90


def acl_config(certs: dict[str, Path], users_file: Path, **extra: object) -> dict:
    return secure_config(
        certs, users_file, **{"authorizer.class.name": AUTHORIZER, "super.users": "User:admin",
                              **extra}
    )  # fmt: skip


@pytest.fixture(scope="module")
def broker(
    tmp_path_factory: pytest.TempPathFactory, certs: dict[str, Path], plain_users_file: Path
) -> Iterator[Broker]:
    config = acl_config(certs, plain_users_file, **{"auto.create.topics.enable": True})
    with Broker(tmp_path_factory.mktemp("acls") / "data", config=config) as b:
        yield b


def client(broker: Broker, user: str, **extra: object) -> dict:
    """librdkafka settings for ``user`` (a PLAIN user) on the SASL_PLAINTEXT listener."""
    return {
        "bootstrap.servers": broker.bootstraps["SASL_PLAINTEXT"],
        "security.protocol": "sasl_plaintext",
        "sasl.mechanism": "PLAIN",
        "sasl.username": user,
        "sasl.password": PLAIN_USERS[user],
        **extra,
    }


def admin(broker: Broker, user: str = "admin") -> AdminClient:
    return AdminClient(client(broker, user))


def unique(stem: str) -> str:
    return f"{stem}-{uuid.uuid4().hex[:8]}"


def allow(rtype, name: str, op, principal: str = "User:alice", pattern=None, perm=None):
    return AclBinding(
        rtype, name, pattern or ResourcePatternType.LITERAL, principal, "*", op,
        perm or AclPermissionType.ALLOW,
    )  # fmt: skip


def add_acls(broker: Broker, *bindings: AclBinding) -> None:
    a = admin(broker)  # (kept: a client dropped before its futures end cancels them)
    for f in a.create_acls(list(bindings)).values():
        f.result(15)


def make_topic(broker: Broker, name: str, partitions: int = 1) -> None:
    a = admin(broker)
    a.create_topics([NewTopic(name, partitions, 1)])[name].result(15)


def produce_error(conf: dict, topic: str) -> KafkaError | None:
    """Produce one record; the delivery error, if any."""
    errors: list = []
    p = Producer({**conf, "message.timeout.ms": 10000})
    p.produce(topic, b"v", partition=0, on_delivery=lambda e, _m: errors.append(e))
    p.flush(20)
    return errors[0] if errors else KafkaError(KafkaError._TIMED_OUT)


def consume_error(conf: dict, topic: str, group: str) -> KafkaError | None:
    """Subscribe with a group; the first error a poll reports (None: it read a record)."""
    c = Consumer({**conf, "group.id": group, "auto.offset.reset": "earliest"})
    try:
        c.subscribe([topic])
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is None:
                continue
            return m.error()
        raise AssertionError("nothing read and no error reported")
    finally:
        c.close()


# -- managing ACLs ---------------------------------------------------------------------------------
def test_admin_client_creates_describes_and_deletes_acls(broker):
    topic = unique("admin-acl")
    bindings = [
        allow(ResourceType.TOPIC, topic, AclOperation.READ),
        allow(
            ResourceType.TOPIC,
            topic + "-",
            AclOperation.WRITE,
            "User:bob",
            ResourcePatternType.PREFIXED,
            AclPermissionType.DENY,
        ),
        allow(ResourceType.GROUP, topic, AclOperation.ALL),
    ]
    a = admin(broker)
    for f in a.create_acls(bindings).values():
        assert f.result(15) is None
    mine = AclBindingFilter(ResourceType.ANY, None, ResourcePatternType.ANY, None, None,
                            AclOperation.ANY, AclPermissionType.ANY)  # fmt: skip
    found = [b for b in a.describe_acls(mine).result(15) if b.name.startswith(topic)]
    assert sorted(found, key=str) == sorted(bindings, key=str)
    # MATCH: the ACLs that apply to one topic name (literal, wildcard, prefixes).
    match = AclBindingFilter(ResourceType.TOPIC, topic + "-x", ResourcePatternType.MATCH, None,
                             None, AclOperation.ANY, AclPermissionType.ANY)  # fmt: skip
    assert a.describe_acls(match).result(15) == [bindings[1]]
    topics_only = AclBindingFilter(ResourceType.TOPIC, None, ResourcePatternType.ANY, None, None,
                                   AclOperation.ANY, AclPermissionType.ANY)  # fmt: skip
    deleted = [
        b for f in a.delete_acls([topics_only]).values() for b in f.result(15)
        if b.name.startswith(topic)
    ]  # fmt: skip
    assert sorted(deleted, key=str) == sorted(bindings[:2], key=str)
    left = [b for b in a.describe_acls(mine).result(15) if b.name.startswith(topic)]
    assert left == [bindings[2]]


def test_invalid_acls_are_refused_one_by_one(broker):
    name = unique("invalid")
    good = allow(ResourceType.TOPIC, name, AclOperation.READ)
    # (confluent-kafka refuses ANY and MATCH itself; a principal without a type reaches us.)
    bad = allow(ResourceType.TOPIC, name, AclOperation.READ, principal="alice")
    a = admin(broker)
    futures = a.create_acls([good, bad])
    assert futures[good].result(15) is None
    with pytest.raises(KafkaException) as e:
        futures[bad].result(15)
    assert e.value.args[0].code() == KafkaError.INVALID_REQUEST


def test_managing_acls_needs_alter_and_describe_on_the_cluster(broker):
    a = admin(broker, "alice")
    binding = allow(ResourceType.TOPIC, unique("x"), AclOperation.READ)
    with pytest.raises(KafkaException) as e:
        a.create_acls([binding])[binding].result(15)
    assert e.value.args[0].code() == KafkaError.CLUSTER_AUTHORIZATION_FAILED
    # (librdkafka's describe_acls does not raise DescribeAcls' error: asked on the wire.)
    describe = dict(
        resource_type_filter=1, resource_name_filter=None, pattern_type_filter=1,
        principal_filter=None, host_filter=None, operation=1, permission_type=1,
    )  # fmt: skip
    with Conn(broker.bootstraps["SASL_PLAINTEXT"]) as c:
        c.login("PLAIN", "alice", PLAIN_USERS["alice"])
        assert c.request(29, 3, **describe)["error_code"] == CLUSTER_AUTHORIZATION_FAILED
    # PLAINTEXT clients are User:ANONYMOUS: no super user here either.
    with Conn(broker.bootstraps["PLAINTEXT"]) as c:
        assert c.request(29, 3, **describe)["error_code"] == CLUSTER_AUTHORIZATION_FAILED


# -- enforcement -----------------------------------------------------------------------------------
def test_produce_needs_write_on_the_topic(broker):
    topic = unique("produce")
    make_topic(broker, topic)
    alice = client(broker, "alice")
    assert produce_error(alice, topic).code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    add_acls(broker, allow(ResourceType.TOPIC, topic, AclOperation.READ))
    assert produce_error(alice, topic).code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    add_acls(broker, allow(ResourceType.TOPIC, topic, AclOperation.WRITE))
    assert produce_error(alice, topic) is None
    # A DENY wins over the ALLOW.
    add_acls(broker, allow(ResourceType.TOPIC, topic, AclOperation.WRITE,
                           perm=AclPermissionType.DENY))  # fmt: skip
    assert produce_error(alice, topic).code() == KafkaError.TOPIC_AUTHORIZATION_FAILED


def test_prefixed_acls_cover_the_topics_they_begin(broker):
    prefix = unique("team") + "-"
    for t in ("a", "b"):
        make_topic(broker, prefix + t)
    make_topic(broker, prefix[:-1] + "x")
    add_acls(broker, allow(ResourceType.TOPIC, prefix, AclOperation.WRITE,
                           pattern=ResourcePatternType.PREFIXED))  # fmt: skip
    alice = client(broker, "alice")
    assert produce_error(alice, prefix + "a") is None
    assert produce_error(alice, prefix + "b") is None
    assert produce_error(alice, prefix[:-1] + "x").code() == KafkaError.TOPIC_AUTHORIZATION_FAILED


def test_consuming_needs_read_on_the_group(broker):
    topic, group = unique("consume"), unique("group")
    make_topic(broker, topic)
    assert produce_error(client(broker, "admin"), topic) is None
    alice = client(broker, "alice")
    add_acls(broker, allow(ResourceType.TOPIC, topic, AclOperation.READ))
    error = consume_error(alice, topic, group)
    assert error is not None and error.code() == KafkaError.GROUP_AUTHORIZATION_FAILED
    add_acls(broker, allow(ResourceType.GROUP, group, AclOperation.READ))
    assert consume_error(alice, topic, group) is None


def test_fetch_needs_read_on_the_topic(broker):
    topic = unique("fetch")
    make_topic(broker, topic)
    assert produce_error(client(broker, "admin"), topic) is None
    group = unique("g")
    add_acls(
        broker,
        allow(ResourceType.TOPIC, topic, AclOperation.DESCRIBE),
        allow(ResourceType.GROUP, group, AclOperation.READ),
    )
    c = Consumer({**client(broker, "alice"), "group.id": group})
    try:
        c.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        deadline = time.monotonic() + 30
        error = None
        while time.monotonic() < deadline and error is None:
            m = c.poll(0.5)
            if m is not None:
                error = m.error()
                assert error is not None, "read a record without READ"
        assert error is not None and error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    finally:
        c.close()


def test_metadata_hides_topics_the_principal_may_not_describe(broker):
    seen, hidden = unique("seen"), unique("hidden")
    for t in (seen, hidden):
        make_topic(broker, t)
    add_acls(broker, allow(ResourceType.TOPIC, seen, AclOperation.WRITE))  # implies DESCRIBE
    listed = admin(broker, "alice").list_topics(timeout=15).topics
    assert seen in listed and hidden not in listed
    assert hidden in admin(broker).list_topics(timeout=15).topics  # the super user sees it
    with Conn(broker.bootstraps["SASL_PLAINTEXT"]) as c:
        c.login("PLAIN", "alice", PLAIN_USERS["alice"])
        out = c.request(3, 12, topics=[{"name": hidden, "topic_id": None},
                                       {"name": unique("missing"), "topic_id": None},
                                       {"name": seen, "topic_id": None}],
                        allow_auto_topic_creation=True,
                        include_topic_authorized_operations=True)  # fmt: skip
    by_name = {t["name"]: t for t in out["topics"]}
    assert [t["error_code"] for t in out["topics"][:2]] == [TOPIC_AUTHORIZATION_FAILED] * 2
    # Nothing tells an existing hidden topic from a missing one (no id, no partitions).
    assert by_name[hidden]["partitions"] == []
    assert by_name[hidden]["topic_id"] in (None, uuid.UUID(int=0))
    assert by_name[seen]["error_code"] == 0
    # WRITE: WRITE and the DESCRIBE it implies (bits 4 and 8).
    assert by_name[seen]["topic_authorized_operations"] == (1 << 4) | (1 << 8)
    assert admin(broker).list_topics(timeout=15).topics.keys() >= {seen, hidden}


def test_auto_creation_needs_create(broker):
    name = unique("auto")
    add_acls(broker, allow(ResourceType.TOPIC, name, AclOperation.DESCRIBE))
    with Conn(broker.bootstraps["SASL_PLAINTEXT"]) as c:
        c.login("PLAIN", "alice", PLAIN_USERS["alice"])
        md = dict(topics=[{"name": name, "topic_id": None}], allow_auto_topic_creation=True,
                  include_topic_authorized_operations=False)  # fmt: skip
        assert c.request(3, 12, **md)["topics"][0]["error_code"] == TOPIC_AUTHORIZATION_FAILED
        assert name not in admin(broker).list_topics(timeout=15).topics
        add_acls(broker, allow(ResourceType.TOPIC, name, AclOperation.CREATE))
        assert c.request(3, 12, **md)["topics"][0]["error_code"] == 0
    assert name in admin(broker).list_topics(timeout=15).topics


def test_the_super_user_does_everything(broker):
    topic, group = unique("super"), unique("super-group")
    conf = client(broker, "admin")
    a = admin(broker)
    make_topic(broker, topic, partitions=2)
    assert produce_error(conf, topic) is None
    assert consume_error(conf, topic, group) is None
    a.delete_topics([topic])[topic].result(15)
    assert topic not in a.list_topics(timeout=15).topics


def test_mutual_tls_principal(broker, certs):
    topic = unique("mtls")
    make_topic(broker, topic)
    conf = {"bootstrap.servers": broker.bootstraps["SSL"], "security.protocol": "ssl",
            "ssl.ca.location": str(certs["ca.pem"]),
            "ssl.certificate.location": str(certs["client.crt"]),
            "ssl.key.location": str(certs["client.key"])}  # fmt: skip
    assert produce_error(conf, topic).code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    subject = "User:CN=client,O=Stratalog test"
    add_acls(broker, allow(ResourceType.TOPIC, topic, AclOperation.WRITE, principal=subject))
    assert produce_error(conf, topic) is None


# -- kafka-acls.sh ---------------------------------------------------------------------------------
def test_kafka_acls_tool(broker, tmp_path):
    from stratalog.peers.kafka import run_tool

    topic = unique("tool")
    make_topic(broker, topic)
    props = tmp_path / "admin.properties"
    props.write_text(
        "security.protocol=SASL_PLAINTEXT\nsasl.mechanism=PLAIN\n"
        "sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required "
        f'username="admin" password="{PLAIN_USERS["admin"]}";\n'
    )
    base = ["--bootstrap-server", broker.bootstraps["SASL_PLAINTEXT"],
            "--command-config", str(props)]  # fmt: skip

    def acls(*args: str) -> subprocess.CompletedProcess[str]:
        out = run_tool("kafka-acls", *base, *args, timeout=TOOL_TIMEOUT)
        assert out.returncode == 0, out.stderr[-3000:]
        return out

    # --producer: WRITE, DESCRIBE and CREATE on the topic (as Kafka's tool adds them).
    acls("--add", "--allow-principal", "User:alice", "--producer", "--topic", topic)
    listed = acls("--list", "--topic", topic).stdout
    for op in ("WRITE", "DESCRIBE", "CREATE"):
        assert f"(principal=User:alice, host=*, operation={op}, permissionType=ALLOW)" in listed
    assert produce_error(client(broker, "alice"), topic) is None
    acls("--remove", "--force", "--allow-principal", "User:alice", "--producer", "--topic", topic)
    assert "User:alice" not in acls("--list", "--topic", topic).stdout
    assert produce_error(client(broker, "alice"), topic).code() == (
        KafkaError.TOPIC_AUTHORIZATION_FAILED
    )


# -- durability ------------------------------------------------------------------------------------
def test_acls_survive_a_restart(tmp_path, certs, plain_users_file):
    config = acl_config(certs, plain_users_file)
    topic = unique("restart")
    binding = allow(ResourceType.TOPIC, topic, AclOperation.WRITE)
    with Broker(tmp_path / "data", config=config) as b:
        make_topic(b, topic)
        add_acls(b, binding)
    with Broker(tmp_path / "data", config=config) as b:
        every = AclBindingFilter(ResourceType.ANY, None, ResourcePatternType.ANY, None, None,
                                 AclOperation.ANY, AclPermissionType.ANY)  # fmt: skip
        assert admin(b).describe_acls(every).result(15) == [binding]
        assert produce_error(client(b, "alice"), topic) is None
    # Without the authorizer the stored ACLs are kept but neither enforced nor served.
    with Broker(tmp_path / "data", config=secure_config(certs, plain_users_file)) as b:
        assert produce_error(client(b, "alice"), topic) is None


def test_allow_everyone_if_no_acl_found(tmp_path, certs, plain_users_file):
    config = acl_config(certs, plain_users_file, **{"allow.everyone.if.no.acl.found": True})
    open_topic, guarded = unique("open"), unique("guarded")
    with Broker(tmp_path / "data", config=config) as b:
        for t in (open_topic, guarded):
            make_topic(b, t)
        add_acls(b, allow(ResourceType.TOPIC, guarded, AclOperation.WRITE, principal="User:bob"))
        alice = client(b, "alice")
        assert produce_error(alice, open_topic) is None
        assert produce_error(alice, guarded).code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
