"""The broker's request latency histogram (Kafka's TotalTimeMs), read from its own /metrics
endpoint while real clients produce and fetch."""

from __future__ import annotations

import socket
import time

from confluent_kafka import Consumer, Producer, TopicPartition

from stratalog import Broker

from .conftest import BrokerProcess, create_topic, scrape_metrics


def _scrape(admin: str) -> dict[tuple[str, str], float]:
    """Every stratalog_request_seconds sample, as (sample name, api) -> value."""
    out: dict[tuple[str, str], float] = {}
    for s in scrape_metrics(admin, "stratalog_request") + scrape_metrics(admin, "stratalog_fsync"):
        key = s.name if "le" not in s.labels else f"{s.name}{{le={s.labels['le']}}}"
        out[(key, s.labels.get("api", ""))] = s.value
    return out


def test_every_answered_request_is_timed_by_api(tmp_path):
    with Broker(tmp_path / "data") as b:
        admin = b.service.core.admin_address
        create_topic(b.bootstrap, "timed", 2)
        before = _scrape(admin)

        p = Producer({"bootstrap.servers": b.bootstrap, "acks": "all", "linger.ms": 2})
        for i in range(2000):
            p.produce("timed", value=b"%05d" % i, partition=i % 2)
            if i % 500 == 499:
                p.flush(10)  # several produce requests, each answered after its fsync
        assert p.flush(10) == 0
        c = Consumer({"bootstrap.servers": b.bootstrap, "group.id": "timed"})
        c.assign([TopicPartition("timed", 0, 0), TopicPartition("timed", 1, 0)])
        got = 0
        deadline = time.monotonic() + 20
        while got < 2000 and time.monotonic() < deadline:
            got += sum(1 for m in c.consume(500, 0.5) if m.error() is None)
        c.close()
        assert got == 2000
        after = _scrape(admin)

    def delta(name: str, api: str) -> float:
        return after.get((name, api), 0.0) - before.get((name, api), 0.0)

    for api in ("produce", "fetch", "metadata"):
        n = delta("stratalog_requests_total", api)
        timed = delta("stratalog_request_seconds_count", api)
        assert n > 0, api
        if api == "produce":
            # Each produce was answered (flush returned) and timed once.
            assert timed == n
        else:
            # A consumer's last long poll, or a request on a connection closing, may still be
            # unanswered: not timed (yet).
            assert 0 < timed <= n, api
        assert delta("stratalog_request_seconds_sum", api) > 0, api
        assert delta("stratalog_request_seconds_bucket{le=+Inf}", api) == timed, api
    # Every acknowledged produce waited for a group commit (fsync=always): those were timed.
    assert delta("stratalog_fsync_seconds_count", "") > 0
    assert delta("stratalog_fsync_seconds_sum", "") > 0


def _lag_buckets(admin: str) -> dict[float, float]:
    return {
        float(s.labels["le"]): s.value
        for s in scrape_metrics(admin, "stratalog_event_loop_lag_seconds_bucket")
    }


def test_event_loop_lag_shows_a_step_that_holds_the_loop(tmp_path):
    """A step that holds the event loop (as migration's index switch once did for 100+ ms)
    shows up in stratalog_event_loop_lag_seconds."""
    with Broker(tmp_path / "data") as b:
        admin = b.service.core.admin_address
        time.sleep(0.5)
        before = _lag_buckets(admin)
        b._loop.call_soon_threadsafe(time.sleep, 0.3)  # hold the loop for 300 ms
        time.sleep(0.6)
        after = _lag_buckets(admin)
    inf = float("inf")
    assert after[inf] - before[inf] >= 10  # the probe kept running
    le = min(x for x in after if x >= 0.2)
    over = (after[inf] - after[le]) - (before[inf] - before[le])
    assert over >= 1, "a 300 ms hold of the loop was not seen as lag over 200 ms"


def test_an_api_never_called_has_no_latency_series(tmp_path):
    """Series appear with an API's first request: 23 APIs' empty histograms made every scrape
    render some 1,300 bucket lines. A broker process of its own: the histograms are
    process-wide, and other tests' brokers in this process have called every API."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    bp = BrokerProcess(tmp_path / "data", settings={"admin.port": str(port)}).start()
    try:
        admin = f"127.0.0.1:{port}"
        create_topic(bp.bootstrap, "lazy", 1)  # Metadata and CreateTopics, not Produce
        apis = {api for (name, api) in _scrape(admin) if name.startswith("stratalog_request_s")}
        assert "create_topics" in apis and "produce" not in apis, apis
        p = Producer({"bootstrap.servers": bp.bootstrap})
        p.produce("lazy", b"v")
        assert p.flush(10) == 0
        assert ("stratalog_request_seconds_count", "produce") in _scrape(admin)
    finally:
        bp.kill()
