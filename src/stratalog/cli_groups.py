"""``stratalog groups`` and ``stratalog configs``: consumer groups with their lag, offset resets,
and topic or broker configs, through Kafka's admin API (as kafka-consumer-groups and
kafka-configs do), so they work against any Kafka-compatible broker.

Lag is the partition's end (its high watermark, as kafka-consumer-groups shows it) minus the
group's committed offset.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

import typer
from rich.table import Table

from stratalog.cli_client import Bootstrap, admin, console, fail, result

groups_app = typer.Typer(
    no_args_is_help=True, help="Consumer groups: list, describe with lag, reset offsets, delete."
)
configs_app = typer.Typer(no_args_is_help=True, help="Describe and alter topic or broker configs.")

Group = Annotated[str, typer.Argument(help="The consumer group's id.")]


def _ends(client, partitions: list) -> dict:
    """(topic, partition) -> the partition's end offset (high watermark)."""
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import OffsetSpec

    if not partitions:
        return {}
    asked = {TopicPartition(t, p): OffsetSpec.latest() for t, p in partitions}
    out = {}
    for tp, fut in client.list_offsets(asked).items():
        out[(tp.topic, tp.partition)] = result(fut, f"the end of {tp.topic}-{tp.partition}").offset
    return out


def _committed(client, group: str) -> dict:
    """(topic, partition) -> the group's committed offset."""
    from confluent_kafka import ConsumerGroupTopicPartitions

    futures = client.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)])
    listed = result(futures[group], f"the offsets of group {group!r}")
    return {(tp.topic, tp.partition): tp.offset for tp in listed.topic_partitions if tp.offset >= 0}


@groups_app.command("list")
def groups_list(bootstrap: Bootstrap = "127.0.0.1:9092") -> None:
    """Every consumer group, with its state and protocol type."""
    client = admin(bootstrap)
    listed = result(client.list_consumer_groups(), "listing the consumer groups")
    table = Table("group", "state", "type")
    for g in sorted(listed.valid, key=lambda g: g.group_id):
        kind = getattr(g, "type", None)
        table.add_row(g.group_id, g.state.name if g.state else "", kind.name if kind else "")
    console.print(table)


@groups_app.command("describe")
def groups_describe(group: Group, bootstrap: Bootstrap = "127.0.0.1:9092") -> None:
    """A group's state and members, and per partition its committed offset, end and lag."""
    client = admin(bootstrap)
    described = result(client.describe_consumer_groups([group])[group], f"group {group!r}")
    owner = {}
    for m in described.members:
        for tp in m.assignment.topic_partitions if m.assignment else []:
            owner[(tp.topic, tp.partition)] = f"{m.client_id} ({m.host})"
    committed = _committed(client, group)
    ends = _ends(client, sorted(set(committed) | set(owner)))
    console.print(
        f"group [bold]{group}[/bold]: {described.state.name if described.state else '?'}, "
        f"{len(described.members)} member(s), assignor {described.partition_assignor or '-'}"
    )
    table = Table("topic", "partition", "committed", "end", "lag", "member")
    total = 0
    for key in sorted(ends):
        c = committed.get(key)
        lag = ends[key] - c if c is not None else None
        total += lag or 0
        table.add_row(
            key[0], str(key[1]), "-" if c is None else str(c), str(ends[key]),
            "-" if lag is None else str(lag), owner.get(key, "-"),
        )  # fmt: skip
    console.print(table)
    console.print(f"total lag: {total:,}")


@groups_app.command("reset-offsets")
def groups_reset_offsets(
    group: Group,
    topic: Annotated[str, typer.Option(help="The topic whose offsets to reset.")],
    to_earliest: Annotated[bool, typer.Option("--to-earliest")] = False,
    to_latest: Annotated[bool, typer.Option("--to-latest")] = False,
    to_offset: Annotated[int | None, typer.Option("--to-offset")] = None,
    to_datetime: Annotated[
        str | None, typer.Option("--to-datetime", help="ISO-8601; the first offset at or after.")
    ] = None,
    execute: Annotated[
        bool, typer.Option("--execute", help="Commit the new offsets (without: show the plan).")
    ] = False,
    bootstrap: Bootstrap = "127.0.0.1:9092",
) -> None:
    """Move a group's committed offsets on a topic, as kafka-consumer-groups --reset-offsets
    does: a plan first, committed with --execute while the group has no members."""
    from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition
    from confluent_kafka.admin import OffsetSpec

    given = [to_earliest, to_latest, to_offset is not None, to_datetime is not None]
    if sum(given) != 1:
        fail("give exactly one of --to-earliest, --to-latest, --to-offset, --to-datetime")
    if to_offset is not None and to_offset < 0:
        fail(f"--to-offset must be 0 or more, not {to_offset}")
    client = admin(bootstrap)
    md = _topic(client, topic)
    parts = [(topic, p) for p in sorted(md.partitions)]
    if to_offset is not None:
        target = {key: to_offset for key in parts}
    else:
        if to_earliest:
            spec = OffsetSpec.earliest()
        elif to_latest:
            spec = OffsetSpec.latest()
        else:
            try:
                when = datetime.fromisoformat(str(to_datetime))
            except ValueError:
                fail(f"--to-datetime {to_datetime!r} is not an ISO-8601 time")
            spec = OffsetSpec.for_timestamp(int(when.timestamp() * 1000))
        asked = {TopicPartition(t, p): spec for t, p in parts}
        ends = _ends(client, parts)
        target = {}
        for tp, fut in client.list_offsets(asked).items():
            off = result(fut, f"offsets of {tp.topic}-{tp.partition}").offset
            key = (tp.topic, tp.partition)
            target[key] = off if off >= 0 else ends[key]  # no record that late: the end
    committed = _committed(client, group)
    table = Table("topic", "partition", "committed", "new offset")
    for key in parts:
        c = committed.get(key)
        table.add_row(key[0], str(key[1]), "-" if c is None else str(c), str(target[key]))
    console.print(table)
    if not execute:
        console.print("a plan only: add --execute to commit it")
        return
    described = result(client.describe_consumer_groups([group])[group], f"group {group!r}")
    if described.members:
        fail(
            f"group {group!r} has {len(described.members)} active member(s): stop them first "
            "(offsets of a live group are its members' to commit)"
        )
    tps = [TopicPartition(t, p, target[(t, p)]) for t, p in parts]
    fut = client.alter_consumer_group_offsets([ConsumerGroupTopicPartitions(group, tps)])[group]
    result(fut, f"committing the offsets of group {group!r}")
    console.print(f"group {group!r}: {len(tps)} offset(s) committed")


def _topic(client, topic: str):
    md = client.list_topics(topic=topic, timeout=15)
    t = md.topics.get(topic)
    if t is None or t.error is not None or not t.partitions:
        fail(f"topic {topic!r} does not exist")
    return t


@groups_app.command("delete")
def groups_delete(group: Group, bootstrap: Bootstrap = "127.0.0.1:9092") -> None:
    """Delete a group with no members, and its committed offsets."""
    client = admin(bootstrap)
    result(client.delete_consumer_groups([group])[group], f"deleting group {group!r}")
    console.print(f"group {group!r} deleted")


def _resource(topic: str | None, broker: int | None):
    from confluent_kafka.admin import ConfigResource, ResourceType

    if (topic is None) == (broker is None):
        fail("give exactly one of --topic or --broker")
    if topic is not None:
        return ConfigResource(ResourceType.TOPIC, topic)
    return ConfigResource(ResourceType.BROKER, str(broker))


@configs_app.command("describe")
def configs_describe(
    topic: Annotated[str | None, typer.Option(help="A topic's configs.")] = None,
    broker: Annotated[int | None, typer.Option(help="A broker's configs (its node id).")] = None,
    bootstrap: Bootstrap = "127.0.0.1:9092",
) -> None:
    """Every config of a topic or broker, its value and where it comes from."""
    client = admin(bootstrap)
    res = _resource(topic, broker)
    configs = result(client.describe_configs([res])[res], f"the configs of {res.name}")
    table = Table("config", "value", "source")
    for name in sorted(configs):
        entry = configs[name]
        value = "(sensitive)" if entry.is_sensitive else str(entry.value)
        table.add_row(name, value, entry.source_name if hasattr(entry, "source_name") else "")
    console.print(table)


@configs_app.command("alter")
def configs_alter(
    topic: Annotated[str | None, typer.Option(help="A topic's configs.")] = None,
    broker: Annotated[int | None, typer.Option(help="A broker's configs (its node id).")] = None,
    set_: Annotated[list[str], typer.Option("--set", help="key=value to set; repeatable.")] = [],  # noqa: B006
    delete: Annotated[
        list[str], typer.Option("--delete", help="A key to reset to its default; repeatable.")
    ] = [],  # noqa: B006
    bootstrap: Bootstrap = "127.0.0.1:9092",
) -> None:
    """Set or reset configs of a topic or broker (IncrementalAlterConfigs)."""
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry

    if not set_ and not delete:
        fail("nothing to change: give --set key=value or --delete key")
    res = _resource(topic, broker)
    for item in set_:
        if "=" not in item:
            fail(f"--set {item!r} is not of the form key=value")
        key, value = item.split("=", 1)
        res.add_incremental_config(
            ConfigEntry(key.strip(), value.strip(), incremental_operation=AlterConfigOpType.SET)
        )
    for key in delete:
        res.add_incremental_config(
            ConfigEntry(key.strip(), None, incremental_operation=AlterConfigOpType.DELETE)
        )
    client = admin(bootstrap)
    result(client.incremental_alter_configs([res])[res], f"altering the configs of {res.name}")
    console.print(f"{res.name}: {len(set_)} set, {len(delete)} reset")
