"""The WebSocket opening handshake as Tripwire relays it (RFC 6455 §4): the client's headers go upstream
as `forward.request_headers` makes them for HTTP (no hop-by-hop or `X-Tripwire-*` header, the agent's
key or the upstream's own, subprotocols and `openai-beta` kept), minus those each hop's WebSocket
negotiates itself; the upstream's 101 headers come back to the client; an upstream that refuses the
upgrade has its status (and headers) answered to the client.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import aiohttp
from aiohttp import web
from multidict import CIMultiDict

from proxy.forward import json_error, request_headers, response_headers

# the handshake headers each hop negotiates itself (aiohttp, on each side)
HANDSHAKE_HEADERS = frozenset(
    {
        "sec-websocket-key",
        "sec-websocket-version",
        "sec-websocket-extensions",
        "sec-websocket-accept",
        "sec-websocket-protocol",
    }
)


def is_websocket_upgrade(request: web.Request) -> bool:
    """A WebSocket opening handshake (RFC 6455 §4.1): GET, `Upgrade: websocket`, `Connection: upgrade`."""
    if request.method != "GET":
        return False
    upgrade = {t.strip().lower() for v in request.headers.getall("Upgrade", []) for t in v.split(",")}
    connection = {t.strip().lower() for v in request.headers.getall("Connection", []) for t in v.split(",")}
    return "websocket" in upgrade and "upgrade" in connection


def upstream_handshake_headers(incoming: Mapping[str, str], upstream: Any) -> CIMultiDict[str]:
    """The client's handshake headers as HTTP's are forwarded (the key handled the same way),
    minus those each hop's WebSocket negotiates itself."""
    headers = request_headers(incoming, upstream, identity_encoding=False)
    for name in list(headers.keys()):
        if name.lower() in HANDSHAKE_HEADERS:
            headers.popall(name, None)
    return headers


def requested_protocols(headers: Mapping[str, str]) -> list[str]:
    values = headers.getall("Sec-WebSocket-Protocol", []) if hasattr(headers, "getall") else []
    return [p.strip() for v in values for p in v.split(",") if p.strip()]


def client_handshake_headers(upstream_headers: Mapping[str, str] | None) -> CIMultiDict[str]:
    """The upstream's 101 headers for the client's 101 (request ids, rate limits, model, ...)."""
    out: CIMultiDict[str] = CIMultiDict()
    if upstream_headers is None:
        return out
    for name, value in response_headers(upstream_headers, drop_length=True).items():
        low = name.lower()
        if low in HANDSHAKE_HEADERS or low in ("date", "server", "content-type"):
            continue
        out.add(name, value)
    return out


def refused_upgrade(e: aiohttp.WSServerHandshakeError) -> web.Response:
    """The upstream answered the upgrade with another status: the client gets that status."""
    status = e.status if 200 <= e.status <= 599 and e.status != 101 else 502
    headers: CIMultiDict[str] = CIMultiDict()
    if e.headers is not None:
        for name, value in response_headers(e.headers, drop_length=True).items():
            if name.lower() in HANDSHAKE_HEADERS or name.lower() in ("content-type", "content-encoding"):
                continue
            headers.add(name, value)
    message = (
        f"the upstream refused the WebSocket upgrade: HTTP {e.status}"
        if status == e.status
        else f"the upstream answered the WebSocket upgrade wrongly: {e.message}"
    )
    answer = json_error(status, message, "upstream_websocket_refused", "websocket_upgrade_refused")
    response = answer.to_response()
    for name, value in headers.items():
        response.headers.add(name, value)
    return response
