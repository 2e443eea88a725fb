"""The console's HTTP surface: its page (``/``, console/static/) and its JSON API under
``/api/``, answered by a ``ConsoleService`` on a thread.

    GET  /api/overview                 brokers, health, tiers, migration
    GET  /api/topics                   every topic: partitions, records, bytes per tier
    GET  /api/topics/NAME              partitions (leader, replicas, ISR, offsets), configs
    GET  /api/records?topic=T&partition=P&offset=O|timestamp=MS&limit=N
    GET  /api/groups                   every consumer group with its lag
    GET  /api/groups/GROUP             members, committed offsets, lag per partition
    GET  /api/metrics                  counters and latency histograms for the charts
    POST /api/topics/create            {"name", "partitions", "replication_factor", "configs"}
    POST /api/topics/delete            {"name"}
    POST /api/groups/reset-offsets     {"group", "topic", "to": earliest|latest|offset|timestamp,
                                        "offset" | "timestamp"}

Writes take a JSON body with ``content-type: application/json`` (which a page of another site
cannot send without the browser asking first). Bad input is answered 400 with a message; a
Kafka error by its meaning: 403 not authorized, 404 unknown topic or group, 409 exists, 503
another broker answers for it, 502 the broker could not be asked.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from stratalog.client.errors import ConnectionLost, WireError
from stratalog.console.http import Answer, static
from stratalog.console.service import BadRequest, ConsoleService

log = logging.getLogger(__name__)

# Kafka error code -> HTTP status
_STATUS = {
    3: 404,  # UNKNOWN_TOPIC_OR_PARTITION
    69: 404,  # GROUP_ID_NOT_FOUND
    36: 409,  # TOPIC_ALREADY_EXISTS
    29: 403,  # TOPIC_AUTHORIZATION_FAILED
    30: 403,  # GROUP_AUTHORIZATION_FAILED
    31: 403,  # CLUSTER_AUTHORIZATION_FAILED
    17: 400,  # INVALID_TOPIC_EXCEPTION
    37: 400,  # INVALID_PARTITIONS
    38: 400,  # INVALID_REPLICATION_FACTOR
    40: 400,  # INVALID_CONFIG
    42: 400,  # INVALID_REQUEST
    44: 400,  # POLICY_VIOLATION
    1: 400,  # OFFSET_OUT_OF_RANGE
    6: 503,  # NOT_LEADER_OR_FOLLOWER: another broker answers for it (see MOVED)
    16: 503,  # NOT_COORDINATOR
}
MOVED = (
    " (another broker answers for it: open its console, or `stratalog console --bootstrap`, "
    "which asks every broker)"
)

GETS: dict[str, Callable[[ConsoleService, str, dict[str, str]], Any]] = {
    "overview": lambda s, _arg, _q: s.overview(),
    "topics": lambda s, arg, _q: s.topic(arg) if arg else s.topics(),
    "records": lambda s, _arg, q: s.records(q),
    "groups": lambda s, arg, _q: s.group(arg) if arg else s.groups(),
    "metrics": lambda s, _arg, _q: s.metrics(),
}
POSTS: dict[str, Callable[[ConsoleService, dict[str, Any]], Any]] = {
    "topics/create": ConsoleService.create_topic,
    "topics/delete": ConsoleService.delete_topic,
    "groups/reset-offsets": ConsoleService.reset_offsets,
}


def _json(status: int, doc: Any) -> Answer:
    return Answer(status, "application/json", json.dumps(doc).encode())


def _error(status: int, message: str) -> Answer:
    return _json(status, {"error": message})


async def answer(
    method: bytes,
    target: bytes,
    headers: list[tuple[bytes, bytes]],
    body: bytes,
    service: Callable[[], ConsoleService],
) -> Answer | None:
    """The answer to a request of the console (its page or its API); None for another path.
    ``service`` makes the service for one request (on the thread that uses it)."""
    url = urlsplit(target.decode("latin-1"))
    path = url.path
    if not path.startswith("/api/"):
        found = static(path) if method in (b"GET", b"HEAD") else None
        return found
    route = path[len("/api/") :]
    if method == b"GET":
        name, _, arg = route.partition("/")
        view = GETS.get(name)
        if view is None:
            return _error(404, f"no such view: /api/{route}")
        query = dict(parse_qsl(url.query, keep_blank_values=False))
        return await _run(service, lambda s: view(s, unquote(arg), query))
    if method == b"POST":
        action = POSTS.get(route)
        if action is None:
            return _error(404, f"no such action: POST /api/{route}")
        ctype = next((v for k, v in headers if k == b"content-type"), b"")
        if ctype.split(b";")[0].strip().lower() != b"application/json":
            return _error(415, "send a JSON body with content-type: application/json")
        try:
            doc = json.loads(body or b"null")
        except (ValueError, UnicodeDecodeError) as e:
            return _error(400, f"the body is not JSON: {e}")
        if not isinstance(doc, dict):
            return _error(400, "the body must be a JSON object")
        return await _run(service, lambda s: action(s, doc))
    return Answer(405, "application/json", b'{"error": "GET or POST"}', [("allow", "GET, POST")])


async def _run(service: Callable[[], ConsoleService], call: Callable[[ConsoleService], Any]):
    def work() -> Answer:
        s = None
        try:
            s = service()
            return _json(200, call(s))
        except BadRequest as e:
            return _error(400, str(e))
        except ConnectionLost as e:
            return _error(502, str(e))
        except WireError as e:
            status = _STATUS.get(e.error_code, 502)
            return _error(status, str(e) + (MOVED if status == 503 else ""))
        except Exception as e:  # a bug or a broker that does not answer: said, not dropped
            log.exception("console: %s failed", getattr(call, "__name__", "a request"))
            return _error(500, f"{type(e).__name__}: {e}")
        finally:
            if s is not None:
                s.client.close()

    return await asyncio.get_running_loop().run_in_executor(None, work)
