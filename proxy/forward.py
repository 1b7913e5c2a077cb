"""Forwarding to the upstream and relaying its answer chunk by chunk.

Upstream calls go through a lean pooled HTTP/1.1 client (proxy/upstream_http.py); aiohttp's
`ClientSession` stays for calls through an egress proxy or with ~/.netrc credentials, alert webhooks
and WebSocket upgrades. The answer is relayed as it arrives: each chunk goes through the exchange's
observer (which may drop an injected event, never hold a stream back) and straight to the client.

An answer the upstream compressed although Tripwire asked for `identity` (gzip, deflate; br when a
brotli module that bounds its output is installed; proxy/content_coding.py) is decoded for the
observer only: the client gets the upstream's bytes and headers as they were sent. Decoding is
bounded per event-loop turn and in all (`max_decoded_bytes`: past it the trace keeps the answer's
start, marked truncated). An observer that rewrites the stream (the injected usage chunk) sees the
decoded stream and its output is compressed again with the same coding.

A stream that breaks mid-way (or that drain has to cut) is ended the way the upstream ended it:
abnormally, the connection closed without the chunked body's clean end, so the client's SDK raises
as it would without Tripwire (SPEC §4.2); the call is still recorded (status "error"). MCP answers
are the exception: a broken MCP stream is ended cleanly, its client resumes it with Last-Event-ID.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
import random
import ssl
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import aiohttp
import orjson
from multidict import CIMultiDict
from yarl import URL

from proxy.agent_keys import is_agent_key_header
from proxy.call_request import ClientAnswer
from proxy.constants import OVERHEAD_HEADER
from proxy.content_coding import Codec, ContentDecodeError, content_codings
from proxy.egress import Egress, WayOut
from proxy.exchange import Answer, Exchange
from proxy.outages import OutageLog, unreachable_message
from proxy.routing import TRIPWIRE_HEADER_PREFIX
from proxy.settings import UpstreamConfig
from proxy.upstream_http import UpstreamPool, UpstreamResponse, ssl_context

# an answer being relayed: from the lean client, or from aiohttp (the egress proxy's way)
Upstream = UpstreamResponse | aiohttp.ClientResponse

log = logging.getLogger("tripwire.forward")

# RFC 9110 §7.6.1 hop-by-hop headers, plus those the proxy recomputes.
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    }
)
HOP_BY_HOP_LENGTH = HOP_BY_HOP | {"content-length"}
AUTH_HEADERS = ("authorization", "api-key", "x-api-key")


def connection_named(headers: Mapping[str, str]) -> set[str]:
    """Headers a `Connection` header names are hop-by-hop too (RFC 9110 §7.6.1)."""
    values = (
        headers.getall("connection", []) if hasattr(headers, "getall") else [headers.get("connection", "")]
    )
    return {h.strip().lower() for v in values for h in v.split(",") if h.strip()}


# request headers never sent upstream: hop-by-hop, Host (the upstream's own), Content-Length (the
# body may be rewritten), Content-Encoding (aiohttp hands over a compressed body decoded), Expect
# (aiohttp answered any 100-continue itself and sends the whole body)
_NOT_FORWARDED = HOP_BY_HOP | {"host", "content-length", "content-encoding", "expect"}
_NOT_FORWARDED_IDENTITY = _NOT_FORWARDED | {"accept-encoding"}


def request_headers(
    incoming: Mapping[str, str],
    upstream: UpstreamConfig,
    *,
    identity_encoding: bool,
) -> CIMultiDict[str]:
    """Headers to send upstream: the agent's, minus hop-by-hop, Host and X-Tripwire-*.

    `identity_encoding` asks for an uncompressed answer when the proxy must read it.
    """
    drop = _NOT_FORWARDED_IDENTITY if identity_encoding else _NOT_FORWARDED
    if "connection" in incoming:
        drop = drop | connection_named(incoming)
    out: CIMultiDict[str] = CIMultiDict(
        [
            (name, value)
            for name, value in incoming.items()
            if (low := name.lower()) not in drop and not low.startswith(TRIPWIRE_HEADER_PREFIX)
        ]
    )
    if identity_encoding:
        # without the header any coding is acceptable (RFC 9110 §12.5.3): say so explicitly
        out["Accept-Encoding"] = "identity"
    key = upstream.read_api_key()
    if key:
        for h in AUTH_HEADERS:
            out.popall(h, None)
        if upstream.auth_header == "authorization":
            out["Authorization"] = f"Bearer {key}"
        else:
            out[upstream.auth_header] = key
    elif upstream.api_key == "none":  # a keyless upstream (SPEC §9): no key header goes on
        for h in AUTH_HEADERS:
            out.popall(h, None)
    else:
        # a Tripwire agent key is Tripwire's, never an upstream's (also when a key source gave
        # nothing: an unset variable, a missing file)
        for h in AUTH_HEADERS:
            if h in out and is_agent_key_header(out[h]):
                out.popall(h, None)
    return out


def response_headers(upstream_headers: Mapping[str, str], *, drop_length: bool) -> CIMultiDict[str]:
    drop = HOP_BY_HOP_LENGTH if drop_length else HOP_BY_HOP
    if "connection" in upstream_headers:
        drop = drop | connection_named(upstream_headers)
    return CIMultiDict(
        [(name, value) for name, value in upstream_headers.items() if name.lower() not in drop]
    )


# what a call cut when the drain's grace ran out records as why its answer ended short
DRAIN_CUT_REASON = "Tripwire shut down before the answer ended (drain grace over)"

# decoded bytes of a compressed answer the observer reads per event-loop turn: a chunk that expands
# a thousandfold is read over many turns, so other calls run in between (a few ms each at most)
DECODE_SLICE = 256 * 1024


class ObserverFeed:
    """Feeds the observer the answer as it arrives (decoded) and says what the client gets.

    Without a content coding the observer's output is what the client gets, as always. With one
    Tripwire can decode, the observer reads the decoded bytes; the client gets the upstream's own
    bytes, unless the observer rewrites the stream (then its output, compressed again). A coding
    Tripwire cannot decode is fed to the observer as it is (it will not parse: recorded as such).

    Decoding is bounded: `DECODE_SLICE` decoded bytes at most until the relay lets other calls run
    (`backlog`, then `resume()`), and `limit` in all, past which the observer reads no more of the
    answer (`truncated`; the client still gets every byte). A rewriting observer's output is what the
    client gets, so it reads the whole answer, a slice per turn.
    """

    def __init__(self, observer: Any, codings: list[str], limit: int | None = None) -> None:
        self.observer = observer
        self.rewrites = bool(getattr(observer, "rewrites", False))
        self.codec: Codec | None = None
        if observer is not None and codings and Codec.decodes(codings):
            self.codec = Codec(codings)
        self.reading = True  # the observer still reads the answer
        self.decode_error: str | None = None
        self.limit = None if self.rewrites else limit
        self.truncated = False
        self.backlog = False  # decoded bytes wait for the next turn: the relay calls resume()
        self._pieces: Iterator[bytes] = _NOTHING
        self._decoded = 0
        self._budget = DECODE_SLICE

    def feed(self, chunk: bytes) -> bytes:
        observer = self.observer
        if observer is None:
            return chunk
        if self.codec is None:
            return observer.feed(chunk) if self.reading else chunk
        pieces = self.codec.decode(chunk)
        self._pieces = itertools.chain(self._pieces, pieces) if self.backlog else pieces
        out = self._read()
        if self.decode_error is not None:
            return chunk  # the client gets the upstream's broken bytes as they are
        return out if self.rewrites else chunk

    def resume(self) -> bytes:
        """After the relay let other calls run: another slice of the backlog; what the client gets."""
        self._budget = DECODE_SLICE
        out = self._read()
        return out if self.rewrites else b""

    def flush(self) -> bytes:
        """At the end of the upstream body: what the client still gets (an observer's held tail)."""
        observer = self.observer
        if observer is None:
            return b""
        held = bytearray()
        while self.backlog:  # (the relay reads the backlog before the next chunk: a direct caller)
            held += self.resume()
        tail = observer.flush() if hasattr(observer, "flush") and self.reading else b""
        if self.codec is None:
            return tail
        return bytes(held) + self.codec.encode(tail, final=True) if self.rewrites else b""

    def _read(self) -> bytes:
        """Hand decoded pieces to the observer until this turn's slice is spent (or the limit
        reached); returns the rewriting observer's output, compressed again."""
        observer = self.observer
        codec = self.codec
        assert codec is not None
        out = bytearray()
        try:
            for piece in self._pieces:
                if self.limit is not None and self._decoded + len(piece) > self.limit:
                    if self._decoded < self.limit:
                        observer.feed(piece[: self.limit - self._decoded])
                    self._stop()
                    self.truncated = True
                    log.warning(
                        "a compressed upstream answer decodes to more than %d bytes "
                        "(max_decoded_bytes): recorded truncated, relayed whole",
                        self.limit,
                    )
                    return b""
                self._decoded += len(piece)
                self._budget -= len(piece)
                kept = observer.feed(piece)
                if self.rewrites:
                    out += codec.encode(kept, final=False)  # piece by piece: memory stays bounded
                if self._budget <= 0:
                    self.backlog = True
                    return bytes(out)
        except ContentDecodeError as e:
            # the client gets the upstream's broken bytes as they are; the observer no more of them
            self._stop()
            self.decode_error = str(e)
            log.warning("could not decode an upstream answer for recording: %s", e)
        self.backlog = False
        return bytes(out)

    def _stop(self) -> None:
        self.reading = False
        self.codec = None
        self.backlog = False
        self._pieces = _NOTHING


_NOTHING: Iterator[bytes] = iter(())  # (an empty iterator stays empty: one serves every ObserverFeed)


RETRY_STATUSES = frozenset({502, 503})
MAX_BACKOFF_S = 30.0


def retryable_error(e: BaseException) -> bool:
    """Connection errors (refused, reset, connect timeout), not a read timeout after sending."""
    if not isinstance(e, aiohttp.ClientConnectionError):
        return False
    return not isinstance(e, TimeoutError) or isinstance(e, aiohttp.ConnectionTimeoutError)


def backoff_delay(attempt: int, base_s: float, rand: Callable[[], float] = random.random) -> float:
    """Jittered exponential back-off: base x 2^(attempt-1), capped, times a factor in [0.5, 1)."""
    return min(MAX_BACKOFF_S, base_s * 2 ** (attempt - 1)) * (0.5 + rand() / 2)


def json_error(status: int, message: str, err_type: str, code: str, **extra: object) -> Answer:
    body = {"error": {"message": message, "type": err_type, "code": code, **extra}}
    return Answer(status, orjson.dumps(body))


class Forwarder:
    def __init__(
        self,
        *,
        connect_timeout_s: float,
        ttfb_timeout_s: float,
        ca_bundle: str | None = None,
        retries: int = 0,
        retry_base_s: float = 0.5,
        max_decoded_bytes: int | None = None,
    ) -> None:
        self.connect_timeout_s = connect_timeout_s
        self.ttfb_timeout_s = ttfb_timeout_s
        self.ca_bundle = ca_bundle
        self.retries = retries  # opt-in (settings.upstream_retries): see send()
        self.retry_base_s = retry_base_s
        # how much of a compressed answer the observer reads (settings.max_decoded_bytes; see ObserverFeed)
        self.max_decoded_bytes = max_decoded_bytes
        # the upstream calls that go out directly (nearly all of them)
        self.pool: UpstreamPool | None = None
        # calls through an egress proxy or with ~/.netrc credentials, and alert webhooks; the way out
        # (proxy, ~/.netrc) is read once, at start
        self.http: aiohttp.ClientSession | None = None
        self.egress: Egress | None = None
        # WebSocket upgrades (proxy/websocket/handler.py) read the way out from the environment per
        # connection (trust_env): long-lived, so the lookup does not matter there
        self.session: aiohttp.ClientSession | None = None
        # answers being relayed right now, so a drain that runs out of grace can end them cleanly
        self._active: dict[int, tuple[Exchange, Upstream]] = {}
        self.outages = OutageLog()  # one log line per upstream outage, not one per failed call

    async def start(self) -> None:
        ssl_ctx: ssl.SSLContext | bool = True
        if self.ca_bundle:
            ssl_ctx = ssl.create_default_context(cafile=self.ca_bundle)
        self.egress = Egress()  # HTTPS_PROXY / NO_PROXY / ~/.netrc, as trust_env reads them, once
        self.http = self._client(ssl_ctx, trust_env=False)
        self.session = self._client(ssl_ctx, trust_env=True)
        self.pool = UpstreamPool(
            ssl_context=ssl_ctx if isinstance(ssl_ctx, ssl.SSLContext) else ssl_context(None),
            connect_timeout_s=self.connect_timeout_s,
            read_timeout_s=self.ttfb_timeout_s,
        )

    def _client(self, ssl_ctx: ssl.SSLContext | bool, *, trust_env: bool) -> aiohttp.ClientSession:
        return aiohttp.ClientSession(
            # no total timeout: streams of reasoning models run for minutes; sock_read bounds silence
            timeout=aiohttp.ClientTimeout(
                total=None, connect=self.connect_timeout_s, sock_read=self.ttfb_timeout_s
            ),
            connector=aiohttp.TCPConnector(ssl=ssl_ctx, limit=0),
            auto_decompress=False,  # relay bytes exactly as encoded; Content-Encoding passes through
            trust_env=trust_env,
            skip_auto_headers=("User-Agent", "Accept-Encoding", "Content-Type"),
        )

    async def close(self) -> None:
        if self.pool is not None:
            self.pool.close()
        for client in (self.http, self.session):
            if client is not None:
                await client.close()

    async def _relay(self, ex: Exchange, upstream: Upstream, response: ClientAnswer, *, whole: bool) -> bytes:
        """Copy the answer chunk by chunk through the observer to the client.

        A client that hangs up is not an upstream failure (it must not trip the breaker): stop
        reading (the upstream stops generating) and let the call be recorded as incomplete.
        With `ex.hold_end`, returns the bytes kept back for the answer's end (`_end`): a whole
        answer's last piece, or an MCP stream from the call's result on; a stream keeps back only
        its clean end.
        """
        tap = ObserverFeed(ex.observer, content_codings(upstream.headers), self.max_decoded_bytes)
        chunks = upstream if isinstance(upstream, UpstreamResponse) else upstream.content.iter_any()
        hold, mcp = ex.hold_end, getattr(ex.protocol, "kind", None) == "mcp"
        held = b""
        try:
            async for chunk in chunks:
                out = tap.feed(chunk)
                if hold and (whole or (mcp and ex.result is not None)):
                    if whole and not (mcp and ex.result is not None):
                        out, held = held, out  # the previous piece goes; this one may be the last
                    else:
                        out, held = b"", held + out  # the client must not have the result yet
                if out and not await self._write(ex, response, out):
                    break
                if tap.backlog and not await self._read_backlog(ex, response, tap):
                    break
            else:
                tail = tap.flush()
                if hold:
                    held += tail
                elif tail:
                    await self._write(ex, response, tail)
        except (aiohttp.ClientError, TimeoutError) as e:
            # The upstream broke mid-answer: record an error; forward() ends the client's stream
            # abnormally, as the upstream's ended
            ex.stream_complete = False
            ex.upstream_error = f"upstream stream broke: {type(e).__name__}: {e}".rstrip(": ")
        except asyncio.CancelledError:
            # the handler was cancelled (a server with handler_cancellation, or shutdown): a hang-up
            ex.stream_complete = False
            ex.client_disconnected = True
            if ex.incomplete_reason is None:
                ex.incomplete_reason = "the client disconnected before the answer ended"
            raise
        finally:
            ex.content_truncated = tap.truncated
        if ex.drain_aborted:
            ex.stream_complete = False
            ex.upstream_error = None
            ex.incomplete_reason = DRAIN_CUT_REASON
        return held

    async def _read_backlog(self, ex: Exchange, response: ClientAnswer, tap: ObserverFeed) -> bool:
        """The rest of a chunk that decodes large, a slice per event-loop turn so that other calls
        run in between; False when the relay must stop (the client hung up, drain cut it)."""
        while tap.backlog:
            await asyncio.sleep(0)
            if ex.drain_aborted:
                return False
            out = tap.resume()
            if out and not await self._write(ex, response, out):
                return False
        return True

    @staticmethod
    def _hung_up(ex: Exchange) -> None:
        ex.stream_complete = False
        ex.client_disconnected = True
        ex.incomplete_reason = "the client disconnected before the answer ended"

    @classmethod
    async def _write(cls, ex: Exchange, response: ClientAnswer, data: bytes) -> bool:
        try:
            await response.write(data)
            return True
        except ConnectionResetError:  # includes aiohttp's ClientConnectionResetError
            cls._hung_up(ex)
            return False

    @staticmethod
    def _broken(ex: Exchange) -> bool:
        """The answer did not end cleanly (the upstream broke, or drain cut it): end it abnormally.

        Not for MCP, whose clients resume a broken stream (Last-Event-ID) and are given a clean end.
        """
        if getattr(ex.protocol, "kind", None) == "mcp":
            return False
        return ex.upstream_error is not None or ex.drain_aborted

    @staticmethod
    def _cut(ex: Exchange, response: ClientAnswer) -> None:
        """Close the client's connection without the body's clean end (no last chunk, or short of
        Content-Length): what was relayed still goes out first, then the client sees the break."""
        response.force_close()
        transport = ex.request.transport
        if transport is not None:
            transport.close()

    def abort_all(self) -> int:
        """Drain grace is over: cut the streams still relaying; each records itself as incomplete
        and its client's answer is ended abnormally (SPEC §4.2)."""
        for ex, upstream in list(self._active.values()):
            ex.drain_aborted = True
            upstream.close()
        return len(self._active)

    async def post_json(self, url: str, body: dict[str, object]) -> None:
        """Alert webhooks: best effort, short timeout, failures logged."""
        assert self.http is not None and self.egress is not None
        target = URL(url)
        way = self.egress.way_out(target)
        try:
            async with self.http.post(
                target,
                data=orjson.dumps(body),
                headers={"Content-Type": "application/json", **(way.headers or {})},
                timeout=aiohttp.ClientTimeout(total=10),
                proxy=way.proxy,
                proxy_headers=way.proxy_headers,
                auth=way.auth,
            ) as resp:
                if resp.status >= 400:
                    log.warning("alert webhook %s answered HTTP %d", url, resp.status)
        except (aiohttp.ClientError, TimeoutError) as e:
            log.warning("alert webhook %s failed: %s", url, e)

    async def send(
        self, ex: Exchange, method: str, url: str, headers: CIMultiDict[str], body: bytes
    ) -> Upstream:
        """Send the request; with `retries`, resend it after a connection error, 502 or 503.

        Only before anything reached the client (the answer is not relayed until this returns),
        with jittered exponential back-off, so the circuit breaker counts one failure only when
        every attempt failed. `ex.upstream_retries` says how many resends it took.
        """
        assert self.pool is not None and self.egress is not None, "Forwarder.start() not called"
        # the path and query are passed on as the client encoded them (%23 stays %23)
        target = URL(url, encoded=True)
        way = self.egress.way_out(target)
        if way.headers:
            headers = headers.copy()
            headers.update(way.headers)
        # the lean client goes straight to the upstream; aiohttp knows proxies and credentials
        direct = way.proxy is None and way.auth is None and target.raw_user is None
        attempt = 0
        while True:
            try:
                upstream: Upstream
                if direct:
                    upstream = await self.pool.request(method, target, headers, body)
                else:
                    upstream = await self._via_aiohttp(method, target, headers, body, way)
            except aiohttp.ClientError as e:
                if attempt >= self.retries or not retryable_error(e):
                    raise
                why = type(e).__name__
            else:
                if attempt >= self.retries or upstream.status not in RETRY_STATUSES:
                    return upstream
                why = f"HTTP {upstream.status}"
                upstream.release()
            attempt += 1
            ex.upstream_retries = attempt
            delay = backoff_delay(attempt, self.retry_base_s)
            log.info("upstream %s: %s; retry %d/%d in %.2fs", url, why, attempt, self.retries, delay)
            await asyncio.sleep(delay)

    async def _via_aiohttp(
        self, method: str, target: URL, headers: CIMultiDict[str], body: bytes, way: WayOut
    ) -> aiohttp.ClientResponse:
        assert self.http is not None
        return await self.http.request(
            method,
            target,
            headers=headers,
            data=body or None,
            allow_redirects=False,
            proxy=way.proxy,
            proxy_headers=way.proxy_headers,
            auth=way.auth,
        )

    async def forward(
        self,
        ex: Exchange,
        url: str,
        headers: CIMultiDict[str],
        body: bytes,
        *,
        extra_response_headers: Iterable[tuple[str, str]] = (),
    ) -> None:
        """Send the request upstream and relay the answer into `ex.response`.

        Failures before any byte reached the client become `ex.answer` (502/504); a failure mid-stream
        ends the client's stream abnormally, as the upstream's ended. Either way `ex.upstream_error`
        says what happened.
        """
        assert self.pool is not None, "Forwarder.start() not called"
        request = ex.request
        ex.forwarded = True
        ex.upstream_started = time.monotonic()
        response: ClientAnswer | None = None
        held = b""
        try:
            async with await self.send(ex, request.method, url, headers, body) as upstream:
                ex.upstream_status = upstream.status
                self.outages.answered(ex.route.kind, ex.route.upstream)
                ex.first_byte_at = time.monotonic()
                observer = ex.observer
                if observer is not None and hasattr(observer, "status"):
                    observer.status = upstream.status  # error bodies on streaming requests get http_NNN
                rewrites = observer is not None and getattr(observer, "rewrites", False)
                out_headers = response_headers(upstream.headers, drop_length=rewrites)
                is_sse = upstream.headers.get("content-type", "").startswith("text/event-stream")
                if is_sse:
                    out_headers.setdefault("Cache-Control", "no-cache")
                    out_headers["X-Accel-Buffering"] = "no"
                for name, value in extra_response_headers:
                    out_headers[name] = value
                out_headers[OVERHEAD_HEADER] = ex.overhead_ms(time.monotonic())
                response = ex.answer_maker(upstream.status, upstream.reason, out_headers, is_sse)
                ex.response = response
                try:
                    await response.prepare(request)
                except ConnectionResetError:
                    # aiohttp raises ClientConnectionResetError (a ClientError too) when the client
                    # has hung up before the answer's head went out: the client's doing, not the
                    # upstream's, so it must not count toward the circuit breaker
                    self._hung_up(ex)
                    return
                self._active[id(ex)] = (ex, upstream)
                try:
                    held = await self._relay(ex, upstream, response, whole=not is_sse)
                finally:
                    self._active.pop(id(ex), None)
        except TimeoutError:
            ex.upstream_error = "upstream timed out"
            if response is None:
                ex.answer = json_error(
                    504,
                    "Tripwire: the upstream did not answer in time",
                    "upstream_timeout",
                    "upstream_timeout",
                )
        except aiohttp.ClientError as e:
            ex.upstream_error = f"upstream connection failed: {type(e).__name__}: {e}"
            if response is None:
                message = unreachable_message(ex.route.upstream, URL(url, encoded=True), e)
                self.outages.failed(ex.route.kind, ex.route.upstream, message)
                ex.answer = json_error(502, message, "upstream_unreachable", "upstream_unreachable")
        finally:
            ex.upstream_done = time.monotonic()
        if response is not None and not ex.client_disconnected:
            # written by the handler once the call is settled (SPEC §8); not an MCP answer that did
            # not carry the call's result (legacy's 202, a stream the client resumes on a GET): the
            # client needs its end to go on
            if ex.hold_end and (ex.result is not None or getattr(ex.protocol, "kind", None) != "mcp"):
                ex.held_end = functools.partial(self._end, ex, response, held)
                return
            await self._end(ex, response, held)

    async def _end(self, ex: Exchange, response: ClientAnswer, held: bytes) -> None:
        """The answer's end: what was kept back, then the clean end, or the cut of a broken answer."""
        if held and not await self._write(ex, response, held):
            return
        if self._broken(ex):
            # a head still held back goes out first: the client sees the answer break, as direct
            with contextlib.suppress(ConnectionResetError, RuntimeError):
                await response.write(b"")
            self._cut(ex, response)
            return
        try:
            await response.write_eof()
        except (ConnectionResetError, RuntimeError):
            ex.client_disconnected = True
