"""Admin requests over a ``WireClient``: the cluster's brokers and partitions (leaders, in-sync
replicas), consumer groups (listed on every broker, described at their coordinator, members'
assignments decoded), topic configs and topic deletion.

What the web console (``stratalog.console``) shows of a cluster, asked as any Kafka admin tool
asks it. Each function raises ``WireError`` with the Kafka error's name when the answer is one.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any

from stratalog.client.errors import WireError
from stratalog.client.wire import WireClient

LIST_GROUPS_V = 5
DESCRIBE_GROUPS_V = 5
CONSUMER_GROUP_DESCRIBE_V = 0
DELETE_TOPICS_V = 6
DESCRIBE_CONFIGS_V = 4
TOPIC_RESOURCE = 2
BROKER_RESOURCE = 4


@dataclass
class Partition:
    index: int
    leader: int
    replicas: list[int]
    isr: list[int]
    error: str | None = None


@dataclass
class Cluster:
    cluster_id: str | None
    controller: int
    brokers: dict[int, str]  # node id -> HOST:PORT
    topics: dict[str, list[Partition]]
    internal: set[str] = field(default_factory=set)


@dataclass
class Member:
    member_id: str
    client_id: str
    host: str
    assignment: list[tuple[str, int]]


@dataclass
class Group:
    group_id: str
    state: str
    protocol_type: str
    assignor: str
    members: list[Member]


def _check(code: Any, what: str, message: str | None = None) -> None:
    if int(code):
        detail = f": {message}" if message else ""
        raise WireError(f"{what}: {code.name}{detail}", int(code))


def cluster(client: WireClient) -> Cluster:
    """Every broker, and every topic's partitions with their leader, replicas and ISR."""
    resp = client._refresh(None)  # (the client learns the brokers and leaders from it)
    topics: dict[str, list[Partition]] = {}
    internal = set()
    for t in resp.topics:
        if t.name is None or int(t.error_code):
            continue
        if t.is_internal:
            internal.add(t.name)
        topics[t.name] = sorted(
            (
                Partition(
                    p.partition_index,
                    p.leader_id,
                    list(p.replica_nodes),
                    list(p.isr_nodes),
                    p.error_code.name if int(p.error_code) else None,
                )
                for p in t.partitions
            ),
            key=lambda p: p.index,
        )
    return Cluster(
        resp.cluster_id,
        resp.controller_id,
        {b.node_id: f"{b.host}:{b.port}" for b in resp.brokers},
        topics,
        internal,
    )


def list_groups(client: WireClient, brokers: list[int]) -> dict[str, tuple[str, str]]:
    """group id -> (state, type) from every broker (each lists the groups it coordinates)."""
    out: dict[str, tuple[str, str]] = {}
    body = client._new(16, LIST_GROUPS_V, states_filter=(), types_filter=())
    for node in brokers or [None]:
        resp = client._connection(node).request(16, LIST_GROUPS_V, body)
        _check(resp.error_code, "ListGroups")
        for g in resp.groups:
            out[g.group_id] = (g.group_state, g.group_type or g.protocol_type or "")
    return out


def describe_group(client: WireClient, group: str) -> Group:
    """A group's state and members with their assignments: DescribeGroups, and for a group of
    the consumer protocol (KIP-848) ConsumerGroupDescribe."""
    body = client._new(
        15,
        DESCRIBE_GROUPS_V,
        groups=(group,),
        include_authorized_operations=False,
    )
    resp = client._to_coordinator(
        group, 15, DESCRIBE_GROUPS_V, body, lambda r: {int(g.error_code) for g in r.groups}
    )
    g = resp.groups[0]
    if not int(g.error_code) and (g.members or g.protocol_type):
        members = [
            Member(m.member_id, m.client_id, m.client_host, _assignment(m.member_assignment))
            for m in g.members
        ]
        return Group(group, g.group_state, g.protocol_type, g.protocol_data, members)
    # Not a classic group with members: a group of the consumer protocol, or an empty one.
    described = _describe_consumer_group(client, group)
    if described is not None:
        return described
    _check(g.error_code, f"DescribeGroups {group}")
    return Group(group, g.group_state, g.protocol_type, g.protocol_data, [])


def _describe_consumer_group(client: WireClient, group: str) -> Group | None:
    body = client._new(
        69, CONSUMER_GROUP_DESCRIBE_V, group_ids=(group,), include_authorized_operations=False
    )
    resp = client._to_coordinator(
        group, 69, CONSUMER_GROUP_DESCRIBE_V, body, lambda r: {int(x.error_code) for x in r.groups}
    )
    d = resp.groups[0] if resp.groups else None
    if d is None or int(d.error_code):
        return None
    members = [
        Member(
            m.member_id,
            m.client_id,
            m.client_host,
            [(tp.topic_name, p) for tp in m.assignment.topic_partitions for p in tp.partitions],
        )
        for m in d.members
    ]
    return Group(group, d.group_state, "consumer", d.assignor_name, members)


def _assignment(data: bytes | None) -> list[tuple[str, int]]:
    """The (topic, partition)s of a classic consumer's assignment (ConsumerProtocolAssignment:
    version, then topics of partitions); nothing for another protocol's bytes."""
    if not data or len(data) < 6:
        return []
    out = []
    try:
        pos = 2  # version
        (n_topics,) = struct.unpack_from(">i", data, pos)
        pos += 4
        for _ in range(max(n_topics, 0)):
            (n,) = struct.unpack_from(">h", data, pos)
            topic = bytes(data[pos + 2 : pos + 2 + n]).decode()
            pos += 2 + n
            (n_parts,) = struct.unpack_from(">i", data, pos)
            pos += 4
            parts = struct.unpack_from(f">{max(n_parts, 0)}i", data, pos)
            pos += 4 * len(parts)
            out += [(topic, p) for p in parts]
    except (struct.error, UnicodeDecodeError):
        return out
    return out


def delete_topic(client: WireClient, name: str, timeout_ms: int = 30000) -> None:
    state = client._new(20, DELETE_TOPICS_V, "DeleteTopicState", name=name, topic_id=None)
    resp = client.request(
        20, DELETE_TOPICS_V, client._new(20, DELETE_TOPICS_V, topics=(state,), timeout=timeout_ms)
    )
    r = resp.responses[0]
    _check(r.error_code, f"DeleteTopics {name}", r.error_message)


def topic_configs(client: WireClient, name: str) -> dict[str, dict[str, Any]]:
    """config name -> {value, source, sensitive, read_only} of a topic."""
    return configs(client, TOPIC_RESOURCE, name)


def configs(client: WireClient, resource_type: int, name: str) -> dict[str, dict[str, Any]]:
    """config name -> {value, source, sensitive, read_only} of a topic or broker (its id)."""
    res = client._new(
        32,
        DESCRIBE_CONFIGS_V,
        "DescribeConfigsResource",
        resource_type=resource_type,
        resource_name=name,
        configuration_keys=None,
    )
    resp = client.request(
        32,
        DESCRIBE_CONFIGS_V,
        client._new(
            32,
            DESCRIBE_CONFIGS_V,
            resources=(res,),
            include_synonyms=False,
            include_documentation=False,
        ),
    )
    r = resp.results[0]
    _check(r.error_code, f"DescribeConfigs {name}", r.error_message)
    return {
        c.name: {
            "value": None if c.is_sensitive else c.value,
            "source": int(c.config_source),
            "sensitive": bool(c.is_sensitive),
            "read_only": bool(c.read_only),
        }
        for c in r.configs
    }
