"""Differential conformance: every scenario runs against Stratalog and the reference Apache Kafka.

One Apache Kafka 4.4.0 (``KafkaBroker``) and one embedded Stratalog broker serve the whole
session. A scenario is a plain function ``scenario(bootstrap, ...) -> observable``; :func:`both`
runs it against the two brokers at once (one thread each) and returns
``(stratalog, kafka)``, which the test normalises and compares with ``==``. Scenarios use unique
topic and group names, the same on both brokers.
"""

from __future__ import annotations

import shutil
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from stratalog import Broker
from stratalog.peers.kafka import KafkaBroker, KafkaSetupError

from ..conftest import KAFKA_TEST_JVM
from . import wire

# Kafka configured like Stratalog's defaults where they differ from Kafka's own defaults, plus
# retention checks from the start and every second, so retention is observable within a test.
KAFKA_PROPERTIES = {
    "group.initial.rebalance.delay.ms": "0",
    "auto.create.topics.enable": "false",
    "num.partitions": "1",
    "log.initial.task.delay.ms": "0",
    "log.retention.check.interval.ms": "1000",
}
SCENARIO_TIMEOUT = 120


@dataclass
class Pair:
    stratalog: Broker
    kafka: KafkaBroker

    @property
    def bootstraps(self) -> dict[str, str]:
        return {"stratalog": self.stratalog.bootstrap, "kafka": self.kafka.bootstrap}


def warm_up(bootstrap: str, timeout: float = 60) -> None:
    """Until the group and producer-id coordinators answer without a transient error.

    A fresh Kafka creates __consumer_offsets on first use and answers COORDINATOR_NOT_AVAILABLE
    (and InitProducerId COORDINATOR_LOAD_IN_PROGRESS) until then; scenarios should not see that.
    """
    deadline = time.monotonic() + timeout
    while True:
        coord = wire.call(bootstrap, 10, 6, key_type=0, coordinator_keys=["warm-up"])
        pid = wire.call(
            bootstrap,
            22,
            5,
            transactional_id=None,
            transaction_timeout=60000,
            producer_id=-1,
            producer_epoch=-1,
        )
        groups = wire.call(
            bootstrap, 15, 5, groups=["warm-up"], include_authorized_operations=False
        )
        if (
            coord["coordinators"][0]["error_code"] == 0
            and pid["error_code"] == 0
            and groups["groups"][0]["error_code"] == 0
        ):
            return
        assert time.monotonic() < deadline, f"{bootstrap} not ready: {coord} {pid} {groups}"
        time.sleep(0.2)


def start_kafka(
    make: Callable[[], KafkaBroker] = lambda: KafkaBroker(
        KAFKA_PROPERTIES, jvm_options=KAFKA_TEST_JVM
    ),
) -> KafkaBroker:
    """Start the reference Kafka; retry only the peer's known start-up flake.

    stratalog.peers.kafka draws the cluster id as URL-safe base64 of a random UUID, which starts
    with '-' one time in 64; kafka-storage's argument parser then takes it for an option and the
    format step fails ("--cluster-id: expected one argument"). (Kafka's own Uuid.randomUuid()
    never yields a leading '-'.) Any other set-up error fails the session at once.
    """
    for attempt in range(3):
        kafka = make()
        try:
            return kafka.start()
        except KafkaSetupError as e:
            if kafka.log_dir is not None:  # left behind when the broker keeps its data
                shutil.rmtree(kafka.log_dir, ignore_errors=True)
            if "--cluster-id" not in str(e) or attempt == 2:
                raise
    raise AssertionError("unreachable")


@pytest.fixture(scope="session")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    """The reference Kafka and an embedded Stratalog (default configuration), for the session."""
    kafka = start_kafka()
    try:
        with Broker(tmp_path_factory.mktemp("stratalog") / "data") as strat:
            warm_up(kafka.bootstrap)
            warm_up(strat.bootstrap)
            yield Pair(strat, kafka)
    finally:
        kafka.stop()


def both(pair: Pair, scenario: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[Any, Any]:
    """Run ``scenario(bootstrap, *args, **kwargs)`` on both brokers at once: (stratalog, kafka)."""
    with ThreadPoolExecutor(2, thread_name_prefix="scenario") as pool:
        fs = {
            name: pool.submit(scenario, bs, *args, **kwargs) for name, bs in pair.bootstraps.items()
        }
        return fs["stratalog"].result(SCENARIO_TIMEOUT), fs["kafka"].result(SCENARIO_TIMEOUT)


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def name(request: pytest.FixtureRequest) -> str:
    """A topic/group name unique to the test, the same for both brokers."""
    base = request.node.name.split("[")[0].removeprefix("test_").replace("_", "-")[:30]
    return unique(f"cf-{base}")


@pytest.fixture
def fresh_stratalog(tmp_path: Path) -> Callable[..., Broker]:
    """Start extra Stratalog brokers with given settings; all are stopped after the test."""
    started: list[Broker] = []

    def start(data_dir: Path | None = None, **config: Any) -> Broker:
        b = Broker(data_dir or tmp_path / f"data-{len(started)}", config=config)
        b.start()
        started.append(b)
        return b

    try:
        yield start
    finally:
        for b in reversed(started):
            b.stop()
