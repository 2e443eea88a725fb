"""Records whose timestamps are already past their topic's retention.ms are deleted by
retention moments after they are acknowledged: a user loading last year's events meets this
first. The broker counts them (stratalog_records_past_retention_total) and says so in its log
once per topic, naming the setting to change."""

from __future__ import annotations

import logging
import time

from confluent_kafka import Producer

from stratalog import Broker

from .conftest import create_topic, scrape_metrics

DAY_MS = 86_400_000


def _past_retention(admin: str) -> float:
    samples = scrape_metrics(admin, "stratalog_records_past_retention_total")
    return sum(s.value for s in samples)


def _produce(bootstrap: str, topic: str, n: int, age_ms: int) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    stamp = int(time.time() * 1000) - age_ms
    for i in range(n):
        p.produce(topic, b"v%d" % i, key=b"k%d" % i, timestamp=stamp + i)
    assert p.flush(30) == 0


def test_old_records_are_counted_and_said_once_per_topic(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="stratalog")
    with Broker(tmp_path / "data", config={"admin.port": 0}) as b:
        admin = b.service.core.admin_address
        create_topic(b.bootstrap, "history")  # retention.ms: 7 days
        create_topic(b.bootstrap, "kept", **{"retention.ms": "-1"})
        create_topic(b.bootstrap, "compacted", **{"cleanup.policy": "compact"})
        before = _past_retention(admin)
        _produce(b.bootstrap, "history", 10, 30 * DAY_MS)
        _produce(b.bootstrap, "history", 4, 60 * DAY_MS)
        _produce(b.bootstrap, "history", 5, 60_000)  # a minute old: kept
        _produce(b.bootstrap, "kept", 6, 30 * DAY_MS)  # retention off
        _produce(b.bootstrap, "compacted", 3, 30 * DAY_MS)  # not deleted by age
        assert _past_retention(admin) - before == 14
    warnings = [
        r.getMessage() for r in caplog.records if "older than its retention" in r.getMessage()
    ]
    assert len(warnings) == 1 and warnings[0].startswith("topic history:"), warnings
    assert "retention.ms=-1" in warnings[0]
