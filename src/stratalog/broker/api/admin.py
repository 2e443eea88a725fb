"""Topic administration: CreateTopics, DeleteTopics, CreatePartitions, configs."""

from __future__ import annotations

from collections import Counter
from collections.abc import Awaitable

from stratalog.broker.topic_config import (
    LIST,
    STRING,
    TOPIC_SETTINGS,
    TopicConfigError,
    TopicConfigView,
    default_value,
    validate_topic_configs,
)
from stratalog.cluster.metadata import MetadataError, TopicMeta, validate_topic_name
from stratalog.config import SETTINGS
from stratalog.protocol.connection import Request

from .common import NONE, err, reply, sub

TOPIC_RESOURCE = 2
BROKER_RESOURCE = 4
BROKER_LOGGER_RESOURCE = 8
SOURCE_TOPIC = 1
SOURCE_STATIC_BROKER = 4
SOURCE_DEFAULT = 5


class _TopicPlan:
    """One topic of a CreateTopics request: what was asked, and what became of it."""

    __slots__ = ("configs", "error", "factor", "message", "meta", "partitions", "request")

    def __init__(self, request, partitions: int, factor: int) -> None:
        self.request = request
        self.partitions = partitions
        self.factor = factor
        self.configs: dict[str, str] = {}
        self.error = "NONE"
        self.message: str | None = None
        self.meta = None


def handle_create_topics(core, req: Request, conn):
    body = req.body
    if core.cluster is None:
        plans = _plans(core, body, 1)
        for plan in plans:
            if plan.error != "NONE" or body.validate_only:
                continue
            try:
                plan.meta = core.create_topic(plan.request.name, plan.partitions, plan.configs)
            except MetadataError as e:
                plan.error, plan.message = e.error, str(e)
        return _created(core, req, plans)

    async def in_cluster() -> bytes:
        # Counted in etcd, not this node's watched copy, which may lag a new registration.
        brokers = await core.cluster.registered_brokers()
        plans = _plans(core, body, len(brokers))
        # Created through etcd: every broker learns of it from its watch.
        for plan in plans:
            if plan.error != "NONE" or body.validate_only:
                continue
            name = plan.request.name
            try:
                await core.cluster.create_topic(
                    name, plan.partitions, plan.factor, plan.configs, brokers
                )
                plan.meta = core.metadata.topics.get(name)
            except KeyError:
                plan.error, plan.message = "TOPIC_ALREADY_EXISTS", f"Topic '{name}' already exists."
            except ValueError as e:
                plan.error, plan.message = "INVALID_REPLICATION_FACTOR", str(e)
        return _created(core, req, plans)

    return in_cluster()


def _plans(core, body, brokers: int) -> list[_TopicPlan]:
    """Each requested topic's plan, with the error that refuses it (if any)."""
    counts = Counter(t.name for t in body.topics)
    plans: list[_TopicPlan] = []
    answered: set[str] = set()
    for t in body.topics:
        if t.name in answered:
            continue  # a duplicate gets one answer, as from Kafka
        answered.add(t.name)
        partitions = t.num_partitions if t.num_partitions != -1 else core.config["num.partitions"]
        factor = (
            t.replication_factor
            if t.replication_factor != -1
            else core.config["default.replication.factor"]
        )
        plan = _TopicPlan(t, partitions, factor)
        plans.append(plan)
        try:
            if counts[t.name] > 1:
                raise MetadataError(
                    "INVALID_REQUEST",
                    f"Create topics request from client contains a duplicate topic {t.name}",
                )
            validate_topic_name(t.name)
            if t.name in core.metadata.topics:
                raise MetadataError("TOPIC_ALREADY_EXISTS", f"Topic '{t.name}' already exists.")
            if t.assignments:
                raise MetadataError(
                    "INVALID_REQUEST", "manual replica assignments are not supported"
                )
            if not 1 <= factor <= brokers:
                raise MetadataError(
                    "INVALID_REPLICATION_FACTOR",
                    f"Unable to replicate the partition {factor} time(s): The "
                    f"target replication factor of {factor} cannot be reached "
                    f"because only {brokers} broker(s) are registered.",
                )
            if partitions < 1:
                raise MetadataError(
                    "INVALID_PARTITIONS",
                    "Number of partitions was set to an invalid non-positive value.",
                )
            try:
                plan.configs = {
                    k: v
                    for k, v in validate_topic_configs({c.name: c.value for c in t.configs}).items()
                    if v is not None
                }
            except TopicConfigError as e:
                raise MetadataError("INVALID_CONFIG", str(e)) from None
        except MetadataError as e:
            plan.error, plan.message = e.error, str(e)
    return plans


def _created(core, req: Request, plans: list[_TopicPlan]) -> bytes:
    results = []
    for plan in plans:
        ok = plan.error == "NONE"
        view = TopicConfigView(plan.configs, core.config)
        cfgs = (
            tuple(
                sub(
                    req,
                    "CreatableTopicConfigs",
                    name=c["name"],
                    value=c["value"],
                    read_only=c["read_only"],
                    config_source=SOURCE_DEFAULT if c["is_default"] else SOURCE_TOPIC,
                    is_sensitive=False,
                )
                for c in view.describe()
            )
            if ok
            else ()
        )
        results.append(
            sub(
                req,
                "CreatableTopicResult",
                name=plan.request.name,
                topic_id=plan.meta.topic_id if plan.meta else _zero_uuid(),
                error_code=err(plan.error),
                error_message=plan.message,
                topic_config_error_code=0,
                num_partitions=plan.partitions if ok else -1,
                replication_factor=plan.factor if ok else -1,
                configs=cfgs if ok else (),
            )
        )
    return reply(req, topics=tuple(results))


def _zero_uuid():
    import uuid

    return uuid.UUID(int=0)


def handle_delete_topics(core, req: Request, conn):
    body = req.body
    if hasattr(body, "topic_names"):
        targets = [(n, None) for n in body.topic_names]
    else:
        targets = [(t.name, t.topic_id) for t in body.topics]
    results = []
    deletes: list[str] = []  # in a cluster: deleted through etcd after validation
    for name, tid in targets:
        error, message = "NONE", None
        topic_id = tid or _zero_uuid()
        try:
            if name is None and tid is not None:
                t = core.topic_by_id(tid)
                if t is None:
                    raise MetadataError(
                        "UNKNOWN_TOPIC_ID", "This server does not host this topic ID."
                    )
                name = t.name
            validate_topic_name(name)
            if name not in core.metadata.topics:
                raise MetadataError(
                    "UNKNOWN_TOPIC_OR_PARTITION", "This server does not host this topic-partition."
                )
            if core.cluster is not None:
                topic_id = core.metadata.topics[name].topic_id
                deletes.append(name)
            else:
                topic_id = core.delete_topic(name).topic_id
        except MetadataError as e:
            error, message = e.error, str(e)
            if error == "INVALID_TOPIC_EXCEPTION":
                error = "UNKNOWN_TOPIC_OR_PARTITION"
        results.append(
            sub(
                req,
                "DeletableTopicResult",
                name=name,
                topic_id=topic_id,
                error_code=err(error),
                error_message=message,
            )
        )
    if not deletes:
        return reply(req, responses=tuple(results))

    async def in_cluster() -> bytes:
        for name in deletes:
            await core.cluster.delete_topic(name)
        return reply(req, responses=tuple(results))

    return in_cluster()


def handle_create_partitions(core, req: Request, conn):
    body = req.body
    results: list[list] = []  # [name, error, message]
    grow: list[tuple[list, int]] = []  # (its result, the count) of those to do
    for t in body.topics:
        error, message = "NONE", None
        try:
            topic = core.metadata.topics.get(t.name)
            if topic is None:
                raise MetadataError(
                    "UNKNOWN_TOPIC_OR_PARTITION", "This server does not host this topic-partition."
                )
            if t.assignments:
                raise MetadataError(
                    "INVALID_REQUEST", "manual replica assignments are not supported"
                )
            if t.count <= len(topic.partitions):
                raise MetadataError(
                    "INVALID_PARTITIONS",
                    f"The topic {t.name} currently has {len(topic.partitions)} partition(s); "
                    f"{t.count} would not be an increase."
                    if t.count < len(topic.partitions)
                    else f"Topic already has {t.count} partition(s).",
                )
            if core.splits(topic):
                core.check_split(topic, t.count)
        except MetadataError as e:
            error, message = e.error, str(e)
        results.append([t.name, error, message])
        if error == "NONE" and not body.validate_only:
            grow.append((results[-1], t.count))

    def answer() -> bytes:
        return reply(req, results=tuple(
            sub(req, "CreatePartitionsTopicResult", name=name, error_code=err(error),
                error_message=message)
            for name, error, message in results
        ))  # fmt: skip

    if core.cluster is None:
        for result, count in grow:
            try:
                core.add_partitions(result[0], count)
            except MetadataError as e:
                result[1:] = [e.error, str(e)]
        return answer()

    async def in_cluster() -> bytes:
        # Through etcd: every broker learns of the new partitions from its watch.
        for result, count in grow:
            try:
                await core.add_partitions_in_cluster(result[0], count)
            except MetadataError as e:
                result[1:] = [e.error, str(e)]
        return answer()

    return in_cluster()


# Kafka's broker-level names of the topic configs' defaults (shown as DEFAULT_CONFIG synonyms).
_BROKER_SYNONYMS = {
    "cleanup.policy": "log.cleanup.policy",
    "compression.type": "compression.type",
    "retention.ms": "log.retention.ms",
    "retention.bytes": "log.retention.bytes",
    "max.message.bytes": "message.max.bytes",
    "message.timestamp.type": "log.message.timestamp.type",
    "segment.bytes": "log.segment.bytes",
    "segment.ms": "log.roll.ms",
    "min.insync.replicas": "min.insync.replicas",
    "flush.messages": "log.flush.interval.messages",
    "flush.ms": "log.flush.interval.ms",
    "message.timestamp.before.max.ms": "log.message.timestamp.before.max.ms",
    "message.timestamp.after.max.ms": "log.message.timestamp.after.max.ms",
    "min.cleanable.dirty.ratio": "log.cleaner.min.cleanable.ratio",
    "min.compaction.lag.ms": "log.cleaner.min.compaction.lag.ms",
    "max.compaction.lag.ms": "log.cleaner.max.compaction.lag.ms",
    "delete.retention.ms": "log.cleaner.delete.retention.ms",
}


def _synonyms(req: Request, core, c: dict) -> tuple:
    """As Kafka: the topic's own override first, then the broker default it falls back to."""
    out = []
    if not c["is_default"]:
        out.append(
            sub(
                req, "DescribeConfigsSynonym", name=c["name"], value=c["value"], source=SOURCE_TOPIC
            )
        )
    setting = TOPIC_SETTINGS[c["name"]]
    out.append(
        sub(
            req,
            "DescribeConfigsSynonym",
            name=_BROKER_SYNONYMS.get(c["name"], c["name"]),
            value=default_value(setting, core.config),
            source=SOURCE_DEFAULT,
        )
    )
    return tuple(out)


def handle_describe_configs(core, req: Request, conn) -> bytes:
    body = req.body
    include_docs = getattr(body, "include_documentation", False)
    results = []
    for res in body.resources:
        keys = set(res.configuration_keys) if res.configuration_keys is not None else None
        entries = []
        error, message = "NONE", None
        if res.resource_type == TOPIC_RESOURCE:
            t = core.metadata.topics.get(res.resource_name)
            if t is None:
                error = "UNKNOWN_TOPIC_OR_PARTITION"
                message = f"Topic '{res.resource_name}' does not exist."
            else:
                with_synonyms = getattr(body, "include_synonyms", False)
                for c in core.topic_config(t).describe():
                    if keys is not None and c["name"] not in keys:
                        continue
                    synonyms = _synonyms(req, core, c) if with_synonyms else ()
                    entries.append(
                        sub(
                            req,
                            "DescribeConfigsResourceResult",
                            name=c["name"],
                            value=c["value"],
                            read_only=c["read_only"],
                            config_source=SOURCE_DEFAULT if c["is_default"] else SOURCE_TOPIC,
                            is_sensitive=False,
                            synonyms=synonyms,
                            config_type=c["kind"],
                            documentation=c["doc"] if include_docs else None,
                        )
                    )
        elif res.resource_type == BROKER_RESOURCE:
            if res.resource_name not in ("", str(core.node_id)):
                error = "INVALID_REQUEST"
                message = (
                    f"Unexpected broker id, expected {core.node_id} but received "
                    f"{res.resource_name}"
                )
            else:
                broker_entries = [
                    (name, str(core.config[name]), st.doc) for name, st in sorted(SETTINGS.items())
                ]
                # Not a setting: where `stratalog status` finds the admin endpoint.
                broker_entries.append(
                    ("admin.address", core.admin_address, "HTTP admin endpoint (/status)")
                )
                for name, value, doc in broker_entries:
                    if keys is not None and name not in keys:
                        continue
                    entries.append(
                        sub(
                            req,
                            "DescribeConfigsResourceResult",
                            name=name,
                            value=value,
                            read_only=True,
                            config_source=SOURCE_STATIC_BROKER,
                            is_sensitive=False,
                            synonyms=(),
                            config_type=STRING,
                            documentation=doc if include_docs else None,
                        )
                    )
        elif res.resource_type == BROKER_LOGGER_RESOURCE:
            entries = []
        else:
            error = "INVALID_REQUEST"
            message = f"Unsupported resource type {res.resource_type}"
        results.append(
            sub(
                req,
                "DescribeConfigsResult",
                error_code=err(error),
                error_message=message,
                resource_type=res.resource_type,
                resource_name=res.resource_name,
                configs=tuple(entries),
            )
        )
    return reply(req, results=tuple(results))


SET, DELETE, APPEND, SUBTRACT = 0, 1, 2, 3


def _list_change(core, topic, c, changes: dict) -> str:
    """APPEND or SUBTRACT on a list config (Kafka allows them on list configs only)."""
    setting = TOPIC_SETTINGS.get(c.name)
    if setting is None:
        raise TopicConfigError(f"Unknown topic config name: {c.name}")
    verb = "append" if c.config_operation == APPEND else "subtract"
    if setting.kind != LIST:
        raise TopicConfigError(f"Config value {verb} is not allowed for config key: {c.name}")
    current = changes.get(c.name, core.topic_config(topic).get(c.name)) or ""
    have = [v for v in current.split(",") if v]
    items = [v for v in (c.value or "").split(",") if v]
    if c.config_operation == APPEND:
        have += [v for v in items if v not in have]
    else:
        have = [v for v in have if v not in items]
    return ",".join(have)


# Kafka's replication throttles (KIP-73), which kafka-reassign-partitions --verify deletes from
# every broker and the moved topics when a reassignment is done. Stratalog has none: deleting
# them succeeds and changes nothing.
THROTTLE_CONFIGS = {
    BROKER_RESOURCE: frozenset({
        "leader.replication.throttled.rate",
        "follower.replication.throttled.rate",
        "replica.alter.log.dirs.io.max.bytes.per.second",
    }),
    TOPIC_RESOURCE: frozenset({
        "leader.replication.throttled.replicas",
        "follower.replication.throttled.replicas",
    }),
}  # fmt: skip


class _NothingToDo(Exception):
    pass


def _clears_throttles(res) -> bool:
    names = THROTTLE_CONFIGS.get(res.resource_type, frozenset())
    return bool(res.configs) and all(
        c.config_operation == DELETE and c.name in names for c in res.configs
    )


def handle_incremental_alter_configs(core, req: Request, conn):
    body = req.body
    answers: list[list] = []  # [resource, error, message]
    alters: list[tuple[list, str, dict[str, str | None]]] = []
    for res in body.resources:
        answer = [res, "NONE", None]
        answers.append(answer)
        try:
            if _clears_throttles(res):
                raise _NothingToDo()  # Stratalog has no replication throttles
            t = _altered_topic(core, res)
            changes: dict[str, str | None] = {}
            for c in res.configs:
                if c.config_operation == SET:
                    changes[c.name] = c.value
                elif c.config_operation == DELETE:
                    if c.name not in TOPIC_SETTINGS:
                        raise TopicConfigError(f"Unknown topic config name: {c.name}")
                    changes[c.name] = None
                else:
                    changes[c.name] = _list_change(core, t, c, changes)
            try:
                checked = validate_topic_configs(changes)
            except TopicConfigError as e:
                raise MetadataError("INVALID_CONFIG", str(e)) from None
            if not body.validate_only:
                alters.append((answer, t.name, checked))
        except _NothingToDo:
            pass
        except TopicConfigError as e:
            answer[1:] = ["INVALID_CONFIG", str(e)]
        except MetadataError as e:
            answer[1:] = [e.error, str(e)]
    return _altered(core, req, answers, alters)


def _altered_topic(core, res) -> TopicMeta:
    """The topic whose configs a resource of (Incremental)AlterConfigs names; MetadataError
    for another resource type or a topic that does not exist."""
    if res.resource_type != TOPIC_RESOURCE:
        raise MetadataError(
            "INVALID_REQUEST",
            "only topic configs can be altered; broker settings come from its config file",
        )
    t = core.metadata.topics.get(res.resource_name)
    if t is None:
        raise MetadataError(
            "UNKNOWN_TOPIC_OR_PARTITION", f"Topic '{res.resource_name}' does not exist."
        )
    return t


def handle_alter_configs(core, req: Request, conn):
    """The legacy AlterConfigs (API 33): a resource's configs are replaced as a whole, so a
    topic override the request does not name goes back to its default (Kafka's
    ConfigurationControlManager.legacyAlterConfigs). Topic configs only, as for
    IncrementalAlterConfigs."""
    body = req.body
    answers: list[list] = []
    alters: list[tuple[list, str, dict[str, str | None]]] = []
    for res in body.resources:
        answer = [res, "NONE", None]
        answers.append(answer)
        try:
            if res.resource_type == BROKER_LOGGER_RESOURCE:
                raise MetadataError(
                    "INVALID_REQUEST",
                    "AlterConfigs is deprecated and does not support the resource type "
                    "BROKER_LOGGER",
                )
            t = _altered_topic(core, res)
            wanted: dict[str, str | None] = {}
            for c in res.configs:
                if c.value is None:
                    raise MetadataError(
                        "INVALID_REQUEST", f"Null value not supported for topic configs: {c.name}"
                    )
                wanted[c.name] = c.value
            try:
                checked = validate_topic_configs(wanted)
            except TopicConfigError as e:
                raise MetadataError("INVALID_CONFIG", str(e)) from None
            # Overrides not named go back to their defaults.
            checked.update({k: None for k in t.configs if k not in checked})
            if not body.validate_only:
                alters.append((answer, t.name, checked))
        except MetadataError as e:
            answer[1:] = [e.error, str(e)]
    return _altered(core, req, answers, alters)


def _altered(core, req: Request, answers: list[list], alters: list) -> bytes | Awaitable[bytes]:
    """Apply the validated config changes (in a cluster through etcd, from where every broker
    takes them) and answer each resource."""

    def respond() -> bytes:
        return reply(
            req,
            responses=tuple(
                sub(
                    req,
                    "AlterConfigsResourceResponse",
                    error_code=err(error),
                    error_message=message,
                    resource_type=res.resource_type,
                    resource_name=res.resource_name,
                )
                for res, error, message in answers
            ),
        )

    pending = [
        (answer, core.alter_topic_configs(name, changes)) for answer, name, changes in alters
    ]
    if all(done is None for _answer, done in pending):
        return respond()

    async def in_cluster() -> bytes:
        for answer, done in pending:
            if done is not None and not await done:
                answer[1:] = [
                    "UNKNOWN_TOPIC_OR_PARTITION",
                    f"Topic '{answer[0].resource_name}' does not exist.",
                ]
        return respond()

    return in_cluster()


__all__ = [
    "NONE",
    "handle_alter_configs",
    "handle_create_partitions",
    "handle_create_topics",
    "handle_delete_topics",
    "handle_describe_configs",
    "handle_incremental_alter_configs",
]
