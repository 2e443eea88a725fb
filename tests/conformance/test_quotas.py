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


# -- enforcement --------------------------------------------------------------------------------


class Session:
    """One connection with a client id of its own: requests answered in order, each timed."""

    def __init__(self, bs: str, client_id: str) -> None:
        import socket

        host, port = bs.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=60)
        self.client_id = client_id
        self.correlation = 0

    def call(self, api_key: int, version: int, **values: Any) -> tuple[dict[str, Any], float]:
        """The decoded answer and the seconds it took."""
        self.correlation += 1
        body = wire.body_bytes(wire.build(api_key, version, **values))
        frame = wire.prefixed(
            wire.header(api_key, version, self.correlation, self.client_id) + body
        )
        t0 = time.monotonic()
        self.sock.sendall(frame)
        head = self._read(4)
        data = self._read(int.from_bytes(head, "big", signed=True))
        took = time.monotonic() - t0
        correlation, answer = wire.decode(api_key, version, data)
        assert correlation == self.correlation
        return wire.plain(answer), took

    def _read(self, n: int) -> bytes:
        buf = b""
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            assert chunk, "connection closed"
            buf += chunk
        return buf

    def close(self) -> None:
        self.sock.close()


def _quota_in_force(bs: str, client: str, key: str, value: float) -> None:
    assert alter(bs, [({"client-id": client}, [(key, value)])]) == [
        ((("client-id", client),), "none")]  # fmt: skip
    deadline = time.monotonic() + 10
    while describe(bs, [("client-id", EXACT, client)], mine=client)["entries"] == []:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    time.sleep(0.5)  # Kafka's quota managers take the change from its metadata log


def produce_throttle_scenario(bs: str, name: str) -> dict[str, Any]:
    """A 3100 B/s produce quota; 4 KiB produces on one connection: Kafka's rate is taken over
    at least ten seconds, so the eighth is the first over it (7 x 4.2 KB / 10 s < 3100)."""
    from stratalog.records import build_batch

    topic, client = f"{name}-t", f"{name}-producer"
    assert wire.create_topic(bs, topic, 1) == 0
    _quota_in_force(bs, client, "producer_byte_rate", 3100.0)
    s = Session(bs, client)
    throttles = []
    try:
        for _ in range(9):
            batch = build_batch([(b"k", b"v" * 4000, int(time.time() * 1000))])
            r, took = s.call(0, 9, transactional_id=None, acks=1, timeout=10000, topic_data=[
                {"name": topic, "partition_data": [{"index": 0, "records": batch}]}])  # fmt: skip
            assert r["responses"][0]["partition_responses"][0]["error_code"] == 0, r
            throttles.append((r["throttle_time"], took))
    finally:
        s.close()
        alter(bs, [({"client-id": client}, [("producer_byte_rate", None)])])
    first = next((i for i, (t, _took) in enumerate(throttles) if t > 0), None)
    return {
        "first_throttled": first,
        "throttle_within_window": first is not None and 0 < throttles[first][0] <= 11_000,
        # The connection was muted: the next request waited (most of) the throttle time.
        "next_waited": first is not None
        and first + 1 < len(throttles)
        and throttles[first + 1][1] >= 0.7 * throttles[first][0] / 1000,
    }


def test_produce_quota_throttles(pair, name):
    strat, kafka = both(pair, produce_throttle_scenario, name)
    assert strat == kafka, wire.differences(strat, kafka)
    assert kafka == {"first_throttled": 7, "throttle_within_window": True, "next_waited": True}


def fetch_throttle_scenario(bs: str, name: str) -> dict[str, Any]:
    """A 3100 B/s fetch quota; one 4 KiB batch per fetch on one connection: the eighth would
    put the client over, and is answered empty with the throttle time. (partition_max_bytes is
    one batch: with more, Kafka sends the start of the next batch too, which Stratalog never
    does, and counts those bytes.)"""
    from stratalog.records import build_batch

    topic, client = f"{name}-t", f"{name}-consumer"
    assert wire.create_topic(bs, topic, 1) == 0
    for i in range(10):
        batch = build_batch([(b"k", b"%d" % i + b"v" * 4000, int(time.time() * 1000))])
        assert wire.produce(bs, topic, 0, batch)["error_code"] == 0
    one = len(batch)  # (every batch has this size)
    _quota_in_force(bs, client, "consumer_byte_rate", 3100.0)
    s = Session(bs, client)
    answers = []
    offset = 0
    try:
        for _ in range(9):
            r, took = s.call(
                1, 12, replica_id=-1, max_wait=100, min_bytes=1, max_bytes=one,
                isolation_level=0, session_id=0, session_epoch=-1, forgotten_topics_data=[],
                rack_id="",
                topics=[{"topic": topic, "partitions": [
                    {"partition": 0, "current_leader_epoch": -1, "fetch_offset": offset,
                     "last_fetched_epoch": -1, "log_start_offset": -1,
                     "partition_max_bytes": one}]}],
            )  # fmt: skip
            batches = [
                b for t in r["responses"] for p in t["partitions"]
                for b in wire.parse_batches(p["records"])
            ]  # fmt: skip
            offset += len(batches)
            answers.append((len(batches), r["throttle_time"], len(r["responses"]), took))
    finally:
        s.close()
        alter(bs, [({"client-id": client}, [("consumer_byte_rate", None)])])
    first = next((i for i, a in enumerate(answers) if a[1] > 0), None)
    return {
        "batches_before": [a[0] for a in answers[: first if first is not None else 9]],
        "first_throttled": first,
        "throttled_answer": None if first is None else answers[first][:1] + answers[first][2:3],
        "next_waited": first is not None
        and first + 1 < len(answers)
        and answers[first + 1][3] >= 0.7 * answers[first][1] / 1000,
    }


def test_fetch_quota_throttles(pair, name):
    strat, kafka = both(pair, fetch_throttle_scenario, name)
    assert strat == kafka, wire.differences(strat, kafka)
    assert kafka["first_throttled"] == 7 and kafka["throttled_answer"] == (0, 0)


def client_throttled_scenario(bs: str, name: str) -> dict[str, Any]:
    """confluent-kafka under a 5000 B/s produce quota sends 70 KB: against a window of ten
    seconds that is about four seconds over, so the producer is slowed (the broker's throttle
    times and mutes) but every record is delivered."""
    from . import clients

    topic, client = f"{name}-t", f"{name}-cf"
    assert wire.create_topic(bs, topic, 1) == 0
    _quota_in_force(bs, client, "producer_byte_rate", 5000.0)
    recs = [clients.Rec(0, b"k%03d" % i, b"v" * 1000) for i in range(70)]
    t0 = time.monotonic()
    try:
        got = clients.cf_produce(bs, topic, recs, **{"client.id": client, "linger.ms": 0,
                                                     "batch.size": 2000})  # fmt: skip
    finally:
        took = time.monotonic() - t0
        alter(bs, [({"client-id": client}, [("producer_byte_rate", None)])])
    return {"delivered": sorted(o for _p, o in got), "slowed": took >= 2.0, "bounded": took < 60}


def test_client_slowed_by_produce_quota(pair, name):
    strat, kafka = both(pair, client_throttled_scenario, name)
    assert strat == kafka, wire.differences(strat, kafka)
    assert kafka["delivered"] == list(range(70)) and kafka["slowed"]
