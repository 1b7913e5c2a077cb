"""One upstream MCP session per server, for the aggregate endpoint (SPEC §3).

The aggregate (`/mcp`) is Tripwire's own MCP server; behind it each configured server gets one
`UpstreamSession`, opened lazily on first use and kept. The session speaks whichever revision the
server accepts (the handshake era, `initialize` + `Mcp-Session-Id`, or 2026-07-28, stateless with
`server/discover`), re-opens after the server restarts, and hands server notifications to a callback.

The bytes go through a `Transport`: the aggregate implements it over the owning server's in-process
MCP pipeline (so guards and the trace see a direct call); tests implement it over plain HTTP.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any, Protocol

JsonObject = dict[str, Any]
NotificationHandler = Callable[[str, str, JsonObject | None], Awaitable[None] | None]
"""`on_notification(server, method, params)`: list-changed, progress, logging, ... from a server."""
ProgressHandler = Callable[[JsonObject], Awaitable[None] | None]
"""`on_progress(params)`: the `notifications/progress` params of one request, as the server sent them."""


class UpstreamError(Exception):
    """The server answered with a JSON-RPC error: relay it as is (code, message, data)."""

    def __init__(self, code: int, message: str, data: Any = None) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.data = data


class ServerUnavailable(Exception):
    """The server could not be reached, failed at the transport level or did not answer in time."""

    def __init__(self, server: str, reason: str) -> None:
        super().__init__(f"MCP server {server!r} unavailable: {reason}")
        self.server = server
        self.reason = reason


class TransportStatus(Exception):
    """An HTTP error status from the server's endpoint (the body, if JSON-RPC, in `message`)."""

    def __init__(self, status: int, message: JsonObject | None = None) -> None:
        super().__init__(f"HTTP {status}")
        self.status = status
        self.message = message


class Transport(Protocol):
    """The bytes under an upstream session: one server's Streamable HTTP endpoint, however reached.

    `post` sends one JSON-RPC message and yields the JSON-RPC messages the server answers with (one
    for a JSON body, several for an SSE stream: notifications, server requests, then the response);
    an HTTP error status raises `TransportStatus` (404 means an unknown session), a failure to
    connect `ServerUnavailable`. Response headers the session needs (`Mcp-Session-Id`) are handed
    to `headers_out` when given.
    """

    def post(
        self,
        server: str,
        headers: Mapping[str, str],
        body: bytes,
        headers_out: Callable[[Mapping[str, str]], None] | None = None,
    ) -> AsyncIterator[JsonObject]: ...

    def get_stream(self, server: str, headers: Mapping[str, str]) -> AsyncIterator[JsonObject]:
        """The server's standalone GET stream (handshake era): its notifications and requests."""
        ...

    async def delete(self, server: str, headers: Mapping[str, str]) -> None:
        """End the session (handshake era, `Mcp-Session-Id` in `headers`)."""
        ...


class UpstreamSession:
    """One server's upstream session, in whichever revision the server accepts."""

    server: str
    revision: str
    """The negotiated protocol version (e.g. "2025-11-25" or "2026-07-28"); "" before opening."""

    def __init__(
        self, server: str, transport: Transport, on_notification: NotificationHandler | None = None
    ) -> None:
        self.server = server
        self.revision = ""
        self._transport = transport
        self._on_notification = on_notification

    async def request(
        self,
        method: str,
        params: JsonObject | None,
        *,
        timeout: float | None = None,  # noqa: ASYNC109 (the seam with the aggregate names it)
        on_progress: ProgressHandler | None = None,
    ) -> JsonObject:
        """Send one request; return its JSON-RPC `result`.

        Raises `UpstreamError` for a JSON-RPC error answer, `ServerUnavailable` for a transport
        failure or no answer within `timeout` seconds.
        """
        raise NotImplementedError

    async def notify(self, method: str, params: JsonObject | None) -> None:
        """Send one notification (e.g. `notifications/cancelled`), translated for the server's revision."""
        raise NotImplementedError

    async def close(self) -> None:
        """End the session (handshake era: `DELETE`), stop its GET stream."""
        raise NotImplementedError


class UpstreamSessions:
    """Every server's upstream session, each opened lazily on first `get` and kept."""

    on_notification: NotificationHandler | None
    """Set by the aggregate: called with (server, method, params) for each server notification."""

    def __init__(self, transport: Transport, on_notification: NotificationHandler | None = None) -> None:
        self._transport = transport
        self.on_notification = on_notification
        self._sessions: dict[str, UpstreamSession] = {}

    def get(self, server: str) -> UpstreamSession:
        """The server's session (created on first use; it opens on its first request)."""
        raise NotImplementedError

    async def close(self) -> None:
        """Close every session."""
        raise NotImplementedError
