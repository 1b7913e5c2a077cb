"""The WebSocket route: open the upstream's socket, then the client's, then relay frames both ways
(a Responses socket's calls through the LLM pipeline), within the agent's cap on open sockets.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import TYPE_CHECKING

import aiohttp
from aiohttp import web
from yarl import URL

from proxy.aiohttp_compat import upgrade_headers
from proxy.appkeys import ENGINE
from proxy.classify.calls import SocketCall, Unknown, classify_socket
from proxy.classify.policy import fail_closed
from proxy.dialects import dialect_for
from proxy.exchange import Answer
from proxy.forward import json_error
from proxy.outages import unreachable_message
from proxy.pipeline import Pipeline
from proxy.routing import Route, join_upstream
from proxy.websocket.handshake import (
    client_handshake_headers,
    refused_upgrade,
    requested_protocols,
    upstream_handshake_headers,
)
from proxy.websocket.relay import CLOSE_TIMEOUT_S, SocketRelay
from proxy.websocket.responses import ResponsesSocket
from proxy.websocket.stages import socket_pipeline

if TYPE_CHECKING:
    from proxy.engine import Engine

log = logging.getLogger("tripwire.websocket")

# upstream messages (a final event repeats the whole output) may be larger than what a client sends
UPSTREAM_MAX_MSG = 512 * 1024 * 1024


def is_responses_socket(route: Route) -> bool:
    if route.kind != "llm":
        return False
    dialect = dialect_for(route.path, "POST")
    return dialect is not None and dialect.WEBSOCKET_CALLS


def unknown_refusal(call: Unknown) -> Answer:
    """404 in the OpenAI error shape (a handshake's answer), naming what was not understood."""
    return json_error(
        404,
        f"Tripwire refused {call.what}; policy applies to this agent, so calls Tripwire cannot read "
        "are refused (set passthrough_unknown: true to relay them unjudged)",
        "invalid_request_error",
        "unknown_endpoint",
    )


async def handle_websocket(request: web.Request, route: Route, http_pipeline: Pipeline) -> web.StreamResponse:
    """Relay one WebSocket: the upstream's socket first, then the client's, then frames both ways.

    A socket whose messages no dialect reads as calls (`/v1/realtime`, any other path) would carry
    calls no guard sees: refused when policy applies to the agent (issue 30), else relayed."""
    engine: Engine = request.app[ENGINE]
    call = classify_socket(route)
    if isinstance(call, SocketCall):
        route = replace(route, path=call.path)  # as the dialect spells it
    elif isinstance(call, Unknown):
        config = engine.guards.config(route.agent)
        if fail_closed(config, engine.auth is not None, engine.settings.passthrough_unknown):
            log.warning("refused a WebSocket of agent %s: %s", route.agent, call.what)
            return unknown_refusal(call).to_response()
    upstream = engine.upstreams.get(route.kind, route.upstream)
    url = join_upstream(upstream.url, route.path, request.rel_url.raw_query_string)
    extensions = request.headers.get("Sec-WebSocket-Extensions", "").lower()
    session = engine.forwarder.session
    assert session is not None, "Forwarder.start() not called"
    try:
        up = await session.ws_connect(
            URL(url, encoded=True),
            headers=upstream_handshake_headers(request.headers, upstream),
            protocols=requested_protocols(request.headers),
            autoclose=False,  # close frames are relayed with their codes
            autoping=False,  # pings and pongs too
            compress=15 if "permessage-deflate" in extensions else 0,
            max_msg_size=UPSTREAM_MAX_MSG,
            timeout=aiohttp.ClientWSTimeout(ws_receive=None, ws_close=CLOSE_TIMEOUT_S),
        )
    except aiohttp.WSServerHandshakeError as e:
        log.info("upstream %s refused a WebSocket upgrade: HTTP %s", route.upstream, e.status)
        return refused_upgrade(e)
    except TimeoutError:
        return json_error(
            504, "Tripwire: the upstream did not answer in time", "upstream_timeout", "upstream_timeout"
        ).to_response()
    except aiohttp.ClientError as e:
        message = unreachable_message(route.upstream, URL(url, encoded=True), e)
        engine.forwarder.outages.failed(route.kind, route.upstream, message)
        return json_error(502, message, "upstream_unreachable", "upstream_unreachable").to_response()
    engine.forwarder.outages.answered(route.kind, route.upstream)
    post_view = request.clone(method="POST") if is_responses_socket(route) else None
    client = web.WebSocketResponse(
        protocols=(up.protocol,) if up.protocol else (),
        autoclose=False,
        autoping=False,
        timeout=CLOSE_TIMEOUT_S,
        max_msg_size=engine.settings.max_body_bytes,
    )
    client.headers.extend(client_handshake_headers(upgrade_headers(up)))
    try:
        await client.prepare(request)
    except BaseException:
        await up.close(code=1001)
        raise
    relay = (
        ResponsesSocket(
            engine, request, route, client, up, socket_pipeline(http_pipeline, engine.services), post_view
        )
        if post_view is not None
        else SocketRelay(engine, request, client, up)
    )
    engine.sockets.add(relay)
    try:
        await relay.run()
    finally:
        engine.sockets.discard(relay)
    return client


async def handle_websocket_within_limits(
    request: web.Request, route: Route, http_pipeline: Pipeline
) -> web.StreamResponse:
    """`handle_websocket`, within the agent's cap on open sockets (proxy/socket_limits.py)."""
    slots = request.app[ENGINE].socket_slots
    if not slots.take(route.agent):
        log.warning("refused a WebSocket of agent %s: %d already open", route.agent, slots.per_agent)
        return slots.refusal(route.agent)
    try:
        return await handle_websocket(request, route, http_pipeline)
    finally:
        slots.give_back(route.agent)
