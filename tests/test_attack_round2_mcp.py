"""Attack round 2 (issue 30), MCP: a hostile agent's attempts on `/mcp/NAME` and the aggregate
`/mcp` against a lax MCP server (docs/gateway.md "Attack round 2"). The invariant: the denied tool
`fs__rm` never runs on the server, however the call is spelled; a permitted one does."""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from yarl import URL

from tests.conftest import StartTripwire
from tests.test_attack_round2 import DENY, HEADERS, serve


class LaxMCP:
    """A lax MCP server, as a hostile or sloppy one may be: it reads the FIRST of duplicate keys,
    methods without regard to case or spaces, positional params, nested batches; it records every
    tool it ran."""

    def __init__(self) -> None:
        self.ran: list[Any] = []
        self.app = web.Application()
        self.app.router.add_route("*", "/{tail:.*}", self.handle)

    def answer(self, msg: Any) -> Any:
        if isinstance(msg, list):
            return [a for a in (self.answer(m) for m in msg) if a is not None]
        if not isinstance(msg, dict):
            return None
        method = str(msg.get("method", "")).strip().lower()
        params = msg.get("params")
        if method == "tools/call":
            name = params[0] if isinstance(params, list) else (params or {}).get("name")
            self.ran.append(name)
            result: Any = {"content": [{"type": "text", "text": f"ran {name}"}]}
        elif method == "tools/list":
            result = {"tools": [{"name": n, "inputSchema": {"type": "object"}} for n in ("rm", "ls")]}
        elif method == "initialize":
            result = {
                "protocolVersion": "2025-06-18",
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "lax", "version": "1"},
            }
        else:
            result = {}
        return {"jsonrpc": "2.0", "id": msg.get("id"), "result": result} if "id" in msg else None

    async def handle(self, request: web.Request) -> web.StreamResponse:
        if request.method != "POST":
            return web.Response(status=405)
        raw = await request.read()
        first_wins = json.loads(raw, object_pairs_hook=lambda pairs: dict(reversed(pairs)))
        found = self.answer(first_wins)
        return web.json_response(found) if found else web.Response(status=202)


def rpc(method: str, params: Any, msg_id: Any = 1) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": msg_id, "method": method, "params": params}


RM = {"name": "rm", "arguments": {}}
# (id, path under the proxy, body (JSON or raw bytes))
MCP_ATTEMPTS: list[tuple[str, str, Any]] = [
    ("batch-of-one", "/mcp/fs", [rpc("tools/call", RM)]),
    ("nested-batch", "/mcp/fs", [[rpc("tools/call", RM)]]),
    ("id-null", "/mcp/fs", rpc("tools/call", RM, None)),
    ("id-object", "/mcp/fs", rpc("tools/call", RM, {"x": 1})),
    ("notification", "/mcp/fs", {"jsonrpc": "2.0", "method": "tools/call", "params": RM}),
    ("method-case", "/mcp/fs", rpc("Tools/Call", RM)),
    ("method-space", "/mcp/fs", rpc("tools/call ", RM)),
    ("positional-params", "/mcp/fs", rpc("tools/call", ["rm", {}])),
    ("name-not-a-string", "/mcp/fs", rpc("tools/call", {"name": ["rm"], "arguments": {}})),
    ("trailing-slash", "/mcp/fs/", rpc("tools/call", RM)),
    ("legacy-messages-path", "/mcp/fs/messages?session_id=x", rpc("tools/call", RM)),
    ("no-jsonrpc-field", "/mcp/fs", {"id": 1, "method": "tools/call", "params": RM}),
    (
        "dup-method-key",
        "/mcp/fs",
        b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"rm","arguments":{}},"method":"ping"}',
    ),
    (
        "dup-name-key",
        "/mcp/fs",
        b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"rm","name":"ls","arguments":{}}}',
    ),
    (
        "dup-params-key",
        "/mcp/fs",
        b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"rm"},"params":{"name":"ls"}}',
    ),
    ("aggregate-batch", "/mcp", [rpc("tools/call", {"name": "fs__rm", "arguments": {}})]),
    ("aggregate-case", "/mcp", rpc("tools/call", {"name": "FS__rm", "arguments": {}})),
    ("aggregate-method-case", "/mcp", rpc("TOOLS/CALL", {"name": "fs__rm", "arguments": {}})),
    ("utf-16-body", "/mcp/fs", json.dumps(rpc("tools/call", RM)).encode("utf-16")),
    ("query-string", "/mcp/fs?name=ls", rpc("tools/call", RM)),
    (
        "aggregate-dup-name-key",
        "/mcp",
        b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"fs__rm","name":"fs__ls","arguments":{}}}',
    ),
]


@pytest.mark.parametrize(("path", "body"), [a[1:] for a in MCP_ATTEMPTS], ids=[a[0] for a in MCP_ATTEMPTS])
async def test_mcp_attempt(start_tripwire: StartTripwire, path: str, body: Any) -> None:
    lax = LaxMCP()
    async with serve(lax.app) as url:
        tw = await start_tripwire(mcp={"fs": {"url": url + "/mcp"}}, guards={"tools": {"deny": DENY}})
        raw = body if isinstance(body, bytes) else json.dumps(body).encode()
        headers = {
            "Accept": "application/json, text/event-stream",
            "Content-Type": "application/json",
            **HEADERS,
        }
        async with aiohttp.ClientSession() as http:
            if path == "/mcp":  # the aggregate wants a session first
                init = rpc(
                    "initialize",
                    {
                        "protocolVersion": "2025-06-18",
                        "capabilities": {},
                        "clientInfo": {"name": "a", "version": "1"},
                    },
                    0,
                )
                async with http.post(tw.url + path, json=init, headers=headers) as r:
                    headers["Mcp-Session-Id"] = r.headers.get("Mcp-Session-Id", "")
            async with http.post(URL(tw.url + path, encoded=True), data=raw, headers=headers) as r:
                await r.read()
    assert [n for n in lax.ran if "rm" in json.dumps(n)] == []


async def test_a_permitted_tool_reaches_the_lax_server(start_tripwire: StartTripwire) -> None:
    """The MCP attempts above can fail: a permitted tool, sent the same ways, runs on the lax server
    (on its direct route and through the aggregate)."""
    lax = LaxMCP()
    async with serve(lax.app) as url:
        tw = await start_tripwire(mcp={"fs": {"url": url + "/mcp"}}, guards={"tools": {"deny": DENY}})
        headers = {"Accept": "application/json, text/event-stream", **HEADERS}
        async with aiohttp.ClientSession() as http:
            init = rpc(
                "initialize",
                {
                    "protocolVersion": "2025-06-18",
                    "capabilities": {},
                    "clientInfo": {"name": "a", "version": "1"},
                },
                0,
            )
            async with http.post(tw.url + "/mcp", json=init, headers=headers) as r:
                headers["Mcp-Session-Id"] = r.headers["Mcp-Session-Id"]
            for path, name in (("/mcp", "fs__ls"), ("/mcp/fs", "ls")):
                async with http.post(
                    tw.url + path, json=rpc("tools/call", {"name": name, "arguments": {}}), headers=headers
                ) as r:
                    assert r.status == 200, await r.text()
    assert lax.ran == ["ls", "ls"]
