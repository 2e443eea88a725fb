"""The cluster's metadata store: a thin asyncio layer over etcd v3.

This is the only module that imports ``etcd3aio`` (pinned exactly, pre-1.0), so a change of
client touches one file. Keys are ``str``, values are opaque ``bytes`` (callers put JSON), and
every failure surfaces as :class:`ClusterError`.

Writes are sent once, never retried here: a retried transaction whose first attempt did apply
would fail its own guard and report ``False`` for a write that happened. So a ``ClusterError``
from a write means its outcome is unknown; re-read before trying again. Reads are retried on
transient gRPC errors.

Leases are kept alive by a task on the caller's event loop, not a thread, so a loop that stalls
past the TTL loses its lease; etcd then deletes the keys under it (the point of a broker's
registration). Being told late is still possible, so writes that depend on holding a lease must
be guarded by revisions (``replace``/``txn``), not by the lease alone.

An ``https://`` etcd is reached over TLS with the CA and client certificate of an
:class:`~stratalog.cluster.etcd_tls.EtcdTls`; a TLS mismatch found while connecting (either side
refusing the other's certificate, or one side not speaking TLS) is reported at once, named,
instead of being retried until the timeout as an unreachable etcd would be.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import AsyncIterator, Awaitable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar
from urllib.parse import urlsplit

import grpc
import grpc.aio
from etcd3aio import (
    Etcd3Client,
    EtcdConnectionError,
    EtcdError,
    SortOrder,
    SortTarget,
    prefix_range_end,
)
from etcd3aio._protobuf import (
    Compare,
    DeleteRangeRequest,
    PutRequest,
    RequestOp,
    WatchCreateRequest,
    WatchRequest,
    WatchStub,
)
from etcd3aio.kv import KVService
from etcd3aio.lease import LeaseService

from stratalog.cluster.errors import ClusterError
from stratalog.cluster.etcd_tls import TRUSTSTORE, EtcdTls, diagnose

log = logging.getLogger(__name__)

T = TypeVar("T")

_PING_KEY = b"/stratalog/.ping"  # read (never written) to check that etcd answers
_DELETE = 1  # mvccpb.Event.EventType.DELETE
_WATCH_BACKOFF = (0.25, 5.0)  # first and longest pause before re-creating a broken watch
_TRANSIENT = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
_FAILURES = (EtcdError, grpc.aio.AioRpcError, TimeoutError)


@dataclass(frozen=True, slots=True)
class WatchEvent:
    key: str
    value: bytes | None  # None: the key was deleted (or its lease ended)
    mod_revision: int  # the revision of the change (of the deletion, for a delete)


class Lease:
    """An etcd lease kept alive from the event loop every TTL/3 (see ``EtcdStore.grant_lease``).

    ``lost`` is set once the lease can no longer be counted on: etcd said it is gone, no
    keep-alive got through within the TTL (as measured here, from the send time of the last
    acknowledged one, so never later than etcd's own expiry), it was revoked, or the store
    was closed. After that it is never renewed again; take a new lease.
    """

    def __init__(self, store: EtcdStore, lease_id: int, ttl: int, granted_at: float) -> None:
        self.id = lease_id
        self.ttl = ttl  # seconds, as granted (etcd raises small TTLs to its minimum, 2 s)
        self.lost = asyncio.Event()
        self._store = store
        self._deadline = granted_at + ttl  # monotonic; granted_at is before the grant was sent
        self._task = asyncio.create_task(self._keep_alive(), name=f"etcd-lease-{lease_id:x}")

    @property
    def held(self) -> bool:
        """Not lost and not past its deadline: right after a stall, before the keep-alive task
        has run and set ``lost``, this is already False."""
        return not self.lost.is_set() and time.monotonic() < self._deadline

    async def revoke(self) -> None:
        """Stop keeping it alive and revoke it: etcd deletes its keys now."""
        await self._stop()
        self.lost.set()
        try:
            await self._store._client_lease().revoke(
                self.id, timeout=self._store.timeout, max_attempts=1
            )
        except grpc.aio.AioRpcError as exc:
            if exc.code() != grpc.StatusCode.NOT_FOUND:  # already expired: nothing to revoke
                raise _error(f"revoke lease {self.id:x}", self._store.where, exc) from exc
        except _FAILURES as exc:
            raise _error(f"revoke lease {self.id:x}", self._store.where, exc) from exc

    async def _stop(self) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task

    def _lose(self, why: str) -> None:
        if not self.lost.is_set():
            log.warning("etcd lease %x lost: %s", self.id, why)
            self.lost.set()

    async def _keep_alive(self) -> None:
        try:
            await self._renew_until_lost()
        except Exception as exc:  # a surprise must not leave the lease looking held
            self._lose(f"its keep-alive task failed: {exc!r}")
            raise

    async def _renew_until_lost(self) -> None:
        interval = self.ttl / 3
        while True:
            # Leave a keep-alive's time before the deadline: a grant answered late (etcd paused
            # as it was sent) starts with a near deadline, which a full interval's sleep missed.
            spare = self._deadline - time.monotonic() - interval
            await asyncio.sleep(min(interval, max(0.0, spare)))
            failures = 0
            while True:  # retry a failed keep-alive while the lease may still be alive
                remaining = self._deadline - time.monotonic()
                if remaining <= 0:
                    self._lose(f"no keep-alive reached etcd within its {self.ttl} s TTL")
                    return
                sent = time.monotonic()
                try:
                    async with asyncio.timeout(min(remaining, interval)):
                        ttl = await self._renew()
                except (*_FAILURES, ClusterError) as exc:
                    failures += 1
                    # Once per outage at INFO: an outage fails every retry, and the last 50 ms
                    # before the deadline used to log a line a millisecond.
                    log.log(
                        logging.INFO if failures == 1 else logging.DEBUG,
                        "etcd lease %x: keep-alive failed (%s); retrying", self.id, exc,
                    )  # fmt: skip
                    await asyncio.sleep(min(0.2, max(remaining - 0.05, 0.02)))
                    continue
                if ttl <= 0:
                    self._lose("etcd says it has expired")
                    return
                self._deadline = sent + ttl
                break

    async def _renew(self) -> int:
        # One request per short-lived stream, as etcd3aio's own keep-alive does; a missing
        # answer is bounded by the caller's timeout instead of hanging on a long-lived stream.
        call = self._store._client_lease().keep_alive(self.id)
        try:
            response = await call.read()
        finally:
            call.cancel()
        if response is grpc.aio.EOF:
            raise ClusterError("keep-alive stream closed without an answer")
        return int(response.TTL)


class EtcdStore:
    """Async key-value access to etcd: get, prefix scans, guarded writes, leases, watches."""

    def __init__(self, client: Etcd3Client, endpoints: list[str], timeout: float) -> None:
        self._client = client
        self.endpoints = list(endpoints)
        self.where = ", ".join(endpoints)
        self.timeout = timeout  # bounds every call, retries included
        self._tls: EtcdTls | None = None
        self._leases: set[Lease] = set()
        self._closed = False

    @classmethod
    async def connect(
        cls, endpoints: list[str], *, timeout: float = 5.0, tls: EtcdTls | None = None
    ) -> EtcdStore:
        """Open a channel to ``endpoints`` ("http://host:port", or "https://host:port" with
        ``tls``) and check etcd answers a linearizable read within ``timeout`` seconds (which
        also bounds every later call)."""
        if not endpoints:
            raise ValueError("no etcd endpoints given")
        schemes = {_scheme(e) for e in endpoints}
        if len(schemes) > 1:
            raise ClusterError(f"etcd endpoints mix http and https: {', '.join(endpoints)}")
        https = schemes == {"https"}
        if https and tls is None:
            raise ClusterError(
                f"etcd at {', '.join(endpoints)} is https, and no CA to check its certificate "
                f"against was given ({TRUSTSTORE})"
            )
        if tls is not None and not https:
            raise ClusterError(
                f"TLS settings for etcd were given, but its endpoints are plain http "
                f"({', '.join(endpoints)}): name them https://"
            )
        targets = [_host_port(e) for e in endpoints]
        if tls is None:
            client = Etcd3Client(targets)
        else:
            try:
                root, key, chain = tls.grpc_material()
            except ValueError as exc:
                raise ClusterError(f"cannot use the TLS settings for etcd: {exc}") from None
            # Several endpoints share one channel, whose name check needs one host name: the
            # first endpoint's (each member's certificate must name it, as with one shared
            # certificate listing every member). One endpoint: its own address is checked.
            server_name = urlsplit(endpoints[0]).hostname if len(endpoints) > 1 else None
            client = Etcd3Client(
                targets,
                ca_cert=root,
                cert_key=key,
                cert_chain=chain,
                tls_server_name=server_name,
            )
        await client.connect()
        store = cls(client, endpoints, timeout)
        store._tls = tls
        refused: list[Exception] = []
        try:
            async with asyncio.timeout(timeout):
                await store._ping_until_answered(timeout, refused)
        except ClusterError:
            await client.close()
            raise
        except _FAILURES as exc:
            await client.close()
            why: object = exc
            if isinstance(exc, TimeoutError):
                why = refused[-1] if refused else f"no answer within {timeout:g} s"
            raise ClusterError(f"cannot reach etcd at {store.where}: {why}") from exc
        return store

    async def _ping_until_answered(self, timeout: float, refused: list[Exception]) -> None:
        # gRPC shares a subchannel per address across channels: one that failed while etcd was
        # down (a restart) refuses new calls until its reconnect backoff ends, so an etcd that
        # is back gets until ``timeout`` to answer, not etcd3aio's few quick retries.
        diagnosed = False
        while True:
            try:
                await self._kv().get(_PING_KEY, count_only=True, timeout=timeout)
                return
            except EtcdConnectionError as exc:
                refused.append(exc)
            if not diagnosed:  # once: a TLS mismatch does not go away by retrying
                diagnosed = True
                why = await asyncio.to_thread(diagnose, self.endpoints[0], self._tls)
                if why is not None:
                    raise ClusterError(why)
            await asyncio.sleep(0.1)

    async def close(self) -> None:
        """Stop all keep-alives (their leases will expire; revoke first to end them now)."""
        self._closed = True
        for lease in list(self._leases):
            await lease._stop()
            lease.lost.set()  # nothing keeps it alive now; not worth a warning
        self._leases.clear()
        await self._client.close()

    async def __aenter__(self) -> EtcdStore:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # Reads

    async def get(self, key: str) -> tuple[bytes, int] | None:
        """(value, mod_revision), or None if absent."""
        r = await self._call(f"get {key!r}", self._kv().get(key, timeout=self.timeout))
        if not r.kvs:
            return None
        kv = r.kvs[0]
        return kv.value, kv.mod_revision

    async def get_prefix(self, prefix: str) -> list[tuple[str, bytes, int]]:
        """(key, value, mod_revision) of every key under ``prefix``, sorted by key."""
        key, end = _range(prefix)
        r = await self._call(
            f"get prefix {prefix!r}",
            self._kv().get(
                key,
                range_end=end,
                sort_order=SortOrder.ASCEND,
                sort_target=SortTarget.KEY,
                timeout=self.timeout,
            ),
        )
        return [(kv.key.decode(), kv.value, kv.mod_revision) for kv in r.kvs]

    # Writes (sent once: see the module docstring)

    async def put(self, key: str, value: bytes, *, lease: Lease | None = None) -> int:
        """Write unconditionally; returns the new revision."""
        r = await self._call(
            f"put {key!r}",
            self._kv().put(
                key, value, lease=_lease_id(lease), timeout=self.timeout, max_attempts=1
            ),
        )
        return int(r.header.revision)

    async def create(self, key: str, value: bytes, *, lease: Lease | None = None) -> bool:
        """Write only if ``key`` is absent; False if it exists."""
        cmp = Compare(
            result=Compare.EQUAL, target=Compare.CREATE, key=key.encode(), create_revision=0
        )
        return await self._txn(f"create {key!r}", [cmp], [_put_op(key, value, lease)])

    async def replace(
        self, key: str, value: bytes, mod_revision: int, *, lease: Lease | None = None
    ) -> bool:
        """Write only if ``key``'s mod_revision is ``mod_revision`` (0: absent); else False."""
        return await self._txn(
            f"replace {key!r}", [_mod_is(key, mod_revision)], [_put_op(key, value, lease)]
        )

    async def txn(
        self,
        expect: Mapping[str, int],
        puts: Mapping[str, bytes],
        deletes: Sequence[str] = (),
    ) -> bool:
        """All or nothing: if every key in ``expect`` has that mod_revision (0: absent), apply
        all ``puts`` and ``deletes`` in one revision and return True; else change nothing."""
        both = set(puts) & set(deletes)
        if both:
            raise ValueError(f"keys both put and deleted in one txn: {sorted(both)}")
        ops = [_put_op(k, v, None) for k, v in puts.items()]
        ops += [RequestOp(request_delete_range=DeleteRangeRequest(key=k.encode())) for k in deletes]
        return await self._txn("txn", [_mod_is(k, rev) for k, rev in expect.items()], ops)

    async def delete(self, key: str) -> None:
        # Idempotent, so etcd3aio may retry it.
        await self._call(f"delete {key!r}", self._kv().delete(key, timeout=self.timeout))

    # Leases and watches

    async def grant_lease(self, ttl: float) -> Lease:
        """A lease of ``ttl`` seconds (rounded up to whole seconds, and to etcd's minimum)."""
        granted_at = time.monotonic()
        r = await self._call(
            "grant lease",
            self._client_lease().grant(
                max(1, math.ceil(ttl)), timeout=self.timeout, max_attempts=1
            ),
        )
        if r.error:
            raise ClusterError(f"etcd at {self.where} refused a lease: {r.error}")
        lease = Lease(self, int(r.ID), int(r.TTL), granted_at)
        self._leases.add(lease)
        lease._task.add_done_callback(lambda _t: self._leases.discard(lease))
        return lease

    async def revoke_lease(self, lease_id: int) -> bool:
        """Revoke another holder's lease (its keys go now); False if it was already gone."""
        try:
            await self._client_lease().revoke(lease_id, timeout=self.timeout, max_attempts=1)
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.NOT_FOUND:
                return False
            raise _error(f"revoke lease {lease_id:x}", self.where, exc) from exc
        except _FAILURES as exc:
            raise _error(f"revoke lease {lease_id:x}", self.where, exc) from exc
        return True

    async def watch_prefix(
        self, prefix: str, start_revision: int | None = None
    ) -> AsyncIterator[WatchEvent]:
        """Changes under ``prefix`` in revision order, from ``start_revision`` (inclusive) or,
        if None, from when the watch is set up, which is at the first iteration.

        A broken stream is re-created from the revision after the last event delivered.
        Raises ClusterError if etcd cancels the watch, e.g. because ``start_revision`` is
        older than its compacted history (re-read the prefix and watch again). Cancelling the
        iterating task or closing the iterator (``contextlib.aclosing``) ends the watch.
        """
        key, end = _range(prefix)
        next_rev = start_revision or 0
        backoff = _WATCH_BACKOFF[0]
        stub = WatchStub(self._channel())
        while True:
            if self._closed:
                raise ClusterError(f"the etcd store for {self.where} is closed")
            create = WatchCreateRequest(key=key, range_end=end, start_revision=next_rev)

            async def requests(
                create: WatchCreateRequest = create,
            ) -> AsyncIterator[WatchRequest]:
                yield WatchRequest(create_request=create)
                await asyncio.Future()  # hold the stream open: half-closing it ends the watch

            call = stub.Watch(requests())
            try:
                async for r in call:
                    if r.canceled or r.compact_revision:
                        raise ClusterError(
                            f"etcd at {self.where} cancelled the watch of {prefix!r} from "
                            f"revision {next_rev}: {r.cancel_reason or 'history compacted'} "
                            f"(compacted to revision {r.compact_revision})"
                        )
                    if r.created and next_rev == 0:
                        # etcd3aio resumes from header.revision + 1 after every response,
                        # which can skip events still being replayed; we resume from the
                        # last event actually delivered, and use the header only here.
                        next_rev = r.header.revision + 1
                    backoff = _WATCH_BACKOFF[0]
                    for ev in r.events:
                        kv = ev.kv
                        value = None if ev.type == _DELETE else kv.value
                        yield WatchEvent(kv.key.decode(), value, kv.mod_revision)
                        next_rev = kv.mod_revision + 1
                log.info("etcd watch of %r ended by the server; re-creating it", prefix)
            except asyncio.CancelledError:
                self._raise_if_closed_under_us()
                raise
            except grpc.aio.AioRpcError as exc:
                if exc.code() not in _TRANSIENT or self._closed:
                    raise _error(f"watch {prefix!r}", self.where, exc) from exc
                log.warning("etcd watch of %r broke (%s); re-creating it", prefix, exc.code().name)
            finally:
                call.cancel()
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, _WATCH_BACKOFF[1])

    # Internals

    async def _txn(self, what: str, compare: list[Compare], ops: list[RequestOp]) -> bool:
        r = await self._call(
            what, self._kv().txn(compare, ops, timeout=self.timeout, max_attempts=1)
        )
        return bool(r.succeeded)

    async def _call(self, what: str, call: Awaitable[T]) -> T:
        try:
            return await call
        except asyncio.CancelledError:
            self._raise_if_closed_under_us()
            raise
        except _FAILURES as exc:
            raise _error(what, self.where, exc) from exc

    def _raise_if_closed_under_us(self) -> None:
        # grpc.aio ends the calls of a closed channel with CancelledError; unless our own task
        # is being cancelled, turn that into an error rather than a fake cancellation.
        task = asyncio.current_task()
        if self._closed and task is not None and not task.cancelling():
            raise ClusterError(f"the etcd store for {self.where} was closed")

    def _kv(self) -> KVService:  # etcd3aio's services are None before connect(), after close()
        if self._client.kv is None:
            raise ClusterError(f"the etcd store for {self.where} is closed")
        return self._client.kv

    def _client_lease(self) -> LeaseService:
        if self._client.lease is None:
            raise ClusterError(f"the etcd store for {self.where} is closed")
        return self._client.lease

    def _channel(self) -> grpc.aio.Channel:
        # etcd3aio offers no watch without its resume bug (see watch_prefix), so we drive the
        # Watch RPC ourselves over its channel (a private attribute of the pinned version).
        channel = self._client._channel
        if channel is None:
            raise ClusterError(f"the etcd store for {self.where} is closed")
        return channel


def _scheme(endpoint: str) -> str:
    return urlsplit(endpoint).scheme if "://" in endpoint else "http"


def _host_port(endpoint: str) -> str:
    parts = urlsplit(endpoint if "://" in endpoint else f"http://{endpoint}")
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.port is None:
        raise ClusterError(
            f"unsupported etcd endpoint {endpoint!r}: expected http://host:port or "
            "https://host:port"
        )
    return f"{parts.hostname}:{parts.port}"


def _range(prefix: str) -> tuple[bytes, bytes]:
    key = prefix.encode()
    if not key:  # etcd rejects an empty key; b"\0" .. b"\0" means every key
        return b"\0", b"\0"
    return key, prefix_range_end(key)


def _lease_id(lease: Lease | None) -> int:
    return 0 if lease is None else lease.id


def _mod_is(key: str, mod_revision: int) -> Compare:
    # etcd3aio 0.3.0 has no helper for comparing mod_revision; a missing key compares as 0.
    return Compare(
        result=Compare.EQUAL, target=Compare.MOD, key=key.encode(), mod_revision=mod_revision
    )


def _put_op(key: str, value: bytes, lease: Lease | None) -> RequestOp:
    return RequestOp(request_put=PutRequest(key=key.encode(), value=value, lease=_lease_id(lease)))


def _error(what: str, where: str, exc: BaseException) -> ClusterError:
    if isinstance(exc, grpc.aio.AioRpcError):
        detail = f"{exc.code().name}: {exc.details()}"
    elif isinstance(exc, TimeoutError):
        detail = "no answer in time"
    else:
        detail = str(exc)
    return ClusterError(f"etcd {what} at {where} failed: {detail}")
