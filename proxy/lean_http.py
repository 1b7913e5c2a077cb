"""The proxy listener's lean lane: plain HTTP/1.1 calls served on an asyncio Protocol.

Why: aiohttp's server machinery (its request and response objects, the payload writer, the
keep-alive loop) costs ~30 us of Python per request, a fifth of what a whole proxied call may
cost (docs/benchmarks.md). The ordinary case - an LLM call: HTTP/1.1, a Content-Length body,
keep-alive - is served here on a Protocol with httptools' llhttp parser (the parser uvicorn
uses) in a few microseconds. The request goes to the same handler as aiohttp's, through a small
request object with what the pipeline reads, and the answer is written by `LeanResponse`
(the same calls as aiohttp's `StreamResponse`: prepare, write, write_eof, force_close).

Everything else hands the connection to aiohttp's own `RequestHandler`, from the first byte of
the request that needs it, for good: an upgrade (WebSocket), a chunked, compressed or `Expect` body,
HTTP/1.0, an oversized or malformed head, a body over the limit, a route that is not an LLM call
(MCP, which relays long-lived streams of its own). aiohttp stays the reference for every edge;
this lane only takes what it can serve exactly as aiohttp would.

One request at a time per connection, as aiohttp: pipelined bytes wait until the answer before
them is out (reading pauses if they pile up). A connection that has not completed a request head
within `keepalive_timeout` (also the idle time between requests) is closed, as aiohttp does
(slow-header clients).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from http import HTTPStatus
from typing import Any

import httptools
from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy

from proxy.aiohttp_compat import (
    SERVER_SOFTWARE,
    AiohttpServer,
    WrappingAppRunner,
    hand_over,
    must_be_empty_body,
    rfc822_formatted_time,
    serialize_head,
    should_remove_content_length,
)
from proxy.call_request import AnswerMaker, ClientAnswer

log = logging.getLogger("tripwire.lean_http")

MAX_REQUEST_LINE = 8190  # aiohttp's max_line_size: longer request lines go to aiohttp (it answers 414)
HIGH_WATER = 64 * 1024  # pipelined bytes kept before reading pauses
MAX_HEADERS = 128  # aiohttp's max_headers: more goes to aiohttp (it answers 400)
# headers a request may carry once only (aiohttp's http_parser refuses duplicates of these)
SINGLETON_HEADERS = (
    "Content-Length",
    "Content-Location",
    "Content-Range",
    "Content-Type",
    "ETag",
    "Host",
    "Max-Forwards",
    "Server",
    "Transfer-Encoding",
    "User-Agent",
)


_SINGLETONS = frozenset(name.lower() for name in SINGLETON_HEADERS)


class _Handover(Exception):
    """Raised from a parser callback: this request is for aiohttp."""


class _RawQuery:
    __slots__ = ("raw_query_string",)

    def __init__(self, raw_query_string: str) -> None:
        self.raw_query_string = raw_query_string


class LeanContent:
    """The request body as it arrives: the subset of aiohttp's StreamReader that read_body uses."""

    __slots__ = ("_chunks", "_left", "_waiter", "_exc")

    def __init__(self, length: int) -> None:
        self._chunks: list[bytes] = []
        self._left = length
        self._waiter: asyncio.Future[None] | None = None
        self._exc: BaseException | None = None

    def feed(self, data: bytes) -> None:
        self._chunks.append(data)
        self._left -= len(data)
        self._wake()

    def set_exception(self, exc: BaseException) -> None:
        self._exc = exc
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def is_eof(self) -> bool:
        return self._left <= 0 and not self._chunks

    def read_nowait(self) -> bytes:
        if self._exc is not None:
            raise self._exc
        if not self._chunks:
            return b""
        data = self._chunks[0] if len(self._chunks) == 1 else b"".join(self._chunks)
        self._chunks = []
        return data

    async def readany(self) -> bytes:
        while not self._chunks and self._left > 0 and self._exc is None:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        return self.read_nowait()

    async def read(self) -> bytes:
        parts: list[bytes] = []
        while True:
            chunk = await self.readany()
            if not chunk:
                return b"".join(parts)
            parts.append(chunk)


class LeanRequest:
    """What the proxy handler and the pipeline read of a request (aiohttp's names and types)."""

    __slots__ = (
        "app",
        "method",
        "raw_path",
        "headers",
        "content_length",
        "content",
        "transport",
        "keep_alive",
        "rel_url",
        "_conn",
    )

    def __init__(
        self,
        conn: LeanConnection,
        app: web.Application,
        method: str,
        raw_path: str,
        headers: CIMultiDictProxy[str],
        content_length: int,
        keep_alive: bool,
    ) -> None:
        self._conn = conn
        self.app = app
        self.method = method
        self.raw_path = raw_path
        self.headers = headers
        self.content_length: int | None = content_length
        self.content = LeanContent(content_length)
        self.transport: asyncio.Transport | None = conn.transport
        self.keep_alive = keep_alive
        query = raw_path.partition("?")[2]
        self.rel_url = _RawQuery(query)

    async def read(self) -> bytes:
        return await self.content.read()


def _frame(headers: CIMultiDict[str], method: str, status: int) -> tuple[bool, bool]:
    """Frame an answer as aiohttp's StreamResponse._prepare_headers does: (a head only, chunked).
    HEAD, 1xx, 204, 304 carry no body (and 1xx/204/304 no Content-Length); without a
    Content-Length the body is chunked; a body gets a default Content-Type."""
    if must_be_empty_body(method, status):
        if should_remove_content_length(method, status):
            headers.popall("Content-Length", None)
        headers.popall("Transfer-Encoding", None)
        return True, False
    length = headers.get("Content-Length")
    if length is None:
        headers["Transfer-Encoding"] = "chunked"
    if length != "0":
        headers.setdefault("Content-Type", "application/octet-stream")
    return False, length is None


def _head(status: int, reason: str, headers: CIMultiDict[str], keep_alive: bool) -> bytes:
    headers.setdefault("Date", rfc822_formatted_time())  # (aiohttp's, made once a second)
    headers.setdefault("Server", SERVER_SOFTWARE)
    if not keep_alive and "Connection" not in headers:
        headers["Connection"] = "close"
    # as aiohttp writes it: a control byte in the reason or a header (an upstream's, relayed) raises
    # ValueError (a 500, no header injection); bytes an upstream sent that are not UTF-8 (kept as
    # surrogates) are left out
    return serialize_head(f"HTTP/1.1 {status} {reason}", headers)


def _internal_error() -> web.Response:
    """The 500 aiohttp answers when a handler raises (its words, for a client not asking for HTML)."""
    status = HTTPStatus.INTERNAL_SERVER_ERROR
    return web.Response(status=500, text=f"{status.value} {status.phrase}\n\n{status.description}")


def _reason(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return ""


class LeanResponse:
    """An answer written straight to the connection: the calls forward() makes of aiohttp's
    StreamResponse. `whole` answers send their head with the first body bytes (one write);
    streams send it at prepare. Without a Content-Length the body is chunked, as aiohttp does."""

    __slots__ = (
        "status",
        "reason",
        "headers",
        "_whole",
        "_conn",
        "_head",
        "_chunked",
        "_empty",
        "prepared",
        "_eof",
    )

    def __init__(
        self, *, status: int, reason: str | None, headers: CIMultiDict[str], whole: bool = False
    ) -> None:
        self.status = status
        self.reason = reason
        self.headers = headers
        self._whole = whole
        self._conn: LeanConnection | None = None
        self._head: bytes | None = None
        self._chunked = False
        self._empty = False  # HEAD, 1xx, 204, 304: a head and nothing more
        self.prepared = False
        self._eof = False

    @property
    def head_sent(self) -> bool:
        return self.prepared and self._head is None

    async def prepare(self, request: Any) -> None:  # a LeanRequest (typed Any as aiohttp's is)
        conn = request._conn
        self._conn = conn
        self.prepared = True
        self._empty, self._chunked = _frame(self.headers, request.method, self.status)
        self._head = conn.head(self.status, self.reason, self.headers)
        conn.responding = self
        if not self._whole:
            await self._send(b"")

    def force_close(self) -> None:
        if self._conn is not None:
            self._conn.keep_alive = False

    async def write(self, data: bytes) -> None:
        if self._empty:
            data = b""  # (the head, if still held, goes out)
        elif self._chunked and data:
            data = b"%x\r\n%b\r\n" % (len(data), data)
        await self._send(data)

    async def write_eof(self, data: bytes = b"") -> None:
        if self._eof:
            return
        if data:
            await self.write(data)
        await self._send(b"0\r\n\r\n" if self._chunked else b"")
        self._eof = True

    async def _send(self, data: bytes) -> None:
        conn = self._conn
        assert conn is not None, "prepare() first"
        if self._head is not None:
            data, self._head = self._head + data, None
        if data:
            await conn.write(data)


def lean_answer(status: int, reason: str | None, headers: CIMultiDict[str], stream: bool) -> LeanResponse:
    """The lean lane's answer maker (`proxy.call_request.AnswerMaker`): a stream's head goes out at
    prepare, a whole answer's with its body."""
    return LeanResponse(status=status, reason=reason, headers=headers, whole=not stream)


# the call handler: (the request, its route, the lane's answer maker) -> what the client is answered
Handler = Callable[[LeanRequest, Any, AnswerMaker], Awaitable[ClientAnswer]]
Router = Callable[[str, CIMultiDictProxy[str]], Any]


class LeanConnection(asyncio.Protocol):
    """One client connection on the lean lane (see the module's docstring)."""

    def __init__(self, server: LeanServer) -> None:
        self.server = server
        self._loop = asyncio.get_running_loop()  # made by the listening server, on its loop
        self.transport: asyncio.Transport | None = None
        self._parser = httptools.HttpRequestParser(self)
        self._buf: bytes | bytearray = b""
        self._scanned = 0  # bytes of _buf searched for the head's end without finding it
        self._checked = 0  # bytes of an unfinished head whose lines were checked (_aiohttps_already)
        self._discard = 0  # bytes of an unread body still to come, to drop
        self._task: asyncio.Task[None] | None = None  # the request being answered
        self._busy = False  # a request is being answered
        self._request: LeanRequest | None = None  # its body still arriving
        self._headers: list[tuple[str, str]] = []
        self._url = b""
        self._head_done = False
        self.keep_alive = True
        self.responding: LeanResponse | None = None
        self.write_paused = False
        self._drain: asyncio.Future[None] | None = None
        self._idle: asyncio.TimerHandle | None = None
        self._idle_since: float | None = None  # when the connection went idle (None: a request is on)
        self._reading_paused = False

    # --- asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.server.lean_connections.add(self)
        self._start_idle()

    def connection_lost(self, exc: BaseException | None) -> None:
        self.server.forget(self)
        self._stop_idle_timer()
        if self._request is not None:
            self._request.content.set_exception(ConnectionResetError("the client closed the connection"))
        if self._drain is not None and not self._drain.done():
            self._drain.set_exception(ConnectionResetError("the client closed the connection"))
        self.transport = None

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        if self._drain is not None and not self._drain.done():
            self._drain.set_result(None)

    async def write(self, data: bytes) -> None:
        """Out to the client, waiting while its socket is full (as aiohttp's writer drains)."""
        transport = self.transport
        if transport is None or transport.is_closing():
            raise ConnectionResetError("Cannot write to closing transport")
        transport.write(data)
        if self.write_paused:
            self._drain = self._loop.create_future()
            await self._drain

    def head(self, status: int, reason: str | None, headers: CIMultiDict[str]) -> bytes:
        """An answer's head; a `Connection: close` in it ends the connection after the answer."""
        if headers.get("Connection", "").lower() == "close":
            self.keep_alive = False
        return _head(status, reason or _reason(status), headers, self.keep_alive)

    def data_received(self, data: bytes) -> None:
        if self._discard:
            if len(data) <= self._discard:
                self._discard -= len(data)
                return
            data = data[self._discard :]
            self._discard = 0
        request = self._request
        if request is not None:  # the body of the request being answered
            left = request.content._left
            if len(data) <= left:
                request.content.feed(data)
                if len(data) == left:
                    self._request = None
                return
            request.content.feed(data[:left])
            self._request = None
            data = data[left:]
        if not self._buf:
            self._buf = data  # the usual case: a whole request in one read, no copy
        else:  # a head arriving in pieces: appended in place (a byte at a time stays linear)
            if not isinstance(self._buf, bytearray):
                self._buf = bytearray(self._buf)
            self._buf += data
        if not self._busy:
            self._next()
        elif len(self._buf) > HIGH_WATER and not self._reading_paused and self.transport is not None:
            self._reading_paused = True
            self.transport.pause_reading()

    # --- httptools callbacks (the head only: the body is framed here, by Content-Length)

    def on_url(self, url: bytes) -> None:
        self._url += url
        if len(self._url) > MAX_REQUEST_LINE:
            raise _Handover

    def on_header(self, name: bytes, value: bytes) -> None:
        if len(value) > self.server.max_field_size or len(name) > self.server.max_field_size:
            raise _Handover
        self._headers.append((name.decode("latin-1"), value.decode("utf-8", "surrogateescape")))

    def on_headers_complete(self) -> None:
        self._head_done = True

    # --- requests

    def _next(self) -> None:
        """Start on the next request in the buffer, if its head is complete."""
        buf = self._buf
        if not buf:
            return
        end = buf.find(b"\r\n\r\n", self._scanned)
        if end < 0:
            if b"\n\n" in buf or b"\n\r\n" in buf:
                self._hand_over()  # a head ended by a bare LF: aiohttp answers it (400)
                return
            self._scanned = max(0, len(buf) - 3)
            if len(buf) > MAX_REQUEST_LINE + self.server.max_field_size:
                self._hand_over()  # a head this long is aiohttp's to refuse (or take), not ours to hold
            elif self._aiohttps_already(buf):
                self._hand_over()
            return
        self._scanned = 0
        self._checked = 0
        if buf.find(b"\n\n", 0, end + 2) >= 0 or buf.find(b"\n\r\n", 0, end) >= 0:
            self._hand_over()  # a line ended by a bare LF: aiohttp's rules (the framing must agree)
            return
        if isinstance(buf, bytearray):
            buf = bytes(buf)
        head_len = end + 4
        self._headers, self._url, self._head_done = [], b"", False
        try:
            self._parser.feed_data(buf[:head_len])
        except (_Handover, httptools.HttpParserError, httptools.HttpParserUpgrade):
            self._hand_over()
            return
        if not self._head_done:
            self._hand_over()
            return
        taken = self._lean_request()
        if taken is None:
            self._hand_over()
            return
        request, route = taken
        length = request.content._left
        if not request.keep_alive and len(buf) > head_len + length:
            self._hand_over()  # bytes after a `Connection: close` request: aiohttp refuses them (400)
            return
        self._cancel_idle()
        self._busy = True
        self._parser = httptools.HttpRequestParser(self)  # a fresh one: the body never goes through it
        body = buf[head_len : head_len + length]
        self._buf = buf[head_len + length :]
        if body:
            request.content.feed(body)
        if request.content._left > 0:
            self._request = request
        self._task = self._loop.create_task(self._answer(request, route))

    def _aiohttps_already(self, buf: bytes | bytearray) -> bool:
        """Whether the lines of a head still arriving already make it aiohttp's. aiohttp reads a head
        line by line and refuses some before its end (a duplicate Content-Length or other singleton,
        a malformed line, too many fields): handed over now, the client gets that answer at once, as
        from aiohttp alone, instead of the silence of a lane waiting for an end that may not come."""
        lines_end = buf.rfind(b"\r\n") + 2
        if lines_end < 2 or lines_end <= self._checked:
            return False
        self._checked = lines_end  # (each line is looked at once a new one completes: few parses)
        self._headers, self._url = [], b""
        try:
            httptools.HttpRequestParser(self).feed_data(bytes(buf[:lines_end]))
        except (_Handover, httptools.HttpParserError, httptools.HttpParserUpgrade):
            return True
        seen: set[str] = set()
        for name, _ in self._headers:
            low = name.lower()
            if low in _SINGLETONS:
                if low in seen:
                    return True
                seen.add(low)
        return len(self._headers) > MAX_HEADERS

    def _lean_request(self) -> tuple[LeanRequest, Any] | None:
        """The request and its route, if the lean lane serves it exactly as aiohttp would; None:
        aiohttp's."""
        parser = self._parser
        if parser.get_http_version() != "1.1" or parser.should_upgrade():
            return None
        if len(self._headers) > MAX_HEADERS:
            return None
        headers = CIMultiDictProxy(CIMultiDict(self._headers))
        if len(headers.getall("Host", ())) != 1:
            return None  # HTTP/1.1 needs exactly one Host (aiohttp answers 400)
        if len({name.lower() for name, _ in self._headers}) != len(self._headers) and any(
            len(headers.getall(name, ())) > 1 for name in SINGLETON_HEADERS
        ):
            return None  # a header that must appear once, twice: aiohttp answers 400
        if "Transfer-Encoding" in headers or "Expect" in headers or "Upgrade" in headers:
            return None
        if headers.get("Content-Encoding", "identity").lower() != "identity":
            return None  # aiohttp decodes a compressed request body for the handler
        lengths = headers.getall("Content-Length", ())
        if len(lengths) > 1:
            return None
        length = 0
        if lengths:
            value = lengths[0]
            if not value.isdigit() or not value.isascii():
                return None
            length = int(value)
            if length > self.server.max_body:
                return None  # aiohttp's path answers 413 (read_body)
        raw_path = self._url.decode("utf-8", "surrogateescape")
        if not raw_path.startswith("/"):
            return None  # absolute-form or asterisk-form targets: aiohttp's
        route = self.server.route(raw_path, headers)
        if route is None:
            return None
        method = parser.get_method().decode("ascii")
        request = LeanRequest(
            self, self.server.app, method, raw_path, headers, length, parser.should_keep_alive()
        )
        return request, route

    async def _answer(self, request: LeanRequest, route: Any) -> None:
        self.keep_alive = request.keep_alive
        try:
            try:
                response: ClientAnswer | None = await self.server.handler(request, route, lean_answer)
            except Exception:
                log.exception("error handling a request")
                response = None
                self.keep_alive = False
            responding = self.responding
            if response is None:
                if responding is None or not responding.head_sent:
                    # nothing went out yet: a 500, as aiohttp answers; else the answer is cut (close)
                    await self._write_response(_internal_error(), request.method)
            elif isinstance(response, LeanResponse):
                if not response._eof:
                    await response.write_eof()
            elif isinstance(response, web.Response):
                await self._write_response(response, request.method)
            else:  # every handler path answers with one of the two
                raise TypeError(f"unexpected answer type {type(response).__name__}")
        except (ConnectionResetError, RuntimeError):
            self.keep_alive = False
        except Exception:
            log.exception("error writing an answer")
            self.keep_alive = False
        finally:
            if self.responding is not None and not self.responding._eof:
                self.keep_alive = False  # a stream that never ended: the connection cannot be reused
            self.responding = None
            self._task = None
            self._finish()

    async def _write_response(self, response: web.Response, method: str) -> None:
        body = response.body
        if body is None:
            body = b""
        elif not isinstance(body, bytes | bytearray):
            raise TypeError("the lean lane answers bytes bodies only")
        headers = CIMultiDict(response.headers)
        headers["Content-Length"] = str(len(body))  # (HEAD keeps the length a GET would get)
        empty, _ = _frame(headers, method, response.status)
        head = self.head(response.status, response.reason, headers)
        await self.write(head if empty else head + bytes(body))

    def _finish(self) -> None:
        self._busy = False
        if self._request is not None:
            # the answer went out before the whole body arrived (a refusal, a draining 503): the
            # rest of it is read and dropped, as aiohttp does, so it is never taken for a request
            self._discard = self._request.content._left
            self._request = None
        transport = self.transport
        if transport is None:
            return
        if not self.keep_alive or self.server.closing:
            transport.close()
            return
        if self._reading_paused:
            self._reading_paused = False
            transport.resume_reading()
        self._start_idle()
        if self._buf:
            self._next()

    def _hand_over(self) -> None:
        """From this request on, the connection is aiohttp's (its own handler, its own rules)."""
        transport = self.transport
        if transport is None:
            return
        self._stop_idle_timer()
        self.server.forget(self)
        if self._reading_paused:
            transport.resume_reading()
        buf, self._buf = bytes(self._buf), b""
        self.transport = None
        hand_over(transport, self.server.inner.protocol(), buf)

    # --- the idle timer (no request head within keepalive_timeout: close)
    # One timer per connection, moved lazily: a request only stamps when the connection went idle
    # (cheaper than a timer made and cancelled per request, as aiohttp does it too).

    def _start_idle(self) -> None:
        timeout = self.server.keepalive_timeout
        if not timeout or self.transport is None:
            return
        loop = self._loop
        self._idle_since = loop.time()
        if self._idle is None:
            self._idle = loop.call_at(self._idle_since + timeout, self._idle_expired)

    def _cancel_idle(self) -> None:
        self._idle_since = None

    def _stop_idle_timer(self) -> None:
        """The connection is no longer the lean lane's (closed, or handed to aiohttp)."""
        self._idle_since = None
        if self._idle is not None:
            self._idle.cancel()
            self._idle = None

    def _idle_expired(self) -> None:
        self._idle = None
        since = self._idle_since
        if since is None or self._busy or self.transport is None:
            return  # busy: the timer starts again when the answer is out
        due = since + self.server.keepalive_timeout
        loop = self._loop
        if loop.time() >= due:
            self.transport.close()
        else:  # it went idle again after the timer was set
            self._idle = loop.call_at(due, self._idle_expired)

    def close_if_idle(self) -> None:
        if not self._busy and self.transport is not None:
            self.transport.close()


class LeanServer:
    """What `AppRunner` hands the listening socket: a factory of connections that start on the lean
    lane. It wraps aiohttp's own server, which makes the handlers connections are handed over to
    and which the runner's shutdown reaches through `pre_shutdown` / `shutdown`."""

    def __init__(
        self,
        inner: AiohttpServer,
        *,
        app: web.Application,
        handler: Handler,
        route: Router,
        max_body: int,
        max_field_size: int,
        keepalive_timeout: float,
    ) -> None:
        self.inner = inner
        self.app = app
        self.handler = handler
        self.route = route
        self.max_body = max_body
        self.max_field_size = max_field_size
        self.keepalive_timeout = keepalive_timeout
        self.lean_connections: set[LeanConnection] = set()
        self.closing = False
        self._none_left: asyncio.Event | None = None  # set when the last lean connection is gone

    def forget(self, conn: LeanConnection) -> None:
        self.lean_connections.discard(conn)
        if not self.lean_connections and self._none_left is not None:
            self._none_left.set()

    def __call__(self) -> LeanConnection:
        return LeanConnection(self)

    @property
    def connections(self) -> list[Any]:
        """Open connections, on either lane (aiohttp's `Server.connections`)."""
        return [*self.lean_connections, *self.inner.connections]

    def pre_shutdown(self) -> None:
        self.closing = True
        for conn in list(self.lean_connections):
            conn.close_if_idle()
        self.inner.pre_shutdown()

    # the runner calls shutdown(timeout) as it calls aiohttp's Server.shutdown
    async def shutdown(self, timeout: float | None = None) -> None:  # noqa: ASYNC109
        """Answers being written get `timeout` to end (as aiohttp gives its handlers); then the
        handlers still running are cancelled (their calls are recorded as cut) and awaited."""
        self.closing = True
        if self.lean_connections:
            self._none_left = asyncio.Event()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout or 0):
                    await self._none_left.wait()
        tasks = [c._task for c in self.lean_connections if c._task is not None and not c._task.done()]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=max(timeout or 0, 1.0))
        for conn in list(self.lean_connections):
            if conn.transport is not None:
                conn.transport.close()
        await self.inner.shutdown(timeout)


class LeanAppRunner(WrappingAppRunner):
    """`web.AppRunner` whose listener serves plain calls on the lean lane (`handler(request, route,
    answer)` for requests `route(raw_path, headers)` gives a route for) and the rest with the app."""

    def __init__(
        self,
        app: web.Application,
        *,
        handler: Handler,
        route: Router,
        max_body: int,
        max_field_size: int,
        keepalive_timeout: float,
        **kwargs: Any,
    ) -> None:
        def wrap(inner: AiohttpServer) -> LeanServer:
            return LeanServer(
                inner,
                app=app,
                handler=handler,
                route=route,
                max_body=max_body,
                max_field_size=max_field_size,
                keepalive_timeout=keepalive_timeout,
            )

        super().__init__(app, wrap=wrap, **kwargs)
