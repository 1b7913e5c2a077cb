"""The aggregate's `Transport` to its servers: each request runs the owning server's own MCP
pipeline in process (SPEC §3), so guards, permissions, the breaker, the trace and replay see an
aggregated call exactly as a direct call of `/mcp/SERVER`.

A POST becomes an `InProcessRequest` (a `CallRequest`) on a `Route` the aggregate builds with
`aggregated=True` (no path or header can set it), handed to the proxy's own `handle_call`; the
answer the pipeline relays is captured by `CapturedAnswer` (the lane's `AnswerMaker`) and read back
as JSON-RPC messages, one JSON body or SSE events as they arrive (progress before the result).
The servers' standalone GET streams are not calls and bypass the pipeline on direct routes too:
they are read straight from the server.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy

from proxy import jsonparse
from proxy.call_request import AnswerMaker, CallRequest, ClientAnswer
from proxy.mcp import jsonrpc
from proxy.mcp.aggregate import trace_context
from proxy.mcp.aggregate.upstream import JsonObject, ServerUnavailable, TransportStatus
from proxy.routing import TRIPWIRE_HEADER_PREFIX, Route
from proxy.sse import SSEDecoder

log = logging.getLogger("tripwire.mcp.aggregate")

CLIENT_REQUEST: ContextVar[Any] = ContextVar("tripwire_aggregate_client", default=None)
"""The aggregate client's own request while the aggregate answers it (set by the aggregate's
handler; the tasks answering it inherit it): what a call held for a person watches for a hang-up
(SPEC §5.5a), since the in-process request has no connection. For the legacy HTTP+SSE transport it
is the session's stream, as on a server's own route."""

RunCall = Callable[[CallRequest, Route, AnswerMaker], Coroutine[Any, Any, ClientAnswer]]
UpstreamUrl = Callable[[str], str]
_RUNNING: set[asyncio.Task[ClientAnswer]] = set()


class _NoQuery:
    raw_query_string = ""


class _Body:
    """The request body, all there at once (a `BodyStream`)."""

    def __init__(self, body: bytes) -> None:
        self._body = body

    def is_eof(self) -> bool:
        return not self._body

    def read_nowait(self) -> bytes:
        body, self._body = self._body, b""
        return body

    async def readany(self) -> bytes:
        return self.read_nowait()


class InProcessRequest:
    """A `CallRequest` the aggregate makes for its server's pipeline."""

    def __init__(
        self,
        app: web.Application,
        method: str,
        path: str,
        headers: CIMultiDict[str],
        body: bytes,
        client: Any = None,
    ) -> None:
        self._app = app
        self.client = client  # the aggregate client's request: its connection is the one to watch
        self._method = method
        self._path = path
        self._headers = CIMultiDictProxy(headers)
        self._body = body
        self._content = _Body(body)

    @property
    def app(self) -> web.Application:
        return self._app

    @property
    def method(self) -> str:
        return self._method

    @property
    def raw_path(self) -> str:
        return self._path

    @property
    def rel_url(self) -> _NoQuery:
        return _NoQuery()

    @property
    def headers(self) -> CIMultiDictProxy[str]:
        return self._headers

    @property
    def content_length(self) -> int | None:
        return len(self._body)

    @property
    def content(self) -> _Body:
        return self._content

    @property
    def transport(self) -> asyncio.Transport | None:
        return None  # no connection of its own: nothing for a stage to close

    @property
    def keep_alive(self) -> bool:
        return True

    async def read(self) -> bytes:
        return self._body


@dataclass
class CapturedAnswer:
    """The pipeline's relayed answer, its bytes queued as they are written (a `ClientAnswer`)."""

    status: int
    headers: CIMultiDict[str]
    chunks: asyncio.Queue[bytes | None] = field(default_factory=asyncio.Queue)
    prepared: bool = False

    async def prepare(self, request: Any) -> object:
        self.prepared = True
        return None

    async def write(self, data: bytes) -> None:
        if data:
            self.chunks.put_nowait(data)

    async def write_eof(self, data: bytes = b"") -> None:
        if data:
            self.chunks.put_nowait(data)
        self.chunks.put_nowait(None)

    def force_close(self) -> None:
        self.chunks.put_nowait(None)


def inner_headers(headers: Mapping[str, str]) -> CIMultiDict[str]:
    out = CIMultiDict({"Content-Type": "application/json", "Accept": "application/json, text/event-stream"})
    for name, value in headers.items():
        if not name.lower().startswith(TRIPWIRE_HEADER_PREFIX):
            out[name] = value
    return out


class PipelineTransport:
    """One aggregate session's way to its servers, as `agent` (and `session`) of the client's route."""

    def __init__(
        self,
        app: web.Application,
        run_call: RunCall,
        known: Callable[[], tuple[str, ...]],
        outer: Route,
        upstream_url: UpstreamUrl,
        http: Callable[[], aiohttp.ClientSession],
        client_headers: Mapping[str, str] | None = None,
    ) -> None:
        self.app = app
        self.run_call = run_call
        self.known = known  # the MCP servers running now (a stdio child registers once started)
        self.outer = outer
        self.upstream_url = upstream_url
        self.http = http
        # what the client's own request carried for its servers (its bearer token), as a direct route forwards it
        self.client_headers = dict(client_headers or {})

    def route(self, server: str) -> Route:
        o = self.outer
        return Route("mcp", server, "", o.agent, o.session, f"{o.prefix}/{server}", aggregated=True)

    async def _run(
        self, server: str, method: str, headers: Mapping[str, str], body: bytes
    ) -> tuple[int, CIMultiDict[str], AsyncIterator[bytes]]:
        request = InProcessRequest(
            self.app,
            method,
            f"{self.outer.prefix}/{server}",
            inner_headers({**self.client_headers, **trace_context.current(), **headers}),
            body,
            CLIENT_REQUEST.get(),
        )
        heads: asyncio.Queue[CapturedAnswer] = asyncio.Queue()

        def make(status: int, reason: str | None, headers: CIMultiDict[str], stream: bool) -> ClientAnswer:
            answer = CapturedAnswer(status, CIMultiDict(headers))
            heads.put_nowait(answer)
            return answer

        task = asyncio.create_task(self.run_call(request, self.route(server), make))
        got_head = asyncio.ensure_future(heads.get())
        try:
            await asyncio.wait({task, got_head}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            got_head.cancel()
            task.cancel()
            raise
        if got_head.done():
            captured = got_head.result()

            # a reader that stops at the result leaves the call to finish (record, settle) on its own
            _RUNNING.add(task)
            task.add_done_callback(_RUNNING.discard)

            async def relayed() -> AsyncIterator[bytes]:
                while (chunk := await captured.chunks.get()) is not None:
                    yield chunk
                await task  # the call's finish hooks (its TOOL_CALL) ran before the answer ends

            return captured.status, captured.headers, relayed()
        got_head.cancel()
        own = task.result()  # Tripwire's own answer (a refusal, a BLOCK, a server that failed)
        body_bytes = bytes(getattr(own, "body", b"") or b"")
        status = int(getattr(own, "status", 500))
        own_headers = CIMultiDict(getattr(own, "headers", {}) or {})
        error = (_json_object(body_bytes) or {}).get("error")
        if isinstance(error, dict) and error.get("code") == jsonrpc.TRIPWIRE_UPSTREAM_ERROR:
            # the pipeline could not reach the server (recorded, counted by its breaker): unavailable
            raise ServerUnavailable(server, str(error.get("message") or "no answer"))

        async def whole() -> AsyncIterator[bytes]:
            if body_bytes:
                yield body_bytes

        return status, own_headers, whole()

    async def post(
        self,
        server: str,
        headers: Mapping[str, str],
        body: bytes,
        headers_out: Callable[[Mapping[str, str]], None] | None = None,
    ) -> AsyncIterator[JsonObject]:
        if (
            b"subscriptions/listen" in body
            and (_json_object(body) or {}).get("method") == "subscriptions/listen"
        ):
            async for msg in self._direct("POST", server, headers, body):  # a stream, not a call
                yield msg
            return
        status, answer_headers, chunks = await self._run(server, "POST", headers, body)
        if headers_out is not None:
            headers_out(answer_headers)
        if status >= 400:
            raw = b"".join([c async for c in chunks])
            message = _json_object(raw)
            raise TransportStatus(status, message)
        async for msg in messages_of(answer_headers.get("Content-Type", ""), chunks):
            yield msg

    def get_stream(self, server: str, headers: Mapping[str, str]) -> AsyncIterator[JsonObject]:
        return self._direct("GET", server, headers, None)

    async def _direct(
        self, method: str, server: str, headers: Mapping[str, str], body: bytes | None
    ) -> AsyncIterator[JsonObject]:
        """A long-lived stream straight from the server: not a call (GET streams bypass the
        pipeline on `/mcp/NAME` too), and it must not count as a call in flight for the drain."""
        if server not in self.known():
            raise ServerUnavailable(server, "not running")
        url = self.upstream_url(server)
        try:
            async with self.http().request(
                method,
                url,
                data=body,
                # a GET stream accepts only SSE; a POST (listen) both, or the server refuses it (406)
                headers={
                    **inner_headers(headers),
                    **({"Accept": "text/event-stream"} if method == "GET" else {}),
                },
                timeout=None,
            ) as response:
                if response.status >= 400:
                    raise TransportStatus(response.status)
                content_type = response.headers.get("Content-Type", "")
                async for msg in messages_of(content_type, response.content.iter_any()):
                    yield msg
        except (aiohttp.ClientError, OSError) as e:
            raise ServerUnavailable(server, str(e) or type(e).__name__) from e

    async def delete(self, server: str, headers: Mapping[str, str]) -> None:
        with contextlib.suppress(Exception):  # best effort: the server forgets idle sessions anyway
            await self._run(server, "DELETE", headers, b"")


async def messages_of(content_type: str, chunks: AsyncIterator[bytes]) -> AsyncIterator[JsonObject]:
    """The JSON-RPC messages of an answer: one JSON body (a batch's each), or SSE `message` events."""
    if "text/event-stream" in content_type:
        decoder = SSEDecoder()
        async for chunk in chunks:
            for event in decoder.feed(chunk):
                if event.type == "message" and event.data:
                    msg = _json_object(event.data.encode())
                    if msg is not None:
                        yield msg
        return
    raw = b"".join([c async for c in chunks])
    if not raw.strip():
        return
    try:
        data = jsonparse.loads(raw)
    except ValueError:
        return
    for msg in data if isinstance(data, list) else [data]:
        if isinstance(msg, dict):
            yield msg


def _json_object(raw: bytes) -> JsonObject | None:
    try:
        data = jsonparse.loads(raw)
    except ValueError:
        return None
    return data if isinstance(data, dict) else None
