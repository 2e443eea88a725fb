"""``stratalog console --bootstrap HOST:PORT``: the web console of a remote broker or cluster,
served from here on a local port.

The same page and API as the broker's admin endpoint (console/routes.py), answered by a
``ConsoleService`` over a ``WireClient`` to the cluster (with the security of
``--command-config``), so every request goes to the broker that answers for it: partitions to
their leader, groups to their coordinator, ListGroups to every broker. Tiers, migration and the
charts' metrics come from the admin endpoint of a broker (its ``admin.address`` config), read as
``stratalog status`` reads it; without one the console shows the rest.

It has no login of its own: whoever reaches its port acts with ``--command-config``'s
credentials. It listens on 127.0.0.1 by default, and there answers only requests addressed to
a loopback name (not a page of another site whose name was made to resolve to 127.0.0.1).
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
from collections.abc import Callable

from stratalog.cli_client import CliError, admin_get, security
from stratalog.client import admin
from stratalog.client.errors import WireError
from stratalog.client.wire import WireClient
from stratalog.console import http, routes
from stratalog.console.service import ConsoleService


def admin_address(bootstrap: str) -> str | None:
    """HOST:PORT of a broker's admin endpoint, from its ``admin.address`` config."""
    with WireClient(bootstrap, security=security(), client_id="stratalog-console") as client:
        for node in admin.cluster(client).brokers:
            try:
                found = admin.configs(client, admin.BROKER_RESOURCE, str(node))
            except WireError:
                continue
            entry = found.get("admin.address")
            if entry and entry["value"]:
                return entry["value"]
    return None


def _reader(address: str | None, path: str) -> Callable[[], str | None]:
    def read() -> str | None:
        if address is None:
            return None
        try:
            return admin_get(address, path).decode()
        except CliError:
            return None  # the console shows what the Kafka API gives

    return read


def make_service(bootstrap: str, address: str | None) -> Callable[[], ConsoleService]:
    status_text = _reader(address, "/status")
    metrics_text = _reader(address, "/metrics")

    def status() -> dict | None:
        text = status_text()
        return json.loads(text) if text else None

    def make() -> ConsoleService:
        client = WireClient(bootstrap, security=security(), client_id="stratalog-console")
        return ConsoleService(client, status=status, metrics_text=metrics_text)

    return make


async def serve(bootstrap: str, host: str, port: int, ready: Callable[[str], None]) -> None:
    """Serve the console until cancelled; ``ready`` gets the URL once it listens."""
    loop = asyncio.get_running_loop()
    address = await loop.run_in_executor(None, admin_address, bootstrap)
    service = make_service(bootstrap, address)

    names: set[str] = set()

    async def respond(request, body: bytes, _peer: str) -> http.Answer:
        asked = next((v for k, v in request.headers if k == b"host"), b"").decode("latin-1")
        if names and asked not in names:
            # Served on loopback, the console acts with --command-config's credentials for
            # whoever reaches it: a page of another site whose name was made to resolve to
            # 127.0.0.1 (DNS rebinding) is not one of them.
            return http.text(421, f"this console answers to {' or '.join(sorted(names))}")
        answer = await routes.answer(request.method, request.target, request.headers, body, service)
        return answer or http.text(404, "the console is at /")

    server = await asyncio.start_server(lambda r, w: http.serve(r, w, respond), host, port)
    bound = server.sockets[0].getsockname()
    if ipaddress.ip_address(bound[0]).is_loopback:
        names.update(f"{n}:{bound[1]}" for n in (bound[0], "localhost", "127.0.0.1", "[::1]"))
    ready(f"http://{bound[0]}:{bound[1]}/")
    async with server:
        await server.serve_forever()
