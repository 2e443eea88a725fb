"""Cluster and topic administration as clients see it, on both brokers.

Metadata shape through each client (topic and partition counts, a leader for every partition,
replica and ISR counts, error codes; not host, port or node ids, which legitimately differ);
DescribeConfigs of the topic configs Stratalog implements (values, and whether each is a default
or a topic override) after CreateTopics and IncrementalAlterConfigs; CreatePartitions.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from typing import Any

import pytest
from aiokafka.admin import AIOKafkaAdminClient
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewPartitions,
    ResourceType,
)
from kafka import KafkaConsumer
from kafka.admin import KafkaAdminClient

from stratalog.records import build_batch

from . import clients, wire
from .conftest import both

pytestmark = pytest.mark.kafka

# The topic configs Stratalog implements; COMPARED leaves out segment.bytes, whose default
# differs on purpose (test_deliberate.py). An override of it is compared.
SUPPORTED_CONFIGS = sorted(wire.COMPARED_CONFIGS | {"segment.bytes"})
COMPARED = sorted(wire.COMPARED_CONFIGS)


def check(strat: Any, kafka: Any) -> None:
    assert strat == kafka, wire.differences(strat, kafka)


# -- metadata shape -------------------------------------------------------------------------------


def _shape(partitions: list[tuple[int, Any, Any, Any, Any]]) -> list[tuple]:
    """(partition, error, leader present, replica count, isr count), sorted."""
    return sorted(
        (p, err, leader is not None and leader >= 0, len(replicas or ()), len(isrs or ()))
        for p, err, leader, replicas, isrs in partitions
    )


def metadata_shape(bs: str, topic: str) -> dict[str, Any]:
    assert wire.create_topic(bs, topic, 3) == 0
    missing = f"{topic}-missing"
    out: dict[str, Any] = {}

    admin = AdminClient({"bootstrap.servers": bs})
    md = admin.list_topics(topic, timeout=10)
    t = md.topics[topic]
    out["confluent"] = {
        "error": t.error,
        "partitions": _shape(
            [(p.id, p.error, p.leader, p.replicas, p.isrs) for p in t.partitions.values()]
        ),
        "brokers": len(md.brokers),
        "controller_present": md.controller_id >= 0,
        "missing": admin.list_topics(missing, timeout=10).topics[missing].error.name(),
    }

    ka = KafkaAdminClient(bootstrap_servers=bs, request_timeout_ms=10000)
    try:
        (d,) = ka.describe_topics([topic])
        cluster = ka.describe_cluster()
        out["kafka-python"] = {
            "error": d["error_code"],
            "internal": d["is_internal"],
            "partitions": _shape(
                [
                    (
                        p["partition_index"],
                        p["error_code"],
                        p["leader_id"],
                        p["replica_nodes"],
                        p["isr_nodes"],
                    )
                    for p in d["partitions"]
                ]
            ),
            # kafka-python asks for authorized operations (Metadata/DescribeCluster flags)
            "topic_authorized_operations": d.get("authorized_operations"),
            "cluster_authorized_operations": cluster.get("authorized_operations"),
            "brokers": len(cluster["brokers"]),
        }
    finally:
        ka.close()
    kc = KafkaConsumer(bootstrap_servers=bs)
    try:
        out["kafka-python-consumer"] = {
            "partitions": sorted(kc.partitions_for_topic(topic) or ()),
            "missing": kc.partitions_for_topic(missing),
        }
    finally:
        kc.close()

    async def aio() -> dict[str, Any]:
        a = AIOKafkaAdminClient(bootstrap_servers=bs, request_timeout_ms=10000)
        await a.start()
        try:
            (d,) = await a.describe_topics([topic])
            return {
                "error": d["error_code"],
                "partitions": _shape(
                    [
                        (p["partition"], p["error_code"], p["leader"], p["replicas"], p["isr"])
                        for p in d["partitions"]
                    ]
                ),
            }
        finally:
            await a.close()

    out["aiokafka"] = asyncio.run(aio())

    res = subprocess.run(
        [clients.KCAT, "-L", "-J", "-b", bs, "-t", topic],
        capture_output=True, text=True, timeout=30, check=True,
    )  # fmt: skip
    kc_md = json.loads(res.stdout)
    (kt,) = kc_md["topics"]
    out["kcat"] = {
        "brokers": len(kc_md["brokers"]),
        "topic": kt["topic"],
        "error": kt.get("error"),
        "partitions": _shape(
            [
                (p["partition"], p.get("error"), p["leader"], p["replicas"], p["isrs"])
                for p in kt["partitions"]
            ]
        ),
    }
    return out


def test_metadata_shape(pair, name):
    strat, kafka = both(pair, metadata_shape, name)
    check(strat, kafka)
    assert kafka["kcat"]["partitions"] == [(p, None, True, 1, 1) for p in range(3)]


# -- configs --------------------------------------------------------------------------------------

OVERRIDES = {
    "cleanup.policy": "delete",
    "compression.type": "producer",
    "retention.ms": "3600000",
    "retention.bytes": "10485760",
    "max.message.bytes": "2000000",
    "message.timestamp.type": "LogAppendTime",
    "segment.bytes": "16777216",
    "segment.ms": "3600000",
    "min.insync.replicas": "1",
    "flush.messages": "1000",
    "flush.ms": "2000",
    "message.timestamp.before.max.ms": "86400000",
    "message.timestamp.after.max.ms": "60000",
    "local.retention.ms": "600000",
    "local.retention.bytes": "1048576",
    "min.cleanable.dirty.ratio": "0.25",
    "min.compaction.lag.ms": "1000",
    "max.compaction.lag.ms": "3600000",
    "delete.retention.ms": "60000",
}
assert set(OVERRIDES) == set(SUPPORTED_CONFIGS)


def describe(bs: str, topic: str, names: list[str] | None = None) -> dict[str, Any]:
    """DescribeConfigs v4: config name -> (value, default or topic override, type, flags)."""
    r = wire.call(
        bs, 32, 4,
        resources=[{"resource_type": 2, "resource_name": topic,
                    "configuration_keys": names or COMPARED}],
        include_synonyms=False, include_documentation=False,
    )["results"][0]  # fmt: skip
    if r["error_code"]:
        return {"error": r["error_code"]}
    return {
        c["name"]: (
            c["value"],
            "topic" if c["config_source"] == wire.TOPIC_CONFIG_SOURCE else "default",
            c["config_type"],
            c["read_only"],
            c["is_sensitive"],
        )
        for c in r["configs"]
    }


def configs(bs: str, topic: str) -> dict[str, Any]:
    assert wire.create_topic(bs, f"{topic}-default", 1) == 0
    assert wire.create_topic(bs, f"{topic}-override", 1, **OVERRIDES) == 0
    out = {
        "default": describe(bs, f"{topic}-default"),
        "override": describe(bs, f"{topic}-override", SUPPORTED_CONFIGS),
        "missing": describe(bs, f"{topic}-missing"),
    }
    admin = AdminClient({"bootstrap.servers": bs})
    res = ConfigResource(ResourceType.TOPIC, f"{topic}-override")
    got = admin.describe_configs([res])[res].result(timeout=10)
    out["confluent"] = {
        k: (v.value, v.is_default, v.source) for k, v in got.items() if k in SUPPORTED_CONFIGS
    }
    return out


def test_describe_configs(pair, name):
    strat, kafka = both(pair, configs, name)
    check(strat, kafka)
    assert {k: v[0] for k, v in kafka["override"].items()} == OVERRIDES


def alter_configs(bs: str, topic: str) -> dict[str, Any]:
    assert wire.create_topic(bs, topic, 1, **{"retention.ms": "3600000"}) == 0
    SET, DELETE, APPEND, SUBTRACT = 0, 1, 2, 3

    def alter(*ops: tuple[str, int, str | None], validate: bool = False, t: str = topic) -> str:
        r = wire.call(
            bs, 44, 1,
            resources=[{"resource_type": 2, "resource_name": t, "configs": [
                {"name": n, "config_operation": op, "value": v} for n, op, v in ops]}],
            validate_only=validate,
        )  # fmt: skip
        return wire.error_names(r["responses"][0]["error_code"]).upper()

    out: dict[str, Any] = {"created": describe(bs, topic)}
    out["set"] = alter(("max.message.bytes", SET, "5000"), ("retention.bytes", SET, "100000"))
    out["delete"] = alter(("retention.ms", DELETE, None))
    out["validate-only"] = alter(("segment.ms", SET, "1000"), validate=True)
    out["bad-value"] = alter(("retention.ms", SET, "forever"))
    out["bad-choice"] = alter(("message.timestamp.type", SET, "Sometime"))
    out["unknown-name"] = alter(("no.such.config", SET, "1"))
    out["append-to-list"] = alter(("cleanup.policy", APPEND, "delete"))
    out["subtract-from-list"] = alter(("cleanup.policy", SUBTRACT, "compact"))
    out["append-to-scalar"] = alter(("retention.ms", APPEND, "1"))
    out["missing-topic"] = alter(("retention.ms", SET, "1000"), t=f"{topic}-missing")
    time.sleep(0.2)  # Kafka applies config changes through its metadata log
    out["after"] = describe(bs, topic)
    admin = AdminClient({"bootstrap.servers": bs})
    res = ConfigResource(
        ResourceType.TOPIC,
        topic,
        incremental_configs=[
            ConfigEntry("retention.ms", "7200000", incremental_operation=AlterConfigOpType.SET)
        ],
    )
    admin.incremental_alter_configs([res])[res].result(timeout=10)
    time.sleep(0.2)
    out["after-confluent"] = describe(bs, topic, ["retention.ms"])
    return out


def test_incremental_alter_configs(pair, name):
    strat, kafka = both(pair, alter_configs, name)
    check(strat, kafka)
    assert kafka["after"]["max.message.bytes"][:2] == ("5000", "topic")
    assert kafka["after"]["retention.ms"][1] == "default"


def create_partitions(bs: str, topic: str, ts: int) -> dict[str, Any]:
    assert wire.create_topic(bs, topic, 1) == 0
    admin = AdminClient({"bootstrap.servers": bs})
    out: dict[str, Any] = {}
    for label, count in (("grow", 3), ("same", 3), ("shrink", 2)):
        f = admin.create_partitions([NewPartitions(topic, count)])[topic]
        try:
            f.result(timeout=10)
            out[label] = "ok"
        except Exception as e:
            out[label] = e.args[0].name() if e.args and hasattr(e.args[0], "name") else repr(e)
    f = admin.create_partitions([NewPartitions(f"{topic}-missing", 2)])[f"{topic}-missing"]
    try:
        f.result(timeout=10)
        out["missing"] = "ok"
    except Exception as e:
        out["missing"] = e.args[0].name()
    wire.wait_for_topic(bs, topic, 3)
    r = wire.produce(bs, topic, 2, build_batch([(b"k", b"v", ts)]))
    out["produce-new-partition"] = (r["error_code"], r["base_offset"])
    out["metadata"] = wire.normalise(wire.metadata(bs, topic)["topics"])
    return out


def test_create_partitions(pair, name):
    strat, kafka = both(pair, create_partitions, name, int(time.time() * 1000))
    check(strat, kafka)
    assert kafka["grow"] == "ok" and kafka["shrink"] == "INVALID_PARTITIONS"
