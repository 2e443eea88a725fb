"""Running a broker: in-process (``stratalog.Broker``) or as the ``stratalog serve`` process.

``Broker`` runs the event loop on a background thread so tests and notebooks can use it as a
context manager::

    with stratalog.Broker("/tmp/data") as b:
        Producer({"bootstrap.servers": b.bootstrap}) ...
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from stratalog.broker.admin_http import AdminServer
from stratalog.broker.core import BrokerCore
from stratalog.broker.dispatch import make_dispatch, request_timers
from stratalog.broker.server import KafkaServer
from stratalog.broker.stopping import BoundedStop
from stratalog.config import BrokerConfig
from stratalog.security.listeners import PLAINTEXT, SSL, Listener
from stratalog.security.listeners import resolve as resolve_listeners

log = logging.getLogger(__name__)

STOP_STEP_S = 30.0  # the longest one step of a clean stop may take before it is given up


def new_event_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop

        return uvloop.new_event_loop()
    except ImportError:  # pragma: no cover - uvloop is a dependency, but stay runnable without
        return asyncio.new_event_loop()


def _tls_context(config: BrokerConfig, listener: Listener):
    """The TLS context of an SSL or SASL_SSL listener (None for the others). Client
    certificates are asked for on SSL listeners only, as Kafka does by default."""
    if not listener.tls:
        return None
    from stratalog.security.tls import server_context

    return server_context(config, None if listener.protocol == SSL else "none")


class BrokerService:
    """Core plus listener, started and stopped inside one event loop."""

    def __init__(self, data_dir: Path, config: BrokerConfig) -> None:
        """Raises ConfigError for listeners that cannot work (a certificate that is missing or
        does not match its key, a PLAIN users file that cannot be read)."""
        listeners = resolve_listeners(config)
        contexts = [_tls_context(config, listener) for listener in listeners]  # before any thread
        self.core = BrokerCore(data_dir, config)
        dispatch = make_dispatch(self.core)
        timers = request_timers()
        self.servers = [
            KafkaServer(
                dispatch,
                listener.host,
                listener.port,
                config["max_request_bytes"],
                timers,
                listener=listener,
                ssl_context=context,
                authenticator=self._authenticators() if listener.sasl else None,
                sasl_max_bytes=config["sasl.server.max.receive.size"],
            )
            for listener, context in zip(listeners, contexts, strict=True)
        ]
        self.server = self.servers[0]  # the inter-broker listener: the broker's own address
        self.admin: AdminServer | None = None

    def _authenticators(self):
        from stratalog.broker.api.versions import handle_api_versions
        from stratalog.security.sasl import SaslAuthenticator

        config, core = self.core.config, self.core
        mechanisms = config.sasl_mechanisms
        reauth_ms = config["connections.max.reauth.ms"]

        def api_versions(req):
            return handle_api_versions(core, req, None)

        oauth = "OAUTHBEARER" in mechanisms and config["sasl.oauthbearer.jwks.endpoint.url"]
        tokens = config.token_validator() if oauth else None
        return lambda: SaslAuthenticator(
            mechanisms, core.credentials, api_versions, reauth_ms, tokens=tokens
        )

    async def start(self) -> None:
        self.open_storage()
        await self.listen()

    def open_storage(self) -> None:
        """Load metadata and recover the logs (may raise OSError from the data directory)."""
        self.core.open()

    async def listen(self) -> None:
        """Open the Kafka listener (may raise OSError for the address) and start tending."""
        # Before any client: a legacy offsets.log is migrated into the offsets topic (durably).
        await self.core.offsets.start()
        # A cluster member answers nothing before it has joined: until then it would act as a
        # single node and take writes for logs it does not lead.
        clustered = bool(self.core.config["cluster.etcd"])
        try:
            for server in self.servers:
                await server.start(serve=not clustered)
        except BaseException:
            for server in self.servers:
                await server.stop()
            raise
        self.core.port = self.server.port
        self.core.listener = self.server.listener
        self.core.listeners = {s.listener.name: s.listener for s in self.servers if s.listener}
        if len(self.servers) > 1 or self.server.listener.protocol != PLAINTEXT:
            log.info("listening: %s", ", ".join(str(s.listener) for s in self.servers))
        if self.core.config["admin.port"] >= 0:
            self.admin = AdminServer(self.core, self.core.host, self.core.config["admin.port"])
            await self.admin.start()
            self.core.admin_address = f"{self.core.advertised_host}:{self.admin.port}"
        if clustered:
            try:
                await self.core.join_cluster()
            except BaseException:
                for server in self.servers:
                    await server.stop()
                if self.admin is not None:
                    await self.admin.stop()
                raise
            for server in self.servers:
                await server.serve()
        self.core.start_background()

    async def stop(self) -> bool:
        """A clean stop, bounded step by step; False if a step was given up (logged)."""
        stop = BoundedStop(STOP_STEP_S)
        for server in self.servers:
            await stop.step(f"the Kafka listener {server.listener.name}", server.stop())
        if self.admin is not None:
            await stop.step("the admin endpoint", self.admin.stop())
        return await self.core.close(STOP_STEP_S) and stop.complete

    @property
    def bootstrap(self) -> str:
        from stratalog.client.wire import join_host_port

        return join_host_port(self.core.advertised_host, self.core.advertised_port)

    @property
    def bootstraps(self) -> dict[str, str]:
        """Listener name -> the address clients are told for it."""
        from stratalog.client.wire import join_host_port

        return {
            s.listener.name: join_host_port(*s.listener.endpoint)
            for s in self.servers
            if s.listener is not None
        }


class Broker:
    """An embedded broker on its own thread and event loop; a context manager."""

    def __init__(
        self,
        data_dir: str | Path,
        port: int = 0,
        host: str = "127.0.0.1",
        config: dict[str, Any] | None = None,
        config_file: str | Path | None = None,
    ) -> None:
        values = dict(config or {})
        values.setdefault("port", port)
        values.setdefault("host", host)
        self.config = BrokerConfig(values, Path(config_file) if config_file else None)
        self.data_dir = Path(data_dir)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self.service: BrokerService | None = None

    def start(self) -> Broker:
        started: Future[None] = Future()
        self._loop = new_event_loop()

        def run() -> None:
            assert self._loop is not None
            asyncio.set_event_loop(self._loop)
            try:
                self.service = BrokerService(self.data_dir, self.config)
                self._loop.run_until_complete(self.service.start())
            except BaseException as e:
                self._close_after_failed_start()
                started.set_exception(e)
                return
            started.set_result(None)
            self._loop.run_forever()

        self._thread = threading.Thread(target=run, name="stratalog-broker", daemon=True)
        self._thread.start()
        started.result(timeout=60)
        return self

    def _close_after_failed_start(self) -> None:
        # As `stratalog serve` does: what was opened is closed, and the loop with it, so that
        # stop() afterwards has nothing to wait for (it used to wait for a loop never run).
        assert self._loop is not None
        try:
            if self.service is not None:
                with contextlib.suppress(Exception):
                    self._loop.run_until_complete(self.service.core.close())
        finally:
            self._loop.close()
            self._loop = None

    def call(self, fn, *args) -> Any:
        """Run ``fn(*args)`` on the broker's loop and return its result (for tests)."""
        assert self._loop is not None

        async def run():
            r = fn(*args)
            if asyncio.iscoroutine(r):
                r = await r
            return r

        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(timeout=60)

    def stop(self) -> None:
        if self._loop is None or self.service is None:
            return
        try:
            asyncio.run_coroutine_threadsafe(self.service.stop(), self._loop).result(timeout=60)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            if self._thread is not None:
                self._thread.join(timeout=10)
            self._loop.close()
            self._loop = None

    @property
    def bootstrap(self) -> str:
        assert self.service is not None, "broker not started"
        return self.service.bootstrap

    @property
    def bootstraps(self) -> dict[str, str]:
        """Listener name -> its address (``bootstraps["SASL_SSL"]``)."""
        assert self.service is not None, "broker not started"
        return self.service.bootstraps

    @property
    def core(self) -> BrokerCore:
        assert self.service is not None
        return self.service.core

    def __enter__(self) -> Broker:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
