"""The broker's admin endpoint: ``GET /status`` (JSON), ``GET /metrics`` (Prometheus) and the
web console (``/`` and ``/api/``: console/routes.py, broker/console_api.py).

A small HTTP/1.1 server on the broker's event loop, with h11 doing the protocol
(console/http.py). ``stratalog
status`` finds it through the Kafka API (the broker's ``admin.address`` config) and prints what
``/status`` returns: per topic and per tier the bytes, segments and timestamp range, and the
migration backlog and rate.

With security on (``admin.auth``: by default when a listener is not PLAINTEXT or the authorizer
is on) every request needs HTTP basic authentication as a SASL user: a PLAIN user of
``sasl.plain.users.file`` or a SCRAM user (security/credentials.py), who with the authorizer on
must also be allowed DESCRIBE on the cluster; the console then acts as that user, every request
it makes checked by the authorizer as the Kafka API checks it. A missing or wrong credential is
answered 401, a user without that ACL 403. A credential that passed is remembered (as a SHA-256
of the header) for ``VERIFIED_S``, so a scraper does not cost a PBKDF2 per scrape.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import gc
import hashlib
import json
import logging
import time
from typing import Any

import h11
from prometheus_client import generate_latest

from stratalog.broker import console_api, metrics
from stratalog.broker.dispatch import make_dispatch
from stratalog.console import http, routes
from stratalog.security.acls import CLUSTER_NAME, Operation, ResourceType
from stratalog.security.tls import ANONYMOUS

VERIFIED_S = 60.0  # how long a credential that passed is taken without checking it again
VERIFIED_MAX = 1024  # credentials remembered at most

log = logging.getLogger(__name__)


def _tier_summary(indexes, segments: int) -> dict[str, Any]:
    nbytes = sum(ix.total_bytes() for ix in indexes)
    # From the summaries the chunk index keeps of its runs on disk: no chunk is read.
    ranges = [r for ix in indexes if (r := ix.timestamp_range()) is not None]
    return {
        "bytes": nbytes,
        "chunks": sum(len(ix) for ix in indexes),
        "segments": segments,
        "oldest_timestamp": min(r[0] for r in ranges) if ranges else None,
        "newest_timestamp": max(r[1] for r in ranges) if ranges else None,
    }


LOG_STATES = ("online", "read-only", "write-error", "failed")


def log_dir(core) -> dict[str, Any]:
    """The hot tier's log directory as its virtual logs see it: ``online`` while all take
    writes, ``read-only`` when one's last write met EROFS (a read-only remount), ``offline``
    when every log has failed, ``degraded`` otherwise; the logs that are not online, with
    their error. Reads go on in every state."""
    counts = dict.fromkeys(LOG_STATES, 0)
    troubled: dict[str, dict[str, str]] = {}
    for name, vlog in core.store.logs.items():
        state = vlog.state
        counts[state] += 1
        if state != "online":
            error = vlog.journal.failed if state == "failed" else vlog.write_error
            troubled[name] = {"state": state, "error": str(error)}
    if not troubled:
        overall = "online"
    elif counts["read-only"]:
        overall = "read-only"
    elif counts["failed"] == len(core.store.logs):
        overall = "offline"
    else:
        overall = "degraded"
    return {"state": overall, "logs": counts, "not_online": troubled}


def _update_lag_metrics(core) -> None:
    """Each committed offset's lag, set afresh at every scrape (groups and topics come and go:
    a deleted one's series goes with it)."""
    metrics.CONSUMER_GROUP_LAG.clear()
    for (group, topic, index), committed in list(core.offsets.offsets.items()):
        p = core.partition(topic, index)
        if p is not None:
            lag = max(0, p.high_watermark - committed.offset)
            metrics.CONSUMER_GROUP_LAG.labels(group, topic, str(index)).set(lag)


def _update_log_metrics(core) -> None:
    doc = log_dir(core)
    for state, n in doc["logs"].items():
        metrics.LOGS_BY_STATE.labels(state).set(n)
    metrics.LOG_DIR_STATE.set(int(doc["state"] == "online"))


def update_scraped_metrics(core) -> None:
    """The gauges set afresh at every scrape (on the event loop)."""
    _update_log_metrics(core)
    _update_lag_metrics(core)


def status(core) -> dict[str, Any]:
    """Everything ``stratalog status`` shows, as plain data."""
    store = core.store
    m = core.migrator
    topics: dict[str, Any] = {}
    for t in core.metadata.topics.values():
        parts = [store.partitions[uid] for uid in t.partitions if uid in store.partitions]
        hot_segments = {(p.vlog.name, s) for p in parts for s in p.chunks.segments()}
        cold_segments = sum(len(p.cold_segments) for p in parts)
        topics[t.name] = {
            "partitions": len(t.partitions),
            "log_start_offsets": [p.log_start_offset for p in parts],
            "log_end_offsets": [p.high_watermark for p in parts],
            "hot": _tier_summary([p.chunks for p in parts], len(hot_segments)),
            "cold": _tier_summary([p.cold for p in parts], cold_segments),
        }
    return {
        "broker": {
            "node_id": core.node_id,
            "bootstrap": f"{core.advertised_host}:{core.advertised_port}",
            "uptime_s": round(time.time() - core.started_at, 1),
            "fsync": str(core.config.fsync_policy),
            "layout": core.config["storage.layout"],
            "gc": {
                "thresholds": list(gc.get_threshold()),
                "frozen_objects": gc.get_freeze_count(),
                "collections": [g["collections"] for g in gc.get_stats()],
            },
        },
        "disk": {
            "path": str(core.disk.path),
            "free_bytes": core.disk.free,
            "min_free_bytes": core.disk.reserve,
            "produce_refused": core.disk.low,
            "log_dir": log_dir(core),
        },
        "tiers": {
            "hot": {
                "path": str(store.root),
                "capacity": core.config["tiers.hot.capacity"],
                "used": m.hot_usage(),
            },
            "cold": None
            if store.cold is None
            else {
                "location": store.cold.location,
                "error": store.cold_error,
            },
        },
        "migration": {
            "threshold": core.config["tiers.migrate.threshold"],
            "backlog_bytes": m.backlog_bytes(),
            "rate_bytes_per_sec": round(m.stats.rate(), 1),
            "migrated_bytes": m.stats.migrated_bytes,
            "migrated_segments": m.stats.migrated_segments,
            "spilling_to_cold": m.stats.spilling,
            "last_error": m.stats.last_error,
        },
        "compaction": {
            "enabled": core.config["log.cleaner.enable"],
            "cleanings": core.cleaner.stats.cleanings,
            "read_bytes": core.cleaner.stats.read_bytes,
            "written_bytes": core.cleaner.stats.written_bytes,
            "records_removed": core.cleaner.stats.records_removed,
            "discarded": core.cleaner.stats.discarded,
            "last_error": core.cleaner.stats.last_error,
        },
        "topics": topics,
    }


def needs_credentials(config) -> bool:
    """Whether the admin endpoint asks for HTTP basic authentication (``admin.auth``)."""
    mode = config["admin.auth"]
    return mode == "basic" or (mode == "auto" and config.secured)


class AdminServer:
    def __init__(self, core, host: str, port: int) -> None:
        self.core = core
        self.host = host
        self.port = port
        self._server: asyncio.AbstractServer | None = None
        self.basic = needs_credentials(core.config)
        self._verified: dict[bytes, tuple[str, float]] = {}  # header digest -> (user, until)
        # The console's in-process Kafka requests go through the same dispatch (and checks).
        self.dispatch = make_dispatch(core)

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, self.host, self.port)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await http.serve(reader, writer, self._respond)

    async def _respond(self, request: h11.Request, body: bytes, host: str) -> http.Answer:
        user = None
        if self.basic:
            refused, user = await self._refusal(request.headers, host)
            if refused is not None:
                return refused
        principal = f"User:{user}" if user else ANONYMOUS
        return await self._route(request, body, principal, host)

    async def _refusal(self, headers, host: str) -> tuple[http.Answer | None, str | None]:
        """(None, the user) if the request's basic credential is a SASL user's who may see
        the cluster; else (the answer, 401 or 403; None)."""
        header = next((v for k, v in headers if k == b"authorization"), None)
        user = await self._user(header) if header is not None else None
        if user is None:
            answer = http.text(401, "a SASL user's credential is needed (HTTP basic auth)")
            answer.headers.append(("www-authenticate", 'Basic realm="stratalog"'))
            return answer, None
        authorizer = self.core.authorizer
        if authorizer is not None and not authorizer.authorize(
            f"User:{user}", host, Operation.DESCRIBE, ResourceType.CLUSTER, CLUSTER_NAME
        ):
            return http.text(403, f"User:{user} may not DESCRIBE the cluster"), None
        return None, user

    async def _user(self, header: bytes) -> str | None:
        """The user a ``Basic`` authorization header proves, if it does."""
        digest = hashlib.sha256(header).digest()
        now = time.monotonic()
        known = self._verified.get(digest)
        if known is not None and known[1] > now:
            return known[0]
        scheme, _, token = header.partition(b" ")
        if scheme.lower() != b"basic":
            return None
        try:
            user, sep, password = (
                base64.b64decode(token.strip(), validate=True).decode().partition(":")
            )
        except (binascii.Error, UnicodeDecodeError):
            return None
        if not sep or not user:
            return None
        # (A SCRAM user's password is checked by PBKDF2 over its iterations: off the loop.)
        check = self.core.credentials.check_plain
        if not await asyncio.get_running_loop().run_in_executor(None, check, user, password):
            return None
        if len(self._verified) >= VERIFIED_MAX:
            self._verified = {d: v for d, v in self._verified.items() if v[1] > now}
            if len(self._verified) >= VERIFIED_MAX:
                self._verified.clear()
        self._verified[digest] = (user, now + VERIFIED_S)
        return user

    async def _route(
        self, request: h11.Request, body: bytes, principal: str, host: str
    ) -> http.Answer:
        path = request.target.split(b"?", 1)[0]
        if request.method == b"GET" and path == b"/status":
            doc = json.dumps(status(self.core), indent=1).encode()
            return http.Answer(200, "application/json", doc)
        if request.method == b"GET" and path == b"/metrics":
            # Rendered on a thread: pure Python over every sample (20-120 ms a scrape with 23
            # request histograms under load), which on the event loop held every request up.
            # The registry and the metrics take their own locks.
            update_scraped_metrics(self.core)
            text = await asyncio.get_running_loop().run_in_executor(None, generate_latest)
            return http.Answer(200, "text/plain; version=0.0.4", text)
        loop = asyncio.get_running_loop()
        answer = await routes.answer(
            request.method,
            request.target,
            request.headers,
            body,
            lambda: console_api.service(self.core, self.dispatch, loop, principal, host),
        )
        if answer is not None:
            return answer
        return http.text(404, "try / (the console), /status or /metrics")
