"""The console's JSON API (console/routes.py) on a real broker's admin endpoint, without a
browser: what it answers for bad input (400 with a message, 404, 405, 409, 413, 415), and that
its views agree with what confluent-kafka sees. Authentication and ACLs: tests/security/
test_console_auth.py."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from stratalog import Broker

from .conftest import console_process, create_topic


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    with Broker(tmp_path_factory.mktemp("console-api") / "data") as b:
        create_topic(b.bootstrap, "events", 2)
        p = Producer({"bootstrap.servers": b.bootstrap})
        for i in range(6):
            p.produce("events", b"v%d" % i, b"k%d" % i, partition=i % 2)
        assert p.flush(30) == 0
        yield b


def call(
    broker: Broker,
    path: str,
    body: object = None,
    *,
    raw: bytes | None = None,
    ctype: str = "application/json",
    method: str | None = None,
) -> tuple[int, object]:
    """(HTTP status, the JSON answer) of a request to the console's API."""
    data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
    request = urllib.request.Request(
        f"http://{broker.core.admin_address}{path}", data=data, method=method
    )
    if data is not None:
        request.add_header("content-type", ctype)
    try:
        with urllib.request.urlopen(request, timeout=20) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        text = e.read()
        try:
            return e.code, json.loads(text)
        except ValueError:
            return e.code, text.decode()


CREATE, DELETE, RESET = "/api/topics/create", "/api/topics/delete", "/api/groups/reset-offsets"


@pytest.mark.parametrize(
    ("path", "body", "message"),
    [
        (CREATE, {}, "'name' must be a non-empty string"),
        (CREATE, {"name": 7}, "'name' must be a non-empty string"),
        (CREATE, {"name": "t", "partitions": "x"}, "'partitions' must be an integer"),
        (CREATE, {"name": "t", "partitions": 0}, "'partitions' must be between"),
        (CREATE, {"name": "t", "partitions": True}, "'partitions' must be an integer"),
        (CREATE, {"name": "t", "configs": ["a"]}, "configs must be an object"),
        (CREATE, {"name": "bad name!"}, "INVALID_TOPIC_EXCEPTION"),
        (CREATE, {"name": "t", "configs": {"retention.ms": "soon"}}, "INVALID_CONFIG"),
        (DELETE, {"name": ""}, "'name' must be a non-empty string"),
        (RESET, {"group": "g", "topic": "events"}, "'to' must be one of"),
        (
            RESET,
            {"group": "g", "topic": "events", "to": "offset", "offset": -1},
            "'offset' must be at least 0",
        ),
    ],
)
def test_bad_writes_are_answered_400_with_a_message(broker, path, body, message) -> None:
    status, doc = call(broker, path, body)
    assert status == 400, doc
    assert message.lower() in doc["error"].lower()


def test_bodies_that_are_not_json_objects(broker) -> None:
    assert call(broker, CREATE, raw=b"{nope")[0] == 400
    assert call(broker, CREATE, raw=b"[1, 2]") == (
        400,
        {"error": "the body must be a JSON object"},
    )
    status, doc = call(broker, CREATE, raw=b'{"name": "x"}', ctype="text/plain")
    assert status == 415 and "application/json" in doc["error"]
    assert call(broker, CREATE, raw=b"x" * (2 << 20))[0] == 413
    assert "made" not in json.dumps(call(broker, "/api/topics")[1])


def test_bad_reads(broker) -> None:
    assert call(broker, "/api/records?partition=0")[0] == 400
    status, doc = call(broker, "/api/records?topic=events&limit=0")
    assert status == 400 and "'limit' must be between 1 and 500" in doc["error"]
    status, doc = call(broker, "/api/records?topic=events&offset=1&timestamp=5")
    assert status == 400 and "not both" in doc["error"]
    assert call(broker, "/api/records?topic=nope")[0] == 404
    assert call(broker, "/api/records?topic=events&partition=9")[0] == 404
    assert call(broker, "/api/topics/nope")[0] == 404
    assert call(broker, "/api/nothing")[0] == 404
    assert call(broker, "/api/topics/rename", {"name": "x"})[0] == 404
    assert call(broker, "/api/topics", method="DELETE")[0] == 405
    assert call(broker, "/no-such-page")[0] == 404


def test_conflicts_and_unknowns(broker) -> None:
    status, doc = call(broker, CREATE, {"name": "events"})
    assert status == 409 and "already exists" in doc["error"]
    assert call(broker, DELETE, {"name": "nope"})[0] == 404
    assert call(broker, RESET, {"group": "g", "topic": "nope", "to": "earliest"})[0] == 404


def test_views_agree_with_a_kafka_client(broker) -> None:
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "api-group"})
    c.commit(offsets=[TopicPartition("events", 0, 1), TopicPartition("events", 1, 3)],
             asynchronous=False)  # fmt: skip
    c.close()
    status, groups = call(broker, "/api/groups")
    assert status == 200
    assert {g["group"]: g["lag"] for g in groups}["api-group"] == (3 - 1) + (3 - 3)
    status, g = call(broker, "/api/groups/api-group")
    assert [(o["partition"], o["committed"], o["end"], o["lag"]) for o in g["offsets"]] == [
        (0, 1, 3, 2),
        (1, 3, 3, 0),
    ]
    status, page = call(broker, "/api/records?topic=events&partition=1&offset=1&limit=1")
    assert status == 200
    assert [(r["offset"], r["key"], r["value"]) for r in page["records"]] == [(1, "azM=", "djM=")]
    assert (page["start"], page["end"], page["next"]) == (0, 3, 2)

    status, done = call(broker, RESET, {"group": "api-group", "topic": "events", "to": "latest"})
    assert status == 200 and done["offsets"] == {"0": 3, "1": 3}
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "api-group"})
    got = c.committed([TopicPartition("events", p) for p in (0, 1)], timeout=15)
    c.close()
    assert [tp.offset for tp in got] == [3, 3]
    # An offset past a partition's end is the end, as kafka-consumer-groups --to-offset has it.
    far = {"group": "api-group", "topic": "events", "to": "offset", "offset": 99}
    assert call(broker, RESET, far)[1]["offsets"] == {"0": 3, "1": 3}


def test_status_and_metrics_stay_where_they_were(broker) -> None:
    with urllib.request.urlopen(f"http://{broker.core.admin_address}/status", timeout=10) as r:
        assert "events" in json.loads(r.read())["topics"]
    with urllib.request.urlopen(f"http://{broker.core.admin_address}/metrics", timeout=10) as r:
        assert b"stratalog_requests_total" in r.read()
    with urllib.request.urlopen(f"http://{broker.core.admin_address}/", timeout=10) as r:
        assert r.headers["content-type"].startswith("text/html")
        assert b"console.js" in r.read()


def test_stratalog_console_answers_as_the_broker_does(broker) -> None:
    with console_process(broker.bootstrap) as url:
        with urllib.request.urlopen(f"{url}/api/topics/events", timeout=20) as r:
            remote = json.loads(r.read())
        assert remote == call(broker, "/api/topics/events")[1]
        # Another site's name resolved to 127.0.0.1 (DNS rebinding): not answered.
        request = urllib.request.Request(f"{url}/api/topics", headers={"Host": "evil.example"})
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(request, timeout=20)
        assert e.value.code == 421
