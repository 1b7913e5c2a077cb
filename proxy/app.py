"""The two aiohttp apps (proxy listener and admin listener) and the serve loop."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import signal
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from proxy.aiohttp_compat import HttpProcessingError
from proxy.appkeys import ENGINE
from proxy.auth import AuthRefusal, refusal_answer
from proxy.call_request import AnswerMaker, CallRequest, ClientAnswer, aiohttp_answer
from proxy.classify.calls import LLMCall, classify_http
from proxy.constants import OVERHEAD_HEADER
from proxy.engine import Engine
from proxy.exchange import Answer, Exchange
from proxy.forward import json_error
from proxy.lean_http import LeanAppRunner
from proxy.lifecycle import running_engine
from proxy.llm_errors import error_in_dialect
from proxy.mcp import jsonrpc
from proxy.mcp.aggregate.inprocess import PipelineTransport
from proxy.mcp.aggregate.names import aggregate_servers
from proxy.mcp.aggregate.server import Aggregate
from proxy.pipeline import Pipeline
from proxy.pipelines import pipelines
from proxy.routing import AGENT_HEADER, SESSION_HEADER, Route, RouteError, resolve
from proxy.settings import Settings, StdioServerConfig, UpstreamConfig, split_host_port, url_host
from proxy.websocket.handler import handle_websocket_within_limits
from proxy.websocket.handshake import is_websocket_upgrade

log = logging.getLogger("tripwire")

RUNNER_SHUTDOWN_S = 2.0
# how `serve` runs both listeners' runners (the tests run theirs the same way, tests/conftest.py):
# no access log; the engine's drain already gave in-flight calls their grace, the runner only closes
# sockets; and no handler cancellation (aiohttp's default): a client that hangs up is noticed at the
# next write, or by a watcher (proxy.mcp.hub.client_gone)
RUNNER_ARGS: dict[str, Any] = {"access_log": None, "shutdown_timeout": RUNNER_SHUTDOWN_S}
PROXY_MAX_FIELD_SIZE = 65536  # agents send long headers (cookies, tokens): aiohttp's 8190 is short
PIPELINES: web.AppKey[dict[str, Pipeline]] = web.AppKey("tripwire_pipelines", dict)
AGGREGATE: web.AppKey[Aggregate] = web.AppKey("tripwire_aggregate", Aggregate)


def route_of(engine: Engine, raw_path: str, headers: Mapping[str, str]) -> Route | RouteError:
    """The call's route; an agent calls the same few paths again and again, so routes are kept
    (`resolve` is pure: same path, identity headers and upstream names, same route)."""
    path = raw_path.split("?", 1)[0]
    llm_names, mcp_names = engine.upstreams.names("llm"), engine.upstreams.names("mcp")
    agent = engine.settings.agent
    key = (path, headers.get(AGENT_HEADER), headers.get(SESSION_HEADER), agent, llm_names, mcp_names)
    found = _ROUTES.get(key)
    if found is None:
        found = resolve(path, headers, default_agent=agent, llm_names=llm_names, mcp_names=mcp_names)
        if len(_ROUTES) >= ROUTES_KEPT:
            _ROUTES.clear()  # paths that carry session ids are many; a full table starts over
        _ROUTES[key] = found
    return found


ROUTES_KEPT = 4096
_ROUTES: dict[tuple[object, ...], Route | RouteError] = {}


async def proxy_handler(request: web.Request) -> web.StreamResponse:
    route = route_of(request.app[ENGINE], request.raw_path, request.headers)
    if isinstance(route, RouteError):
        auth = request.app[ENGINE].auth
        refused = await auth.check_unrouted(request.headers) if auth is not None else None
        if refused is not None:
            unrouted = Route("llm", "", request.raw_path, "", None, "")  # (the OpenAI error shape)
            return refusal_answer(unrouted, request.method, refused).to_response()
        error_body = {
            "error": {
                "message": route.message,
                "type": "tripwire_route",
                "code": "not_found" if route.status == 404 else "bad_path",
                "configured": list(route.known),
            }
        }
        return web.Response(
            status=route.status, body=orjson.dumps(error_body), content_type="application/json"
        )
    engine = request.app[ENGINE]
    if engine.auth is not None:  # agent keys (SPEC §9): before a WebSocket upgrade or an MCP stream too
        checked = await engine.auth.check(route, request.raw_path, request.headers)
        if isinstance(checked, AuthRefusal):
            return refusal_answer(route, request.method, checked).to_response()
        route = checked
    if route.kind == "aggregate":  # `/mcp`: every MCP server behind one endpoint (SPEC §3)
        return await request.app[AGGREGATE].handle(request, route)
    # what only aiohttp's lane serves (the lean lane hands these over): while draining, every call
    # is refused alike (handle_routed_call)
    if not engine.draining:
        if is_websocket_upgrade(request):  # relayed frame by frame; Responses calls judged per message
            return await handle_websocket_within_limits(request, route, request.app[PIPELINES]["llm"])
        # long-lived streams that are not one call (MCP GET streams, legacy SSE) bypass the pipeline
        streaming_handler = engine.stream_handler(route, request)
        if streaming_handler is not None:
            return await streaming_handler(request, route)
    answer = await handle_routed_call(request, route, aiohttp_answer)
    assert isinstance(answer, web.StreamResponse), "aiohttp's lane answers with aiohttp's responses"
    return answer


async def handle_call(request: CallRequest, route: Route, answer_maker: AnswerMaker) -> ClientAnswer:
    """The lean lane's handler (plain LLM calls: see `proxy_runner`): the agent-key check, then the call."""
    auth = request.app[ENGINE].auth
    if auth is not None:
        checked = await auth.check(route, request.raw_path, request.headers)
        if isinstance(checked, AuthRefusal):
            return refusal_answer(route, request.method, checked).to_response()
        route = checked
    return await handle_routed_call(request, route, answer_maker)


async def handle_routed_call(request: CallRequest, route: Route, answer_maker: AnswerMaker) -> ClientAnswer:
    """A routed (and, with agent keys, authenticated) call, on either lane (aiohttp's
    `web.Request`, or the lean lane's `proxy.lean_http.LeanRequest`); a forwarded answer is
    relayed into what the lane's `answer_maker` makes."""
    engine = request.app[ENGINE]
    started, started_wall = time.monotonic(), time.time()
    if engine.draining:
        return (await draining_answer(request, route)).to_response()
    try:
        body = await read_body(request, engine.settings.max_body_bytes, engine.settings.body_idle_timeout_s)
    except web.HTTPRequestEntityTooLarge:
        limit = engine.settings.max_body_bytes
        return json_error(
            413,
            f"request body larger than {limit} bytes (max_body_bytes)",
            "tripwire_request_too_large",
            "request_too_large",
        ).to_response()
    except TimeoutError:
        log.info("a client sent no body byte for %.0fs: 408", engine.settings.body_idle_timeout_s)
        answer = json_error(408, "request body timed out", "tripwire_request_timeout", "body_timeout")
        answer.headers["Connection"] = "close"
        return answer.to_response()
    except (ConnectionError, aiohttp.ClientPayloadError, HttpProcessingError) as e:
        # the client hung up (or broke its framing) mid-body: nobody to answer, nothing to record
        log.debug("client went away while sending its body: %r", e)
        return web.Response(status=400, text="incomplete request body")
    call = classify_http(route, request.method, body)
    if isinstance(call, LLMCall) and call.path != route.path:
        route = replace(route, path=call.path)  # forwarded as the dialect spells it
    ex = Exchange(
        request=request,
        route=route,
        body=body,
        started=started,
        started_wall=started_wall,
        answer_maker=answer_maker,
    )
    ex.classified = call
    engine.call_started()
    try:
        try:
            await request.app[PIPELINES][route.kind].run(ex)
        finally:
            if ex.held_end is not None:  # the call is settled: its answer may end (SPEC §8)
                await ex.held_end()
    finally:
        engine.call_finished()
    if ex.response is not None:
        return ex.response
    if ex.answer is not None:
        own = error_in_dialect(ex, ex.answer)  # Tripwire's own errors in the agent's protocol
        own.headers[OVERHEAD_HEADER] = ex.overhead_ms(time.monotonic())
        return own.to_response()
    return json_error(500, "Tripwire produced no answer", "tripwire_internal", "internal").to_response()


async def read_body(request: CallRequest, limit: int, idle_timeout: float) -> bytes:
    """The whole body, at most `limit` bytes (413 past it), each read waiting at most `idle_timeout`
    (TimeoutError): a client that trickles or stalls its body cannot hold a handler forever."""
    if request.content_length is not None and request.content_length > limit:
        raise web.HTTPRequestEntityTooLarge(max_size=limit, actual_size=request.content_length)
    content = request.content
    chunks: list[bytes] = []
    size = 0
    while True:
        # what has arrived is taken without a timer (a small body is usually all there already)
        chunk = content.read_nowait()
        if not chunk:
            if content.is_eof():
                return b"".join(chunks)
            async with asyncio.timeout(idle_timeout):
                chunk = await content.readany()
            if not chunk:
                return b"".join(chunks)
        size += len(chunk)
        if size > limit:
            raise web.HTTPRequestEntityTooLarge(max_size=limit, actual_size=size)
        chunks.append(chunk)


async def draining_answer(request: CallRequest, route: Route) -> Answer:
    """SIGTERM: no new calls. MCP clients get a JSON-RPC error (SDKs tear a session down on HTTP errors)."""
    if route.kind == "mcp" and request.method == "POST":
        parsed = jsonrpc.parse_body(await request.read())
        msg = parsed[0][0] if parsed and len(parsed[0]) == 1 and isinstance(parsed[0][0], dict) else {}
        body = jsonrpc.render_error(
            msg.get("id"),
            jsonrpc.TRIPWIRE_UPSTREAM_ERROR,
            "Tripwire is shutting down; retry shortly",
            {"retry_after": 5},
        )
        return Answer(200, body, "application/json")
    answer = json_error(503, "Tripwire is shutting down", "tripwire_unavailable", "draining")
    answer.headers["Retry-After"] = "5"
    return answer


def proxy_handler_args(settings: Settings) -> dict[str, Any]:
    """The proxy listener's connection limits, the same on both lanes."""
    return {"max_field_size": PROXY_MAX_FIELD_SIZE, "keepalive_timeout": settings.header_timeout_s}


def make_proxy_app(engine: Engine) -> web.Application:
    app = web.Application(
        client_max_size=engine.settings.max_body_bytes,
        # aiohttp closes a connection that has not completed a request head within its keep-alive
        # timeout (also the idle time allowed between keep-alive requests): a slow-header client
        # (slowloris) holds a socket at most that long
        handler_args=proxy_handler_args(engine.settings),
    )
    app[ENGINE] = engine
    app[PIPELINES] = pipelines(engine.services)
    app[AGGREGATE] = make_aggregate(engine, app)
    app.router.add_route("*", "/{tail:.*}", proxy_handler)
    return app


def make_aggregate(engine: Engine, app: web.Application) -> Aggregate:
    """The aggregate endpoint `/mcp`, whose calls run their server's pipeline through `handle_call`."""

    def transport_for(outer: Route, client_headers: Mapping[str, str]) -> PipelineTransport:
        def http() -> aiohttp.ClientSession:
            assert engine.forwarder.http is not None, "the forwarder starts before the listeners"
            return engine.forwarder.http

        return PipelineTransport(
            app,
            handle_call,
            lambda: engine.upstreams.names("mcp"),
            outer,
            lambda server: engine.upstreams.get("mcp", server).url,
            http,
            client_headers,
        )

    settings = engine.settings
    own: dict[str, UpstreamConfig | StdioServerConfig] = {**settings.mcp, **settings.mcp_stdio}
    aggregate = Aggregate(
        engine.guards.config,
        aggregate_servers(settings),
        settings.list_timeout_s,
        transport_for,
        {name: c.list_timeout_s for name, c in own.items() if c.list_timeout_s is not None},
    )
    engine.health_reports["mcp_aggregate"] = aggregate.health

    async def close(app: web.Application) -> None:
        await aggregate.close()

    app.on_cleanup.append(close)
    return aggregate


def lean_route(engine: Engine) -> Callable[[str, Mapping[str, str]], Route | None]:
    """Which requests the lean lane takes: LLM calls (the hot path). MCP calls relay long-lived
    streams and session GETs of their own, route errors are rare: aiohttp's lane serves those."""

    def route(raw_path: str, headers: Mapping[str, str]) -> Route | None:
        found = route_of(engine, raw_path, headers)
        return found if isinstance(found, Route) and found.kind == "llm" else None

    return route


def proxy_runner(app: web.Application, **kwargs: Any) -> web.AppRunner:
    """The proxy listener's runner: plain LLM calls on the lean HTTP/1.1 lane (proxy/lean_http.py),
    everything else on aiohttp's (the same app)."""
    engine = app[ENGINE]
    return LeanAppRunner(
        app,
        handler=handle_call,
        route=lean_route(engine),
        max_body=engine.settings.max_body_bytes,
        **proxy_handler_args(engine.settings),
        **kwargs,
    )


def make_admin_app(engine: Engine) -> web.Application:
    from viewer.api import setup_admin
    from viewer.approvals_api import setup_approvals
    from viewer.keys_api import setup_keys_api
    from viewer.pins_api import setup_pins

    app = web.Application()
    app[ENGINE] = engine
    setup_admin(app, engine)
    setup_keys_api(app, engine.agent_keys)  # agent keys (SPEC §9), behind the same admin token
    setup_approvals(app, engine.approvals, engine.sessions)  # SPEC §5.5a
    setup_pins(app, engine.pins, (*engine.settings.mcp, *engine.settings.mcp_stdio))  # docs/mcp.md
    return app


def startup_lines(settings: Settings, engine: Engine) -> str:
    host, port = split_host_port(settings.listen)
    ahost, aport = split_host_port(settings.admin_listen)
    shown, ashown = url_host(host), url_host(ahost)
    base = f"http://{shown}:{port}"
    lines = [
        f"Tripwire proxy on {base} -> {settings.upstream.url}; traces in {engine.data_dir}",
        f"  export OPENAI_BASE_URL={base}/v1"
        + "".join(f"   {n}: {base}/llm/{n}" for n in engine.upstreams.names("llm")),
        f"  Codex: codex -c openai_base_url={base}/v1   other clients: docs/clients.md",
    ]
    mcp = engine.upstreams.names("mcp")
    mcp_part = ("MCP: " + "  ".join(f"{n} -> {base}/mcp/{n}" for n in mcp) + "   ") if mcp else ""
    if mcp and aggregate_servers(settings):
        mcp_part += f"all as one: {base}/mcp   "
    lines.append(f"  {mcp_part}viewer: http://{ashown}:{aport}/")
    return "\n".join(lines)


LISTENER_FLAGS = {"proxy": "--listen", "admin": "--admin-listen"}


class ListenerUnavailable(OSError):
    """A listener cannot bind: says which one, and the flag that moves it."""

    def __init__(self, name: str, listen: str, cause: OSError) -> None:
        super().__init__(cause.errno, cause.strerror)
        flag = LISTENER_FLAGS[name]
        if cause.errno == errno.EADDRINUSE:
            self.message = f"{name} listener {listen} is in use; choose another with {flag}"
        else:
            why = (cause.strerror or str(cause)).lower()
            self.message = f"{name} listener {listen} cannot be opened: {why}; choose another with {flag}"

    def __str__(self) -> str:
        return self.message


async def serve(
    settings: Settings, *, argv: list[str] | None = None, ready: Callable[[], None] | None = None
) -> None:
    """Run both listeners until SIGTERM/SIGINT, then drain and close open runs."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    async with running_engine(settings, argv=argv) as engine:
        runners: list[web.AppRunner] = []
        try:
            for runner_for, app, listen, name in (
                (proxy_runner, make_proxy_app(engine), settings.listen, "proxy"),
                (web.AppRunner, make_admin_app(engine), settings.admin_listen, "admin"),
            ):
                runner = runner_for(app, **RUNNER_ARGS)
                await runner.setup()
                runners.append(runner)
                host, port = split_host_port(listen)
                try:
                    await web.TCPSite(runner, host, port).start()
                except OSError as e:
                    raise ListenerUnavailable(name, listen, e) from e
            print(startup_lines(settings, engine), flush=True)
            if ready is not None:
                ready()
            await stop.wait()
            log.info("signal received: draining (grace %.0fs)", settings.drain_grace_s)
            await engine.drain(settings.drain_grace_s)
        finally:
            for runner in reversed(runners):
                await runner.cleanup()
