"""The pinned MCP tool definitions on the admin listener (docs/mcp.md "Changed tools"), behind the
admin token as every API call:

    GET  /api/pins                          every server's pins and pending (or denied) changes,
                                            each change with its diff against the pin
    POST /api/pins/{server}/reset           forget the server's pins: its next list pins afresh
    POST /api/pins/{server}/tools/{tool}    {"decision": "approve" | "deny", "hash": "..."}: decide a
                                            change without a held call (`hash`, optional: only if
                                            the change is still the definition the person saw)

An unknown server is a 404; deciding a tool with no change pending a 404 too (or 409 when its
change is no longer the `hash` given).
"""

from __future__ import annotations

from typing import Any

import orjson
from aiohttp import web

from proxy.pins.service import Pins

PINS: web.AppKey[Pins] = web.AppKey("tripwire_pins", Pins)


def _json(data: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(data), status=status, content_type="application/json")


def _detail(status: int, detail: str) -> web.Response:
    return _json({"detail": detail}, status=status)


async def list_pins(request: web.Request) -> web.Response:
    return _json({"servers": await request.app[PINS].snapshot()})


def _known(request: web.Request, servers: tuple[str, ...]) -> str | None:
    server = request.match_info["server"]
    return server if server in servers else None


def setup_pins(app: web.Application, pins: Pins, servers: tuple[str, ...]) -> None:
    """`servers`: the configured MCP servers (what can be reset or decided)."""
    app[PINS] = pins

    async def reset(request: web.Request) -> web.Response:
        server = _known(request, servers)
        if server is None:
            return _detail(
                404, f"no MCP server {request.match_info['server']!r} (configured: {list(servers)})"
            )
        await pins.reset(server)
        return _json({"server": server, "reset": True})

    async def decide_tool(request: web.Request) -> web.Response:
        server = _known(request, servers)
        if server is None:
            return _detail(
                404, f"no MCP server {request.match_info['server']!r} (configured: {list(servers)})"
            )
        try:
            body = orjson.loads(await request.read() or b"{}")
        except orjson.JSONDecodeError:
            return _detail(400, "body must be JSON")
        decision = body.get("decision") if isinstance(body, dict) else None
        if decision not in ("approve", "deny"):
            return _detail(400, 'decision must be "approve" or "deny"')
        expected = body.get("hash")
        if expected is not None and not isinstance(expected, str):
            return _detail(400, "hash must be a string")
        tool = request.match_info["tool"]
        current = (await pins.refresh(server)).changes.get(tool)
        if current is None:
            return _detail(404, f"tool {tool!r} of {server!r} has no change to decide")
        if expected is not None and current.hash != expected:
            return _detail(
                409, f"tool {tool!r} of {server!r} changed again since: its change is {current.hash}"
            )
        done = await (pins.approve if decision == "approve" else pins.deny)(server, tool, current.hash)
        return _json({"server": server, "tool": tool, "decision": decision, "done": done})

    app.router.add_get("/api/pins", list_pins)
    app.router.add_post("/api/pins/{server}/reset", reset)
    app.router.add_post("/api/pins/{server}/tools/{tool}", decide_tool)
