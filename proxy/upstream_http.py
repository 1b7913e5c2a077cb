"""A lean pooled HTTP/1.1 client for the upstream calls, the hot path of every forwarded call.

aiohttp's `ClientSession` costs about 60 us of CPU per call (the ClientRequest, a task per body
write, the connector, ClientResponse.start). This client is an asyncio Protocol on the loop's own
transports (uvloop's under `tripwire serve`) with llhttp (MagicStack's httptools) parsing the
answer: the request goes out in one write, the answer's body is handed on as it arrives.

- http and https (the Forwarder's SSL context; SNI = the URL's host), a connect timeout, a read
  timeout between bytes (aiohttp's `sock_read`, stopped while the consumer is behind) and no total
  timeout: streams of reasoning models run for minutes.
- A keep-alive pool per (scheme, host, port) without a connection limit (as `TCPConnector(limit=0)`).
  A connection goes back only once its whole answer was read and both sides allow keep-alive (never
  after a 101 or an answer it could not frame), and is closed once idle for 15 s (aiohttp's
  keepalive_timeout). A request is sent again on a fresh
  connection only if idempotent and its pooled connection broke before any byte of the answer.
- The answer's head is bounded as aiohttp's client bounds it (8190 bytes a line or field, 128
  fields); the body's framing follows Transfer-Encoding's last coding (RFC 9112 section 6.3).
- The request's bytes are what aiohttp sent for the same call: `Host` from the URL, the caller's
  headers in their order, `Accept: */*` when absent, `Content-Length` for a body (and 0 for a
  bodyless POST/PUT/PATCH/DELETE); no User-Agent, no Accept-Encoding, no Content-Type of its own.
- The body is relayed as sent (no decompression; the ObserverFeed decodes for the observer), with flow
  control: the socket stops being read while the consumer has `_HIGH_WATER` bytes waiting.
- Failures raise aiohttp's own exception classes where aiohttp raised them (refused:
  ClientConnectorError; connect timeout: ConnectionTimeoutError; closed before the answer:
  ServerDisconnectedError; a broken body: ClientPayloadError; silence: SocketTimeoutError), so the
  callers' except clauses, `retryable_error` and the recorded messages stay as they were.

aiohttp stays for what this does not do: WebSocket upgrades (`Forwarder.session`), alert webhooks
(`Forwarder.post_json`) and calls that go out through an egress proxy or carry credentials from
`~/.netrc` or the URL (proxy/egress.py; `Forwarder.send` picks the way).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
from typing import Any

import aiohappyeyeballs
import httptools
from aiohttp import (
    ClientConnectionError,
    ClientConnectorCertificateError,
    ClientConnectorDNSError,
    ClientConnectorError,
    ClientConnectorSSLError,
    ClientOSError,
    ClientPayloadError,
    ClientResponseError,
    ConnectionTimeoutError,
    InvalidUrlClientError,
    RequestInfo,
    ServerDisconnectedError,
    SocketTimeoutError,
    hdrs,
)
from multidict import CIMultiDict, CIMultiDictProxy, istr
from yarl import URL

from proxy.aiohttp_compat import (
    BadHttpMessage,
    ContentLengthError,
    HttpProcessingError,
    InvalidHeader,
    LineTooLong,
    TransferEncodingError,
    connection_key,
)

# methods aiohttp sends without Content-Length when they carry no body
_BODYLESS_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "TRACE"})
# methods a request may be sent again for (aiohttp's IDEMPOTENT_METHODS, RFC 9112 section 9.3.1)
_IDEMPOTENT_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "TRACE", "PUT", "DELETE"})
# the answer's head, as aiohttp's client bounds it (max_line_size, max_field_size, max_headers): a
# longer reason, a longer field (name and value) or more fields fail the answer. llhttp hands a field
# over only once it is whole, so the head's bytes are counted as they come too: past what the limits
# allow in all (every field at its longest, with its ": " and CRLF), the answer fails without waiting
# for the end of a field that never ends
_MAX_LINE_SIZE = 8190
_MAX_FIELD_SIZE = 8190
_MAX_HEADERS = 128
_MAX_HEAD_BYTES = (_MAX_HEADERS + 1) * (_MAX_FIELD_SIZE + 4)
# flow control, as aiohttp's StreamReader (2 x its 64 KiB limit): stop reading the socket while the
# consumer has this much waiting, read again once it took it
_HIGH_WATER = 128 * 1024
# an idle pooled connection is closed after this long (aiohttp's keepalive_timeout default)
KEEPALIVE_S = 15.0
# aiohttp's connector default
_HAPPY_EYEBALLS_DELAY_S = 0.25
# a read timer may fire a little early (the loop's clock resolution): that close is close enough
_TIMER_SLACK_S = 0.001

PoolKey = tuple[str, str, int]

# aiohttp's parser spells the header names it knows its own way (set-cookie -> Set-Cookie) and
# response_headers() passes names on as they come: the client keeps getting those spellings
_KNOWN_NAMES = {str(v).lower().encode(): str(v) for v in vars(hdrs).values() if isinstance(v, istr)}
_names: dict[bytes, str] = {}  # raw name -> its text, for the names upstreams send (bounded)
_NAMES_KEPT = 512
_NAME_KEPT_LEN = 64  # longer names are spelled out each time (an upstream's odd ones are not kept)


def _header_name(raw: bytes) -> str:
    name = _names.get(raw)
    if name is None:
        name = _KNOWN_NAMES.get(raw.lower()) or raw.decode("utf-8", "surrogateescape")
        if len(_names) < _NAMES_KEPT and len(raw) <= _NAME_KEPT_LEN:
            _names[raw] = name
    return name


def _last_coding_is_chunked(value: bytes) -> bool:
    """Whether a Transfer-Encoding value's last coding is chunked: only then is the body chunked
    (RFC 9112 section 6.3; `chunked, gzip` is read until the connection closes, as llhttp reads it)."""
    return value.rpartition(b",")[2].strip(b" \t").lower() == b"chunked"


def ssl_context(ca_bundle: str | None) -> ssl.SSLContext:
    """The context aiohttp used: its verified default (ALPN http/1.1), or one trusting `ca_bundle`."""
    if ca_bundle:
        return ssl.create_default_context(cafile=ca_bundle)
    ctx = ssl.create_default_context()
    ctx.set_alpn_protocols(("http/1.1",))
    return ctx


def request_bytes(method: str, url: URL, headers: CIMultiDict[str], body: bytes) -> bytes:
    """The request's head and body, as aiohttp wrote them for the same call."""
    host = headers.get("Host") if "Host" in headers else url.host_port_subcomponent
    lines = [f"{method} {url.raw_path_qs} HTTP/1.1", f"Host: {host}"]
    lines += [f"{name}: {value}" for name, value in headers.items() if name.lower() != "host"]
    if "Accept" not in headers:
        lines.append("Accept: */*")
    if "Content-Length" not in headers and (body or method not in _BODYLESS_METHODS):
        lines.append(f"Content-Length: {len(body)}")
    lines += ("", "")
    text = "\r\n".join(lines)
    # a CR or LF inside a name or value would split the head (aiohttp refuses them the same way)
    if text.count("\n") != len(lines) - 1 or text.count("\r") != len(lines) - 1:
        raise ValueError("Newline or carriage return character detected in HTTP headers")
    head = text.encode("utf-8", "surrogateescape")
    return head + body if body else head


class UpstreamResponse:
    """One answer: status, reason, headers; the body as an async iterator of chunks as they came
    (what is waiting is handed on joined); `release` (the connection goes back to the pool only if
    the whole answer was read) and `close` (cut it). Used as `async with`, as aiohttp's."""

    def __init__(self, conn: _Connection | None, method: str, url: URL) -> None:
        self._conn = conn  # None once the answer is complete (the connection is pooled or closed)
        self.method = method
        self.url = url
        self.status = 0
        self.reason = ""
        self.headers: CIMultiDictProxy[str] = CIMultiDictProxy(CIMultiDict())
        self.head_done = False
        self.complete = False  # the whole body arrived
        self._chunks: list[bytes] = []
        self._buffered = 0
        self._exc: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None

    # --- fed by the connection ------------------------------------------------------------------

    def _feed(self, data: bytes) -> bool:
        """A body chunk; True when the consumer is far enough behind to stop reading the socket."""
        self._chunks.append(data)
        self._buffered += len(data)
        self._wake()
        return self._buffered >= _HIGH_WATER

    def _finish(self) -> None:
        self.complete = True
        self._conn = None
        self._wake()

    def _fail(self, exc: BaseException) -> None:
        if self._exc is None:
            self._exc = exc
        self._conn = None
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def _wait(self) -> None:
        self._waiter = waiter = asyncio.get_running_loop().create_future()
        try:
            await waiter
        finally:
            self._waiter = None

    async def _wait_head(self) -> None:
        while not self.head_done:
            if self._exc is not None:
                raise self._exc
            await self._wait()

    # --- read by the caller ---------------------------------------------------------------------

    def __aiter__(self) -> UpstreamResponse:
        return self

    async def __anext__(self) -> bytes:
        while not self._chunks:
            if self._exc is not None:
                raise self._exc
            if self.complete:
                raise StopAsyncIteration
            await self._wait()
        chunks = self._chunks
        data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        self._chunks = []
        self._buffered = 0
        conn = self._conn
        if conn is not None and conn.paused:
            conn.resume()
        return data

    async def read(self) -> bytes:
        return b"".join([chunk async for chunk in self])

    def release(self) -> None:
        """Done with the answer: a connection still in the middle of it cannot be reused."""
        conn = self._conn
        if conn is not None:
            self._conn = None
            conn.abandon(self)

    def close(self) -> None:
        """Cut the answer: whoever reads it next gets the error aiohttp's `close()` left."""
        if self._exc is None:
            self._exc = ClientConnectionError("Connection closed")
            self._chunks = []
            self._wake()
        self.release()

    async def __aenter__(self) -> UpstreamResponse:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self.release()


class _Connection(asyncio.Protocol):
    """One upstream connection: writes a request, parses its answer into an UpstreamResponse."""

    def __init__(self, pool: UpstreamPool, key: PoolKey) -> None:
        self.pool = pool
        self.key = key
        self.loop = pool.loop
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        # as lenient as aiohttp's own response parser (outside its debug mode): obs-fold and other
        # loose field syntax, a bare LF as a line end, spaces after a chunk size
        self.parser.set_dangerous_leniencies(
            lenient_headers=True, lenient_optional_cr_before_lf=True, lenient_spaces_after_chunk_size=True
        )
        self.response: UpstreamResponse | None = None
        self.closed = False
        self.reusable = True  # False once the byte stream's state is unsure (HEAD, upgrade, garbage)
        self.paused = False
        self.idle_since = 0.0
        self.got_bytes = False  # anything of the current answer arrived
        self.head_bytes = 0  # bytes received since the request went out, until the answer's head ended
        self.last_read = 0.0
        self.timer: asyncio.TimerHandle | None = None
        # the answer being parsed
        self._reason = b""
        self._headers: CIMultiDict[str] = CIMultiDict()
        self._chunked = False
        self._content_length: int | None = None
        self._body_received = 0
        self._header_count = 0
        self._interim = False  # a 1xx answer before the real one
        self._trailers = False  # the head is done: fields now are a chunked body's trailer

    # --- the request ----------------------------------------------------------------------------

    def send(self, response: UpstreamResponse, data: bytes) -> None:
        assert self.transport is not None
        self.response = response
        self.got_bytes = False
        self.head_bytes = 0
        self._start_message()
        self.transport.write(data)
        timeout = self.pool.read_timeout_s
        if timeout:
            self.last_read = now = self.loop.time()
            self.timer = self.loop.call_at(now + timeout, self._on_timer)

    def abandon(self, response: UpstreamResponse) -> None:
        """The caller let go of an answer still arriving: the rest of it is not read, so close."""
        if self.response is response:
            self.response = None
            self.close()

    def close(self) -> None:
        self.closed = True
        self._stop_timer()
        if self.transport is not None:
            self.transport.close()

    def resume(self) -> None:
        self.paused = False
        self.last_read = self.loop.time()  # the time the consumer was behind is not the upstream's
        if self.transport is not None:
            self.transport.resume_reading()

    # --- asyncio.Protocol -----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # (uvloop's are not asyncio.Transport)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        self.got_bytes = True
        self.last_read = self.loop.time()
        response = self.response
        head_before = response is None or response.head_done
        if not head_before:
            self.head_bytes += len(data)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self.reusable = False  # not asked for; what follows the head is not HTTP
            if self.response is not None and self.response.head_done:
                self._message_done()
            return
        except httptools.HttpParserError as e:
            # a limit of ours raised inside a callback comes back wrapped: say what it said
            cause = e.__context__
            self._parse_failed(cause if isinstance(cause, BadHttpMessage) else e, head_before)
            return
        if (
            response is not None
            and self.head_bytes > _MAX_HEAD_BYTES
            and self.response is response
            and not response.head_done
        ):
            self._parse_failed(BadHttpMessage(f"Response head longer than {_MAX_HEAD_BYTES} bytes"))

    def eof_received(self) -> bool | None:
        self.closed = True  # a pooled connection the server closed is never used again
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._stop_timer()
        self.pool.forget(self)
        response = self.response
        if response is None:
            return
        self.response = None
        if not response.head_done:
            if isinstance(exc, OSError):
                response._fail(ClientOSError(*exc.args))
            else:
                response._fail(ServerDisconnectedError())
        elif not self._chunked and self._content_length is None and exc is None:
            response._finish()  # a body without length ends with the connection
        else:
            # aiohttp's words for each case
            underlying: Exception = (
                TransferEncodingError("Not enough data to satisfy transfer length header.")
                if self._chunked or self._content_length is None
                else ContentLengthError(
                    "Not enough data to satisfy content length header "
                    f"(received {self._body_received} of {self._content_length} bytes)."
                )
            )
            message = f"Response payload is not completed: {underlying!r}"
            if exc is not None:
                message = f"{message}. {exc!r}"
            response._fail(ClientPayloadError(message))

    # --- httptools callbacks --------------------------------------------------------------------

    def on_message_begin(self) -> None:
        if self.response is None:  # bytes nobody asked for
            raise ValueError("unexpected data on an idle connection")

    def on_status(self, reason: bytes) -> None:
        self._reason += reason
        if len(self._reason) > _MAX_LINE_SIZE:
            raise LineTooLong(self._reason[:100] + b"...", _MAX_LINE_SIZE)

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._trailers:
            return  # a chunked body's trailer fields: read and dropped, as aiohttp does
        if len(name) + len(value) > _MAX_FIELD_SIZE:
            raise LineTooLong((name + b": " + value)[:100] + b"...", _MAX_FIELD_SIZE)
        # as aiohttp's parser: llhttp strips the whitespace before a value, not after; a NUL is refused
        value = value.rstrip(b" \t")
        if b"\x00" in value:
            raise InvalidHeader(value)
        self._header_count += 1
        if self._header_count > _MAX_HEADERS:
            raise BadHttpMessage("Too many headers received")
        text = _header_name(name)
        if len(text) in (14, 17):
            if text == "Content-Length":
                with contextlib.suppress(ValueError):  # (llhttp refuses a malformed one itself)
                    self._content_length = int(value)
            elif text == "Transfer-Encoding":
                # the last coding decides (a later Transfer-Encoding field continues the list)
                self._chunked = _last_coding_is_chunked(value)
        self._headers.add(text, value.decode("utf-8", "surrogateescape"))

    def on_headers_complete(self) -> None:
        response = self.response
        assert response is not None
        status = self.parser.get_status_code()
        if 100 <= status < 200 and status != 101:
            self._interim = True  # 103 Early Hints and the like: the answer follows (aiohttp skips them)
            self._start_message()
            return
        if status == 101:
            # a switch nobody asked for: what follows the head is not HTTP. llhttp ends the message
            # before it raises HttpParserUpgrade, so the connection is marked now, never pooled
            self.reusable = False
        self._trailers = True
        response.status = status
        response.reason = self._reason.decode("utf-8", "surrogateescape")
        response.headers = CIMultiDictProxy(self._headers)
        response.head_done = True
        response._wake()
        if response.method == "HEAD":
            # llhttp cannot be told a HEAD answer has no body: the answer ends here, the connection too
            self.reusable = False
            self._message_done()

    def on_body(self, body: bytes) -> None:
        response = self.response
        self._body_received += len(body)
        if response is not None and response._feed(body) and self.transport is not None:
            self.paused = True
            self.transport.pause_reading()

    def on_message_complete(self) -> None:
        if self._interim:
            self._interim = False
            return
        if self.response is not None:
            self._message_done()

    # --- internals ------------------------------------------------------------------------------

    def _start_message(self) -> None:
        self._reason = b""
        self._trailers = False
        self._headers = CIMultiDict()
        self._chunked = False
        self._content_length = None
        self._body_received = 0
        self._header_count = 0

    def _message_done(self) -> None:
        response = self.response
        assert response is not None
        self.response = None
        self._stop_timer()
        response._finish()
        if self.reusable and not self.closed and self.parser.should_keep_alive():
            if self.paused:
                self.paused = False
                assert self.transport is not None
                self.transport.resume_reading()
            self.pool.put(self)
        else:
            self.close()

    def _parse_failed(self, e: Exception, head_before: bool = True) -> None:
        """The answer cannot be parsed. As aiohttp: one refused in the read that brought its head
        fails at its start (aiohttp's parser hands nothing of that read over), one refused later
        fails in its body. `head_before`: the head had arrived in an earlier read."""
        response = self.response
        self.response = None
        self.reusable = False
        self.close()
        if response is None:
            return
        if not head_before:
            response.head_done = False  # (its caller, woken for the head, has not run yet)
        if not response.head_done:
            # what aiohttp's ClientResponse.start raised for a head its parser refused
            url = response.url
            info = RequestInfo(url, response.method, CIMultiDictProxy(CIMultiDict()), url)
            if isinstance(e, HttpProcessingError):
                error = ClientResponseError(info, (), status=e.code, message=e.message)
            else:
                error = ClientResponseError(info, (), status=400, message=str(e))
            response._fail(error)
        else:
            response._fail(ClientPayloadError(f"Response payload is not completed: {e!r}"))

    def _stop_timer(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _on_timer(self) -> None:
        self.timer = None
        response = self.response
        timeout = self.pool.read_timeout_s
        if response is None or not timeout:
            return
        now = self.loop.time()
        if self.paused:  # the consumer is behind, not the upstream: sock_read stays stopped
            self.timer = self.loop.call_at(now + timeout, self._on_timer)
            return
        due = self.last_read + timeout
        if now + _TIMER_SLACK_S < due:
            self.timer = self.loop.call_at(due, self._on_timer)
            return
        self.response = None
        self.reusable = False
        self.close()
        response._fail(SocketTimeoutError("Timeout on reading data from socket"))


class UpstreamPool:
    """Keep-alive connections per (scheme, host, port), no limit; `request` sends one call."""

    def __init__(
        self,
        *,
        ssl_context: ssl.SSLContext,
        connect_timeout_s: float | None,
        read_timeout_s: float | None,
        keepalive_s: float = KEEPALIVE_S,
    ) -> None:
        self.loop = asyncio.get_running_loop()
        self.ssl_context = ssl_context
        self.connect_timeout_s = connect_timeout_s
        self.read_timeout_s = read_timeout_s
        self.keepalive_s = keepalive_s
        # per key, oldest first: a connection goes back at the end and is taken from the end
        self._idle: dict[PoolKey, list[_Connection]] = {}
        self._open: set[_Connection] = set()
        # one timer for the pool, due when the oldest idle connection has idled `keepalive_s`
        self._reaper: asyncio.TimerHandle | None = None

    async def request(
        self, method: str, url: URL, headers: CIMultiDict[str], body: bytes
    ) -> UpstreamResponse:
        """Send the request; returns once the answer's head arrived (the body follows)."""
        scheme = url.scheme
        host = url.raw_host
        port = url.port
        if scheme not in ("http", "https") or not host or port is None:
            raise InvalidUrlClientError(url)
        key = (scheme, host, port)
        data = request_bytes(method, url, headers, body)
        conn = self._take(key)
        if conn is not None:
            try:
                return await self._exchange(conn, method, url, data)
            except (ClientOSError, ServerDisconnectedError):
                if conn.got_bytes or method not in _IDEMPOTENT_METHODS:
                    raise
                # A pooled connection that failed before any byte of the answer: most likely the
                # server closed it idle as the request went out, but it may as well have received
                # the request and acted on it before the connection broke. Only an idempotent
                # request is sent once more, on a fresh connection (as aiohttp does, RFC 9112
                # section 9.3.1); a POST or PATCH fails here, as it may have happened upstream.
        conn = await self._connect(key, url)
        return await self._exchange(conn, method, url, data)

    async def _exchange(self, conn: _Connection, method: str, url: URL, data: bytes) -> UpstreamResponse:
        response = UpstreamResponse(conn, method, url)
        conn.send(response, data)
        try:
            await response._wait_head()
        except BaseException:
            response.release()  # cancelled or failed: the connection is not reused
            raise
        return response

    async def _connect(self, key: PoolKey, url: URL) -> _Connection:
        """A new connection, as aiohttp's connector made it (resolve, then happy eyeballs), so a
        failure says what it said."""
        scheme, host, port = key
        tls = scheme == "https"
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                try:
                    infos = await self.loop.getaddrinfo(
                        host, port, type=socket.SOCK_STREAM, flags=socket.AI_ADDRCONFIG
                    )
                except OSError as e:
                    if e.errno is None and isinstance(e, TimeoutError):
                        raise
                    raise ClientConnectorDNSError(_connection_key(url, tls), e) from e
                sock = await aiohappyeyeballs.start_connection(
                    infos, happy_eyeballs_delay=_HAPPY_EYEBALLS_DELAY_S, loop=self.loop
                )
                _, conn = await self.loop.create_connection(
                    lambda: _Connection(self, key),
                    sock=sock,
                    ssl=self.ssl_context if tls else None,
                    server_hostname=host if tls else None,
                )
        except TimeoutError as e:
            if e.errno is None:
                raise ConnectionTimeoutError(f"Connection timeout to host {url}") from e
            raise ClientConnectorError(_connection_key(url, tls), e) from e
        except ssl.CertificateError as e:
            raise ClientConnectorCertificateError(_connection_key(url, tls), e) from e
        except ssl.SSLError as e:
            raise ClientConnectorSSLError(_connection_key(url, tls), e) from e
        except OSError as e:
            raise ClientConnectorError(_connection_key(url, tls), e) from e
        self._open.add(conn)
        return conn

    def _take(self, key: PoolKey) -> _Connection | None:
        idle = self._idle.get(key)
        if not idle:
            return None
        now = self.loop.time()
        while idle:
            conn = idle.pop()  # the most recently used: the least likely to have been closed
            transport = conn.transport
            if conn.closed or not conn.reusable or transport is None or transport.is_closing():
                conn.close()
                continue
            if now - conn.idle_since > self.keepalive_s:
                conn.close()
                continue
            return conn
        return None

    def put(self, conn: _Connection) -> None:
        now = self.loop.time()
        conn.idle_since = now
        self._idle.setdefault(conn.key, []).append(conn)
        if self._reaper is None:
            self._reaper = self.loop.call_at(now + self.keepalive_s, self._reap)

    def _reap(self) -> None:
        """Close the connections idle for `keepalive_s` (aiohttp's keepalive_timeout), then wait for
        the next oldest: a burst's connections do not stay open until the upstream closes them."""
        self._reaper = None
        now = self.loop.time()
        due: float | None = None
        for key, idle in list(self._idle.items()):
            while idle and now + _TIMER_SLACK_S >= idle[0].idle_since + self.keepalive_s:
                idle.pop(0).close()
            if idle:
                first = idle[0].idle_since + self.keepalive_s
                due = first if due is None else min(due, first)
            else:
                del self._idle[key]
        if due is not None:
            self._reaper = self.loop.call_at(due, self._reap)

    def forget(self, conn: _Connection) -> None:
        self._open.discard(conn)
        idle = self._idle.get(conn.key)
        if idle and conn in idle:
            idle.remove(conn)

    def close(self) -> None:
        if self._reaper is not None:
            self._reaper.cancel()
            self._reaper = None
        for conn in list(self._open):
            conn.close()
        self._idle.clear()

    def open_connections(self) -> tuple[_Connection, ...]:
        return tuple(self._open)

    def idle_count(self) -> int:
        """Connections kept for the next call (those the server closed meanwhile not counted)."""
        return sum(not c.closed for idle in self._idle.values() for c in idle)


def _connection_key(url: URL, tls: bool) -> Any:
    """What aiohttp's connector errors print: host, port and `ssl:default`."""
    return connection_key(url.raw_host or "", url.port, tls)
