"""The aggregate endpoint `/mcp` (SPEC §3): one MCP server in front of every configured one.

To its client it is an ordinary MCP server, in whichever revision the client speaks: the handshake
era (`initialize`, then `Mcp-Session-Id` naming Tripwire's own session; a GET stream for
notifications), 2026-07-28 (stateless requests, `server/discover`), or the legacy HTTP+SSE
transport (a GET stream whose `endpoint` event names where to POST). Each client session maps to
one upstream session per server (`UpstreamSessions`, opened lazily), whose requests run that
server's own pipeline in process (proxy/mcp/aggregate/inprocess.py).

`tools/list` is the union of every server's tools named `SERVER__TOOL`, fetched concurrently, each
server within `list_timeout_s`: a server down, slow or failing drops out (a warning, `/healthz`)
and is probed until it answers again, when `notifications/tools/list_changed` tells the client.
Tools the agent may not call (SPEC §9) are left out. Prompts are prefixed the same way; resources
keep their URIs and are routed to the server that listed them. Cursors are Tripwire's own
(proxy/mcp/aggregate/names.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any

import orjson
from aiohttp import web

from proxy import jsonparse
from proxy.guards.config import GuardConfig
from proxy.mcp import jsonrpc
from proxy.mcp.aggregate import revisions as rev
from proxy.mcp.aggregate import trace_context
from proxy.mcp.aggregate.client_session import (
    LISTEN_FLAGS,
    STREAM_QUEUE,
    SUBSCRIPTION_META,
    ClientSession,
    RpcError,
    as_dict,
    put_bounded,
)
from proxy.mcp.aggregate.inprocess import CLIENT_REQUEST
from proxy.mcp.aggregate.methods import (
    CAPABILITIES,
    HANDSHAKE_VERSIONS,
    LIST_CHANGED,
    METHOD_NOT_FOUND,
    MODERN_VERSION,
    SERVER_INFO,
    Methods,
)
from proxy.mcp.aggregate.upstream import (
    REOPENED,
    JsonObject,
    ServerUnavailable,
    Transport,
    TransportStatus,
    UpstreamError,
    UpstreamSessions,
)
from proxy.routing import Route

log = logging.getLogger("tripwire.mcp.aggregate")

VERSION_META = "io.modelcontextprotocol/protocolVersion"
# 2026-07-28 results that carry ttlMs and cacheScope
CACHEABLE = frozenset(
    ("tools/list", "prompts/list", "resources/list", "resources/templates/list", "resources/read")
)
KEEPALIVE_S = 15.0  # a comment on an idle stream or a slow answer, which also notices a client that left
MAX_INPUT_ROUNDS = 8  # a server asking a handshake client again and again: answered this often at most
ASK_TIMEOUT_S = 600.0  # how long a server's question (sampling, elicitation) waits for the client
MAX_SESSIONS = 1000  # client sessions kept; the least recently used one closes past it
SESSION_IDLE_S = 3600.0  # a client session without a request or an open stream this long is closed

TransportFor = Callable[[Route, Mapping[str, str]], Transport]


class Aggregate:
    def __init__(
        self,
        guard_config: Callable[[str], GuardConfig],
        servers: tuple[str, ...],
        list_timeout_s: float,
        transport_for: TransportFor,
        server_list_timeouts: Mapping[str, float] | None = None,
    ) -> None:
        self.methods = Methods(guard_config, servers, list_timeout_s, server_list_timeouts)
        self.servers = servers
        self.transport_for = transport_for
        self.sessions: dict[str, ClientSession] = {}  # in least-recently-used order

    # --- health --------------------------------------------------------------------------------

    def health(self) -> JsonObject:
        """For /healthz: the servers that last failed to list, and why (never fails readiness)."""
        return {"servers": list(self.servers), "down": dict(self.methods.server_health)}

    # --- sessions ------------------------------------------------------------------------------

    def _open(
        self,
        key: str,
        route: Route,
        headers: Mapping[str, str],
        *,
        modern: bool,
        legacy: bool,
        client: tuple[Any, Any] = (None, None),
    ) -> ClientSession:
        """A client session. `client`: its (clientInfo, capabilities), which its upstream sessions
        declare to the servers, so a server may ask it what it can answer (sampling, elicitation)."""
        info, capabilities = (c if isinstance(c, dict) else None for c in client)
        transport = self.transport_for(route, _client_headers(headers))
        s = ClientSession(
            key, route, UpstreamSessions(transport, client_info=info, capabilities=capabilities)
        )
        s.modern, s.legacy = modern, legacy
        s.upstreams.on_notification = lambda server, method, params: self._relay(s, server, method, params)
        now = time.monotonic()
        for old in [o for o in self.sessions.values() if not o.streams and now - o.used > SESSION_IDLE_S]:
            _close_later(self.sessions.pop(old.key))  # its client left without a DELETE
        self.sessions[key] = s
        while len(self.sessions) > MAX_SESSIONS:
            oldest = next(iter(self.sessions))
            _close_later(self.sessions.pop(oldest))
        return s

    def _find(self, key: str, route: Route) -> ClientSession | None:
        """The client's session; None when unknown, or opened by another agent (never shared)."""
        s = self.sessions.get(key)
        if s is None or s.route.agent != route.agent:
            return None
        self.sessions[key] = self.sessions.pop(key)  # most recently used last
        s.used = time.monotonic()
        return s

    def _stateless(self, route: Route, headers: Mapping[str, str], first: JsonObject) -> ClientSession:
        """2026-07-28 clients keep no session: one per agent and session keeps the upstream ones."""
        key = f"modern:{route.agent}:{route.session or ''}"
        return self._find(key, route) or self._open(
            key, route, headers, modern=True, legacy=False, client=_meta_client(first)
        )

    async def close(self) -> None:
        sessions, self.sessions = list(self.sessions.values()), {}
        for s in sessions:
            await _close(s)

    def _relay(self, s: ClientSession, server: str, method: str, params: JsonObject | None) -> None:
        """A server's notification: list changes and resource updates go to the client as they are."""
        if method == REOPENED:  # back after a loss, or restarted: what it listed may have changed
            self.methods.reopened(s, server)
            return
        if method in LIST_CHANGED or method in ("notifications/resources/updated", "notifications/message"):
            s.send(method, params)

    # --- HTTP ----------------------------------------------------------------------------------

    async def handle(self, request: web.Request, route: Route) -> web.StreamResponse:
        with trace_context.answering(request.headers):  # the client's traceparent, to its servers
            return await self._handle(request, route)

    async def _handle(self, request: web.Request, route: Route) -> web.StreamResponse:
        if request.method == "GET":
            return await self._get(request, route)
        if request.method == "DELETE":
            s = self._find(request.headers.get("Mcp-Session-Id", ""), route)
            if s is None:
                return web.Response(status=404, text="unknown session")
            self.sessions.pop(s.key, None)
            await _close(s)
            return web.Response(status=200)
        if request.method != "POST":
            return web.Response(status=405, headers={"Allow": "GET, POST, DELETE"})
        CLIENT_REQUEST.set(request)  # a held call watches this client's connection (SPEC §5.5a)
        parsed = jsonrpc.parse_body(await request.read())
        if parsed is None:
            return _json(
                jsonrpc.render_error(None, jsonrpc.PARSE_ERROR, "Parse error: the body is not JSON"), 400
            )
        messages, batch = parsed
        legacy_key = request.query.get("session")
        if legacy_key is not None:
            return await self._legacy_post(legacy_key, route, messages)
        first = messages[0] if messages and isinstance(messages[0], dict) else {}
        if first.get("method") == "initialize" and not batch:
            return self._initialize(request, route, first)
        version = request.headers.get("MCP-Protocol-Version") or _meta_version(first)
        session_id = request.headers.get("Mcp-Session-Id")
        if version == MODERN_VERSION and not session_id:
            s = self._stateless(route, request.headers, first)
        elif version and version not in HANDSHAKE_VERSIONS and not session_id:
            data = {"supported": [*HANDSHAKE_VERSIONS, MODERN_VERSION], "requested": version}
            body = jsonrpc.render_error(
                first.get("id"), UNSUPPORTED_VERSION, "Unsupported protocol version", data
            )
            return _json(body, 400)
        elif session_id:
            found = self._find(session_id, route)
            if found is None:
                # unknown (or another agent's): the client starts a new session, as after a server restart
                return _json(
                    jsonrpc.render_error(first.get("id"), INVALID_PARAMS_SESSION, "Session not found"), 404
                )
            s = found
        else:
            body = jsonrpc.render_error(
                first.get("id"),
                jsonrpc.INVALID_REQUEST,
                "Bad Request: initialize first (or send Mcp-Session-Id)",
            )
            return _json(body, 400)
        requests = [m for m in messages if jsonrpc.kind(m) == "request"]
        for m in messages:
            if jsonrpc.kind(m) == "notification":
                self._client_notification(s, m)
            elif jsonrpc.kind(m) == "response":
                _answered(s, m)
        if not requests:
            return web.Response(status=202)
        if batch:
            answers = await asyncio.gather(*(self._answer(s, m, None) for m in requests))
            return _json(b"[" + b",".join(answers) + b"]")
        msg = requests[0]
        if msg.get("method") == "subscriptions/listen":
            return await self._listen(request, s, msg)
        return await self._respond(request, s, msg)

    def _initialize(self, request: web.Request, route: Route, msg: JsonObject) -> web.Response:
        params = as_dict(msg.get("params"))
        asked = params.get("protocolVersion")
        version = asked if asked in HANDSHAKE_VERSIONS else HANDSHAKE_VERSIONS[-1]
        client = (params.get("clientInfo"), params.get("capabilities"))
        s = self._open(uuid.uuid4().hex, route, request.headers, modern=False, legacy=False, client=client)
        result = {"protocolVersion": version, "capabilities": CAPABILITIES, "serverInfo": SERVER_INFO}
        return _json(jsonrpc.render_result(msg.get("id"), result), headers={"Mcp-Session-Id": s.key})

    async def _respond(self, request: web.Request, s: ClientSession, msg: JsonObject) -> web.StreamResponse:
        """One request's answer: JSON, unless something must go to the client before it (progress,
        a server's question) or it is long in coming (a call held for approval, a slow tool): then
        an SSE stream, those first (or a `: keep-alive` comment every KEEPALIVE_S, which keeps the
        client's read timeout and any proxy between from closing it), the answer last."""
        headers = {"Mcp-Session-Id": s.key} if not s.modern else {}
        out: asyncio.Queue[bytes | None] = asyncio.Queue()
        sse = "text/event-stream" in request.headers.get("Accept", "")
        task = self._running(s, msg, out.put_nowait if sse else None)
        task.add_done_callback(lambda t: out.put_nowait(None))
        response: web.StreamResponse | None = None
        while True:
            try:
                event = await (asyncio.wait_for(out.get(), KEEPALIVE_S) if sse else out.get())
            except TimeoutError:  # (a queue's get gives up its place, never an item, on a timeout)
                if response is None:
                    response = await _sse_answer(request, headers)
                await response.write(b": keep-alive\n\n")
                continue
            if event is None:
                break
            if response is None:
                response = await _sse_answer(request, headers)
            await response.write(jsonrpc.sse_message(event))
        if response is None:
            if task.cancelled():  # the client cancelled it: no answer (MCP "Cancellation")
                return web.Response(status=202, headers=headers)
            return _json(task.result(), headers=headers)
        if not task.cancelled():
            await response.write(jsonrpc.sse_message(task.result()))
        await response.write_eof()
        return response

    def _running(
        self, s: ClientSession, msg: JsonObject, sink: Callable[[bytes], None] | None
    ) -> asyncio.Task[bytes]:
        """A client request being answered, cancellable by its `notifications/cancelled`."""
        key = jsonrpc.id_key(msg.get("id"))
        task = asyncio.create_task(self._answer(s, msg, sink))
        s.running[key] = task
        task.add_done_callback(lambda t: s.running.pop(key, None) if s.running.get(key) is t else None)
        return task

    async def _listen(self, request: web.Request, s: ClientSession, msg: JsonObject) -> web.StreamResponse:
        """2026-07-28 `subscriptions/listen`: an SSE stream of the list changes the client asked for,
        acknowledged first, kept until the client closes it."""
        asked = as_dict(as_dict(msg.get("params")).get("notifications"))
        honored = {flag: True for flag in LISTEN_FLAGS.values() if asked.get(flag)}
        queue: asyncio.Queue[bytes] = asyncio.Queue(STREAM_QUEUE)
        listener = (msg.get("id"), frozenset(honored), queue)
        ack = {
            "jsonrpc": "2.0",
            "method": "notifications/subscriptions/acknowledged",
            "params": {"notifications": honored, "_meta": {SUBSCRIPTION_META: msg.get("id")}},
        }
        put_bounded(queue, orjson.dumps(ack))
        s.listeners.append(listener)
        try:
            return await self._stream(request, s, None, queue)
        finally:
            s.listeners.remove(listener)

    async def _get(self, request: web.Request, route: Route) -> web.StreamResponse:
        session_id = request.headers.get("Mcp-Session-Id")
        if session_id:
            s = self._find(session_id, route)
            if s is None:
                return web.Response(status=404, text="unknown session")
            return await self._stream(request, s, None)
        if "text/event-stream" not in request.headers.get("Accept", "") or request.query.get("session"):
            return web.Response(status=405, headers={"Allow": "POST"})
        # the legacy HTTP+SSE transport: this stream is the session; its `endpoint` names the POSTs'
        s = self._open(uuid.uuid4().hex, route, request.headers, modern=False, legacy=True)
        s.stream_request = request
        try:
            return await self._stream(request, s, f"{request.path}?session={s.key}")
        finally:
            self.sessions.pop(s.key, None)
            await _close(s)

    async def _stream(
        self,
        request: web.Request,
        s: ClientSession,
        endpoint: str | None,
        queue: asyncio.Queue[bytes] | None = None,
    ) -> web.StreamResponse:
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await response.prepare(request)
        s.streams += 1
        try:
            if endpoint is not None:
                await response.write(b"event: endpoint\ndata: " + endpoint.encode() + b"\n\n")
            while not s.closed:
                try:
                    message = await asyncio.wait_for((queue or s.stream).get(), KEEPALIVE_S)
                except TimeoutError:
                    await response.write(b": keep-alive\n\n")
                    continue
                if not message:  # the session closed
                    break
                await response.write(jsonrpc.sse_message(message))
        except ConnectionError:
            pass  # the client left
        finally:
            s.streams -= 1
            s.used = time.monotonic()
        return response

    async def _legacy_post(self, key: str, route: Route, messages: list[Any]) -> web.Response:
        s = self._find(key, route)
        if s is None or not s.legacy:
            return web.Response(status=404, text="unknown session")
        CLIENT_REQUEST.set(s.stream_request)  # this POST gets its 202 now: the stream is the client
        for m in messages:
            kind = jsonrpc.kind(m)
            if kind == "notification":
                self._client_notification(s, m)
            elif kind == "response":
                _answered(s, m)
            elif kind == "request":
                if m.get("method") == "initialize":
                    params = as_dict(m.get("params"))
                    asked = params.get("protocolVersion")
                    version = asked if asked in HANDSHAKE_VERSIONS else HANDSHAKE_VERSIONS[0]
                    for name, value in (
                        ("client_info", params.get("clientInfo")),
                        ("capabilities", params.get("capabilities")),
                    ):
                        if isinstance(value, dict):  # before any upstream session opens
                            setattr(s.upstreams, name, dict(value))
                    result = {
                        "protocolVersion": version,
                        "capabilities": CAPABILITIES,
                        "serverInfo": SERVER_INFO,
                    }
                    s.push(jsonrpc.render_result(m.get("id"), result))
                else:
                    task = self._running(s, m, s.push)
                    task.add_done_callback(lambda t: s.push(t.result()) if not t.cancelled() else None)
        return web.Response(status=202, text="Accepted")

    def _client_notification(self, s: ClientSession, msg: JsonObject) -> None:
        """`notifications/cancelled` cancels the request it names (its upstream request is cancelled
        as the server's revision says); initialized and roots changes are Tripwire's own business."""
        if msg.get("method") == "notifications/cancelled":
            task = s.running.get(jsonrpc.id_key(as_dict(msg.get("params")).get("requestId")))
            if task is not None:
                task.cancel()

    # --- JSON-RPC ------------------------------------------------------------------------------

    async def _answer(
        self, s: ClientSession, msg: JsonObject, progress: Callable[[bytes], None] | None
    ) -> bytes:
        """The response message to one client request."""
        msg_id = msg.get("id")
        method = msg.get("method")
        params = as_dict(msg.get("params"))
        try:
            methods = self.methods
            handler = methods.HANDLERS.get(method) if isinstance(method, str) else None
            if handler is None:
                raise RpcError(METHOD_NOT_FOUND, f"Method not found: {method}")
            result = await handler(methods, s, params, _progress_relay(msg, progress))
            for _ in range(MAX_INPUT_ROUNDS):
                if s.modern or result.get("resultType") != "input_required":
                    break  # a 2026-07-28 client answers input_required itself
                # a handshake client: the server's questions as requests on this answer's stream
                answers = await self._ask_client(s, result, progress)
                retry = rev.retry_params(params, answers, result.get("requestState"))
                result = await handler(methods, s, retry, _progress_relay(msg, progress))
        except RpcError as e:
            return jsonrpc.render_error(msg_id, e.code, e.message, e.data)
        except UpstreamError as e:
            return jsonrpc.render_error(msg_id, e.code, e.message, e.data)
        except (ServerUnavailable, TransportStatus) as e:
            return jsonrpc.render_error(msg_id, jsonrpc.TRIPWIRE_UPSTREAM_ERROR, str(e))
        if s.modern:  # what 2026-07-28 requires of results, whatever revision the server spoke
            result.setdefault("resultType", "complete")
            if method in CACHEABLE:  # never cached: a server may drop out or come back any time
                result["ttlMs"], result["cacheScope"] = 0, "private"
        return jsonrpc.render_result(msg_id, result)

    async def _ask_client(
        self, s: ClientSession, result: JsonObject, sink: Callable[[bytes], None] | None
    ) -> dict[str, Any]:
        """Send each request of an `input_required` result to a handshake client; its answers by key."""
        if sink is None:
            raise RpcError(
                jsonrpc.INTERNAL_ERROR,
                "the MCP server asked the client a question; accept text/event-stream to answer it",
            )
        asked: list[tuple[str, str, asyncio.Future[JsonObject]]] = []
        for key, method, params in rev.input_requests(result):
            request_id = f"tripwire-{uuid.uuid4().hex}"
            future: asyncio.Future[JsonObject] = asyncio.get_running_loop().create_future()
            s.asked[jsonrpc.id_key(request_id)] = future
            asked.append((key, request_id, future))
            request: JsonObject = {"jsonrpc": "2.0", "id": request_id, "method": method}
            if params is not None:
                request["params"] = params
            sink(orjson.dumps(request))
        answers: dict[str, Any] = {}
        try:
            for key, _, future in asked:
                answer = await asyncio.wait_for(future, ASK_TIMEOUT_S)
                answers[key] = answer["result"] if "result" in answer else {"error": answer.get("error")}
        except TimeoutError:
            raise RpcError(
                jsonrpc.INTERNAL_ERROR, "the client did not answer the MCP server's question"
            ) from None
        finally:
            for _, request_id, _ in asked:
                s.asked.pop(jsonrpc.id_key(request_id), None)
        return answers


INVALID_PARAMS_SESSION = -32001  # the SDKs' "Session not found" with HTTP 404
UNSUPPORTED_VERSION = -32022  # 2026-07-28's UnsupportedProtocolVersionError, naming what is supported


def _answered(s: ClientSession, msg: JsonObject) -> None:
    """The client's answer to a question the aggregate sent it for a server."""
    future = s.asked.get(jsonrpc.id_key(msg.get("id")))
    if future is not None and not future.done():
        future.set_result(msg)


def _meta_client(msg: JsonObject) -> tuple[Any, Any]:
    """A 2026-07-28 request's (clientInfo, clientCapabilities) from its `_meta` envelope."""
    meta = as_dict(as_dict(msg.get("params")).get("_meta"))
    return meta.get(rev.CLIENT_INFO_META), meta.get(rev.CLIENT_CAPABILITIES_META)


def _progress_token(msg: JsonObject) -> Any:
    params = msg.get("params")
    meta = params.get("_meta") if isinstance(params, dict) else None
    return meta.get("progressToken") if isinstance(meta, dict) else None


def _progress_relay(
    msg: JsonObject, sink: Callable[[bytes], None] | None
) -> Callable[[JsonObject], None] | None:
    """The server's progress for this request, as the client's own token's."""
    token = _progress_token(msg)
    if token is None or sink is None:
        return None

    def relay(params: JsonObject) -> None:
        progress = {**params, "progressToken": token}
        sink(jsonparse.dumps({"jsonrpc": "2.0", "method": "notifications/progress", "params": progress}))

    return relay


def _meta_version(msg: JsonObject) -> Any:
    params = msg.get("params")
    meta = params.get("_meta") if isinstance(params, dict) else None
    return meta.get(VERSION_META) if isinstance(meta, dict) else None


def _client_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """What the client's request carries for its servers: its credentials, as a direct route forwards them."""
    return {k: v for k in ("Authorization",) if (v := headers.get(k))}


async def _sse_answer(request: web.Request, headers: Mapping[str, str]) -> web.StreamResponse:
    response = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache", **headers}
    )
    await response.prepare(request)
    return response


def _json(body: bytes, status: int = 200, headers: Mapping[str, str] | None = None) -> web.Response:
    return web.Response(status=status, body=body, content_type="application/json", headers=headers)


async def _close(s: ClientSession) -> None:
    s.closed = True
    if s.probe is not None:
        s.probe.cancel()
    s.push(b"")  # wakes its GET stream, which then ends
    for _, _, queue in s.listeners:
        put_bounded(queue, b"")
    with contextlib.suppress(Exception):
        await s.upstreams.close()


_CLOSING: set[asyncio.Task[None]] = set()


def _close_later(s: ClientSession) -> None:
    task = asyncio.create_task(_close(s))
    _CLOSING.add(task)
    task.add_done_callback(_CLOSING.discard)
