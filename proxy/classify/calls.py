"""What a call is, decided once before any stage judges it (issue 30).

Pure: the route, the method and the body in, one typed call out. Every later reader (the parse
stages, admission's checks, the WebSocket route) reads this answer instead of deriving its own:

- `LLMCall`: a POST a dialect reads (its name, operation, and the path in its own spelling);
- `Relayed`: an operation Tripwire knows and relays without a dialect (any GET, a models list,
  files, a token count, ...): no model call, no tool;
- `MCPCall`: the JSON-RPC messages of a POST to an MCP server, every element of a batch, a
  `tools/call` without an `id` included;
- `SocketCall`: a WebSocket whose messages a dialect reads as calls (the Responses socket);
- `Unknown`: what Tripwire cannot read, and what that was (refused when policy applies:
  `proxy.classify.policy`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from proxy import dialects, jsonparse
from proxy.routing import Route

JSONRPC_KINDS = ("request", "notification", "response", "invalid")


@dataclass(frozen=True, slots=True)
class LLMCall:
    dialect: str  # the dialect module's DIALECT
    operation: str  # its OPERATION (gen_ai.operation.name)
    path: str  # the upstream path in the dialect's own spelling (what is forwarded)


@dataclass(frozen=True, slots=True)
class Relayed:
    operation: str  # e.g. "read" (a GET), "files", "count_tokens"


@dataclass(frozen=True, slots=True)
class MCPMessage:
    kind: str  # request | notification | response | invalid (JSON-RPC 2.0)
    method: str | None
    tool: str | None  # a `tools/call`'s `params.name` (as sent), else None
    unreadable: str | None = None  # why no guard could judge it (attack round 2), else None


@dataclass(frozen=True, slots=True)
class MCPCall:
    messages: tuple[MCPMessage, ...]
    batch: bool
    raw: tuple[Any, ...]  # the parsed messages, as sent

    @property
    def tool_calls(self) -> tuple[MCPMessage, ...]:
        """Every `tools/call` of the POST, with an id or without (JSON-RPC says a request has one;
        a server may run it anyway)."""
        return tuple(m for m in self.messages if m.method == "tools/call")

    @property
    def unjudgeable(self) -> str | None:
        """Why some message of the POST cannot be judged (a lax server may still run it as a tool
        call): refused while policy applies. None when every message can be."""
        return next((m.unreadable for m in self.messages if m.unreadable is not None), None)


@dataclass(frozen=True, slots=True)
class SocketCall:
    dialect: str
    path: str


@dataclass(frozen=True, slots=True)
class Unknown:
    what: str  # what was not understood, for the refusal's message


Call = LLMCall | Relayed | MCPCall | SocketCall | Unknown

# POSTs on an LLM route that Tripwire relays without a dialect (upstream-relative, after an optional
# /v1, lower case): no tool call comes out of them. Anything else is Unknown.
RELAYED_POSTS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"/(files|uploads)(/.*)?"), "files"),
    (re.compile(r"/messages/count_tokens|/responses/input_tokens"), "count_tokens"),
    (re.compile(r"/responses/[^/]+/cancel"), "cancel"),
    (re.compile(r"/responses/compact"), "compact"),
)


def classify_http(route: Route, method: str, body: bytes) -> Call:
    """The call a request on `route` is (`route.path` is already normalised by routing)."""
    if route.kind == "llm":
        if body and method.upper() != "POST":
            # a GET (or PUT, ...) with a body, or a method override header an upstream honours,
            # would be a model call relayed unread (attack round 2)
            return Unknown(f"{method.upper()} {route.path or '/'} with a body: only a POST carries a call")
        return classify_llm(route.path, method)
    if method.upper() != "POST":
        return Relayed(method.lower())
    return classify_mcp(body)


@lru_cache(maxsize=512)  # an agent calls the same few paths again and again (paths are bounded by it)
def classify_llm(path: str, method: str) -> Call:
    """The call a request on an LLM route is, from its (normalised) path and method: immutable, kept."""
    if method.upper() != "POST":
        return Relayed("read" if method.upper() in ("GET", "HEAD", "OPTIONS") else method.lower())
    found = dialects.match(path, method)
    if found is not None:
        module = dialects.named(found[0])
        assert module is not None
        return LLMCall(found[0], module.OPERATION, found[1])
    rest = path.rstrip("/").lower()
    rest = rest[3:] if rest.startswith("/v1/") else rest
    for pattern, operation in RELAYED_POSTS:
        if pattern.fullmatch(rest):
            return Relayed(operation)
    return Unknown(f"POST {path or '/'}: no dialect of Tripwire reads this endpoint")


def classify_socket(route: Route) -> Call:
    """A WebSocket upgrade: a Responses socket (its calls judged message by message) or Unknown."""
    found = dialects.match(route.path, "POST") if route.kind == "llm" else None
    module = dialects.named(found[0]) if found is not None else None
    if found is not None and module is not None and module.WEBSOCKET_CALLS:
        return SocketCall(found[0], found[1])
    return Unknown(f"a WebSocket on {route.path or '/'}: Tripwire reads no calls on it")


def classify_mcp(body: bytes) -> Call:
    try:
        data = jsonparse.loads(body)
    except ValueError:
        return Unknown("the request body is not JSON (JSON-RPC parse error)")
    batch = isinstance(data, list)
    raw = tuple(data) if batch else (data,)
    return MCPCall(tuple(mcp_message(m) for m in raw), batch, raw)


def mcp_message(msg: Any) -> MCPMessage:
    """One JSON-RPC message: request (method + id), notification (method, no id), response."""
    if not isinstance(msg, dict):
        # a batch inside a batch: a server flattening it would run its tools/calls unjudged
        return MCPMessage(
            "invalid", None, None, "a batch nested in a batch" if isinstance(msg, list) else None
        )
    method = msg.get("method")
    if isinstance(method, str):
        params = msg.get("params")
        name = params.get("name") if isinstance(params, dict) else None
        tool = name if method == "tools/call" and isinstance(name, str) else None
        kind = "request" if "id" in msg else "notification"
        return MCPMessage(kind, method, tool, unreadable_call(method, tool))
    if "id" in msg and ("result" in msg or "error" in msg):
        return MCPMessage("response", None, None)
    return MCPMessage("invalid", None, None)


def unreadable_call(method: str, tool: str | None) -> str | None:
    """A tools/call no guard can judge, which a lax server may still run: `Tools/Call` or
    `tools/call ` (methods are case-sensitive; a server folding them runs the tool), or a
    `tools/call` whose `params` is not an object with a string `name` (positional params)."""
    if method == "tools/call":
        return None if tool is not None else "a tools/call without a string params.name"
    if method.strip().casefold() == "tools/call":
        return f"method {method!r} (not spelled tools/call)"
    return None
