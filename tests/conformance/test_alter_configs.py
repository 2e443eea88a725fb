"""The legacy AlterConfigs (API 33) against Apache Kafka: a topic's configs replaced as a whole.

Older clients and confluent-kafka's ``alter_configs`` send it (``kafka-configs --alter`` sends
IncrementalAlterConfigs, tested in test_admin.py). Every version, raw: overrides set, overrides
not named going back to their defaults, validate-only, bad values, unknown names, a null value,
a missing topic, the broker-logger resource; then DescribeConfigs and what a producer meets
(``max.message.bytes``). confluent-kafka's ``alter_configs`` does the same through librdkafka.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType

from stratalog.records import build_batch

from . import wire
from .conftest import both
from .test_admin import describe

pytestmark = pytest.mark.kafka

TOPIC_RESOURCE, BROKER_LOGGER_RESOURCE = 2, 8


def alter(bs: str, version: int, resources: list[tuple[int, str, dict[str, str | None]]],
          validate: bool = False) -> list[tuple[str, int, str]]:  # fmt: skip
    r = wire.call(
        bs, 33, version,
        resources=[{"resource_type": rt, "resource_name": n,
                    "configs": [{"name": k, "value": v} for k, v in cfg.items()]}
                   for rt, n, cfg in resources],
        validate_only=validate,
    )  # fmt: skip
    return sorted(
        (x["resource_name"], x["resource_type"], wire.error_names(x["error_code"]))
        for x in r["responses"]
    )


def raw_scenario(bs: str, topic: str, version: int) -> dict[str, Any]:
    created = {"retention.ms": "3600000", "max.message.bytes": "5000"}
    assert wire.create_topic(bs, topic, 1, **created) == 0
    other = f"{topic}-other"
    assert wire.create_topic(bs, other, 1) == 0
    T = TOPIC_RESOURCE
    out: dict[str, Any] = {"created": describe(bs, topic)}
    # Validate-only changes nothing.
    out["validate"] = alter(bs, version, [(T, topic, {"segment.ms": "1000"})], validate=True)
    out["after_validate"] = describe(bs, topic)
    # Replace: retention.bytes set, max.message.bytes kept by naming it, retention.ms dropped.
    out["replace"] = alter(
        bs,
        version,
        [(T, topic, {"retention.bytes": "100000", "max.message.bytes": "5000"}),
         (T, other, {"cleanup.policy": ""})],
    )  # fmt: skip
    time.sleep(0.2)  # Kafka applies config changes through its metadata log
    out["after_replace"] = describe(bs, topic)
    out["other_after_replace"] = describe(bs, other)
    # Errors, each for its resource only.
    out["errors"] = alter(
        bs,
        version,
        [
            (T, f"{topic}-missing", {"retention.ms": "1000"}),
            (T, other, {"retention.ms": "forever"}),
            (T, topic, {"no.such.config": "1"}),
        ],
    )
    out["after_errors"] = describe(bs, topic)
    out["bad_choice"] = alter(bs, version, [(T, topic, {"message.timestamp.type": "Sometime"})])
    # An empty list: every override goes.
    out["clear"] = alter(bs, version, [(T, topic, {})])
    time.sleep(0.2)
    out["after_clear"] = describe(bs, topic)
    # What a producer meets: max.message.bytes set low, then a batch above it.
    out["limit"] = alter(bs, version, [(T, topic, {"max.message.bytes": "200"})])
    time.sleep(0.2)
    big = build_batch([(b"k", b"x" * 400, int(time.time() * 1000))])
    out["produce_big"] = wire.error_names(wire.produce(bs, topic, 0, big)["error_code"])
    return out


@pytest.mark.parametrize("version", [0, 1, 2])
def test_alter_configs_raw(pair, name, version):
    strat, kafka = both(pair, raw_scenario, f"{name}-v{version}", version)
    assert strat == kafka, wire.differences(strat, kafka)
    assert kafka["after_replace"]["retention.ms"][1] == "default"
    assert kafka["after_replace"]["retention.bytes"][:2] == ("100000", "topic")


def null_value_scenario(bs: str, topic: str) -> dict[str, Any]:
    assert wire.create_topic(bs, topic, 1, **{"retention.ms": "3600000"}) == 0
    out = {"null": alter(bs, 2, [(TOPIC_RESOURCE, topic, {"retention.ms": None})])}
    time.sleep(0.2)
    out["after"] = describe(bs, topic, ["retention.ms"])
    out["broker_logger"] = alter(bs, 2, [(BROKER_LOGGER_RESOURCE, "1", {"root": "INFO"})])
    return out


def test_alter_configs_null_value_and_broker_logger(pair, name):
    strat, kafka = both(pair, null_value_scenario, name)
    assert strat == kafka, wire.differences(strat, kafka)


def confluent_scenario(bs: str, topic: str) -> dict[str, Any]:
    assert wire.create_topic(bs, topic, 1, **{"retention.ms": "3600000"}) == 0
    admin = AdminClient({"bootstrap.servers": bs})
    res = ConfigResource(ResourceType.TOPIC, topic, set_config={"retention.bytes": "123456"})
    futures = admin.alter_configs([res])  # (deprecated in confluent-kafka's docs, not removed)
    futures[res].result(timeout=30)
    time.sleep(0.2)
    out = {"after": describe(bs, topic, ["retention.ms", "retention.bytes"])}
    missing = ConfigResource(
        ResourceType.TOPIC, f"{topic}-missing", set_config={"retention.ms": "1"}
    )
    futures = admin.alter_configs([missing])
    try:
        futures[missing].result(timeout=30)
        out["missing"] = "ok"
    except Exception as e:
        out["missing"] = e.args[0].name()
    return out


@pytest.mark.filterwarnings("ignore:alter_configs has been deprecated:DeprecationWarning")
def test_alter_configs_confluent(pair, name):
    strat, kafka = both(pair, confluent_scenario, name)
    assert strat == kafka, wire.differences(strat, kafka)
    assert kafka["after"]["retention.ms"][1] == "default"
