"""Topic-level configs: the Kafka names Stratalog honours, their defaults and validation."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from stratalog.config import BrokerConfig

# DescribeConfigs config types (KIP-569)
BOOLEAN, STRING, INT, SHORT, LONG, DOUBLE, LIST = 1, 2, 3, 4, 5, 6, 7


class TopicConfigError(ValueError):
    """Answered with INVALID_CONFIG and this message."""


@dataclass(frozen=True)
class TopicSetting:
    name: str
    kind: int
    doc: str
    broker_default: str | None = None  # the broker setting that supplies the default
    default: str | None = None
    choices: tuple[str, ...] = ()
    low: float | None = None  # Kafka's Range validator: at least
    high: float | None = None  # ... and at most
    read_only: bool = False  # kept by the broker; AlterConfigs and CreateTopics may not set it


_T = TopicSetting
TOPIC_SETTINGS: dict[str, TopicSetting] = {
    t.name: t
    for t in [
        _T(
            "cleanup.policy",
            LIST,
            "'delete' drops old data by retention.ms/bytes; 'compact' keeps each key's latest "
            "record (docs/architecture.md, Compaction); both may be listed; an empty list keeps "
            "everything.",
            default="delete",
            choices=("compact", "delete"),
        ),
        _T(
            "min.cleanable.dirty.ratio",
            DOUBLE,
            "A compacted partition is cleaned once this share of its cleanable bytes was "
            "written since its last cleaning.",
            broker_default="log.cleaner.min.cleanable.ratio",
            low=0,
            high=1,
        ),
        _T(
            "min.compaction.lag.ms",
            LONG,
            "Records younger than this are never compacted.",
            broker_default="log.cleaner.min.compaction.lag.ms",
            low=0,
        ),
        _T(
            "max.compaction.lag.ms",
            LONG,
            "A partition whose oldest uncleaned record is older than this is cleaned whatever "
            "its dirty ratio.",
            broker_default="log.cleaner.max.compaction.lag.ms",
            low=1,
        ),
        _T(
            "delete.retention.ms",
            LONG,
            "How long a tombstone stays in a compacted partition after the cleaning that first "
            "kept it.",
            broker_default="log.cleaner.delete.retention.ms",
            low=0,
        ),
        _T(
            "compression.type",
            STRING,
            "Batches are stored as the producer compressed them.",
            default="producer",
            choices=("producer",),
        ),
        _T(
            "retention.ms",
            LONG,
            "Drop chunks older than this; -1 keeps them forever.",
            broker_default="retention.ms",
        ),
        _T(
            "retention.bytes",
            LONG,
            "Keep at most this many bytes per partition; -1: no limit.",
            broker_default="retention.bytes",
        ),
        _T(
            "max.message.bytes",
            INT,
            "Largest record batch accepted.",
            broker_default="message.max.bytes",
        ),
        _T(
            "message.timestamp.type",
            STRING,
            "CreateTime keeps the producer's timestamps; "
            "LogAppendTime stamps batches with broker time.",
            default="CreateTime",
            choices=("CreateTime", "LogAppendTime"),
        ),
        _T(
            "local.retention.ms",
            LONG,
            "How long chunks stay in the hot tier before migration; -2: as retention.ms.",
            broker_default="local.retention.ms",
        ),
        _T(
            "local.retention.bytes",
            LONG,
            "Hot bytes per partition before migration; -2: as retention.bytes.",
            broker_default="local.retention.bytes",
        ),
        _T(
            "late.event.policy",
            STRING,
            "What to do with a batch outside message.timestamp.before/after.max.ms: 'reject' "
            "(INVALID_TIMESTAMP) or 'stamp' (accept it as LogAppendTime, broker time).",
            default="reject",
            choices=("reject", "stamp"),
        ),
        _T(
            "segment.bytes",
            INT,
            "Accepted for compatibility; segments roll by the broker's "
            "segment.bytes since partitions share virtual logs.",
            broker_default="segment.bytes",
        ),
        _T(
            "segment.ms",
            LONG,
            "Accepted for compatibility (see segment.bytes).",
            broker_default="segment.ms",
        ),
        _T(
            "min.insync.replicas",
            INT,
            "In a cluster: an acks=all produce is refused (NOT_ENOUGH_REPLICAS) while fewer "
            "replicas are in sync. A single node is always 1.",
            default="1",
        ),
        _T(
            "flush.messages",
            LONG,
            "Accepted for compatibility; durability is set by the broker's fsync policy.",
            default="9223372036854775807",
        ),
        _T(
            "flush.ms",
            LONG,
            "Accepted for compatibility (see flush.messages).",
            default="9223372036854775807",
        ),
        _T(
            "message.timestamp.before.max.ms",
            LONG,
            "Largest allowed lag of a batch's timestamp behind broker time.",
            default="9223372036854775807",
        ),
        _T(
            "message.timestamp.after.max.ms",
            LONG,
            "Largest allowed lead of a batch's timestamp ahead of broker time.",
            default="3600000",
        ),
        _T(
            "partition.autoscale.enable",
            BOOLEAN,
            "Split the topic's partitions under load (dynamic partitioning, docs/"
            "dynamic-partitioning.md): each split doubles them, the children in their parents' "
            "virtual logs; CreatePartitions to twice the count is a split on request, other "
            "counts are refused.",
            default="false",
            choices=("true", "false"),
        ),
        _T(
            "partition.autoscale.bytes.per.sec",
            LONG,
            "A split is asked for when a partition takes more than this many bytes per second "
            "over partition.autoscale.window.ms.",
            default="8388608",
            low=1,
        ),
        _T(
            "partition.autoscale.window.ms",
            LONG,
            "How long a partition's rate must stay above partition.autoscale.bytes.per.sec.",
            default="10000",
            low=100,
        ),
        _T(
            "partition.autoscale.max.partitions",
            INT,
            "No split past this many partitions.",
            default="64",
            low=1,
        ),
        _T(
            "partition.split.history",
            STRING,
            "The topic's partition counts, one per split (read-only): '2,4,8' was created with "
            "2 and split twice. Readers take each partition's parent from it.",
            default="",
            read_only=True,
        ),
    ]
}

_INTS = (INT, LONG, SHORT)


def validate_topic_configs(configs: dict[str, str | None]) -> dict[str, str | None]:
    """Check names and values; returns the configs normalised to strings."""
    out: dict[str, str | None] = {}
    for name, value in configs.items():
        setting = TOPIC_SETTINGS.get(name)
        if setting is None:
            raise TopicConfigError(f"Unknown topic config name: {name}")
        if setting.read_only:
            raise TopicConfigError(f"{name} is read-only: the broker keeps it")
        if value is None:
            out[name] = None
            continue
        value = str(value)
        number: float | None = None
        if setting.kind in _INTS:
            try:
                number = int(value)
            except ValueError:
                raise TopicConfigError(
                    f"Invalid value {value} for configuration {name}: Not a number of type "
                    f"{'INT' if setting.kind == INT else 'LONG'}"
                ) from None
        elif setting.kind == DOUBLE:
            try:
                number = float(value)
            except ValueError:
                raise TopicConfigError(
                    f"Invalid value {value} for configuration {name}: Not a number of type DOUBLE"
                ) from None
            if number != number or number in (float("inf"), float("-inf")):
                raise TopicConfigError(f"Invalid value {value} for configuration {name}")
        if number is not None:
            if setting.low is not None and number < setting.low:
                raise TopicConfigError(
                    f"Invalid value {value} for configuration {name}: Value must be at least "
                    f"{_bound(setting.low)}"
                )
            if setting.high is not None and number > setting.high:
                raise TopicConfigError(
                    f"Invalid value {value} for configuration {name}: Value must be no more "
                    f"than {_bound(setting.high)}"
                )
        if setting.kind == LIST and setting.choices:
            bad = [v for v in value.split(",") if v.strip() and v.strip() not in setting.choices]
            if bad:
                raise TopicConfigError(
                    f"Invalid value {bad[0]} for configuration {name}: String must be one of: "
                    f"{', '.join(setting.choices)}"
                )
        elif setting.choices and value not in setting.choices:
            raise TopicConfigError(
                f"Invalid value {value} for configuration {name}: String must be one of: "
                f"{', '.join(setting.choices)}"
            )
        out[name] = value
    return out


def _bound(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


def default_value(setting: TopicSetting, broker: BrokerConfig) -> str:
    if setting.broker_default is not None:
        return str(broker[setting.broker_default])
    return str(setting.default)


class TopicConfigView:
    """A topic's effective configs: its own overrides over the broker's defaults."""

    def __init__(self, overrides: dict[str, str], broker: BrokerConfig) -> None:
        self.overrides = overrides
        self.broker = broker

    def get(self, name: str) -> str:
        if name in self.overrides:
            return self.overrides[name]
        return default_value(TOPIC_SETTINGS[name], self.broker)

    def get_int(self, name: str) -> int:
        return int(self.get(name))

    def get_float(self, name: str) -> float:
        return float(self.get(name))

    def policies(self) -> set[str]:
        """The cleanup policies (``cleanup.policy`` as a set)."""
        return {v.strip() for v in self.get("cleanup.policy").split(",") if v.strip()}

    def describe(self) -> list[dict[str, Any]]:
        out = []
        for name, s in sorted(TOPIC_SETTINGS.items()):
            out.append(
                {
                    "name": name,
                    "value": self.get(name),
                    "is_default": name not in self.overrides,
                    "read_only": s.read_only,
                    "kind": s.kind,
                    "doc": s.doc,
                }
            )
        return out
