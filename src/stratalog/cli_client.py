"""What the ``stratalog`` client commands share: the consoles, one-line failures, and the
Kafka clients they make (librdkafka's admin client, over the security of --command-config)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

console = Console(soft_wrap=True, width=None if sys.stdout.isatty() else 250)
err_console = Console(stderr=True, soft_wrap=True)

Bootstrap = Annotated[str, typer.Option("--bootstrap", "-b", help="Broker address HOST:PORT.")]
TIMEOUT = 15.0
# The Kafka client settings of --command-config (security.protocol, sasl.*, ssl.*), for the
# client commands' connections.
client_settings: dict[str, str] = {}


class CliError(Exception):
    """A problem to report in one line."""


def fail(message: str) -> None:
    raise CliError(message)


def use_command_config(path: Path) -> None:
    """Read --command-config's Kafka client properties; a setting that cannot work fails now."""
    from stratalog.client.security import SecurityConfigError, from_config, read_properties

    try:
        settings = read_properties(str(path))
        from_config(settings)
    except SecurityConfigError as e:
        fail(str(e))
    client_settings.update(settings)


def security():
    from stratalog.client.security import from_config

    return from_config(client_settings)


def client_config(bootstrap: str, **extra) -> dict:
    """librdkafka settings for the CLI's clients: quiet (errors are reported in one line), over
    the security of --command-config."""
    from stratalog.client.security import librdkafka_settings

    check_reachable(bootstrap)
    return {
        "bootstrap.servers": bootstrap,
        "log_level": 0,
        "socket.timeout.ms": 10000,
        **librdkafka_settings(security()),
        **extra,
    }


def check_reachable(bootstrap: str) -> None:
    import socket

    from stratalog.client.wire import split_host_port

    problems = []
    for addr in bootstrap.split(","):
        hp = split_host_port(addr)
        if hp is None:
            fail(f"--bootstrap {addr!r} is not of the form HOST:PORT")
        host, port = hp
        try:
            socket.create_connection((host, port), timeout=5).close()
            return
        except OSError as e:
            problems.append(f"{addr}: {e.strerror or e}")
    fail(f"cannot reach a broker at {bootstrap} ({'; '.join(problems)})")


def admin(bootstrap: str):
    from confluent_kafka.admin import AdminClient

    return AdminClient(client_config(bootstrap))


def result(future, what: str):
    from confluent_kafka import KafkaException

    try:
        return future.result(timeout=TIMEOUT)
    except KafkaException as e:
        fail(f"{what}: {e.args[0].str() if e.args else e}")
    except TimeoutError:
        fail(f"{what}: no answer from the broker within {TIMEOUT:.0f} s")


def metadata(admin, bootstrap: str, topic: str | None = None):
    from confluent_kafka import KafkaException

    try:
        return admin.list_topics(topic=topic, timeout=TIMEOUT)
    except KafkaException as e:
        fail(f"cannot reach a broker at {bootstrap}: {e.args[0].str() if e.args else e}")


def admin_get(address: str, path: str) -> bytes:
    """GET ``path`` of a broker's admin endpoint (HOST:PORT, its ``admin.address`` config),
    with the credential of STRATALOG_ADMIN_USER and STRATALOG_ADMIN_PASSWORD if set (a secured
    broker's endpoint takes a SASL user's: docs/security.md)."""
    import base64
    import os
    import urllib.request

    request = urllib.request.Request(f"http://{address}{path}")
    user = os.environ.get("STRATALOG_ADMIN_USER")
    if user:
        token = f"{user}:{os.environ.get('STRATALOG_ADMIN_PASSWORD', '')}".encode()
        request.add_header("Authorization", "Basic " + base64.b64encode(token).decode())
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT) as r:
            return r.read()
    except OSError as e:
        hint = ""
        if getattr(e, "code", None) in (401, 403):
            hint = " (set STRATALOG_ADMIN_USER and STRATALOG_ADMIN_PASSWORD to a SASL user's)"
        fail(f"cannot read the broker's {path} from http://{address}{path}: {e}{hint}")
    raise AssertionError("unreachable")
