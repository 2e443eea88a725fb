"""The soak summary's recovery column, from a run's recorded recoveries."""

from __future__ import annotations

from pathlib import Path

from stratalog.faults.report import row


def _result(recovery: list[dict]) -> dict:
    return {"config": {"target": "stratalog"}, "check": {"stats": {"recovery": recovery}}}


def test_a_fault_on_a_broker_that_led_nothing_needs_no_recovery() -> None:
    recovery = [
        {"f": "kill", "partitions": [2, 5], "first_ok_s": 2.88},
        {"f": "pause", "partitions": [], "first_ok_s": None},  # a paused controller
    ]
    assert row(Path("run-1"), _result(recovery))["recovery_s"] == 2.88


def test_partitions_that_never_acknowledged_again_are_never() -> None:
    recovery = [
        {"f": "kill", "partitions": [2, 5], "first_ok_s": 2.88},
        {"f": "pause", "partitions": [1], "first_ok_s": None},
    ]
    assert row(Path("run-1"), _result(recovery))["recovery_s"] == "never"
