"""One HTTP/1.1 exchange per connection, with h11 doing the protocol: the loop the broker's
admin endpoint (broker/admin_http.py) and ``stratalog console`` (console/remote.py) share.

``respond(request, body, peer)`` gets the h11 request, its body (at most ``MAX_BODY`` bytes:
a larger one is answered 413 unread) and the peer's address, and returns an ``Answer``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from importlib import resources

import h11

MAX_BODY = 1 << 20
TIMEOUT_S = 30
LINGER_S = 2.0  # after refusing a body: how long, and how much of it, to read and drop
LINGER_BYTES = 16 * MAX_BODY


@dataclass
class Answer:
    status: int
    content_type: str
    body: bytes
    headers: list[tuple[str, str]] = field(default_factory=list)


def text(status: int, message: str) -> Answer:
    return Answer(status, "text/plain; charset=utf-8", message.encode() + b"\n")


Respond = Callable[[h11.Request, bytes, str], Awaitable[Answer]]

_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
}


def static(path: str) -> Answer | None:
    """The console's page and its script and style (package data in console/static/), by
    their path ("/" is the page); None for another path."""
    name = "index.html" if path == "/" else path.lstrip("/")
    suffix = name[name.rfind(".") :] if "." in name else ""
    if suffix not in _TYPES or "/" in name:
        return None
    f = resources.files("stratalog.console").joinpath("static", name)
    if not f.is_file():
        return None
    return Answer(200, _TYPES[suffix], f.read_bytes(), [("cache-control", "no-cache")])


async def serve(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, respond: Respond
) -> None:
    conn = h11.Connection(h11.SERVER, max_incomplete_event_size=64 * 1024)
    peer = writer.get_extra_info("peername")
    host = peer[0] if peer else ""
    request: h11.Request | None = None
    body = bytearray()
    try:
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                data = await asyncio.wait_for(reader.read(65536), timeout=TIMEOUT_S)
                conn.receive_data(data)
                if not data:
                    break
                continue
            if isinstance(event, h11.Request):
                request = event
                length = next((v for k, v in event.headers if k == b"content-length"), b"0")
                if not length.isdigit() or int(length) > MAX_BODY:
                    await _send(conn, writer, text(413, f"a body of at most {MAX_BODY} bytes"))
                    await _linger(reader)
                    break
                continue
            if isinstance(event, h11.Data):
                body += event.data
                if len(body) > MAX_BODY:
                    await _send(conn, writer, text(413, f"a body of at most {MAX_BODY} bytes"))
                    await _linger(reader)
                    break
                continue
            if isinstance(event, h11.EndOfMessage) and request is not None:
                await _send(conn, writer, await respond(request, bytes(body), host))
                break
            if isinstance(event, h11.ConnectionClosed):
                break
    except (TimeoutError, h11.RemoteProtocolError, ConnectionError):
        pass
    finally:
        writer.close()


async def _linger(reader: asyncio.StreamReader) -> None:
    """Read and drop what the client still sends (for a while) before closing: closed with
    unread data, the socket would reset, and the client would see a broken pipe instead of the
    answer it was sent."""
    try:
        async with asyncio.timeout(LINGER_S):
            dropped = 0
            while dropped < LINGER_BYTES and (data := await reader.read(65536)):
                dropped += len(data)
    except TimeoutError:
        pass


async def _send(conn: h11.Connection, writer: asyncio.StreamWriter, answer: Answer) -> None:
    headers = [
        ("content-type", answer.content_type),
        ("content-length", str(len(answer.body))),
        ("connection", "close"),  # one request per connection keeps this small
        *answer.headers,
    ]
    writer.write(conn.send(h11.Response(status_code=answer.status, headers=headers)))
    writer.write(conn.send(h11.Data(data=answer.body)))
    writer.write(conn.send(h11.EndOfMessage()))
    await writer.drain()
