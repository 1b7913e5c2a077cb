"""Every aiohttp internal Tripwire uses, in one place, each with what it is and why.

The lean lanes (proxy/lean_http.py serving plain calls, proxy/upstream_http.py sending them) must
answer, frame and fail exactly as aiohttp does, so they use aiohttp's own helpers where the two must
agree, and hand connections to aiohttp's own server for everything else. None of this is aiohttp's
documented API: a release may move it. Everything outside this module imports aiohttp's public names
only (`aiohttp`, `aiohttp.web`, `aiohttp.hdrs`), so a move breaks here, at import, or in the lanes'
tests, which `scripts/test.sh` also runs on the lowest aiohttp the pins allow ("== lowest versions").
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Any

from aiohttp import ClientWebSocketResponse, web
from aiohttp.helpers import (
    # egress (proxy/egress.py): the proxy variables and ~/.netrc read as `trust_env=True` reads them,
    # with the same parsing, once at start instead of per request
    ProxyInfo,
    basicauth_from_netrc,
    # the lean lane frames an answer as `StreamResponse._prepare_headers` does: which answers carry
    # no body (HEAD, 1xx, 204, 304) and which of those lose their Content-Length
    must_be_empty_body,
    netrc_from_env,
    proxies_from_env,
    # the lean lane's Date: aiohttp's own formatted time (made once a second)
    rfc822_formatted_time,
    should_remove_content_length,
)
from aiohttp.http import SERVER_SOFTWARE  # the Server header aiohttp sends: both lanes answer alike

# The exceptions aiohttp's HTTP parsers raise: the upstream client raises them where aiohttp's client
# did (its callers' except clauses and recorded messages stay as they were), and a client's broken
# body arrives as one of them on aiohttp's lane (proxy/app.py).
from aiohttp.http_exceptions import (
    BadHttpMessage,
    ContentLengthError,
    HttpProcessingError,
    InvalidHeader,
    LineTooLong,
    TransferEncodingError,
)

# aiohttp's head writer (a private function): the lean lane's heads are aiohttp's byte for byte,
# including its refusals (a control byte in a reason or field raises ValueError: a 500, no header
# injection) and what it leaves out (bytes that are not UTF-8)
from aiohttp.http_writer import _serialize_headers
from aiohttp.web_server import Server  # public (`web.Server`); what the runner asks of it is not

__all__ = [
    "SERVER_SOFTWARE",
    "AiohttpServer",
    "BadHttpMessage",
    "ContentLengthError",
    "HttpProcessingError",
    "InvalidHeader",
    "LineTooLong",
    "ProxyInfo",
    "Server",
    "TransferEncodingError",
    "OneWriteResponse",
    "WrappingAppRunner",
    "basicauth_from_netrc",
    "connection_key",
    "hand_over",
    "must_be_empty_body",
    "netrc_from_env",
    "proxies_from_env",
    "rfc822_formatted_time",
    "serialize_head",
    "should_remove_content_length",
    "upgrade_headers",
]


def serialize_head(status_line: str, headers: Mapping[str, str]) -> bytes:
    """An answer's head as aiohttp writes it (`http_writer._serialize_headers`)."""
    return _serialize_headers(status_line, headers)  # type: ignore[arg-type]  # (a CIMultiDict in practice)


def connection_key(host: str, port: int | None, is_ssl: bool) -> Any:
    """The `client_reqrep.ConnectionKey` aiohttp's connector errors carry and print (host, port,
    `ssl:default`): the upstream client raises the same errors. Built by keyword: its fields grew
    between releases (`server_hostname` in 3.13), their order is not a promise."""
    from aiohttp.client_reqrep import ConnectionKey

    return ConnectionKey(
        host=host,
        port=port,
        is_ssl=is_ssl,
        ssl=True,
        proxy=None,
        proxy_auth=None,
        proxy_headers_hash=None,
    )


def upgrade_headers(ws: ClientWebSocketResponse) -> Mapping[str, str] | None:
    """The headers of the upstream's 101 (request ids, rate limits, ...), relayed on the client's 101:
    aiohttp keeps the handshake's response as the private `ClientWebSocketResponse._response`."""
    response = getattr(ws, "_response", None)
    return getattr(response, "headers", None)


class OneWriteResponse(web.StreamResponse):
    """A non-streamed answer on aiohttp's lane: its head goes out with the first body bytes, in one
    write (aiohttp's own `Response` does the same, through the private class attribute
    `_send_headers_immediately`), instead of a write of its own."""

    _send_headers_immediately = False


class AiohttpServer:
    """aiohttp's low-level `Server` as the lean lane uses it: a maker of aiohttp's connection
    handlers (`RequestHandler`, a Protocol) it hands connections over to, and what `AppRunner`
    calls on its server at shutdown (`pre_shutdown`, `shutdown(timeout)`: not public)."""

    def __init__(self, server: Server) -> None:
        self.server = server

    def protocol(self) -> asyncio.Protocol:
        return self.server()  # (what TCPSite's loop.create_server makes per connection)

    @property
    def connections(self) -> list[Any]:
        return list(self.server.connections)

    def pre_shutdown(self) -> None:
        self.server.pre_shutdown()

    async def shutdown(self, timeout: float | None) -> None:  # noqa: ASYNC109  (aiohttp's signature)
        await self.server.shutdown(timeout)


def hand_over(transport: asyncio.Transport, protocol: asyncio.Protocol, data: bytes) -> None:
    """Give a live connection to `protocol` (an aiohttp `RequestHandler`) mid-stream: it starts as on a
    fresh connection and reads `data`, the bytes already received, first. aiohttp does not support
    this (a handler expects `connection_made` from the loop), but `RequestHandler` only keeps the
    transport and starts its keep-alive loop there."""
    transport.set_protocol(protocol)
    protocol.connection_made(transport)
    if data:
        protocol.data_received(data)


class WrappingAppRunner(web.AppRunner):
    """A `web.AppRunner` whose sites listen with `wrap(aiohttp's server)` instead of aiohttp's server:
    `AppRunner._make_server` (private) is the hook. The object returned is what TCPSite calls per
    connection (a Protocol factory) and what the runner's shutdown calls (`pre_shutdown`,
    `shutdown(timeout)`)."""

    def __init__(self, app: web.Application, *, wrap: Callable[[AiohttpServer], Any], **kwargs: Any) -> None:
        super().__init__(app, **kwargs)
        self._wrap = wrap

    async def _make_server(self) -> Server:
        inner = await super()._make_server()
        return self._wrap(AiohttpServer(inner))
