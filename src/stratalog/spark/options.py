"""Options of the "stratalog" Spark source and sink, with the Kafka source's names and meanings.

Spark hands Python data sources their options with lower-cased keys and string values; every
lookup here is by lower-cased name. Bad combinations fail at planning time with a message that
names the option, as Spark's Kafka source does.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from stratalog.client.security import ClientSecurity, SecurityConfigError, from_config

EARLIEST = -2
LATEST = -1


class OptionError(ValueError):
    """A bad option; the message names it."""


@dataclass(frozen=True)
class SourceOptions:
    bootstrap: str
    subscribe: tuple[str, ...] = ()
    subscribe_pattern: str | None = None
    assign: dict[str, tuple[int, ...]] = field(default_factory=dict)
    starting: str | dict[str, dict[int, int]] | None = None  # "earliest" | "latest" | per-partition
    ending: str | dict[str, dict[int, int]] | None = None
    starting_timestamp: int | None = None
    ending_timestamp: int | None = None
    starting_by_timestamp: dict[str, dict[int, int]] | None = None
    ending_by_timestamp: dict[str, dict[int, int]] | None = None
    timestamp_strategy: str = "error"
    max_offsets_per_trigger: int | None = None
    min_partitions: int | None = None
    fail_on_data_loss: bool = True
    include_headers: bool = False
    read_committed: bool = False  # ranges end at the last stable offset; aborted left out
    # Read the leader's files when it runs on the executor's host (client/colocated.py).
    colocated_reads: bool = True
    # Bytes per partition and Fetch (the Kafka consumer's max.partition.fetch.bytes)
    fetch_bytes: int = 8 * 1024 * 1024
    security: ClientSecurity = field(default_factory=ClientSecurity)  # kafka.security.protocol...


def _get(options: Mapping[str, str], name: str) -> str | None:
    v = options.get(name.lower())
    return None if v is None else str(v)


def _bool(options: Mapping[str, str], name: str, default: bool) -> bool:
    v = _get(options, name)
    if v is None:
        return default
    if v.lower() in ("true", "false"):  # as Scala's toBoolean: no spaces around
        return v.lower() == "true"
    raise OptionError(f"option '{name}' must be 'true' or 'false', not {v!r}")


def _positive_int(options: Mapping[str, str], name: str) -> int | None:
    v = _get(options, name)
    if v is None:
        return None
    try:
        n = int(v) if v == v.strip() else 0  # as Scala's toInt: no spaces around
    except ValueError:
        raise OptionError(f"option '{name}' must be a positive integer, not {v!r}") from None
    if n <= 0:
        raise OptionError(f"option '{name}' must be a positive integer, not {v!r}")
    return n


def _long(options: Mapping[str, str], name: str) -> int | None:
    v = _get(options, name)
    if v is None:
        return None
    try:
        return int(v)
    except ValueError:
        raise OptionError(
            f"option '{name}' must be a timestamp in milliseconds since the epoch, not {v!r}"
        ) from None


def parse_partition_json(name: str, text: str) -> dict[str, dict[int, int]]:
    """``{"topic": {"0": 23, "1": -2}}`` -> {"topic": {0: 23, 1: -2}}, with clear errors."""
    try:
        raw = json.loads(text)
    except ValueError as e:
        raise OptionError(
            f"option '{name}' is not valid JSON ({e.msg}); expected e.g. "
            f'{{"topicA": {{"0": 23, "1": -2}}}}'
        ) from None
    if not isinstance(raw, dict):
        raise OptionError(f"option '{name}' must be a JSON object of topics, got {text!r}")
    out: dict[str, dict[int, int]] = {}
    for topic, parts in raw.items():
        if not isinstance(parts, dict):
            raise OptionError(
                f"option '{name}': topic {topic!r} must map partitions to numbers, got {parts!r}"
            )
        out[topic] = {}
        for p, v in parts.items():
            try:
                out[topic][int(p)] = int(v)
            except (TypeError, ValueError):
                raise OptionError(
                    f"option '{name}': {topic!r} partition {p!r} -> {v!r} is not a number"
                ) from None
    return out


def _offsets(options: Mapping[str, str], name: str) -> str | dict[str, dict[int, int]] | None:
    v = _get(options, name)
    if v is None:
        return None
    word = v.strip().lower()
    if word in ("earliest", "latest"):
        return word
    return parse_partition_json(name, v)


def parse_security(options: Mapping[str, str]) -> ClientSecurity:
    """TLS and SASL from the Kafka client settings among the options (``kafka.security.protocol``,
    ``kafka.sasl.jaas.config``, ``kafka.ssl.truststore.location``, ...), as Spark's Kafka source
    passes them to its consumer."""
    kafka = {k[len("kafka.") :]: str(v) for k, v in options.items() if k.startswith("kafka.")}
    try:
        return from_config(kafka)
    except SecurityConfigError as e:
        raise OptionError(f"Kafka option kafka.{e}") from None


def parse_bootstrap(options: Mapping[str, str]) -> str:
    b = _get(options, "kafka.bootstrap.servers") or _get(options, "bootstrap.servers")
    if not b:
        raise OptionError(
            "option 'bootstrap.servers' (or 'kafka.bootstrap.servers') must name the broker, "
            "e.g. 127.0.0.1:9092"
        )
    return b


# Consumer settings Spark's Kafka source refuses, because the source manages them itself; the
# same ones are refused here, with the reason.
_UNSUPPORTED = {
    "kafka.auto.offset.reset": "set the source option 'startingOffsets' instead",
    "kafka.key.deserializer": "keys are always read as bytes; cast or decode them in the query",
    "kafka.value.deserializer": (
        "values are always read as bytes; cast or decode them in the query"
    ),
    "kafka.enable.auto.commit": "the source does not commit offsets; Spark's checkpoint keeps them",
    "kafka.interceptor.classes": "the source does not run consumer interceptors",
}


# Source options of Spark's Kafka source that this source does not implement: refused, so a
# query never silently runs without what it asked for.
_NOT_IMPLEMENTED = ("minOffsetsPerTrigger", "maxTriggerDelay")


def _refuse_kafka_options(options: Mapping[str, str], refused: Mapping[str, str]) -> None:
    for name, why in refused.items():
        if _get(options, name) is not None:
            raise OptionError(f"Kafka option '{name[len('kafka.') :]}' is not supported: {why}")


def _check_unsupported(options: Mapping[str, str]) -> None:
    for name in _NOT_IMPLEMENTED:
        if _get(options, name) is not None:
            raise OptionError(f"option '{name}' is not supported by format(\"stratalog-python\")")
    _refuse_kafka_options(options, _UNSUPPORTED)
    check_isolation_level(_get(options, "kafka.isolation.level"))


def check_isolation_level(level: str | None) -> None:
    if level is not None and level not in ("read_uncommitted", "read_committed"):
        raise OptionError(
            "Kafka option 'isolation.level' must be 'read_uncommitted' or 'read_committed', "
            f"not {level!r}"
        )


def _check_limits(starting, ending, starting_ts, ending_ts, starting_bt, ending_bt) -> None:
    """A start after the end, both given (Spark's checkOffsetLimitValidity): an error, not an
    empty read. Only the options that win are compared (a timestamp beats offsets)."""
    if starting_ts is not None and ending_ts is not None and starting_ts > ending_ts:
        raise OptionError(
            f"the specified start timestamp ({starting_ts}) is greater than the end timestamp "
            f"({ending_ts})"
        )
    pairs = []
    no_global = starting_ts is None and ending_ts is None
    no_by_ts = starting_bt is None and ending_bt is None
    if no_global and starting_bt is not None and ending_bt is not None:
        pairs.append((starting_bt, ending_bt, "timestamp"))
    elif no_global and no_by_ts and isinstance(starting, dict) and isinstance(ending, dict):
        pairs.append((starting, ending, "offset"))
    for start, end, what in pairs:
        for t, parts in start.items():
            for p, s in parts.items():
                e = end.get(t, {}).get(p)
                if e is not None and s >= 0 and e >= 0 and s > e:
                    raise OptionError(
                        f"the specified start {what} {s} is greater than the end {what} {e} "
                        f"for {t}-{p}"
                    )


def parse_source_options(options: Mapping[str, str], *, streaming: bool) -> SourceOptions:
    bootstrap = parse_bootstrap(options)
    _check_unsupported(options)
    given = [n for n in ("subscribe", "subscribePattern", "assign") if _get(options, n)]
    if len(given) != 1:
        raise OptionError(
            "exactly one of 'subscribe', 'subscribePattern' or 'assign' must be given"
            + (f", not {' and '.join(repr(g) for g in given)}" if given else "")
        )
    subscribe: tuple[str, ...] = ()
    pattern = None
    assign: dict[str, tuple[int, ...]] = {}
    if given[0] == "subscribe":
        subscribe = tuple(t.strip() for t in _get(options, "subscribe").split(",") if t.strip())
        if not subscribe:
            raise OptionError("option 'subscribe' names no topic")
    elif given[0] == "subscribePattern":
        pattern = _get(options, "subscribePattern").strip()  # as Spark's Kafka source
        try:
            re.compile(pattern)
        except re.error as e:
            raise OptionError(f"option 'subscribePattern' is not a valid regex: {e}") from None
    else:
        parsed = _assign_json(_get(options, "assign"))
        assign = parsed
    starting = _offsets(options, "startingOffsets")
    ending = _offsets(options, "endingOffsets")
    starting_ts = _long(options, "startingTimestamp")
    ending_ts = _long(options, "endingTimestamp")
    starting_bt = _get(options, "startingOffsetsByTimestamp")
    ending_bt = _get(options, "endingOffsetsByTimestamp")
    strategy = (_get(options, "startingOffsetsByTimestampStrategy") or "error").lower()
    if strategy not in ("error", "latest"):
        raise OptionError(
            "option 'startingOffsetsByTimestampStrategy' must be 'error' or 'latest', not "
            f"{strategy!r}"
        )
    if streaming:
        for name in ("endingOffsets", "endingTimestamp", "endingOffsetsByTimestamp"):
            if _get(options, name) is not None:
                raise OptionError(f"option '{name}' is for batch queries only")
    else:
        # Only the option that wins is checked: a timestamp beats startingOffsets/endingOffsets.
        if starting_ts is None and starting_bt is None:
            if starting == "latest":
                raise OptionError("option 'startingOffsets' can't be 'latest' for batch queries")
            if isinstance(starting, dict) and any(
                v == LATEST for parts in starting.values() for v in parts.values()
            ):
                raise OptionError(
                    "option 'startingOffsets' can't use -1 (latest) for batch queries"
                )
        if ending_ts is None and ending_bt is None:
            if ending == "earliest":
                raise OptionError("option 'endingOffsets' can't be 'earliest' for batch queries")
            if isinstance(ending, dict) and any(
                v == EARLIEST for parts in ending.values() for v in parts.values()
            ):
                raise OptionError("option 'endingOffsets' can't use -2 (earliest)")
        # maxOffsetsPerTrigger is accepted and ignored in batch, as Spark's Kafka source does.
    starting_bt_parsed = (
        parse_partition_json("startingOffsetsByTimestamp", starting_bt) if starting_bt else None
    )
    ending_bt_parsed = (
        parse_partition_json("endingOffsetsByTimestamp", ending_bt) if ending_bt else None
    )
    if not streaming:
        _check_limits(
            starting, ending, starting_ts, ending_ts, starting_bt_parsed, ending_bt_parsed
        )
    return SourceOptions(
        bootstrap=bootstrap,
        subscribe=subscribe,
        subscribe_pattern=pattern,
        assign=assign,
        starting=starting,
        ending=ending,
        starting_timestamp=starting_ts,
        ending_timestamp=ending_ts,
        starting_by_timestamp=starting_bt_parsed,
        ending_by_timestamp=ending_bt_parsed,
        timestamp_strategy=strategy,
        max_offsets_per_trigger=_positive_int(options, "maxOffsetsPerTrigger"),
        min_partitions=_positive_int(options, "minPartitions"),
        fail_on_data_loss=_bool(options, "failOnDataLoss", True),
        include_headers=_bool(options, "includeHeaders", False),
        colocated_reads=_bool(options, "colocatedReads", True),
        fetch_bytes=_positive_int(options, "kafka.max.partition.fetch.bytes") or 8 * 1024 * 1024,
        read_committed=_get(options, "kafka.isolation.level") == "read_committed",
        security=parse_security(options),
    )


def _assign_json(text: str) -> dict[str, tuple[int, ...]]:
    try:
        raw = json.loads(text)
    except ValueError as e:
        raise OptionError(
            f"option 'assign' is not valid JSON ({e.msg}); expected e.g. "
            f'{{"topicA": [0, 1], "topicB": [2, 4]}}'
        ) from None
    if not isinstance(raw, dict) or not all(
        isinstance(v, list) and all(isinstance(p, int) for p in v) for v in raw.values()
    ):
        raise OptionError(f"option 'assign' must look like {{\"topicA\": [0, 1]}}, got {text!r}")
    return {t: tuple(ps) for t, ps in raw.items()}


# For tests of re-runs: a write task's attempts numbered below FAIL_ATTEMPTS_OPTION (default 1:
# the first) fail once FAIL_OPTION records of theirs are acknowledged. The JVM sink reads the
# same options.
FAIL_OPTION = "testing.failAfterRecords"
FAIL_ATTEMPTS_OPTION = "testing.failAttempts"
# The Python sink orders a task's rows in memory (see writer.py); past this it refuses.
DEFAULT_MAX_TASK_BYTES = 1 << 30


@dataclass(frozen=True)
class SinkOptions:
    bootstrap: str
    topic: str | None
    exactly_once: bool = True
    sorted: bool = False  # exactlyOnce=sorted: a task's rows are ordered by what is written
    max_task_bytes: int = DEFAULT_MAX_TASK_BYTES
    fail_after_records: int | None = None
    fail_attempts: int = 1
    security: ClientSecurity = field(default_factory=ClientSecurity)


_SINK_UNSUPPORTED = {
    "kafka.key.serializer": "keys are serialized as bytes (a string key as UTF-8)",
    "kafka.value.serializer": "values are serialized as bytes (a string value as UTF-8)",
}


def parse_sink_options(options: Mapping[str, str]) -> SinkOptions:
    _refuse_kafka_options(options, _SINK_UNSUPPORTED)
    topic = _get(options, "topic")
    given = _get(options, "exactlyOnce")
    eo = "true" if given is None else given.lower()
    if eo not in ("true", "false", "sorted"):
        raise OptionError(
            "option 'exactlyOnce' must be 'true', 'sorted' or 'false', "
            f"not {_get(options, 'exactlyOnce')!r}"
        )
    return SinkOptions(
        parse_bootstrap(options),
        topic.strip() if topic is not None else None,
        exactly_once=eo != "false",
        sorted=eo == "sorted",
        max_task_bytes=_positive_int(options, "exactlyOnce.maxTaskBytes") or DEFAULT_MAX_TASK_BYTES,
        fail_after_records=_positive_int(options, FAIL_OPTION),
        fail_attempts=_positive_int(options, FAIL_ATTEMPTS_OPTION) or 1,
        security=parse_security(options),
    )
