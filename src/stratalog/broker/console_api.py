"""The web console inside the broker: its ``ConsoleService`` (console/service.py) over a
``WireClient`` whose requests go to this broker's own handlers in-process, as the console's
user, instead of over a socket.

A request is built and its answer decoded exactly as over TCP; in between, ``dispatch`` (with
the authorizer's checks in front of every handler when it is on) runs on the broker's event loop
with a caller that stands for the connection: the principal of the HTTP basic credential the
admin endpoint checked (``User:ANONYMOUS`` without one) and the peer's address. So the console
reads and changes what that user may, and nothing the Kafka API would refuse them.

The /status document, the metrics and the record browser's reads come from the broker's state
directly: ``status(core)`` and each partition's ``read`` (whole stored batches, cold tier
included) on the event loop, with READ on the topic checked as a Fetch would.

In a cluster without security the requests for other brokers (and the reads of partitions this
one does not hold) go to them over TCP; with security on the console answers for what this
broker holds (``InBrokerClient``), and ``stratalog console --bootstrap``, which logs in to each
broker with ``--command-config``, shows the rest.
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
from collections.abc import Callable
from typing import Any, TypeVar

from prometheus_client import generate_latest

from stratalog.client.connection import Address
from stratalog.client.errors import WireError
from stratalog.client.wire import WireClient
from stratalog.console.service import ConsoleService
from stratalog.protocol import codec
from stratalog.protocol.connection import Request
from stratalog.security.acls import Operation, ResourceType
from stratalog.storage.partition import FileSlice

CALL_TIMEOUT_S = 30.0
NOT_HELD = 6  # NOT_LEADER_OR_FOLLOWER
T = TypeVar("T")


class Caller:
    """What the handlers see of the connection a request came on."""

    listener = None  # the broker's advertised address answers Metadata

    def __init__(self, principal: str, peer: str) -> None:
        self.principal = principal
        self.peer = peer

    def mute(self, _seconds: float) -> None:
        pass

    def abort(self) -> None:
        pass


class LoopbackConnection:
    """A ``BrokerConnection`` to the broker this runs in: requests from a thread, dispatched
    on the broker's loop."""

    is_open = True

    def __init__(self, address: Address, dispatch, loop, caller: Caller) -> None:
        self.address = address
        self._dispatch = dispatch
        self._loop = loop
        self._caller = caller
        self._ids = itertools.count(1)

    def open(self) -> None:
        return None

    def close(self) -> None:
        pass

    def request(self, api_key: int, version: int, body: Any) -> Any:
        cid = next(self._ids)
        req = Request(api_key, version, cid, "stratalog-console", body, 0)
        frame = on_loop(self._loop, lambda: self._answer(req))
        _cid, resp = codec.decode_response(api_key, version, frame[4:])
        return resp

    async def _answer(self, req: Request) -> bytes:
        answer = self._dispatch(req, self._caller)
        if inspect.isawaitable(answer):
            answer = await answer
        if isinstance(answer, list | tuple):
            answer = b"".join(bytes(p) for p in answer)
        return bytes(answer)


class InBrokerClient(WireClient):
    """A WireClient whose connection to this broker is the loopback one. In a cluster without
    security its connections to the other brokers are ordinary ones (every client there is
    ``User:ANONYMOUS`` anyway); with security on, the console has no credential of its user to
    log in to them with, so every request stays here and what another broker answers for
    (a partition it leads, a group it coordinates) is answered NOT_LEADER_OR_FOLLOWER or
    NOT_COORDINATOR, at once."""

    def __init__(self, core, dispatch, loop, caller: Caller) -> None:
        self._home_address = (core.advertised_host, core.advertised_port)
        self._only_here = core.config.secured
        super().__init__(
            f"{core.advertised_host}:{core.advertised_port}",
            client_id="stratalog-console",
            leader_wait=0.0 if self._only_here else 5.0,
        )
        self._loopback = (dispatch, loop, caller)

    def _new_connection(self, addr: Address):
        if self._only_here or tuple(addr) == self._home_address:
            return LoopbackConnection(addr, *self._loopback)
        return super()._new_connection(addr)


def on_loop(loop, call: Callable[[], Any]) -> Any:
    """Run ``call`` (a function, or one returning a coroutine) on the broker's loop from a
    thread, and return its result."""

    async def run():
        result = call()
        return await result if inspect.isawaitable(result) else result

    return asyncio.run_coroutine_threadsafe(run(), loop).result(CALL_TIMEOUT_S)


def service(core, dispatch, loop, principal: str, peer: str) -> ConsoleService:
    """The console service of one HTTP request, as ``principal``, for a thread."""
    from stratalog.broker.admin_http import status, update_scraped_metrics

    caller = Caller(principal, peer)

    def read_batches(topic: str, partition: int, offset: int, max_bytes: int) -> bytes:
        try:
            parts = on_loop(loop, lambda: _read(core, caller, topic, partition, offset, max_bytes))
        except WireError as e:
            if e.error_code != NOT_HELD or core.config.secured:
                raise
            return svc.fetch_batches(topic, partition, offset, max_bytes)  # from its leader
        try:
            return b"".join(p.read() if isinstance(p, FileSlice) else p for p in parts)
        finally:
            loop.call_soon_threadsafe(_release, parts)

    def metrics_text() -> str:
        on_loop(loop, lambda: update_scraped_metrics(core))
        return generate_latest().decode()

    svc = ConsoleService(
        InBrokerClient(core, dispatch, loop, caller),
        status=lambda: on_loop(loop, lambda: status(core)),
        metrics_text=metrics_text,
        read_batches=read_batches,
    )
    return svc


def _read(core, caller: Caller, topic: str, partition: int, offset: int, max_bytes: int):
    """Whole stored batches of a partition from ``offset`` (on the loop), if the caller may
    READ the topic, as a Fetch checks."""
    authorizer = core.authorizer
    if authorizer is not None and not authorizer.authorize(
        caller.principal, caller.peer, Operation.READ, ResourceType.TOPIC, topic
    ):
        raise WireError(f"{caller.principal} may not READ topic {topic!r}", 29)
    p = core.partition(topic, partition)
    if p is None:
        if core.partition_exists(topic, partition):
            raise WireError(f"{topic}-{partition} is not held by this broker", NOT_HELD)
        raise WireError(f"{topic}-{partition} does not exist", 3)
    result = p.read(offset, max_bytes)
    # Memory parts (the tail cache) are copied here, on the loop; file slices are read by the
    # caller's thread and released on the loop after.
    return [bytes(x) if not isinstance(x, FileSlice) else x for x in result.parts]


def _release(parts: list) -> None:
    for p in parts:
        if isinstance(p, FileSlice):
            p.release()
