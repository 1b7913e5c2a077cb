"""Forwarding to the upstream and relaying its answer chunk by chunk.

One `aiohttp.ClientSession` per app. The answer is relayed as it arrives: each chunk goes through
the exchange's observer (which may drop an injected event, never hold a stream back) and straight
to the client. A stream that breaks mid-way is closed cleanly towards the client and marked
incomplete, so the call is still recorded (with status "error").
"""

from __future__ import annotations

import asyncio
import logging
import random
import ssl
import time
from collections.abc import Callable, Iterable, Mapping

import aiohttp
import orjson
from aiohttp import web
from multidict import CIMultiDict
from yarl import URL

from proxy.exchange import Answer, Exchange
from proxy.routing import TRIPWIRE_HEADER_PREFIX
from proxy.settings import UpstreamConfig

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
AUTH_HEADERS = ("authorization", "api-key", "x-api-key")


def connection_named(headers: Mapping[str, str]) -> set[str]:
    """Headers a `Connection` header names are hop-by-hop too (RFC 9110 §7.6.1)."""
    values = (
        headers.getall("connection", []) if hasattr(headers, "getall") else [headers.get("connection", "")]
    )
    return {h.strip().lower() for v in values for h in v.split(",") if h.strip()}


def request_headers(
    incoming: Mapping[str, str],
    upstream: UpstreamConfig,
    *,
    identity_encoding: bool,
) -> CIMultiDict[str]:
    """Headers to send upstream: the agent's, minus hop-by-hop, Host and X-Tripwire-*.

    `identity_encoding` asks for an uncompressed answer when the proxy must read it.
    """
    out: CIMultiDict[str] = CIMultiDict()
    named_in_connection = connection_named(incoming)
    for name, value in incoming.items():
        low = name.lower()
        if (
            low in HOP_BY_HOP
            or low in named_in_connection
            # aiohttp hands us the body already decompressed, so its Content-Encoding no longer applies;
            # aiohttp answered any Expect: 100-continue itself and sends the whole body
            or low in ("host", "content-length", "content-encoding", "expect")
            or low.startswith(TRIPWIRE_HEADER_PREFIX)
        ):
            continue
        if identity_encoding and low == "accept-encoding":
            continue
        out.add(name, value)
    key = upstream.api_key()
    if key:
        for h in AUTH_HEADERS:
            out.popall(h, None)
        if upstream.auth_header == "authorization":
            out["Authorization"] = f"Bearer {key}"
        else:
            out[upstream.auth_header] = key
    return out


def response_headers(upstream_headers: Mapping[str, str], *, drop_length: bool) -> CIMultiDict[str]:
    out: CIMultiDict[str] = CIMultiDict()
    named_in_connection = connection_named(upstream_headers)
    for name, value in upstream_headers.items():
        low = name.lower()
        if low in HOP_BY_HOP or low in named_in_connection or (drop_length and low == "content-length"):
            continue
        out.add(name, value)
    return out


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
    ) -> None:
        self.connect_timeout_s = connect_timeout_s
        self.ttfb_timeout_s = ttfb_timeout_s
        self.ca_bundle = ca_bundle
        self.retries = retries  # opt-in (settings.upstream_retries): see send()
        self.retry_base_s = retry_base_s
        self.session: aiohttp.ClientSession | None = None
        # answers being relayed right now, so a drain that runs out of grace can end them cleanly
        self._active: dict[int, tuple[Exchange, aiohttp.ClientResponse]] = {}

    async def start(self) -> None:
        ssl_ctx: ssl.SSLContext | bool = True
        if self.ca_bundle:
            ssl_ctx = ssl.create_default_context(cafile=self.ca_bundle)
        self.session = aiohttp.ClientSession(
            # no total timeout: streams of reasoning models run for minutes; sock_read bounds silence
            timeout=aiohttp.ClientTimeout(
                total=None, connect=self.connect_timeout_s, sock_read=self.ttfb_timeout_s
            ),
            connector=aiohttp.TCPConnector(ssl=ssl_ctx, limit=0),
            auto_decompress=False,  # relay bytes exactly as encoded; Content-Encoding passes through
            trust_env=True,  # HTTPS_PROXY / NO_PROXY for the way out
            skip_auto_headers=("User-Agent", "Accept-Encoding", "Content-Type"),
        )

    async def close(self) -> None:
        if self.session is not None:
            await self.session.close()

    async def _relay(
        self, ex: Exchange, upstream: aiohttp.ClientResponse, response: web.StreamResponse
    ) -> None:
        """Copy the answer chunk by chunk through the observer to the client.

        A client that hangs up is not an upstream failure (it must not trip the breaker): stop
        reading (the upstream stops generating) and let the call be recorded as incomplete.
        """
        observer = ex.observer
        try:
            async for chunk in upstream.content.iter_any():
                out = observer.feed(chunk) if observer is not None else chunk
                if out and not await self._write(ex, response, out):
                    break
            else:
                if observer is not None and hasattr(observer, "flush"):
                    tail = observer.flush()
                    if tail:
                        await self._write(ex, response, tail)
        except (aiohttp.ClientError, TimeoutError) as e:
            # The upstream broke mid-answer: end the client's stream cleanly, record an error.
            ex.stream_complete = False
            ex.upstream_error = f"upstream stream broke: {type(e).__name__}: {e}".rstrip(": ")
        except asyncio.CancelledError:
            # the handler was cancelled (a server with handler_cancellation, or shutdown): a hang-up
            ex.stream_complete = False
            ex.extra["client_disconnected"] = True
            ex.extra.setdefault("incomplete_reason", "the client disconnected before the answer ended")
            raise
        if ex.extra.get("drain_aborted"):
            ex.stream_complete = False
            ex.upstream_error = None
            ex.extra["incomplete_reason"] = "Tripwire shut down before the answer ended (drain grace over)"

    @staticmethod
    async def _write(ex: Exchange, response: web.StreamResponse, data: bytes) -> bool:
        try:
            await response.write(data)
            return True
        except ConnectionResetError:  # includes aiohttp's ClientConnectionResetError
            ex.stream_complete = False
            ex.extra["client_disconnected"] = True
            ex.extra["incomplete_reason"] = "the client disconnected before the answer ended"
            return False

    def abort_all(self) -> int:
        """Drain grace is over: cut the streams still relaying; each records itself as incomplete."""
        for ex, upstream in list(self._active.values()):
            ex.extra["drain_aborted"] = True
            upstream.close()
        return len(self._active)

    async def post_json(self, url: str, body: dict[str, object]) -> None:
        """Alert webhooks: best effort, short timeout, failures logged."""
        assert self.session is not None
        try:
            async with self.session.post(
                url,
                data=orjson.dumps(body),
                headers={"Content-Type": "application/json"},
                timeout=aiohttp.ClientTimeout(total=10),
            ) as resp:
                if resp.status >= 400:
                    log.warning("alert webhook %s answered HTTP %d", url, resp.status)
        except (aiohttp.ClientError, TimeoutError) as e:
            log.warning("alert webhook %s failed: %s", url, e)

    async def send(
        self, ex: Exchange, method: str, url: str, headers: CIMultiDict[str], body: bytes
    ) -> aiohttp.ClientResponse:
        """Send the request; with `retries`, resend it after a connection error, 502 or 503.

        Only before anything reached the client (the answer is not relayed until this returns),
        with jittered exponential back-off, so the circuit breaker counts one failure only when
        every attempt failed. `ex.extra["upstream_retries"]` says how many resends it took.
        """
        assert self.session is not None, "Forwarder.start() not called"
        attempt = 0
        while True:
            try:
                upstream = await self.session.request(
                    # the path and query are passed on as the client encoded them (%23 stays %23)
                    method,
                    URL(url, encoded=True),
                    headers=headers,
                    data=body or None,
                    allow_redirects=False,
                )
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
            ex.extra["upstream_retries"] = attempt
            delay = backoff_delay(attempt, self.retry_base_s)
            log.info("upstream %s: %s; retry %d/%d in %.2fs", url, why, attempt, self.retries, delay)
            await asyncio.sleep(delay)

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
        ends the client's stream cleanly. Either way `ex.upstream_error` says what happened.
        """
        assert self.session is not None, "Forwarder.start() not called"
        request = ex.request
        ex.forwarded = True
        ex.upstream_started = time.monotonic()
        response: web.StreamResponse | None = None
        try:
            async with await self.send(ex, request.method, url, headers, body) as upstream:
                ex.upstream_status = upstream.status
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
                response = web.StreamResponse(
                    status=upstream.status, reason=upstream.reason, headers=out_headers
                )
                ex.response = response
                await response.prepare(request)
                self._active[id(ex)] = (ex, upstream)
                try:
                    await self._relay(ex, upstream, response)
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
                ex.answer = json_error(
                    502,
                    f"Tripwire could not reach the upstream: {type(e).__name__}",
                    "upstream_unreachable",
                    "upstream_unreachable",
                )
        finally:
            ex.upstream_done = time.monotonic()
        if response is not None and not ex.extra.get("client_disconnected"):
            try:
                await response.write_eof()
            except (ConnectionResetError, RuntimeError):
                ex.extra["client_disconnected"] = True
