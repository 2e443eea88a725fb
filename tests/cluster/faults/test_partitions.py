"""A short partition run (``-m faults``) against Stratalog's three-broker cluster, its links
through fault proxies: one leader cut from etcd past its lease while it still serves clients
and replicates (the zombie leader), then one leader cut from its peers' replication traffic
past ``replica.lag.time.max.ms`` while it still reaches etcd. The checker must find nothing.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from stratalog.faults.history import load_history
from stratalog.faults.runner import RunConfig, run

from .test_runs import verdict

pytestmark = pytest.mark.faults

MIX = ("etcd-cut1", "isolate1")


def test_stratalog_partitions_find_no_anomaly(tmp_path: Path) -> None:
    out = tmp_path / "partitions"
    cfg = RunConfig(
        target="stratalog",
        duration=35,
        seed=11,
        faults=MIX,
        fixed=True,
        rate=150,
        partitions=6,
        quiet_start=4,
        gap=(4, 4),
        cut=(7, 7),  # past the 3 s lease, and past the lag below
        settings={"replica.lag.time.max.ms": "4000"},  # the isolated leader drops its backups
        settle=5,
        led_timeout=10,
        final_read_timeout=20,
        message_timeout_ms=60_000,
        drain_timeout=20,
    )
    result = run(cfg, out)
    c = result["check"]
    assert result["nemesis"]["applied"] == list(MIX), verdict(result, out)
    assert result["nemesis"]["healed"], verdict(result, out)
    assert c["stats"]["nemesis"] == {"cut": 2, "reconnect": 2, "heal": 1}, verdict(result, out)
    assert c["stats"]["sends"]["ok"] > 1000, verdict(result, out)
    assert c["stats"]["reads"]["poll_records"] > 0, verdict(result, out)
    assert {a: n for a, n in c["counts"].items() if n} == {}, verdict(result, out)
    assert c["valid"] is True, verdict(result, out)
    # The cuts took: the etcd victim lost its lease, and the isolated broker left an in-sync
    # set. Which one depends on what it led when cut: the metadata that picked it as a leader
    # may be a moment old (leadership moves after the etcd cut), so either it dropped its own
    # backups or the leaders it backed dropped it.
    victims = {
        e["value"]["link"]: e["value"]["nodes"][0]
        for e in load_history(out / "history.jsonl")
        if e["process"] == "nemesis" and e["f"] == "cut" and e["type"] == "invoke"
    }
    logs = {
        p.stem.removeprefix("cluster-"): p.read_text() for p in (out / "logs").glob("cluster-*.log")
    }
    node = victims["etcd"].removeprefix("broker-")
    assert f"node {node} lost its etcd lease" in logs[victims["etcd"]], verdict(result, out)
    isolated = victims["replication"]
    dropped = [
        line
        for name, text in logs.items()
        for line in text.splitlines()
        if "out of the in-sync set" in line
        and (name == isolated or f"backup {isolated.removeprefix('broker-')} is" in line)
    ]
    assert dropped, verdict(result, out)
