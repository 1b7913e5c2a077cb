"""A client's session with the aggregate endpoint `/mcp` (proxy/mcp/aggregate/server.py), and the
JSON-RPC error its methods raise (proxy/mcp/aggregate/methods.py): what both modules share."""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field
from typing import Any

import orjson

from proxy.mcp.aggregate.resources import ResourceOwners
from proxy.mcp.aggregate.upstream import JsonObject, UpstreamSessions
from proxy.routing import Route

STREAM_QUEUE = 256  # notifications waiting for a client's GET stream; older ones drop past it
# 2026-07-28 `subscriptions/listen`: the filter's flag of each notification the aggregate relays
LISTEN_FLAGS = {
    "notifications/tools/list_changed": "toolsListChanged",
    "notifications/prompts/list_changed": "promptsListChanged",
    "notifications/resources/list_changed": "resourcesListChanged",
}
SUBSCRIPTION_META = "io.modelcontextprotocol/subscriptionId"


class RpcError(Exception):
    def __init__(self, code: int, message: str, data: Any = None) -> None:
        super().__init__(message)
        self.code, self.message, self.data = code, message, data


@dataclass
class ClientSession:
    """One client's session with the aggregate: Tripwire's own, whatever its servers' are."""

    key: str
    route: Route
    upstreams: UpstreamSessions
    modern: bool = False
    legacy: bool = False
    stream: asyncio.Queue[bytes] = field(default_factory=lambda: asyncio.Queue(STREAM_QUEUE))
    down: dict[str, str] = field(default_factory=dict)  # server -> why it dropped out
    resources: ResourceOwners = field(default_factory=ResourceOwners)  # URI -> the server that owns it
    probe: asyncio.Task[None] | None = None
    closed: bool = False
    used: float = field(default_factory=time.monotonic)  # its last request
    # the client's requests being answered (id -> task), for its notifications/cancelled
    running: dict[str, asyncio.Task[bytes]] = field(default_factory=dict)
    # questions a server asked this (handshake) client through the aggregate: request id -> its answer
    asked: dict[str, asyncio.Future[JsonObject]] = field(default_factory=dict)
    streams: int = 0  # its open GET / listen streams (a session with one open is in use)
    stream_request: Any = None  # legacy HTTP+SSE: the session's stream, whose closing is a hang-up
    # 2026-07-28 clients' `subscriptions/listen` streams: (their request id, what they asked for, queue)
    listeners: list[tuple[Any, frozenset[str], asyncio.Queue[bytes]]] = field(default_factory=list)

    def send(self, method: str, params: JsonObject | None = None) -> None:
        """A notification for the client's GET stream (handshake era, legacy SSE) or its listen
        streams (2026-07-28: only what each asked for, stamped with its subscription id)."""
        msg: JsonObject = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            msg["params"] = params
        self.push(orjson.dumps(msg))
        for listen_id, wanted, queue in self.listeners:
            if LISTEN_FLAGS.get(method) in wanted:
                meta = {**as_dict(as_dict(params).get("_meta")), SUBSCRIPTION_META: listen_id}
                put_bounded(queue, orjson.dumps({**msg, "params": {**as_dict(params), "_meta": meta}}))

    def push(self, message: bytes) -> None:
        put_bounded(self.stream, message)


def put_bounded(queue: asyncio.Queue[bytes], message: bytes) -> None:
    """Queued for a stream; past its bound the oldest is dropped (a client that does not read)."""
    if queue.full():
        with contextlib.suppress(asyncio.QueueEmpty):
            queue.get_nowait()
    queue.put_nowait(message)


def as_dict(value: Any) -> JsonObject:
    return value if isinstance(value, dict) else {}
