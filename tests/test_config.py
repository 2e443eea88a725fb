"""Settings: documented, typed, and rejected with a clear message when wrong."""

from __future__ import annotations

import re

import pytest

from stratalog.broker.topic_config import TOPIC_SETTINGS, TopicConfigError, validate_topic_configs
from stratalog.config import SETTINGS, BrokerConfig, ConfigError

from .conftest import REPO


def _documented() -> set[str]:
    text = (REPO / "docs" / "configuration.md").read_text()
    return set(re.findall(r"^\| `([^`]+)` \|", text, re.M))


def test_every_setting_is_documented_and_nothing_else():
    assert _documented() == set(SETTINGS) | set(TOPIC_SETTINGS)


def test_toml_file_nested_tables_flatten(tmp_path):
    f = tmp_path / "s.toml"
    f.write_text('fsync = "never"\n[storage]\nlayout = "per-partition"\nvirtual_logs = 8\n')
    c = BrokerConfig({"storage.virtual_logs": 2}, f)
    assert c["fsync"] == "never"
    assert c["storage.layout"] == "per-partition"
    assert c["storage.virtual_logs"] == 2  # overrides beat the file


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"no.such.setting": 1}, "unknown setting 'no.such.setting'"),
        ({"port": "eighty"}, "setting 'port' must be int"),
        ({"fsync": "sometimes"}, "fsync must be"),
        ({"storage.layout": "columnar"}, "storage.layout must be"),
        ({"storage.fsync_via": "aio"}, "storage.fsync_via must be"),
        ({"segment.bytes": 0}, "must be positive"),
        ({"auto.create.topics.enable": "perhaps"}, "must be bool"),
        ({"storage.direct_io": "maybe"}, "must be bool"),
        ({"storage.direct_min_bytes": -1}, "storage.direct_min_bytes must be 0 or more"),
        (
            {"fetch.backlog.fsync_target_ms": 2, "fsync": "interval:100"},
            "fsync='interval:100' has none",
        ),
        (
            {
                "fetch.backlog.fsync_target_ms": 2,
                "fetch.backlog.min_bytes_per_sec": 9_000_000,
                "fetch.backlog.max_bytes_per_sec": 5_000_000,
            },
            "fetch.backlog.min_bytes_per_sec (9000000) is above",
        ),
        ({"fetch.backlog.min_bytes_per_sec": 0}, "must be positive"),
        (
            {"log.cleaner.fsync_target_ms": 5, "fsync": "never"},
            "log.cleaner.fsync_target_ms steers the cleaner by the fsyncs",
        ),
        (
            {
                "log.cleaner.fsync_target_ms": 5,
                "log.cleaner.min_bytes_per_sec": 9_000_000,
                "log.cleaner.io.max.bytes.per.second": 5_000_000,
            },
            "log.cleaner.min_bytes_per_sec (9000000) is above",
        ),
        ({"log.cleaner.min_bytes_per_sec": 0}, "must be positive"),
        ({"log.cleaner.priority": "high"}, "log.cleaner.priority must be"),
    ],
)
def test_bad_settings_name_the_problem(values, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        BrokerConfig(values)


def test_bad_config_file(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        BrokerConfig(file=tmp_path / "missing.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("fsync = \n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        BrokerConfig(file=bad)


def test_topic_configs_are_validated():
    assert validate_topic_configs({"retention.ms": 5}) == {"retention.ms": "5"}
    with pytest.raises(TopicConfigError, match="Unknown topic config name: foo"):
        validate_topic_configs({"foo": "1"})
    with pytest.raises(TopicConfigError, match="Not a number"):
        validate_topic_configs({"retention.bytes": "lots"})
    with pytest.raises(TopicConfigError, match="must be one of"):
        validate_topic_configs({"message.timestamp.type": "WallClock"})
