"""What each MCP method of the aggregate endpoint `/mcp` answers (SPEC §3), over every configured
server: lists merged from every server's page (each within its list timeout; one that fails drops
out of `tools/list`, is probed until it answers, and the client is told its lists changed), names
prefixed `SERVER__NAME` and routed back to their server, resources routed by URI, tools the agent
may not call left out (SPEC §9). The transport, sessions and JSON-RPC framing around it are
proxy/mcp/aggregate/server.py's.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import secrets
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from proxy import __version__
from proxy.guards.config import GuardConfig
from proxy.guards.permissions import permission
from proxy.mcp.aggregate.client_session import ClientSession, RpcError, as_dict
from proxy.mcp.aggregate.names import decode_cursor, encode_cursor, owner, prefixed
from proxy.mcp.aggregate.resources import Ambiguous
from proxy.mcp.aggregate.upstream import JsonObject, ServerUnavailable, TransportStatus, UpstreamError

log = logging.getLogger("tripwire.mcp.aggregate")

HANDSHAKE_VERSIONS = ("2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25")
MODERN_VERSION = "2026-07-28"
SERVER_INFO = {"name": "tripwire", "version": __version__}
CAPABILITIES: JsonObject = {
    "tools": {"listChanged": True},
    "prompts": {"listChanged": True},
    "resources": {"listChanged": True, "subscribe": True},
    "completions": {},
    "logging": {},
}
LIST_CHANGED = (
    "notifications/tools/list_changed",
    "notifications/prompts/list_changed",
    "notifications/resources/list_changed",
)
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
RESOURCE_NOT_FOUND = -32002
PROBE_INTERVAL_S = 1.0  # how often a server that dropped out is asked again for its tools


class Methods:
    """The aggregate's MCP methods (`HANDLERS`, by method name) and the servers' list health."""

    def __init__(
        self,
        guard_config: Callable[[str], GuardConfig],
        servers: tuple[str, ...],
        list_timeout_s: float,
        server_list_timeouts: Mapping[str, float] | None = None,
    ) -> None:
        self.guard_config = guard_config  # the agent's effective guard config (its tool permissions)
        self.servers = servers
        # signs Tripwire's list cursors (proxy/mcp/aggregate/names.py); a client's MCP session on
        # `/mcp` lives in this process, and so do the cursors it is given
        self.cursor_key = secrets.token_bytes(32)
        self.list_timeout_s = list_timeout_s
        self.server_list_timeouts = dict(server_list_timeouts or {})  # servers with their own
        self.server_health: dict[str, JsonObject] = {}

    # --- servers dropping out of tools/list, and coming back -----------------------------------

    def reopened(self, s: ClientSession, server: str) -> None:
        """A server back after a loss, or restarted: what it listed may have changed."""
        if s.down.pop(server, None) is not None:
            log.warning("aggregate /mcp: MCP server %r is back in tools/list", server)
        self.server_health.pop(server, None)
        for changed in LIST_CHANGED:
            s.send(changed)

    def _dropped(self, s: ClientSession, server: str, why: str) -> None:
        if server not in s.down:
            log.warning("aggregate /mcp: MCP server %r dropped out of tools/list: %s", server, why)
        s.down[server] = why
        self.server_health[server] = {"error": why, "since": time.time()}
        if s.probe is None or s.probe.done():
            s.probe = asyncio.create_task(  # (a fresh context: not the request's traceparent, forever)
                self._probe(s), name=f"tripwire-aggregate-probe-{s.key}", context=contextvars.Context()
            )

    def _back(self, s: ClientSession, server: str) -> None:
        if s.down.pop(server, None) is not None:
            log.warning("aggregate /mcp: MCP server %r is back in tools/list", server)
            for method in LIST_CHANGED:
                s.send(method)
        self.server_health.pop(server, None)

    async def _probe(self, s: ClientSession) -> None:
        """Ask the servers that dropped out for their tools until they answer (list-changed then)."""
        while s.down and not s.closed:
            await asyncio.sleep(PROBE_INTERVAL_S)
            await asyncio.gather(*(self._list_one(s, srv, "tools/list", None) for srv in list(s.down)))

    async def _discover(self, s: ClientSession, params: JsonObject, progress: Any) -> JsonObject:
        return {
            "supportedVersions": [*HANDSHAKE_VERSIONS, MODERN_VERSION],
            "capabilities": CAPABILITIES,
            "resultType": "complete",
            "ttlMs": 0,
            "cacheScope": "private",
            "_meta": {"io.modelcontextprotocol/serverInfo": SERVER_INFO},
        }

    async def _ping(self, s: ClientSession, params: JsonObject, progress: Any) -> JsonObject:
        return {}

    async def _list_one(
        self, s: ClientSession, server: str, method: str, cursor: str | None
    ) -> JsonObject | None:
        """One server's page of a list, or None when it failed or took longer than `list_timeout_s`."""
        limit = self.server_list_timeouts.get(server, self.list_timeout_s)
        try:
            result = await asyncio.wait_for(
                s.upstreams.get(server).request(
                    method, {"cursor": cursor} if cursor else None, timeout=limit
                ),
                limit,
            )
        except UpstreamError as e:
            if e.code == METHOD_NOT_FOUND:  # the server has none of these: not a failure
                return None
            why = f"{method} failed: {e.message}"
        except (ServerUnavailable, TransportStatus) as e:
            why = str(e)
        except TimeoutError:
            why = f"{method} took longer than list_timeout_s ({limit:g}s)"
        except Exception as e:  # one server's surprise must not fail the others' list
            log.exception("aggregate /mcp: %s of %r failed", method, server)
            why = f"{method} failed: {e!r}"
        else:
            if method == "tools/list":
                self._back(s, server)
            return result
        if method == "tools/list":
            self._dropped(s, server, why)
        else:
            log.warning("aggregate /mcp: %r left out of %s: %s", server, method, why)
        return None

    async def _merged(
        self, s: ClientSession, method: str, key: str, params: JsonObject
    ) -> tuple[list[tuple[str, JsonObject]], str | None]:
        """Every server's page of a list, concurrently; each item with its server, and the next cursor."""
        cursor = params.get("cursor")
        if cursor is None:
            cursors: dict[str, str | None] = dict.fromkeys(self.servers)
        else:
            decoded = decode_cursor(cursor, method, self.servers, key=self.cursor_key)
            if decoded is None:
                raise RpcError(INVALID_PARAMS, f"Invalid cursor for {method}")
            cursors = dict(decoded)
        pages = await asyncio.gather(*(self._list_one(s, srv, method, c) for srv, c in cursors.items()))
        items: list[tuple[str, JsonObject]] = []
        more: dict[str, str] = {}
        for server, page in zip(cursors, pages, strict=True):
            if page is None:
                continue
            items.extend((server, item) for item in page.get(key) or () if isinstance(item, dict))
            nxt = page.get("nextCursor")
            if isinstance(nxt, str) and nxt:
                more[server] = nxt
        return items, encode_cursor(method, more, key=self.cursor_key) if more else None

    async def _tools_list(self, s: ClientSession, params: JsonObject, progress: Any) -> JsonObject:
        items, nxt = await self._merged(s, "tools/list", "tools", params)
        tools_config = self.guard_config(s.route.agent).tools
        tools = []
        for server, tool in items:
            name = prefixed(server, str(tool.get("name") or ""))
            if name is None:
                log.warning(
                    "aggregate /mcp: tool %r of %r left out: its name is too long", tool.get("name"), server
                )
                continue
            if permission(tools_config, name) == "deny":
                continue
            tools.append({**tool, "name": name})
        return _page({"tools": tools}, nxt)

    async def _tools_call(self, s: ClientSession, params: JsonObject, progress: Any) -> JsonObject:
        server, tool = self._owned(params.get("name"), "tool")
        return await s.upstreams.get(server).request(
            "tools/call", {**params, "name": tool}, on_progress=progress
        )

    def _owned(self, name: Any, what: str) -> tuple[str, str]:
        found = owner(name) if isinstance(name, str) else None
        if found is None or found[0] not in self.servers:
            # what an MCP server answers for a name it does not know (spec: "Unknown tool")
            raise RpcError(INVALID_PARAMS, f"Unknown {what}: {name}")
        return found

    async def _prompts_list(self, s: ClientSession, params: JsonObject, progress: Any) -> JsonObject:
        items, nxt = await self._merged(s, "prompts/list", "prompts", params)
        prompts = []
        for server, prompt in items:
            name = prefixed(server, str(prompt.get("name") or ""))
            if name is not None:
                prompts.append({**prompt, "name": name})
        return _page({"prompts": prompts}, nxt)

    async def _prompts_get(self, s: ClientSession, params: JsonObject, progress: Any) -> JsonObject:
        server, prompt = self._owned(params.get("name"), "prompt")
        return await s.upstreams.get(server).request("prompts/get", {**params, "name": prompt})

    async def _resources_list(self, s: ClientSession, params: JsonObject, progress: Any) -> JsonObject:
        items, nxt = await self._merged(s, "resources/list", "resources", params)
        for server, resource in items:
            s.resources.resource(str(resource.get("uri")), server)
        return _page({"resources": [r for _, r in items]}, nxt)

    async def _templates_list(self, s: ClientSession, params: JsonObject, progress: Any) -> JsonObject:
        items, nxt = await self._merged(s, "resources/templates/list", "resourceTemplates", params)
        kept = []
        for server, template in items:
            if s.resources.template(str(template.get("uriTemplate")), server):
                kept.append(template)
            else:
                log.warning(
                    "aggregate /mcp: template %r of %r left out: it names no scheme, it would own any URI",
                    template.get("uriTemplate"),
                    server,
                )
        return _page({"resourceTemplates": kept}, nxt)

    async def _resource_owner(self, s: ClientSession, uri: Any) -> str:
        if not isinstance(uri, str):
            raise RpcError(INVALID_PARAMS, "uri is required")
        listed_now = not s.resources.listed
        if listed_now:  # every server's listing first: a template never beats a listed URI
            await self._list_resources(s)
        found = s.resources.owner(uri)
        if found is None and not listed_now:  # not listed yet in this session: list, then look again
            await self._list_resources(s)
            found = s.resources.owner(uri)
        if isinstance(found, Ambiguous):
            servers = ", ".join(found.servers)
            raise RpcError(
                INVALID_PARAMS,
                f"Resource {uri} is claimed by several servers ({servers}): refused",
                {"uri": uri},
            )
        if found is None:
            raise RpcError(RESOURCE_NOT_FOUND, "Resource not found", {"uri": uri})
        return found

    async def _list_resources(self, s: ClientSession) -> None:
        s.resources.listed = True
        await self._resources_list(s, {}, None)
        await self._templates_list(s, {}, None)

    async def _by_uri(self, method: str, s: ClientSession, params: JsonObject) -> JsonObject:
        server = await self._resource_owner(s, params.get("uri"))
        return await s.upstreams.get(server).request(method, params)

    async def _resources_read(self, s: ClientSession, params: JsonObject, progress: Any) -> JsonObject:
        return await self._by_uri("resources/read", s, params)

    async def _subscribe(self, s: ClientSession, params: JsonObject, progress: Any) -> JsonObject:
        return await self._by_uri("resources/subscribe", s, params)

    async def _unsubscribe(self, s: ClientSession, params: JsonObject, progress: Any) -> JsonObject:
        return await self._by_uri("resources/unsubscribe", s, params)

    async def _complete(self, s: ClientSession, params: JsonObject, progress: Any) -> JsonObject:
        ref = as_dict(params.get("ref"))
        if ref.get("type") == "ref/prompt":
            server, prompt = self._owned(ref.get("name"), "prompt")
            params = {**params, "ref": {**ref, "name": prompt}}
        else:
            server = await self._resource_owner(s, ref.get("uri"))
        return await s.upstreams.get(server).request("completion/complete", params)

    async def _set_level(self, s: ClientSession, params: JsonObject, progress: Any) -> JsonObject:
        await asyncio.gather(
            *(
                s.upstreams.get(srv).request("logging/setLevel", params, timeout=self.list_timeout_s)
                for srv in self.servers
            ),
            return_exceptions=True,
        )
        return {}

    HANDLERS: dict[str, Callable[[Methods, ClientSession, JsonObject, Any], Awaitable[JsonObject]]] = {
        "server/discover": _discover,
        "ping": _ping,
        "tools/list": _tools_list,
        "tools/call": _tools_call,
        "prompts/list": _prompts_list,
        "prompts/get": _prompts_get,
        "resources/list": _resources_list,
        "resources/templates/list": _templates_list,
        "resources/read": _resources_read,
        "resources/subscribe": _subscribe,
        "resources/unsubscribe": _unsubscribe,
        "completion/complete": _complete,
        "logging/setLevel": _set_level,
    }


def _page(result: JsonObject, nxt: str | None) -> JsonObject:
    if nxt is not None:
        result["nextCursor"] = nxt
    return result
