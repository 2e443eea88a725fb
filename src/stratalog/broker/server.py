"""The asyncio side of the Kafka listener: sockets in, ordered responses out.

Requests on one connection are started in arrival order (so appends keep the producer's order)
but may complete out of order (a Produce waiting for its group commit does not hold up the next
Produce, which is what lets one pipelining producer fill an fsync group). Responses are written
strictly in request order, as Kafka clients require. A connection that sends garbage is closed
alone; the rest of the broker never sees it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

from stratalog.broker import metrics
from stratalog.broker.backlog_sender import BacklogAnswer
from stratalog.protocol.connection import (
    NEED_DATA,
    KafkaConnection,
    ProtocolError,
    Request,
    parse_request,
)
from stratalog.security.listeners import Listener
from stratalog.security.tls import ANONYMOUS, principal_of
from stratalog.storage.partition import FileSlice
from stratalog.storage.throttle import PACE_SLACK_S, PACED_TURN_BYTES, ByteRate, PacedResponse

log = logging.getLogger(__name__)

# A handler's result: a whole response frame, a list of parts (Fetch), or None (acks=0).
Response = bytes | list[Any] | None
Handler = Callable[[Request, "ClientConnection"], Response | Awaitable[Response]]

_MAX_QUEUED = 64  # requests in flight per connection before we stop reading from it
# Response bytes one connection hands to its socket per turn of the event loop. A sendfile of a
# 1 MB chunk took 0.4 ms at p50 and 5-7 ms at its tail while catch-up consumers read (strace),
# and every request arriving meanwhile waited; with this bound a turn costs ~0.1 ms and the loop
# serves the others (a Produce waiting for its turn, a group commit's completion) in between.
_TURN_BYTES = 256 * 1024
# Smallest buffer a TLS connection hands its transport to decrypt into (TlsClientConnection).
_TLS_READ_MIN = 16 * 1024


# Per API key, where a request's latency goes (a histogram's observe); none: not measured.
Timers = dict[int, Callable[[float], None]]

# Queued after a reply that ends the connection (a failed SASL authentication): once the replies
# before it are written, the connection closes.
_CLOSE = object()


class ClientConnection(asyncio.Protocol):
    def __init__(
        self,
        dispatch: Handler,
        max_request_bytes: int,
        on_close: Callable,
        timers: Timers | None = None,
        listener: Listener | None = None,
        authenticator: Any = None,
        sasl_max_bytes: int = 0,
        on_open: Callable | None = None,
    ) -> None:
        self._dispatch = dispatch
        self._conn = KafkaConnection(max_request_bytes)
        # Called once the connection is made: a TLS connection whose handshake fails is never
        # made (nor lost), so a server that tracked it from its creation kept it forever.
        self._on_open = on_open
        self._max_request_bytes = max_request_bytes
        # The listener this connection came in on (Metadata answers with its address).
        self.listener = listener
        # security/sasl.py's SaslAuthenticator on a SASL listener: it takes the frames until
        # the client has authenticated, with the smaller pre-authentication size limit.
        self._auth = authenticator
        if authenticator is not None and sasl_max_bytes > 0:
            self._conn.max_request_bytes = min(max_request_bytes, sasl_max_bytes)
        # Who the client is: User:ANONYMOUS, a client certificate's subject, or a SASL user.
        self.principal = ANONYMOUS
        # Stored bytes go out by sendfile; not through TLS, where the connection writes copies
        # (the Fetch handler reads them on the read pool first).
        self.zero_copy = listener is None or not listener.tls
        self._closing = False  # a reply that ends the connection is queued
        self._drain_wait = False  # TLS: an answer's rest waits for resume_writing
        self._queue: deque[Any] = deque()
        # Beside each queued response: when its request arrived and where its latency goes.
        self._started: deque[tuple[float, Callable[[float], None] | None]] = deque()
        self._timers = timers if timers is not None else {}
        self._on_close = on_close
        # What must happen when this connection goes (state a handler tied to it, such as a
        # share session); run once, in order, from connection_lost.
        self.on_lost: list[Callable[[], None]] = []
        self.transport: asyncio.Transport | None = None
        self.peer: str = ""
        self._reading_paused = False
        self._writing_paused = False
        self._unmute: asyncio.TimerHandle | None = None  # a quota's mute (KIP-219), running
        self._closed = False
        # The rest of a response whose file slice did not fit the socket: it goes on with
        # sendfile when the socket is writable again (polled through a dup of its fd, since
        # the loop refuses a writer on a transport's own fd), never by copying it to memory.
        self._unsent: list[Any] | None = None
        self._wfd = -1
        self._fd = -1  # the socket's fd, for sendfile; -1 when the transport has none (TLS)
        self._sock: Any = None  # the transport's socket, for TCP_CORK
        self._pace: ByteRate | None = None  # the rate of the paced answer being sent
        self._admitted = False  # its next turn's bytes have had their time
        self._paced_left = 0  # its bytes not yet reserved
        # The sender process that holds an answer of this connection's now, or that has seen
        # the socket (it must be told when the connection closes).
        self._offloaded = False
        self._sender: Any = None

    # -- asyncio.Protocol ----------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        if self._on_open is not None:
            self._on_open(self)
        peer = transport.get_extra_info("peername")
        self.peer = peer[0] if peer else ""
        if not self.zero_copy:
            # TLS: the socket carries records, not our bytes. No sendfile, no corking; with a
            # verified client certificate (mutual TLS) its subject is the principal.
            if self._auth is None:
                self.principal = principal_of(transport.get_extra_info("ssl_object"))
            return
        sock = transport.get_extra_info("socket")
        self._fd = sock.fileno() if sock is not None else -1
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            self._sock = sock

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        if self._unmute is not None:
            self._unmute.cancel()
            self._unmute = None
        self._stop_polling()
        if self._sender is not None:
            self._sender.forget(self)
        if self._unsent is not None and not self._offloaded:
            # (An answer held by the sender process keeps its slices until it reports back.)
            _release(self._unsent)
        self._unsent = None
        if self._wfd >= 0:
            os.close(self._wfd)
            self._wfd = -1
        for item in self._queue:
            if isinstance(item, asyncio.Future):
                item.cancel()
            else:
                _release(item)
        self._queue.clear()
        self._started.clear()
        for lost in self.on_lost:
            try:
                lost()
            except Exception:
                log.exception("cleaning up after a closed connection")
        self.on_lost = []
        self._on_close(self)

    def pause_writing(self) -> None:
        self._writing_paused = True
        self._update_reading()

    def resume_writing(self) -> None:
        self._writing_paused = False
        if self._drain_wait:
            # TLS: the rest of an answer waited for the transport to drain (see _resume).
            self._drain_wait = False
            asyncio.get_running_loop().call_soon(self._resume)
        self._update_reading()

    def data_received(self, data: bytes) -> None:
        if self._closing:
            return
        try:
            self._conn.receive_data(data)
        except ProtocolError:
            return
        self._start_received()

    def _start_received(self) -> None:
        # (While muted, requests already received wait too: none starts before the mute ends.)
        while not self._closed and not self._closing and self._unmute is None:
            try:
                event = self._conn.next_event() if self._auth is None else self._next_sasl()
            except ProtocolError as e:
                log.info("closing connection from %s: %s", self.peer, e)
                self.abort()
                return
            if event is NEED_DATA:
                break
            if event is not None:
                self._start(event)
        self._update_reading()

    def _next_sasl(self) -> Request | Any:
        """On a SASL listener: the next request for the broker's handlers, ``NEED_DATA``, or
        None when the authenticator took the frame (and queued its reply)."""
        frame = self._conn.next_frame()
        if frame is NEED_DATA:
            return NEED_DATA
        auth = self._auth
        if not auth.active and not auth.takes(frame):
            if auth.expired():
                raise ProtocolError(f"the SASL session of {self.principal} expired")
            return parse_request(frame)
        reply = auth.receive(frame)
        if reply.data is not None:
            self._enqueue(reply.data)
        if reply.close:
            metrics.SASL_AUTHENTICATIONS.labels("failed").inc()
            self._conn.fail()
            self._closing = True
            self._enqueue(_CLOSE)
        elif not auth.active:
            result = "ok" if auth.sessions == 1 else "reauthenticated"
            metrics.SASL_AUTHENTICATIONS.labels(result).inc()
            self.principal = auth.principal
            self._conn.max_request_bytes = self._max_request_bytes
        return None

    def _enqueue(self, item: Any) -> None:
        self._queue.append(item)
        self._started.append((time.monotonic(), None))
        self._flush()

    # -- request handling ----------------------------------------------------------------------
    def _start(self, request: Request) -> None:
        t0 = time.monotonic()
        try:
            result = self._dispatch(request, self)
        except Exception:
            log.exception("handler for API %d v%d failed", request.api_key, request.api_version)
            self.abort()
            return
        if asyncio.iscoroutine(result) or isinstance(result, asyncio.Future):
            fut = asyncio.ensure_future(result)
            self._queue.append(fut)
            fut.add_done_callback(self._future_done)
        else:
            if result is None and not self._queue:
                return  # acks=0: nothing to send, nothing to wait for
            self._queue.append(result)
        self._started.append((t0, self._timers.get(request.api_key)))
        self._flush()

    def _future_done(self, _fut: asyncio.Future) -> None:
        if not self._closed:
            self._flush()

    def _flush(self) -> None:
        queue = self._queue
        transport = self.transport
        while queue and not self._closed and self._unsent is None:
            head = queue[0]
            if isinstance(head, asyncio.Future):
                if not head.done():
                    break
                queue.popleft()
                self._done_one()
                if head.cancelled():
                    continue
                exc = head.exception()
                if exc is not None:
                    log.error("request failed, closing connection", exc_info=exc)
                    self.abort()
                    return
                head = head.result()
            else:
                queue.popleft()
                self._done_one()
            if head is None:
                continue
            assert transport is not None
            if head is _CLOSE:
                transport.close()  # after what is buffered: the failure reply goes out first
                return
            if isinstance(head, bytes):
                transport.write(head)
            else:
                self._send_parts(head)
        self._update_reading()

    def _done_one(self) -> None:
        t0, observe = self._started.popleft()
        if observe is not None:
            observe(time.monotonic() - t0)

    def _send_parts(self, parts: list[Any]) -> None:
        """Send an answer of parts (see ``_send_some``), corked if it has several."""
        corked = self._cork(parts)
        try:
            self._send_some(parts)
        finally:
            if corked:
                self._uncork()

    def _cork(self, parts: list[Any]) -> bool:
        """Hold the socket's segments while one answer of several parts goes out (TCP_CORK),
        if it has a file slice: each ``sendfile`` would otherwise push its own segment through
        loopback (a tail Fetch of small batches is one slice per batch), costing the broker a
        transmit and the client a wake-up each. Uncorking sends what is held at once."""
        sock = self._sock
        if (
            sock is None
            or len(parts) < 2
            or isinstance(parts, BacklogAnswer)  # the sender process sends it, not this call
            or not any(isinstance(p, FileSlice) for p in parts)
        ):
            return False
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_CORK, 1)
        except OSError:
            self._sock = None  # not a TCP socket after all: never try again
            return False
        return True

    def _uncork(self) -> None:
        with contextlib.suppress(OSError):
            self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_CORK, 0)

    def _send_some(self, parts: list[Any]) -> None:
        """Write an answer made of memory parts and file slices, in order.

        Slices go out with ``sendfile`` straight from the page cache (zero copy). When the
        socket is full in the middle of one, the rest of the response waits in ``_unsent`` for
        the socket to drain (see ``_writable``); later responses queue behind it. After
        ``_TURN_BYTES`` the rest waits for the loop's next turn instead (``_resume``), so one
        large response never holds the loop. A slice is copied to memory only where sendfile
        cannot be used at all (not a plain socket). Every slice is released exactly once: when
        sent, copied, or the connection is lost.
        """
        transport = self.transport
        assert transport is not None
        if isinstance(parts, BacklogAnswer):
            if self._fd >= 0 and transport.get_write_buffer_size() > 0:
                self._wait_writable(parts)  # bytes before it go first; then here again
                return
            fut = parts.sender.send(self, self._fd, parts)
            if fut is not None:
                self._sender = parts.sender
                self._offloaded = True
                self._unsent = parts  # later answers wait behind it
                fut.add_done_callback(self._offload_done)
                return
            parts = list(parts)  # the sender process is gone: sent here like any answer
        if isinstance(parts, PacedResponse):
            self._pace = parts.rate
            self._paced_left = parts.size
        budget = _TURN_BYTES
        if self._pace is not None:
            budget = PACED_TURN_BYTES
            if not self._admitted:
                # The turn waits for its bytes' time under the budget before any goes out.
                want = min(budget, self._paced_left)
                self._paced_left -= want
                metrics.FETCH_PACED_BYTES.inc(want)
                delay = self._pace.reserve(want) - PACE_SLACK_S
                if delay > 0:
                    self._admitted = True
                    self._next_turn(parts, delay)
                    return
            self._admitted = False
        pending: list[Any] = []
        n = len(parts)
        i = 0
        while i < n:
            p = parts[i]
            if not isinstance(p, FileSlice):
                size = len(p)
                if size > budget:
                    if budget > 0:
                        view = memoryview(p)
                        pending.append(view[:budget])
                        parts = [view[budget:], *parts[i + 1 :]]
                    else:
                        parts = parts[i:]
                    transport.writelines(pending)
                    self._next_turn(parts)
                    return
                pending.append(p)
                budget -= size
                i += 1
                continue
            if pending:
                transport.writelines(pending)
                pending = []
            if self._fd >= 0 and transport.get_write_buffer_size() > 0:
                # Bytes before this slice are still queued in the transport: sendfile must wait.
                self._wait_writable(parts[i:])
                return
            if budget <= 0:
                self._next_turn(parts[i:])
                return
            sent, full = _sendfile(self._fd, p, budget)
            budget -= sent
            if sent:
                metrics.FETCH_SENDFILE_BYTES.inc(sent)
            if sent < p.size and (full or budget <= 0):
                # The rest of this slice keeps the reference the whole slice held.
                rest = [FileSlice(p.segment, p.position + sent, p.size - sent), *parts[i + 1 :]]
                if full:
                    self._wait_writable(rest)
                else:
                    self._next_turn(rest)
                return
            if sent < p.size:
                try:
                    pending.append(p.read(sent))
                except OSError as e:
                    # Part of the answer may be out already: no valid frame can follow.
                    log.error("read for a fetch failed, closing the connection: %s", e)
                    _release(parts[i:])
                    self.abort()
                    return
                metrics.FETCH_COPIED_BYTES.inc(p.size - sent)
            p.release()
            i += 1
        if pending:
            transport.writelines(pending)
        self._pace = None

    def _offload_done(self, fut: asyncio.Future) -> None:
        self._offloaded = False
        self._unsent = None
        if self._closed:
            return
        error = fut.result()
        if error:
            # Part of the answer may be out: no valid frame can follow on this connection.
            log.info("closing connection from %s: backlog answer failed: %s", self.peer, error)
            self.abort()
            return
        self._flush()

    def _next_turn(self, rest: list[Any], delay: float = 0.0) -> None:
        """Send ``rest`` on a later turn of the loop (this one's byte budget is spent): the
        next one, or after ``delay`` seconds for a paced answer."""
        self._unsent = rest
        loop = asyncio.get_running_loop()
        if delay > 0:
            loop.call_later(delay, self._resume)
        else:
            loop.call_soon(self._resume)

    def _resume(self) -> None:
        rest = self._unsent
        if rest is None or self._closed:
            return
        self._unsent = None
        if self._fd < 0:
            # No sendfile here (TLS): the transport keeps the order of what is written, so the
            # rest goes on now, unless the transport is above its high-water mark; then when it
            # drains (resume_writing).
            if self._writing_paused:
                self._unsent = rest
                self._drain_wait = True
                return
        elif self.transport is not None and self.transport.get_write_buffer_size() > 0:
            # The transport still holds bytes before these: let the socket drain first.
            self._wait_writable(rest)
            return
        self._send_parts(rest)
        if self._unsent is None:
            self._flush()

    def _wait_writable(self, rest: list[Any]) -> None:
        self._unsent = rest
        if self._wfd < 0:
            self._wfd = os.dup(self._fd)
        asyncio.get_running_loop().add_writer(self._wfd, self._writable)

    def _stop_polling(self) -> None:
        if self._wfd >= 0:
            try:
                asyncio.get_running_loop().remove_writer(self._wfd)
            except RuntimeError:  # the loop is already closed
                pass

    def _writable(self) -> None:
        rest = self._unsent
        if rest is None or self._closed:
            self._stop_polling()
            return
        if self.transport is not None and self.transport.get_write_buffer_size() > 0:
            return  # the transport is still draining what came before; it writes first
        self._stop_polling()
        self._unsent = None
        self._send_parts(rest)
        if self._unsent is None:
            self._flush()

    def mute(self, seconds: float) -> None:
        """Read no new request for ``seconds``: the client is over a quota and its answer
        says how long to wait (KIP-219); one that does not wait waits all the same."""
        if self.transport is None or self._closed or seconds <= 0:
            return
        loop = asyncio.get_running_loop()
        until = loop.time() + seconds
        if self._unmute is not None:
            if self._unmute.when() >= until:
                return
            self._unmute.cancel()
        self._unmute = loop.call_at(until, self._end_mute)
        self._update_reading()

    def _end_mute(self) -> None:
        self._unmute = None
        self._start_received()

    def _update_reading(self) -> None:
        if self.transport is None or self._closed:
            return
        should_pause = (
            self._writing_paused
            or len(self._queue) >= _MAX_QUEUED
            or self._closing
            or self._unmute is not None
        )
        if should_pause and not self._reading_paused:
            self.transport.pause_reading()
            self._reading_paused = True
        elif not should_pause and self._reading_paused:
            self._reading_paused = False
            self.transport.resume_reading()

    def abort(self) -> None:
        if self.transport is not None and not self._closed:
            self._closed = True
            if self._sender is not None and self._fd >= 0:
                # The sender process holds the socket too: end it now, not when it lets go.
                with contextlib.suppress(OSError), socket.socket(fileno=os.dup(self._fd)) as s:
                    s.shutdown(socket.SHUT_RDWR)
            self.transport.abort()


def _sendfile(out: int, s: FileSlice, limit: int) -> tuple[int, bool]:
    """Send as much of ``s`` as the socket takes now (``limit`` bytes at most), without
    blocking.

    Returns (bytes sent, whether the socket is full); a count short of the slice and of
    ``limit`` with a socket that is not full means sendfile cannot be used here (the caller
    copies the rest).
    """
    if out < 0:
        return 0, False
    sent = 0
    want = min(s.size, limit)
    try:
        while sent < want:
            n = os.sendfile(out, s.segment.fd, s.position + sent, want - sent)
            if n == 0:
                break
            sent += n
    except (BlockingIOError, InterruptedError):
        return sent, True
    except OSError:
        # e.g. the transport is TLS or not a plain socket: fall back to copying.
        pass
    return sent, False


def _release(item: Any) -> None:
    if isinstance(item, list):
        for p in item:
            if isinstance(p, FileSlice):
                p.release()


class TlsClientConnection(ClientConnection):
    """A connection on a TLS listener: a buffered protocol, so the TLS transport decrypts
    straight into a buffer of ours.

    As a plain protocol, uvloop's SSL transport decrypted each TLS record (16 KiB at most) into
    a new bytes object allocated at 256 KiB and shrunk, ended each read with an SSLWantReadError,
    and joined the records of one socket read into one more bytes object before data_received:
    an allocation per record and a copy of every byte the clients sent, on the event loop. Here
    it decrypts the records of a read, one after another, into one buffer sized by what it has
    pending, which is then parsed in place (KafkaConnection keeps the chunks it is given). A
    buffer is never reused: requests still being handled may hold views of it.
    """

    _rbuf: bytearray | None = None

    def get_buffer(self, sizehint: int) -> memoryview:
        # (uvloop asks for its pending ciphertext plus 256: the plaintext is no longer.)
        self._rbuf = bytearray(max(sizehint, _TLS_READ_MIN))
        return memoryview(self._rbuf)

    def buffer_updated(self, nbytes: int) -> None:
        buf, self._rbuf = self._rbuf, None
        if buf is not None and nbytes:
            self.data_received(memoryview(buf)[:nbytes].toreadonly())  # type: ignore[arg-type]


class KafkaServer:
    def __init__(
        self,
        dispatch: Handler,
        host: str,
        port: int,
        max_request_bytes: int,
        timers: Timers | None = None,
        listener: Listener | None = None,
        ssl_context: Any = None,
        authenticator: Callable[[], Any] | None = None,
        sasl_max_bytes: int = 0,
    ) -> None:
        self._dispatch = dispatch
        self._timers = timers
        self.host = host
        self.port = port
        self._max_request_bytes = max_request_bytes
        self._server: asyncio.Server | None = None
        self.connections: set[ClientConnection] = set()
        self.listener = listener  # with its bound port once listening
        self._ssl = ssl_context
        self._authenticator = authenticator  # a new SaslAuthenticator per connection
        self._sasl_max_bytes = sasl_max_bytes

    async def start(self, serve: bool = True) -> None:
        """Bind the listener (the port is known from here on); with ``serve`` False, accept
        connections only once ``serve()`` is called (a cluster member, after it joined)."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            self._connection,
            self.host,
            self.port,
            reuse_address=True,
            backlog=1024,
            start_serving=serve,
            ssl=self._ssl,
        )
        self.port = self._server.sockets[0].getsockname()[1]
        if self.listener is not None:
            self.listener = self.listener.bound(self.port)

    def _connection(self) -> ClientConnection:
        auth = self._authenticator
        kind = ClientConnection if self._ssl is None else TlsClientConnection
        return kind(
            self._dispatch,
            self._max_request_bytes,
            self._untrack,
            self._timers,
            listener=self.listener,
            authenticator=auth() if auth is not None else None,
            sasl_max_bytes=self._sasl_max_bytes,
            on_open=self._track,
        )

    async def serve(self) -> None:
        assert self._server is not None
        await self._server.start_serving()

    def _track(self, c: ClientConnection) -> None:
        self.connections.add(c)

    def _untrack(self, c: ClientConnection) -> None:
        self.connections.discard(c)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            for c in list(self.connections):
                c.abort()
            await self._server.wait_closed()
            self._server = None
