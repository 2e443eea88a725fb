"""Short fault-injection runs (``-m faults``): the harness against Stratalog's three-broker
cluster, and against a three-node Apache Kafka KRaft cluster, the baseline that shows the
harness itself reports nothing on a system that keeps its promises.

Each run is one fixed mix: ``kill -9`` of a partition leader (restarted within 0-5 s), a
``SIGSTOP`` of a leader for 5 s (past Stratalog's 3 s lease), and a 5 s ``SIGSTOP`` of the
coordinator (etcd; on Kafka the active KRaft controller), with fault-free gaps between them.
The history, the verdict and the logs stay under the test's temporary directory.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from stratalog.faults.checker import ANOMALIES
from stratalog.faults.runner import RunConfig, run

pytestmark = pytest.mark.faults

MIX = ("kill1", "pause1", "coord-pause")


def short(target: str, duration: float) -> RunConfig:
    return RunConfig(
        target=target,
        duration=duration,
        seed=7,
        faults=MIX,
        fixed=True,
        rate=150,
        partitions=6,
        quiet_start=4,
        gap=(4, 4),
        pause=(5, 5),
        settle=5,
        led_timeout=10,
        final_read_timeout=20,
        message_timeout_ms=60_000,
        drain_timeout=20,
    )


def verdict(result: dict[str, Any], out: Path) -> str:
    c = result["check"]
    return (
        f"history: {out / 'history.jsonl'}\n"
        f"valid={c['valid']} counts={c['counts']}\n"
        f"nemesis={result['nemesis']}\n"
        f"stats={json.dumps(c['stats'])}\n"
        f"examples={json.dumps(c['anomalies'], default=str)[:4000]}"
    )


def assert_no_anomaly(result: dict[str, Any], out: Path) -> None:
    c = result["check"]
    assert result["nemesis"]["applied"] == list(MIX), verdict(result, out)
    assert result["nemesis"]["healed"], verdict(result, out)
    assert c["stats"]["sends"]["ok"] > 1000, verdict(result, out)
    assert c["stats"]["reads"]["poll_records"] > 0, verdict(result, out)
    assert {a: c["counts"][a] for a in ANOMALIES if c["counts"][a]} == {}, verdict(result, out)
    assert c["valid"] is True, verdict(result, out)


def test_stratalog_short_mix_finds_no_anomaly(tmp_path: Path) -> None:
    out = tmp_path / "stratalog"
    result = run(short("stratalog", 45), out)
    assert_no_anomaly(result, out)


@pytest.mark.kafka
@pytest.mark.skipif(
    not os.environ.get("STRATALOG_FAULTS_ON_KAFKA"),
    reason="the baseline on a Kafka cluster checks the harness, not Stratalog (90 s): "
    "STRATALOG_FAULTS_ON_KAFKA=1, or python -m stratalog.faults soak --target kafka",
)
def test_kafka_baseline_short_mix_finds_no_anomaly(tmp_path: Path) -> None:
    # A Kafka node takes 10-25 s to come back after kill -9 on two cores: a longer run, so the
    # whole mix fits in it.
    out = tmp_path / "kafka"
    result = run(short("kafka", 60), out)
    assert_no_anomaly(result, out)
