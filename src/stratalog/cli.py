"""The ``stratalog`` command: serve a broker, manage topics, produce and consume.

Every failure is reported as one line naming the problem (no traceback) and a non-zero exit.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from stratalog.cli_client import (
    TIMEOUT,
    Bootstrap,
    CliError,
    admin_get,
    console,
    err_console,
    fail,
    use_command_config,
)
from stratalog.cli_client import admin as _admin
from stratalog.cli_client import check_reachable as _check_reachable
from stratalog.cli_client import client_config as _client_config
from stratalog.cli_client import metadata as _metadata
from stratalog.cli_client import result as _result
from stratalog.cli_client import security as _security
from stratalog.cli_groups import configs_app, groups_app

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Stratalog: a Kafka-compatible, tiered stream store.",
)
topics_app = typer.Typer(no_args_is_help=True, help="Create, list, describe and delete topics.")
app.add_typer(topics_app, name="topics")
cluster_app = typer.Typer(
    no_args_is_help=True, help="A local cluster (etcd and brokers on 127.0.0.1) to try things."
)
app.add_typer(cluster_app, name="cluster")
app.add_typer(groups_app, name="groups")
app.add_typer(configs_app, name="configs")


# Piped or captured output has no terminal width; rich would then squeeze tables into 80 columns
# and cut topic names and times short.
@app.callback()
def _options(
    command_config: Annotated[
        Path | None,
        typer.Option(
            "--command-config",
            envvar="STRATALOG_COMMAND_CONFIG",
            help="Kafka client properties (security.protocol, sasl.*, ssl.*) for the client "
            "commands, as Kafka's tools take them.",
        ),
    ] = None,
) -> None:
    if command_config is not None:
        use_command_config(command_config)


def _parse_pairs(pairs: list[str], what: str) -> dict[str, str]:
    out = {}
    for item in pairs:
        if "=" not in item:
            fail(f"{what} {item!r} is not of the form key=value")
        k, v = item.split("=", 1)
        out[k.strip()] = v.strip()
    return out


# -- serve ---------------------------------------------------------------------------------------
@app.command()
def serve(
    data_dir: Annotated[Path, typer.Option("--data-dir", "-d", help="Where data lives.")],
    port: Annotated[
        int | None,
        typer.Option(help="Kafka listener port (0: any free port; default 9092)."),
    ] = None,
    host: Annotated[str | None, typer.Option(help="Address to bind (default 127.0.0.1).")] = None,
    config: Annotated[
        Path | None, typer.Option("--config", "-c", help="TOML settings file.")
    ] = None,
    set_: Annotated[list[str], typer.Option("--set", help="Override a setting: key=value.")] = [],  # noqa: B006
    log_level: Annotated[str, typer.Option(help="Logging level.")] = "INFO",
    node_id: Annotated[
        int | None, typer.Option("--node-id", help="This broker's id (node.id).")
    ] = None,
    etcd: Annotated[
        str | None,
        typer.Option(help="Join the cluster whose metadata is in this etcd (cluster.etcd)."),
    ] = None,
) -> None:
    """Run a broker until SIGTERM or SIGINT, then shut down cleanly."""
    from stratalog.broker import gc_policy, metrics
    from stratalog.broker.broker import BrokerService, new_event_loop
    from stratalog.config import BrokerConfig, ConfigError

    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    values: dict = _parse_pairs(set_, "--set")
    # The options win over --set and the file only when given.
    if port is not None:
        values["port"] = port
    if host is not None:
        values["host"] = host
    if node_id is not None:
        values["node.id"] = node_id
    if etcd is not None:
        values["cluster.etcd"] = etcd
    try:
        cfg = BrokerConfig(values, config)
    except ConfigError as e:
        fail(str(e))
    host, port = cfg["host"], cfg["port"]
    loop = new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        service = BrokerService(data_dir, cfg)
    except ConfigError as e:
        fail(str(e))
    where = cfg["listeners"] or f"{host}:{port}"
    stop = asyncio.Event()

    async def main() -> None:
        try:
            service.open_storage()
        except OSError as e:
            fail(f"cannot open the data directory {data_dir}: {e}")
        except ValueError as e:
            # A metadata file that does not parse (meta/cluster.json, a log's epochs.json).
            fail(
                f"cannot open the data directory {data_dir}: a damaged file ({e}); "
                f"`stratalog scrub --data-dir {data_dir}` names it"
            )
        from stratalog.cluster.errors import ClusterError

        try:
            await service.listen()
        except OSError as e:
            await service.core.close()
            fail(f"cannot listen on {where}: {e.strerror or e}")
        except ClusterError as e:
            await service.core.close()
            fail(f"cannot join the cluster: {e}")
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        gc_policy.apply(cfg["gc.freeze"], cfg["gc.young_threshold"])
        gc_policy.observe_pauses(metrics.GC_PAUSE_SECONDS.observe)
        print(f"Stratalog ready at {service.bootstrap}", flush=True)
        await stop.wait()
        logging.getLogger("stratalog").info("shutting down")
        if not await service.stop():
            # A step was given up (logged by name): threads it left behind would hold the
            # interpreter's exit forever. Nothing more is to be written; recovery has the rest.
            logging.getLogger("stratalog").error("stopped without finishing every step")
            logging.shutdown()
            os._exit(1)
        logging.getLogger("stratalog").info("stopped")

    try:
        loop.run_until_complete(main())
    finally:
        loop.close()


# -- topics --------------------------------------------------------------------------------------
@app.command()
def certs(
    out: Annotated[Path, typer.Option("--out", "-o", help="Directory to write them into.")],
    host: Annotated[
        list[str],
        typer.Option("--host", help="Another name or address for the broker's certificate."),
    ] = [],  # noqa: B006
    days: Annotated[int, typer.Option(help="Validity in days.")] = 365,
) -> None:
    """Make a test CA and certificates for TLS (broker, client, and a second CA's for negative
    tests): for trying security out, not for production (docs/security.md)."""
    from stratalog.security.certs import make_test_certificates

    if days < 1:
        fail(f"--days must be at least 1, not {days}")
    try:
        files = make_test_certificates(out, host, days)
    except OSError as e:
        fail(f"cannot write certificates into {out}: {e.strerror or e}")
    for name in ("ca.pem", "broker.pem", "client.pem", "other-ca.pem", "other-client.pem"):
        print(files[name])


@cluster_app.command("up")
def cluster_up(
    data_dir: Annotated[
        Path, typer.Option("--data-dir", "-d", help="Where etcd and brokers live.")
    ],
    brokers: Annotated[int, typer.Option(help="How many brokers.")] = 3,
    set_: Annotated[list[str], typer.Option("--set", help="A broker setting: key=value.")] = [],  # noqa: B006
    etcd_tls: Annotated[
        bool,
        typer.Option(
            "--etcd-tls",
            help="etcd over https with client certificates required (test certificates).",
        ),
    ] = False,
    certs_dir: Annotated[
        Path | None,
        typer.Option(
            "--certs",
            help="With --etcd-tls: the files of 'stratalog certs' to use (default: made in "
            "<data-dir>/certs).",
        ),
    ] = None,
) -> None:
    """Start one etcd and N brokers on 127.0.0.1, detached; print the bootstrap list."""
    from stratalog.cluster.errors import ClusterError
    from stratalog.cluster.local_cluster import STATE_FILE, LocalCluster

    if brokers < 1:
        fail(f"--brokers must be at least 1, not {brokers}")
    if (data_dir / STATE_FILE).exists():
        fail(f"a cluster is already up in {data_dir}: stop it with 'stratalog cluster down'")
    if certs_dir is not None and not etcd_tls:
        fail("--certs goes with --etcd-tls")
    files = (
        _etcd_certs(certs_dir or data_dir / "certs", made=certs_dir is None) if etcd_tls else None
    )
    cluster = LocalCluster(data_dir, brokers, _parse_pairs(set_, "--set"), etcd_certs=files)
    try:
        cluster.start()
    except ClusterError as e:
        fail(f"cannot start the cluster: {e}")
    print(f"etcd at {cluster.etcd.endpoint}")
    for b in cluster.brokers:
        print(f"broker {b.node_id} at {b.bootstrap} (pid {b.pid}, log {b.log_path})")
    print(f"bootstrap: {cluster.bootstrap}")


def _etcd_certs(where: Path, made: bool) -> dict[str, Path]:
    """The test certificates for --etcd-tls: those in ``where``, made there if ``made`` and
    absent."""
    from stratalog.security.certs import make_test_certificates

    names = ("ca.pem", "broker.crt", "broker.key", "broker.pem")
    files = {name: where / name for name in names}
    if all(f.is_file() for f in files.values()):
        return files
    if not made:
        missing = ", ".join(n for n, f in files.items() if not f.is_file())
        fail(f"--certs {where} lacks {missing}: make them with 'stratalog certs --out {where}'")
    try:
        return make_test_certificates(where)
    except OSError as e:
        fail(f"cannot write certificates into {where}: {e.strerror or e}")


@cluster_app.command("down")
def cluster_down(
    data_dir: Annotated[Path, typer.Option("--data-dir", "-d", help="As given to 'cluster up'.")],
) -> None:
    """Stop the etcd and brokers that 'cluster up' started there, by PID."""
    from stratalog.cluster.errors import ClusterError
    from stratalog.cluster.local_cluster import down

    try:
        for what in down(data_dir):
            print(f"stopped {what}")
    except ClusterError as e:
        fail(str(e))


@topics_app.command("create")
def topics_create(
    name: str,
    bootstrap: Bootstrap = "127.0.0.1:9092",
    partitions: Annotated[int, typer.Option("--partitions", "-p")] = 1,
    replication_factor: Annotated[
        int, typer.Option("--replication-factor", "-r", help="Replicas (-1: the broker's default).")
    ] = -1,
    config: Annotated[list[str], typer.Option("--config", help="Topic config key=value.")] = [],  # noqa: B006
) -> None:
    """Create a topic."""
    from confluent_kafka.admin import NewTopic

    admin = _admin(bootstrap)
    fs = admin.create_topics(
        [NewTopic(name, partitions, replication_factor, config=_parse_pairs(config, "--config"))],
        request_timeout=TIMEOUT,
    )
    _result(fs[name], f"cannot create topic {name!r}")
    console.print(f"created topic {name} with {partitions} partition(s)")


@topics_app.command("list")
def topics_list(bootstrap: Bootstrap = "127.0.0.1:9092") -> None:
    """List topics."""
    md = _metadata(_admin(bootstrap), bootstrap)
    for name in sorted(md.topics):
        print(name)


@topics_app.command("describe")
def topics_describe(name: str, bootstrap: Bootstrap = "127.0.0.1:9092") -> None:
    """Show a topic's partitions, offsets and configs."""
    from confluent_kafka import Consumer, TopicPartition
    from confluent_kafka.admin import ConfigResource

    admin = _admin(bootstrap)
    md = _metadata(admin, bootstrap, name)
    t = md.topics.get(name)
    if t is None or t.error is not None:
        fail(f"topic {name!r} does not exist")
    c = Consumer(
        _client_config(bootstrap, **{"group.id": "stratalog-cli", "enable.auto.commit": False})
    )
    table = Table(title=f"topic {name} (id {t.topic_id})" if hasattr(t, "topic_id") else name)
    for col in ("partition", "leader", "start offset", "end offset"):
        table.add_column(col, justify="right")
    try:
        for pid in sorted(t.partitions):
            lo, hi = c.get_watermark_offsets(TopicPartition(name, pid), timeout=TIMEOUT)
            table.add_row(str(pid), str(t.partitions[pid].leader), str(lo), str(hi))
    finally:
        c.close()
    console.print(table)
    res = ConfigResource("topic", name)
    configs = _result(admin.describe_configs([res])[res], f"cannot describe configs of {name!r}")
    ct = Table(title="configs")
    ct.add_column("name")
    ct.add_column("value")
    ct.add_column("source")
    for k in sorted(configs):
        e = configs[k]
        ct.add_row(k, str(e.value), "default" if e.is_default else "topic")
    console.print(ct)


@topics_app.command("delete")
def topics_delete(name: str, bootstrap: Bootstrap = "127.0.0.1:9092") -> None:
    """Delete a topic and its data."""
    admin = _admin(bootstrap)  # held until the answer: a dropped client cancels its requests
    fs = admin.delete_topics([name], request_timeout=TIMEOUT)
    _result(fs[name], f"cannot delete topic {name!r}")
    console.print(f"deleted topic {name}")


# -- produce and consume ---------------------------------------------------------------------------
@app.command()
def produce(
    topic: str,
    bootstrap: Bootstrap = "127.0.0.1:9092",
    key_separator: Annotated[
        str | None, typer.Option(help="Split each line into key and value at this string.")
    ] = None,
    acks: Annotated[str, typer.Option(help="0, 1 or all.")] = "all",
) -> None:
    """Produce each line of standard input as one record (its bytes as they come)."""
    from confluent_kafka import KafkaException, Producer

    if acks not in ("0", "1", "all", "-1"):
        fail(f"--acks must be 0, 1 or all, not {acks!r}")
    _check_topic(bootstrap, topic)
    errors: list[str] = []

    def on_delivery(err, _msg) -> None:
        if err is not None:
            errors.append(err.str())

    p = Producer(_client_config(bootstrap, acks=acks, **{"linger.ms": 5}))
    n = 0
    sep = key_separator.encode() if key_separator is not None else None
    try:
        for raw in sys.stdin.buffer:  # bytes: a record holds whatever the line held
            line = raw[:-1] if raw.endswith(b"\n") else raw
            key = None
            if sep is not None and sep in line:
                key, line = line.split(sep, 1)
            p.produce(topic, value=line, key=key, on_delivery=on_delivery)
            n += 1
            p.poll(0)
    except KafkaException as e:
        p.flush(TIMEOUT)  # what was taken before the failure still goes out
        fail(f"cannot produce to {topic!r} after {n} record(s): {e.args[0].str() if e.args else e}")
    left = p.flush(TIMEOUT)
    if left:
        fail(f"{left} record(s) not acknowledged within {TIMEOUT:.0f} s")
    if errors:
        fail(f"{len(errors)} record(s) failed: {errors[0]}")
    err_console.print(f"produced {n} record(s) to {topic}")


def _check_topic(bootstrap: str, topic: str) -> None:
    md = _metadata(_admin(bootstrap), bootstrap, topic)
    t = md.topics.get(topic)
    if t is None or t.error is not None:
        fail(f"topic {topic!r} does not exist (create it with: stratalog topics create {topic})")


@app.command()
def consume(
    topic: str,
    bootstrap: Bootstrap = "127.0.0.1:9092",
    from_beginning: Annotated[bool, typer.Option("--from-beginning")] = False,
    group: Annotated[str | None, typer.Option(help="Consumer group (commits offsets).")] = None,
    max_messages: Annotated[int | None, typer.Option(help="Stop after this many.")] = None,
    timeout: Annotated[
        float, typer.Option(help="Stop after this many idle seconds (0: keep waiting).")
    ] = 0.0,
    print_key: Annotated[bool, typer.Option("--print-key")] = False,
) -> None:
    """Print records of a topic, one per line."""
    import time
    import uuid

    from confluent_kafka import Consumer

    _check_topic(bootstrap, topic)
    c = Consumer(
        _client_config(
            bootstrap,
            **{
                "group.id": group or f"stratalog-console-{uuid.uuid4()}",
                "auto.offset.reset": "earliest" if from_beginning else "latest",
                "enable.auto.commit": group is not None,
            },
        )
    )
    c.subscribe([topic])
    n = 0
    last = time.monotonic()
    try:
        while max_messages is None or n < max_messages:
            m = c.poll(0.5)
            if m is None:
                if timeout and time.monotonic() - last > timeout:
                    break
                continue
            if m.error():
                if m.error().fatal():
                    fail(f"consumer failed: {m.error().str()}")
                continue
            last = time.monotonic()
            value = (m.value() or b"").decode("utf-8", "replace")
            if print_key:
                print(f"{(m.key() or b'').decode('utf-8', 'replace')}\t{value}", flush=True)
            else:
                print(value, flush=True)
            n += 1
    except KeyboardInterrupt:
        pass
    finally:
        c.close()
    err_console.print(f"consumed {n} record(s)")


# -- replay --------------------------------------------------------------------------------------
@app.command()
def replay(
    topic: str,
    from_: Annotated[str, typer.Option("--from", help="Start time: ISO-8601 or epoch ms.")],
    to: Annotated[str, typer.Option("--to", help="End time (exclusive).")],
    bootstrap: Bootstrap = "127.0.0.1:9092",
    lateness_ms: Annotated[int, typer.Option(help="How late a record may arrive.")] = 0,
    limit: Annotated[int | None, typer.Option(help="Print at most this many.")] = None,
) -> None:
    """Print a topic's records between two times, in event-time order, as JSON lines."""
    import json

    from stratalog.client.replay import replay_table
    from stratalog.client.wire import WireError

    if lateness_ms < 0:
        fail(f"--lateness-ms must be 0 or more, not {lateness_ms}")
    if limit is not None and limit < 0:
        fail(f"--limit must be 0 or more, not {limit}")
    _check_reachable(bootstrap)
    try:
        table = replay_table(
            bootstrap, topic, from_, to, lateness_ms=lateness_ms, security=_security()
        )
    except (ValueError, WireError) as e:
        fail(str(e))
    n = 0
    for batch in table.to_batches(max_chunksize=10_000):
        for r in batch.to_pylist():
            if limit is not None and n >= limit:
                break
            print(
                json.dumps(
                    {
                        "timestamp": r["timestamp"].isoformat(),
                        "partition": r["partition"],
                        "offset": r["offset"],
                        "key": None if r["key"] is None else r["key"].decode("utf-8", "replace"),
                        "value": None
                        if r["value"] is None
                        else r["value"].decode("utf-8", "replace"),
                    }
                ),
                flush=False,
            )
            n += 1
    sys.stdout.flush()
    err_console.print(f"{n} record(s) of {table.num_rows} between {from_} and {to}")


# -- status --------------------------------------------------------------------------------------
def _admin_status(admin, bootstrap: str) -> dict | None:
    """The broker's /status document, found through its admin.address config (None if the
    broker has no admin endpoint, e.g. it is not Stratalog)."""
    import json

    from confluent_kafka.admin import ConfigResource

    md = _metadata(admin, bootstrap)
    node = next(iter(md.brokers))
    res = ConfigResource("broker", str(node))
    try:
        configs = admin.describe_configs([res])[res].result(timeout=TIMEOUT)
    except Exception:
        return None
    entry = configs.get("admin.address")
    if entry is None or not entry.value:
        return None
    return json.loads(admin_get(entry.value, "/status"))


def _when(ms: int | None) -> str:
    if ms is None:
        return "-"
    import datetime

    return datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC).strftime("%Y-%m-%d %H:%M:%S")


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


@app.command()
def status(
    bootstrap: Bootstrap = "127.0.0.1:9092",
    as_json: Annotated[bool, typer.Option("--json", help="Print the raw status document.")] = False,
) -> None:
    """Show the broker, each topic per tier (bytes, segments, time range), migration, groups."""
    import json

    admin = _admin(bootstrap)
    doc = _admin_status(admin, bootstrap)
    if doc is None:
        fail(f"the broker at {bootstrap} has no Stratalog admin endpoint (admin.address)")
    if as_json:
        print(json.dumps(doc, indent=1))
        return
    b, tiers, mig = doc["broker"], doc["tiers"], doc["migration"]
    console.print(
        f"broker {b['node_id']} at {b['bootstrap']}, up {b['uptime_s']:.0f} s, "
        f"fsync={b['fsync']}, layout={b['layout']}"
    )
    disk = doc.get("disk")
    if disk and disk["produce_refused"]:
        console.print(
            f"[red]disk {disk['path']}: {_size(disk['free_bytes'])} free, under "
            f"storage.min_free_bytes {_size(disk['min_free_bytes'])}: produce refused[/red]"
        )
    elif disk:
        console.print(f"disk {disk['path']}: {_size(disk['free_bytes'])} free")
    log_dir = (disk or {}).get("log_dir")
    if log_dir and log_dir["state"] != "online":
        console.print(f"[red]log dir {doc['tiers']['hot']['path']}: {log_dir['state']}[/red]")
        for name, x in sorted(log_dir["not_online"].items()):
            console.print(f"[red]  virtual log {name}: {x['state']}: {x['error']}[/red]")
    hot = tiers["hot"]
    cap = f" of {_size(hot['capacity'])}" if hot["capacity"] else ""
    console.print(f"hot tier {hot['path']}: {_size(hot['used'])}{cap} in use")
    if tiers["cold"]:
        cold = tiers["cold"]
        state = f"[red]unavailable: {cold['error']}[/red]" if cold["error"] else "ok"
        console.print(f"cold tier {cold['location']}: {state}")
        spill = ", [yellow]hot tier full: writing to the cold tier[/yellow]"
        console.print(
            f"migration: backlog {_size(mig['backlog_bytes'])}, "
            f"{_size(mig['rate_bytes_per_sec'])}/s over the last minute, "
            f"{mig['migrated_segments']} segment(s) / {_size(mig['migrated_bytes'])} moved"
            + (spill if mig["spilling_to_cold"] else "")
        )
    else:
        console.print("cold tier: none configured")
    table = Table()
    for col in ("topic", "tier", "bytes", "segments", "chunks", "oldest", "newest", "offsets"):
        table.add_column(col, no_wrap=col in ("oldest", "newest"))
    for name, t in sorted(doc["topics"].items()):
        span = f"{sum(t['log_start_offsets'])}..{sum(t['log_end_offsets'])}"
        for tier in ("hot", "cold"):
            x = t[tier]
            table.add_row(
                name if tier == "hot" else "",
                tier,
                _size(x["bytes"]),
                str(x["segments"]),
                str(x["chunks"]),
                _when(x["oldest_timestamp"]),
                _when(x["newest_timestamp"]),
                span if tier == "hot" else "",
            )
    console.print(table)
    groups = _result(admin.list_consumer_groups(request_timeout=TIMEOUT), "cannot list groups")
    if groups.valid:
        gt = Table(title="consumer groups")
        gt.add_column("group")
        gt.add_column("state")
        for g in sorted(groups.valid, key=lambda g: g.group_id):
            gt.add_row(g.group_id, str(g.state.name if g.state else ""))
        console.print(gt)


# -- console -------------------------------------------------------------------------------------
@app.command("console")
def console_(
    bootstrap: Bootstrap = "127.0.0.1:9092",
    host: Annotated[str, typer.Option(help="Address to serve the console on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to serve the console on (0: any).")] = 8080,
) -> None:
    """Serve the web console of a remote broker or cluster on a local port (a broker serves
    its own on its admin endpoint: docs/console.md)."""
    from stratalog.client.errors import WireError
    from stratalog.console import remote

    _check_reachable(bootstrap)

    def ready(url: str) -> None:
        console.print(f"Stratalog console of {bootstrap} at {url}", highlight=False)
        sys.stdout.flush()

    try:
        asyncio.run(remote.serve(bootstrap, host, port, ready))
    except WireError as e:
        fail(f"cannot describe the cluster at {bootstrap}: {e}")
    except OSError as e:
        fail(f"cannot serve on {host}:{port}: {e.strerror or e}")


# -- scrub ---------------------------------------------------------------------------------------
@app.command()
def scrub(
    data_dir: Annotated[Path, typer.Option("--data-dir", "-d", help="The broker's data.")],
    config: Annotated[
        Path | None,
        typer.Option("--config", "-c", help="The broker's TOML settings (where its tiers are)."),
    ] = None,
    set_: Annotated[list[str], typer.Option("--set", help="Override a setting: key=value.")] = [],  # noqa: B006
    as_json: Annotated[bool, typer.Option("--json", help="Print the findings as JSON.")] = False,
) -> None:
    """Check every CRC of every file of both tiers, read-only; exit 1 if anything is damaged.

    Refuses a data directory a running broker holds (stop it first)."""
    import json

    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn

    from stratalog.config import BrokerConfig, ConfigError
    from stratalog.storage import scrub as scrubbing
    from stratalog.storage.log_store import DataDirInUse, data_dir_lock

    try:
        cfg = BrokerConfig(_parse_pairs(set_, "--set"), config)
    except ConfigError as e:
        fail(str(e))
    if cfg["tiers.cold.url"]:
        fail("scrub reads a local cold tier only (tiers.cold.path), not tiers.cold.url")
    hot = Path(cfg["tiers.hot.path"]) if cfg["tiers.hot.path"] else data_dir / "logs"
    cold = Path(cfg["tiers.cold.path"]) if cfg["tiers.cold.path"] else None
    if not data_dir.is_dir():
        fail(f"{data_dir} is not a directory")
    if not hot.is_dir():
        fail(f"{hot} is not a hot tier (no such directory)")
    try:
        lock = data_dir_lock(hot, shared=True)
    except DataDirInUse:
        fail(
            f"{data_dir} is held by a running broker: stop it, then scrub (a log being "
            "appended to would read as damaged)"
        )
    except OSError as e:
        fail(f"cannot lock {hot}: {e.strerror or e}")
    # Recovery's scan, which scrub reuses, logs each damaged range it steps over: the table
    # below reports them instead.
    logging.getLogger("stratalog.storage.recovery").setLevel(logging.CRITICAL)
    try:
        plan = scrubbing.plan(data_dir, hot, cold)
        total = plan.total_bytes()
        with Progress(
            TextColumn("[bold]scrub[/bold] {task.description}"),
            BarColumn(),
            DownloadColumn(),
            TimeRemainingColumn(),
            console=err_console,
            transient=True,
            disable=as_json or not err_console.is_terminal,
        ) as bar:
            task = bar.add_task("", total=total)

            def progress(path: str, done: int) -> None:
                bar.update(task, advance=done, description=Path(path).name)

            findings = scrubbing.run(plan, progress)
    finally:
        os.close(lock)
    bad = [f for f in findings if f.status != scrubbing.OK]
    if as_json:
        print(json.dumps({"files": [f.to_json() for f in findings], "damaged": len(bad)}, indent=1))
    else:
        table = Table()
        for col in ("file", "kind", "status", "detail"):
            table.add_column(col)
        colors = {scrubbing.OK: "green", scrubbing.DAMAGED: "red", scrubbing.UNREADABLE: "red"}
        for f in findings:
            name = os.path.relpath(f.path, data_dir) if f.path.startswith(str(data_dir)) else f.path
            status = f"[{colors[f.status]}]{f.status}[/]"
            detail = f.detail + (
                " at " + ", ".join(f"{a}..{b}" for a, b in f.ranges[:4]) if f.ranges else ""
            )
            table.add_row(escape(name), f.kind, status, escape(detail))
        console.print(table)
        console.print(
            f"{len(findings)} files, {_size(total)}: "
            + (f"[red]{len(bad)} damaged[/red]" if bad else "[green]no damage[/green]")
        )
    if bad:
        raise typer.Exit(1)


# -- bench ---------------------------------------------------------------------------------------
@app.command()
def bench(
    workloads: Annotated[
        list[str] | None,
        typer.Argument(help="Workload names in bench/workloads/ or TOML files (default: all)."),
    ] = None,
    target: Annotated[
        list[str],
        typer.Option("--target", "-t", help="Run only these targets (name or kind); repeatable."),
    ] = [],  # noqa: B006
    quick: Annotated[
        bool, typer.Option("--quick", help="The workloads' small \\[profile.quick] sizes.")
    ] = False,
    results: Annotated[
        Path | None, typer.Option("--results", "-o", help="Results directory.")
    ] = None,
    limits: Annotated[
        bool, typer.Option("--limits/--no-limits", help="Measure the disk and loopback first.")
    ] = True,
    list_: Annotated[bool, typer.Option("--list", help="List the workloads and exit.")] = False,
    runs: Annotated[
        int, typer.Option("--runs", "-n", min=1, help="Run every case this often; report medians.")
    ] = 1,
) -> None:
    """Run benchmark workloads on Stratalog and its peers; write JSON, Markdown and PNG charts."""
    import time as _time

    try:
        from stratalog.bench.suite import run_suite
        from stratalog.bench.workload import WorkloadError, find_workloads
    except ImportError as e:
        extras = "pip install 'stratalog[bench]'"
        fail(f"the benchmark needs its extras ({e.name} is missing): {extras}")

    try:
        found = find_workloads(workloads or None, "quick" if quick else "full")
    except WorkloadError as e:
        fail(str(e))
    if list_:
        for w in found:
            names = ", ".join(t.name for t in w.targets)
            console.print(f"[bold]{w.name}[/]: {w.title}  [dim]({names})[/]")
        return
    known = {t.name for w in found for t in w.targets} | {t.kind for w in found for t in w.targets}
    unknown = set(target) - known
    if unknown:
        fail(f"no target {sorted(unknown)} in these workloads (known: {sorted(known)})")
    out = results or Path("bench-results") / _time.strftime("%Y%m%d-%H%M%S")
    # Stopped by SIGTERM (a job runner, a timeout), the bench unwinds as from Ctrl-C: the same
    # finally blocks stop its brokers and load processes instead of leaving them running.
    signal.signal(signal.SIGTERM, _raise_interrupt)
    run_suite(found, out, only_targets=set(target) or None, limits=limits, quick=quick, runs=runs)


def _raise_interrupt(_signum: int, _frame: object) -> None:
    raise KeyboardInterrupt


def main() -> None:
    try:
        # Out of standalone mode typer returns an exit code instead of exiting with it (130
        # after Ctrl-C or SIGTERM, or a command's typer.Exit): pass it on.
        code = app(standalone_mode=False)
        if isinstance(code, int) and code:
            sys.exit(code)
    except CliError as e:
        err_console.print(f"[red]error:[/red] {escape(str(e))}", highlight=False, emoji=False)
        sys.exit(1)
    except (typer.Abort, KeyboardInterrupt):
        sys.exit(130)
    except Exception as e:  # usage errors and the like: one line, no traceback
        # typer vendors its own click, so match click's exceptions by shape, not by class.
        if hasattr(e, "show") and hasattr(e, "exit_code"):
            e.show()
            sys.exit(e.exit_code)
        if type(e).__name__ == "Exit" and hasattr(e, "exit_code"):
            sys.exit(e.exit_code)
        err_console.print(
            f"[red]error:[/red] {type(e).__name__}: {escape(str(e))}", highlight=False, emoji=False
        )
        sys.exit(1)


if __name__ == "__main__":
    main()
