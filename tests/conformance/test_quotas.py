"""Client quotas against Apache Kafka: AlterClientQuotas and DescribeClientQuotas (raw, every
version, and ``kafka-configs --entity-type clients/users/ips``), then their enforcement.

Quotas are broker-wide, so every entity here is named after the test (the default entities,
shared, are set and removed within one test) and listings keep only the test's entities.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from stratalog.peers.kafka import run_tool

from . import wire
from .conftest import both

pytestmark = pytest.mark.kafka

EXACT, DEFAULT, SPECIFIED = 0, 1, 2


def alter(bs: str, entries: list[tuple[dict[str, str | None], list[tuple[str, float | None]]]],
          version: int = 1, validate: bool = False) -> list[tuple[Any, str]]:  # fmt: skip
    """(entity as sorted pairs, error name) per answered entity; ops (key, value or None)."""
    r = wire.call(
        bs, 49, version, validate_only=validate,
        entries=[{"entity": [{"entity_type": t, "entity_name": n} for t, n in entity.items()],
                  "ops": [{"key": k, "value": 0.0 if v is None else v, "remove": v is None}
                          for k, v in ops]}
                 for entity, ops in entries],
    )  # fmt: skip
    return sorted(
        (tuple(sorted((e["entity_type"], e["entity_name"] or "") for e in x["entity"])),
         wire.error_names(x["error_code"]))
        for x in r["entries"]
    )  # fmt: skip


def describe(bs: str, components: list[tuple[str, int, str | None]], strict: bool = False,
             version: int = 1, mine: str = "") -> dict[str, Any]:  # fmt: skip
    """The error and the entries whose named entities contain ``mine`` (defaults are kept)."""
    r = wire.call(
        bs, 48, version, strict=strict,
        components=[{"entity_type": t, "match_type": m, "match": x} for t, m, x in components],
    )  # fmt: skip
    if r["entries"] is None:
        return {"error": wire.error_names(r["error_code"]), "entries": None}
    entries = []
    for x in r["entries"]:
        entity = tuple(sorted((e["entity_type"], e["entity_name"]) for e in x["entity"]))
        if not all(n is None or mine in n for _t, n in entity):
            continue
        values = sorted((v["key"], v["value"]) for v in x["values"])
        entries.append((tuple((t, n or "<default>") for t, n in entity), values))
    return {"error": wire.error_names(r["error_code"]), "entries": sorted(entries)}


def quotas_scenario(bs: str, name: str, version: int) -> dict[str, Any]:
    c1, c2, u1 = f"{name}-c1", f"{name}-c2", f"{name}-u1"
    out: dict[str, Any] = {}
    out["set"] = alter(
        bs,
        [
            ({"client-id": c1}, [("producer_byte_rate", 1000.0), ("consumer_byte_rate", 2000.0)]),
            ({"user": u1}, [("request_percentage", 50.5)]),
            ({"user": u1, "client-id": c1}, [("producer_byte_rate", 3000.0)]),
            ({"user": u1, "client-id": None}, [("controller_mutation_rate", 2.5)]),
            ({"client-id": c2}, [("consumer_byte_rate", 4096.0)]),
        ],
        version,
    )
    out["errors"] = alter(
        bs,
        [
            ({}, [("producer_byte_rate", 1.0)]),
            ({"group": f"{name}-g"}, [("producer_byte_rate", 1.0)]),
            ({"client-id": ""}, [("producer_byte_rate", 1.0)]),
            ({"ip": "10.0.0.1", "user": f"{name}-u2"}, [("connection_creation_rate", 1.0)]),
            ({"ip": "not an ip!"}, [("connection_creation_rate", 1.0)]),
            ({"client-id": f"{name}-c3"}, [("no_such_quota", 1.0)]),
            ({"client-id": f"{name}-c4"}, [("producer_byte_rate", 0.0)]),
            ({"client-id": f"{name}-c5"}, [("producer_byte_rate", -5.0)]),
            ({"client-id": f"{name}-c6"}, [("producer_byte_rate", 1.5)]),
            (
                {"client-id": f"{name}-c7"},
                [("producer_byte_rate", 1.0), ("producer_byte_rate", 2.0)],
            ),
            ({"client-id": f"{name}-c8"}, [("connection_creation_rate", 1.0)]),
            ({"ip": "10.1.2.3"}, [("connection_creation_rate", 3e9)]),
            ({"ip": "10.1.2.4"}, [("producer_byte_rate", 100.0)]),
            ({"user": f"{name}-u3"}, [("request_percentage", 1.0)]),
            ({"user": f"{name}-u3"}, [("request_percentage", 2.0)]),
        ],
        version,
    )
    out["validate_only"] = alter(bs, [({"client-id": c2}, [("producer_byte_rate", 7.0)])],
                                 version, validate=True)  # fmt: skip
    time.sleep(0.3)  # Kafka applies quota changes through its metadata log
    out["all"] = describe(bs, [], version=version, mine=name)
    out["exact_client"] = describe(bs, [("client-id", EXACT, c1)], version=version, mine=name)
    out["exact_client_strict"] = describe(bs, [("client-id", EXACT, c1)], True, version, name)
    out["specified_user"] = describe(bs, [("user", SPECIFIED, None)], version=version, mine=name)
    out["user_and_default_client"] = describe(
        bs, [("user", EXACT, u1), ("client-id", DEFAULT, None)], version=version, mine=name
    )
    out["filter_errors"] = [
        describe(bs, comps, version=version, mine=name)
        for comps in (
            [("client-id", EXACT, c1), ("client-id", EXACT, c2)],
            [("group", EXACT, "x")],
            [("", EXACT, "x")],
            [("client-id", EXACT, None)],
            [("client-id", DEFAULT, "x")],
            [("client-id", SPECIFIED, "x")],
            [("client-id", 7, None)],
            [("ip", SPECIFIED, None), ("user", SPECIFIED, None)],
        )
    ]
    # Removing one key, then every key of an entity (it is gone), and a key never set.
    out["remove"] = alter(
        bs,
        [
            ({"client-id": c1}, [("consumer_byte_rate", None)]),
            ({"client-id": c2}, [("consumer_byte_rate", None)]),
            ({"user": u1}, [("producer_byte_rate", None)]),
        ],
        version,
    )
    time.sleep(0.3)
    out["after_remove"] = describe(bs, [], version=version, mine=name)
    # Clean up (quotas are broker-wide).
    alter(bs, [({"client-id": c1}, [("producer_byte_rate", None)]),
               ({"user": u1}, [("request_percentage", None)]),
               ({"user": u1, "client-id": c1}, [("producer_byte_rate", None)]),
               ({"user": u1, "client-id": None}, [("controller_mutation_rate", None)]),
               ({"user": f"{name}-u3"}, [("request_percentage", None)])], version)  # fmt: skip
    time.sleep(0.3)
    out["after_cleanup"] = describe(bs, [], version=version, mine=name)
    return out


@pytest.mark.parametrize("version", [0, 1])
def test_client_quotas_raw(pair, name, version):
    strat, kafka = both(pair, quotas_scenario, f"{name}-v{version}", version)
    assert strat == kafka, wire.differences(strat, kafka)
    # Five entities set; the second request's u3 was named twice: Kafka applies its first
    # entry and answers INVALID_REQUEST for it.
    assert len(kafka["all"]["entries"]) == 6


def ip_and_default_scenario(bs: str, name: str) -> dict[str, Any]:
    """IP entities and the shared defaults, set and removed again."""
    out = {
        "set": alter(
            bs,
            [
                ({"ip": "127.0.0.2"}, [("connection_creation_rate", 50.0)]),
                ({"ip": None}, [("connection_creation_rate", 20.0)]),
                ({"client-id": None}, [("consumer_byte_rate", 1e12)]),
            ],
        ),
    }
    time.sleep(0.3)
    out["ips"] = describe(bs, [("ip", SPECIFIED, None)])
    out["default_ip"] = describe(bs, [("ip", DEFAULT, None)])
    out["default_client"] = describe(bs, [("client-id", DEFAULT, None)], True)
    out["removed"] = alter(bs, [({"ip": "127.0.0.2"}, [("connection_creation_rate", None)]),
                                ({"ip": None}, [("connection_creation_rate", None)]),
                                ({"client-id": None}, [("consumer_byte_rate", None)])])  # fmt: skip
    time.sleep(0.3)
    out["after"] = describe(bs, [("ip", SPECIFIED, None)])
    return out


def test_client_quotas_ips_and_defaults(pair, name):
    strat, kafka = both(pair, ip_and_default_scenario, name)
    assert strat == kafka, wire.differences(strat, kafka)


def tool_scenario(bs: str, name: str) -> dict[str, Any]:
    """Three JVM runs (each takes seconds): add, describe, delete; the rest read raw."""
    client = f"{name}-tool"

    def tool(*args: str) -> tuple[int, list[str]]:
        r = run_tool("kafka-configs", "--bootstrap-server", bs, *args, timeout=100)
        lines = [x.strip() for x in (r.stdout + r.stderr).splitlines() if x.strip()]
        return r.returncode, [x for x in lines if "WARN" not in x]

    entity = ("--entity-type", "clients", "--entity-name", client)
    rates = "producer_byte_rate=1024,consumer_byte_rate=2048"
    out = {"add": tool("--alter", *entity, "--add-config", rates)}
    time.sleep(0.3)
    out["describe"] = tool("--describe", *entity)
    out["delete"] = tool("--alter", *entity, "--delete-config", "producer_byte_rate")
    time.sleep(0.3)
    out["after"] = describe(bs, [("client-id", EXACT, client)], mine=name)
    return out


def test_kafka_configs_quotas(pair, name):
    # One broker after the other: six JVM starts at once outlast the scenario timeout here.
    strat = tool_scenario(pair.stratalog.bootstrap, name)
    kafka = tool_scenario(pair.kafka.bootstrap, name)
    assert strat == kafka, wire.differences(strat, kafka)
    assert any("producer_byte_rate=1024" in line for line in kafka["describe"][1])
