"""`stratalog groups` and `stratalog configs` against a real broker: lag per partition as the
committed offsets and ends say, offset resets planned then executed (refused while the group
has members), deletion, and configs set and reset. The oracle is confluent-kafka's own view."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from stratalog import Broker

from .conftest import committed_offsets, create_topic


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    with Broker(tmp_path_factory.mktemp("cli-groups") / "data") as b:
        create_topic(b.bootstrap, "lagging", 2)
        p = Producer({"bootstrap.servers": b.bootstrap})
        for i in range(10):
            p.produce("lagging", b"v%d" % i, partition=i % 2)
        assert p.flush(30) == 0
        yield b


def _cli(broker: Broker, *args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "stratalog.cli", *args, "-b", broker.bootstrap]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)


def _consumer(broker: Broker, group: str) -> Consumer:
    return Consumer({"bootstrap.servers": broker.bootstrap, "group.id": group})


def _commit(broker: Broker, group: str, offsets: dict[int, int]) -> None:
    c = _consumer(broker, group)
    try:
        c.commit(offsets=[TopicPartition("lagging", p, o) for p, o in offsets.items()],
                 asynchronous=False)  # fmt: skip
    finally:
        c.close()


def _committed(broker: Broker, group: str) -> dict[int, int]:
    return committed_offsets(broker.bootstrap, group, "lagging", (0, 1))


def _lag_rows(out: str) -> dict[int, tuple[str, str, str]]:
    """partition -> (committed, end, lag) from describe's table."""
    rows = {}
    for line in out.splitlines():
        cells = [c.strip() for c in line.replace("│", "|").split("|") if c.strip()]
        if len(cells) >= 5 and cells[0] == "lagging":
            rows[int(cells[1])] = (cells[2], cells[3], cells[4])
    return rows


def test_groups_show_lag_and_reset_offsets(broker):
    _commit(broker, "readers", {0: 3, 1: 1})  # 5 records per partition
    listed = _cli(broker, "groups", "list")
    assert listed.returncode == 0 and "readers" in listed.stdout, listed.stderr
    described = _cli(broker, "groups", "describe", "readers")
    assert described.returncode == 0, described.stderr
    assert _lag_rows(described.stdout) == {0: ("3", "5", "2"), 1: ("1", "5", "4")}
    assert "total lag: 6" in described.stdout

    plan = _cli(broker, "groups", "reset-offsets", "readers", "--topic", "lagging", "--to-earliest")
    assert plan.returncode == 0 and "a plan only" in plan.stdout, plan.stderr
    assert _committed(broker, "readers") == {0: 3, 1: 1}  # nothing committed by a plan
    done = _cli(broker, "groups", "reset-offsets", "readers", "--topic", "lagging",
                "--to-offset", "4", "--execute")  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert _committed(broker, "readers") == {0: 4, 1: 4}
    latest = _cli(broker, "groups", "reset-offsets", "readers", "--topic", "lagging",
                  "--to-latest", "--execute")  # fmt: skip
    assert latest.returncode == 0 and _committed(broker, "readers") == {0: 5, 1: 5}

    # A group with a live member is its member's to commit: refused, nothing changed.
    member = _consumer(broker, "readers")
    try:
        member.subscribe(["lagging"])
        for _ in range(20):
            member.poll(0.5)
            if member.assignment():
                break
        busy = _cli(broker, "groups", "reset-offsets", "readers", "--topic", "lagging",
                    "--to-earliest", "--execute")  # fmt: skip
        assert busy.returncode != 0 and "active member" in busy.stderr, busy.stderr
    finally:
        member.close()

    deleted = _cli(broker, "groups", "delete", "readers")
    assert deleted.returncode == 0, deleted.stderr
    assert "readers" not in _cli(broker, "groups", "list").stdout


def test_bad_group_commands_are_named(broker):
    both = _cli(broker, "groups", "reset-offsets", "g", "--topic", "lagging", "--to-earliest",
                "--to-latest")  # fmt: skip
    assert both.returncode != 0 and "exactly one of --to-earliest" in both.stderr
    missing = _cli(broker, "groups", "reset-offsets", "g", "--topic", "nope", "--to-earliest")
    assert missing.returncode != 0 and "topic 'nope' does not exist" in missing.stderr
    when = _cli(broker, "groups", "reset-offsets", "g", "--topic", "lagging", "--to-datetime", "x")
    assert when.returncode != 0 and "not an ISO-8601 time" in when.stderr


def test_configs_describe_set_and_reset(broker):
    def value(name: str) -> str:
        out = _cli(broker, "configs", "describe", "--topic", "lagging")
        assert out.returncode == 0, out.stderr
        for line in out.stdout.splitlines():
            cells = [c.strip() for c in line.replace("│", "|").split("|") if c.strip()]
            if cells and cells[0] == name:
                return cells[1]
        raise AssertionError(f"{name} not described: {out.stdout}")

    default = value("retention.ms")
    assert _cli(broker, "configs", "alter", "--topic", "lagging", "--set",
                "retention.ms=86400000").returncode == 0  # fmt: skip
    assert value("retention.ms") == "86400000"
    assert _cli(broker, "configs", "alter", "--topic", "lagging", "--delete",
                "retention.ms").returncode == 0  # fmt: skip
    assert value("retention.ms") == default
    neither = _cli(broker, "configs", "describe")
    assert neither.returncode != 0 and "exactly one of --topic or --broker" in neither.stderr
    nothing = _cli(broker, "configs", "alter", "--topic", "lagging")
    assert nothing.returncode != 0 and "nothing to change" in nothing.stderr


def test_lag_per_group_and_partition_on_metrics(tmp_path):
    from .conftest import scrape_metrics

    with Broker(tmp_path / "data", config={"admin.port": 0}) as b:
        create_topic(b.bootstrap, "lagging", 2)
        p = Producer({"bootstrap.servers": b.bootstrap})
        for i in range(10):
            p.produce("lagging", b"v%d" % i, partition=i % 2)
        assert p.flush(30) == 0
        _commit(b, "metered", {0: 2, 1: 5})

        def lags() -> dict[tuple[str, str], float]:
            samples = scrape_metrics(b.service.core.admin_address, "stratalog_consumer_group_lag")
            return {
                (s.labels["group"], s.labels["partition"]): s.value
                for s in samples
                if s.labels["topic"] == "lagging"
            }

        assert lags() == {("metered", "0"): 3, ("metered", "1"): 0}
        p.produce("lagging", b"more", partition=1)
        assert p.flush(30) == 0
        assert lags()[("metered", "1")] == 1
        assert _cli(b, "groups", "delete", "metered").returncode == 0
        assert lags() == {}  # a deleted group's series go with it
