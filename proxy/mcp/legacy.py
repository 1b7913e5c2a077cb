"""Legacy MCP HTTP+SSE (protocol 2024-11-05): a long-lived GET stream per client session.

The stream's first event (`endpoint`) says where the client must POST; Tripwire rewrites it to
point at itself and remembers where those POSTs really go. Results of the client's POSTs come back
on the stream (the POST gets a bare 202), and Tripwire's own answers (a blocked call) are put on
the stream between the server's events.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING
from urllib.parse import urljoin, urlsplit

from proxy.exchange import Exchange
from proxy.mcp import jsonrpc
from proxy.routing import Route

if TYPE_CHECKING:
    from proxy.upstreams import UpstreamRegistry

log = logging.getLogger("tripwire.mcp")


@dataclass
class LegacyStream:
    """One client's legacy HTTP+SSE stream: where its POSTs go upstream, where results come back."""

    server: str
    uid: str = field(default_factory=lambda: uuid.uuid4().hex)
    exchange: Exchange | None = None  # the GET's exchange; its response is the client's stream
    upstream_post_url: str | None = None
    client_endpoint: tuple[str, str] | None = None  # (route path, query) the client POSTs to
    queued: list[bytes] = field(default_factory=list)

    @property
    def session_key(self) -> str:
        return f"legacy:{self.uid}"

    def take_queued(self) -> bytes:
        out = b"".join(self.queued)
        self.queued.clear()
        return out


class LegacyStreams:
    """The legacy streams of one engine, by the endpoint their clients POST to."""

    def __init__(self, upstreams: UpstreamRegistry) -> None:
        self.upstreams = upstreams
        self.streams: dict[tuple[str, str, str], LegacyStream] = {}  # (server, path, query)
        self._tasks: set[asyncio.Task[None]] = set()  # injected writes in flight (refs kept)

    def for_endpoint(self, server: str, path: str, query: str) -> LegacyStream | None:
        """The stream whose client POSTs to this path and query of the route."""
        return self.streams.get((server, path, query))

    def closed(self, stream: LegacyStream) -> None:
        """The client's stream ended: its endpoint leads nowhere now."""
        if stream.client_endpoint is not None:
            self.streams.pop((stream.server, *stream.client_endpoint), None)

    def rewrite_endpoint(self, stream: LegacyStream, route: Route, stream_url: str, data: str) -> str:
        """The `endpoint` event: point the client at Tripwire, remember where its POSTs really go."""
        target = urljoin(stream_url, data.strip())
        base = self.upstreams.get("mcp", route.upstream).url
        parts = urlsplit(target)
        if target.startswith(base) and target[len(base) : len(base) + 1] in ("/", "?", ""):
            rest = target[len(base) :]
            path, _, query = rest.partition("?")
        else:
            path, query = parts.path, parts.query
        path = path if not path or path.startswith("/") else "/" + path
        if stream.client_endpoint is not None:
            self.streams.pop((stream.server, *stream.client_endpoint), None)
        stream.client_endpoint = (path, query)
        stream.upstream_post_url = target
        self.streams[(stream.server, path, query)] = stream
        return route.prefix + path + (f"?{query}" if query else "")

    def inject(self, stream: LegacyStream, data: bytes) -> None:
        """Put one of Tripwire's own JSON-RPC messages on a legacy stream, between the server's events."""
        event = jsonrpc.sse_message(data)
        response = stream.exchange.response if stream.exchange is not None else None
        if response is None or not response.prepared:
            stream.queued.append(event)
            return

        async def write() -> None:
            try:
                await response.write(event)
            except (ConnectionResetError, RuntimeError):
                log.info("legacy stream of %s closed before an injected answer", stream.server)

        task = asyncio.get_running_loop().create_task(write())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
