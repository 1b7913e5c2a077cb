"""What Tripwire keeps across MCP requests: tool calls waiting for their result, and the GET streams
it relays (a Streamable HTTP server stream, or a legacy SSE stream: proxy/mcp/legacy.py).

A `tools/call` is answered on the POST's own answer (JSON or SSE), on a GET stream the client
resumed after the POST's stream broke, or (legacy HTTP+SSE) on the session's long-lived SSE stream
while the POST got a bare 202. So results are matched by (server, MCP session, JSON-RPC id) wherever
they show up, and only JSON-RPC *responses* match: notifications and server-to-client requests
carry a method and never complete a call.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from aiohttp import web

from proxy.exchange import Exchange
from proxy.forward import request_headers
from proxy.mcp import jsonrpc
from proxy.mcp.legacy import LegacyStream, LegacyStreams
from proxy.mcp.observe import MessageObserver
from proxy.routing import Route, join_upstream

if TYPE_CHECKING:
    from proxy.forward import Forwarder
    from proxy.settings import Settings
    from proxy.upstreams import UpstreamRegistry

log = logging.getLogger("tripwire.mcp")

PendingKey = tuple[str, str, str]  # (server, session key, id key)
# How often a relayed GET stream checks that its client is still connected.
CLIENT_CHECK_S = 0.25
# A call answered `input_required` that the client never resends is forgotten after this long.
INPUT_REQUIRED_TTL_S = 3600.0
# `tools/list` answers waiting to be filtered (tool permissions); the oldest goes beyond this many
# (an answer that never comes: the client hung up, the server failed)
MAX_LIST_REWRITES = 1024

# rewrite(response) -> the response to send instead, or None to relay it unchanged
Rewrite = Callable[[dict[str, Any]], dict[str, Any] | None]


@dataclass
class Pending:
    call: jsonrpc.MCPToolCall
    future: asyncio.Future[dict[str, Any]]
    server_asked: bool = False  # the server sent its session a request (sampling, elicitation) meanwhile
    on_server_request: Callable[[], None] | None = None


@dataclass
class AwaitingInput:
    """A 2026-07-28 call answered `input_required`: the resend continues it (one TOOL_CALL)."""

    started: float  # monotonic
    started_wall: float
    guard_fields: dict[str, Any] | None = None  # the first round trip's guard record (replay)


class McpHub:
    def __init__(self, settings: Settings, forwarder: Forwarder, upstreams: UpstreamRegistry) -> None:
        self.settings = settings
        self.forwarder = forwarder
        self.upstreams = upstreams
        self.pending: dict[PendingKey, Pending] = {}
        self.legacy = LegacyStreams(upstreams)  # legacy HTTP+SSE sessions (proxy/mcp/legacy.py)
        self.awaiting_input: dict[tuple[Any, ...], AwaitingInput] = {}
        # answers to rewrite wherever they arrive (a tools/list the permissions filter)
        self.rewrites: dict[PendingKey, Rewrite] = {}

    # --- matching results -------------------------------------------------------------------

    def register(self, session_key: str, call: jsonrpc.MCPToolCall) -> Pending:
        key = (call.server, session_key, jsonrpc.id_key(call.jsonrpc_id))
        pending = Pending(call, asyncio.get_running_loop().create_future())
        self.pending[key] = pending
        return pending

    def rewrite_answer(self, server: str, session_key: str, jsonrpc_id: Any, rewrite: Rewrite) -> None:
        """The answer to request `jsonrpc_id` goes to the client as `rewrite` makes it, on whichever
        stream it comes (the POST's JSON or SSE answer, a resumed GET stream, a legacy SSE stream)."""
        if len(self.rewrites) >= MAX_LIST_REWRITES:
            del self.rewrites[next(iter(self.rewrites))]
        self.rewrites[(server, session_key, jsonrpc.id_key(jsonrpc_id))] = rewrite

    def forget(self, session_key: str, call: jsonrpc.MCPToolCall) -> None:
        self.pending.pop((call.server, session_key, jsonrpc.id_key(call.jsonrpc_id)), None)

    def deliver(self, server: str, session_key: str | None, msg: dict[str, Any]) -> dict[str, Any] | None:
        """A message seen on an answer or stream: complete the call it answers, if any.

        Returns the message to send instead (a WARN appends a text block), or None.
        """
        if session_key is None:
            return None
        kind = jsonrpc.kind(msg)
        if kind == "request":
            self.server_request(server, session_key)
        if kind != "response":
            return None
        key = (server, session_key, jsonrpc.id_key(msg.get("id")))
        if self.rewrites:  # (empty unless tool permissions filter a tools/list)
            rewrite = self.rewrites.pop(key, None)
            if rewrite is not None:
                return rewrite(msg)
        pending = self.pending.pop(key, None)
        if pending is None:
            return None
        if not pending.future.done():
            pending.future.set_result(msg)
        if pending.call.append_text:
            return jsonrpc.append_text_block(msg, pending.call.append_text)
        return None

    def server_request(self, server: str, session_key: str) -> None:
        """The server asked the client something: calls waiting on this session may depend on the answer."""
        for key, pending in self.pending.items():
            if key[0] == server and key[1] == session_key:
                pending.server_asked = True
                if pending.on_server_request is not None:
                    pending.on_server_request()

    def fail_session(self, server: str, session_key: str, message: str) -> None:
        """A legacy stream closed: calls still waiting on it will not get an answer."""
        for key in [k for k in self.pending if k[0] == server and k[1] == session_key]:
            pending = self.pending.pop(key)
            if not pending.future.done():
                pending.future.set_exception(ConnectionError(message))

    def await_input(
        self,
        key: tuple[Any, ...],
        started: float,
        started_wall: float,
        guard_fields: dict[str, Any] | None = None,
    ) -> None:
        """Remember a call answered `input_required` until the client resends it (pruned after a TTL)."""
        for old in [k for k, v in self.awaiting_input.items() if started - v.started > INPUT_REQUIRED_TTL_S]:
            del self.awaiting_input[old]
        self.awaiting_input.setdefault(key, AwaitingInput(started, started_wall, guard_fields))

    # --- GET streams (Streamable HTTP server stream, legacy SSE stream) ----------------------

    def stream_handler(
        self, route: Route, request: web.Request
    ) -> Callable[[web.Request, Route], Awaitable[web.StreamResponse]] | None:
        if route.kind == "mcp" and request.method == "GET":
            return self.handle_stream
        return None

    async def handle_stream(self, request: web.Request, route: Route) -> web.StreamResponse:
        """Relay a GET stream event by event, matching results, rewriting a legacy `endpoint` event."""
        upstream = self.upstreams.get("mcp", route.upstream)
        url = join_upstream(upstream.url, route.path, request.rel_url.raw_query_string)
        headers = request_headers(request.headers, upstream, identity_encoding=True)
        ex = Exchange(
            request=request, route=route, body=b"", started=time.monotonic(), started_wall=time.time()
        )
        mcp_session = request.headers.get("Mcp-Session-Id")
        legacy = LegacyStream(route.upstream, exchange=ex)
        state: dict[str, str | None] = {"key": f"s:{mcp_session}" if mcp_session else None}

        def on_endpoint(data: str) -> str:
            state["key"] = legacy.session_key
            return self.legacy.rewrite_endpoint(legacy, route, url, data)

        ex.observer = MessageObserver(
            lambda msg: self.deliver(route.upstream, state["key"], msg),
            limit=self.settings.max_body_bytes,
            on_endpoint=on_endpoint,
            take_injected=legacy.take_queued,
        )
        forward = asyncio.ensure_future(self.forwarder.forward(ex, url, headers, b""))
        gone = asyncio.ensure_future(client_gone(request))
        try:
            await asyncio.wait({forward, gone}, return_when=asyncio.FIRST_COMPLETED)
            if forward.done():
                forward.result()  # what the relay raised, as before
            else:
                # the client left a silent stream: end the upstream one too, or the server keeps it
                # as the session's stream (and answers the client's next GET 409 Conflict)
                forward.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await forward
        finally:
            forward.cancel()
            gone.cancel()
            if legacy.client_endpoint is not None:
                self.legacy.closed(legacy)
                self.fail_session(legacy.server, legacy.session_key, "the legacy SSE stream closed")
        if isinstance(ex.response, web.StreamResponse):  # MCP is always on aiohttp's lane
            return ex.response
        if ex.answer is not None:
            return ex.answer.to_response()
        return web.Response(status=502)


async def client_gone(request: web.Request) -> None:
    """Returns once the client's connection is closed. aiohttp does not cancel a handler when its
    client hangs up (`tripwire serve` runs without handler cancellation), and a relay only notices
    on its next write, which on a quiet stream may be minutes away."""
    while True:
        transport = request.transport
        if transport is None or transport.is_closing():
            return
        await asyncio.sleep(CLIENT_CHECK_S)
