"""The aggregate endpoint's edges, over raw JSON-RPC against small MCP servers on 127.0.0.1: Tripwire's
own cursors over each server's, a slow server dropping out after `list_timeout_s`, an unknown
prefixed tool, tool permissions on the merged list, the circuit refusal shape per server, a header
that cannot pass a direct call off as aggregated."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import orjson
from aiohttp import web
from aiohttp.test_utils import TestServer

from proxy.mcp import jsonrpc
from tests.conftest import StartTripwire


class FakeMCP:
    """A handshake-era MCP server: `pages` of tools, each listing after `list_delay` seconds."""

    def __init__(self, pages: list[list[str]], list_delay: float = 0.0) -> None:
        self.pages = pages
        self.list_delay = list_delay
        self.calls: list[dict[str, Any]] = []
        self.app = web.Application()
        self.app.router.add_route("*", "/mcp", self.handle)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        if request.method != "POST":
            return web.Response(status=405)
        msg = await request.json()
        method, msg_id, params = msg.get("method"), msg.get("id"), msg.get("params") or {}
        if "id" not in msg:
            return web.Response(status=202)
        headers = {"Mcp-Session-Id": "fake-session"}
        if method == "initialize":
            result: Any = {
                "protocolVersion": params.get("protocolVersion"),
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "fake", "version": "1"},
            }
        elif method == "tools/list":
            await asyncio.sleep(self.list_delay)
            page = int(params.get("cursor") or 0)
            result = {"tools": [{"name": n, "inputSchema": {"type": "object"}} for n in self.pages[page]]}
            if page + 1 < len(self.pages):
                result["nextCursor"] = str(page + 1)
        elif method == "tools/call":
            self.calls.append(params)
            result = {"content": [{"type": "text", "text": f"ran {params['name']}"}], "isError": False}
        else:
            body = {"jsonrpc": "2.0", "id": msg_id, "error": {"code": -32601, "message": "Method not found"}}
            return web.json_response(body, headers=headers)
        return web.json_response({"jsonrpc": "2.0", "id": msg_id, "result": result}, headers=headers)


@asynccontextmanager
async def served(fake: FakeMCP) -> AsyncIterator[str]:
    server = TestServer(fake.app, host="127.0.0.1")
    await server.start_server()
    try:
        yield str(server.make_url("/mcp"))
    finally:
        await server.close()


class RawClient:
    """A handshake-era client speaking raw JSON-RPC to `/mcp`."""

    def __init__(self, http: aiohttp.ClientSession, url: str, headers: dict[str, str] | None = None) -> None:
        self.http, self.url, self.headers, self.ids = http, url, dict(headers or {}), 0

    async def rpc(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        self.ids += 1
        body = {"jsonrpc": "2.0", "id": self.ids, "method": method, "params": params or {}}
        headers = {"Accept": "application/json, text/event-stream", **self.headers}
        async with self.http.post(self.url, json=body, headers=headers) as r:
            assert r.status == 200, await r.text()
            if "Mcp-Session-Id" in r.headers:
                self.headers["Mcp-Session-Id"] = r.headers["Mcp-Session-Id"]
            answer: dict[str, Any] = orjson.loads(await r.read())
            return answer

    async def open(self) -> None:
        await self.rpc(
            "initialize",
            {
                "protocolVersion": "2025-11-25",
                "capabilities": {},
                "clientInfo": {"name": "t", "version": "1"},
            },
        )


async def test_cursors_cover_each_servers_own(start_tripwire: StartTripwire) -> None:
    paged, single = FakeMCP([["a1", "a2"], ["a3"], ["a4"]]), FakeMCP([["b1"]])
    async with served(paged) as paged_url, served(single) as single_url:
        tw = await start_tripwire(mcp={"pa": {"url": paged_url}, "si": {"url": single_url}})
        async with aiohttp.ClientSession() as http:
            client = RawClient(http, f"{tw.url}/mcp")
            await client.open()
            seen: list[str] = []
            cursor = None
            for _ in range(10):
                page = (await client.rpc("tools/list", {"cursor": cursor} if cursor else {}))["result"]
                seen.extend(t["name"] for t in page["tools"])
                cursor = page.get("nextCursor")
                if cursor is None:
                    break
                assert cursor not in ("1", "2")  # Tripwire's own, not a server's
            assert sorted(seen) == ["pa__a1", "pa__a2", "pa__a3", "pa__a4", "si__b1"]
            bad = await client.rpc("tools/list", {"cursor": "1"})
            assert bad["error"]["code"] == -32602


async def test_a_slow_server_drops_out_the_rest_are_served(start_tripwire: StartTripwire) -> None:
    slow, quick = FakeMCP([["late"]], list_delay=30), FakeMCP([["fast"]])
    async with served(slow) as slow_url, served(quick) as quick_url:
        tw = await start_tripwire(
            mcp={"slow": {"url": slow_url}, "quick": {"url": quick_url}}, list_timeout_s=1
        )
        async with aiohttp.ClientSession() as http:
            client = RawClient(http, f"{tw.url}/mcp")
            await client.open()
            listed = (await client.rpc("tools/list"))["result"]["tools"]
            assert [t["name"] for t in listed] == ["quick__fast"]
            async with http.get(f"{tw.admin_url}/healthz") as r:
                down = (await r.json())["mcp_aggregate"]["down"]
            assert list(down) == ["slow"] and "list_timeout_s" in down["slow"]["error"]


async def test_unknown_prefixed_tool_is_the_servers_unknown_tool_error(start_tripwire: StartTripwire) -> None:
    fake = FakeMCP([["run"]])
    async with served(fake) as url:
        tw = await start_tripwire(mcp={"files": {"url": url}})
        async with aiohttp.ClientSession() as http:
            client = RawClient(http, f"{tw.url}/mcp")
            await client.open()
            for name in ("nope__run", "run", "files"):
                answer = await client.rpc("tools/call", {"name": name, "arguments": {}})
                assert answer["error"]["code"] == -32602 and name in answer["error"]["message"]
            ok = await client.rpc("tools/call", {"name": "files__run", "arguments": {}})
            assert ok["result"]["content"][0]["text"] == "ran run"
            assert [c["name"] for c in fake.calls] == ["run"]  # the server's own name, once


async def test_denied_tools_left_out_of_the_merged_list(start_tripwire: StartTripwire) -> None:
    fake, other = FakeMCP([["read", "write", "delete"]]), FakeMCP([["read"]])
    async with served(fake) as url, served(other) as other_url:
        guards = {"tools": {"deny": ["files__delete", "git__*"]}}
        tw = await start_tripwire(
            mcp={"files": {"url": url}, "git": {"url": other_url}}, agents={"bot": guards}
        )
        async with aiohttp.ClientSession() as http:
            for path, expected in (
                ("/agents/bot/mcp", ["files__read", "files__write"]),
                ("/agents/other/mcp", ["files__delete", "files__read", "files__write", "git__read"]),
            ):
                client = RawClient(http, f"{tw.url}{path}")
                await client.open()
                listed = (await client.rpc("tools/list"))["result"]["tools"]
                assert sorted(t["name"] for t in listed) == expected


async def test_a_denied_tool_called_through_the_aggregate_is_blocked_unforwarded(
    start_tripwire: StartTripwire,
) -> None:
    # the aggregated call's name is already `SERVER__TOOL`: the permissions and the rate limits
    # must match that, not `files__files__delete`
    fake = FakeMCP([["read", "delete"]])
    async with served(fake) as url:
        guards = {
            "tools": {"deny": ["files__delete"]},
            "rate_limits": [{"match": "files__read", "max_calls": 1, "per_s": 3600}],
        }
        tw = await start_tripwire(mcp={"files": {"url": url}}, agents={"bot": guards})
        async with aiohttp.ClientSession() as http:
            client = RawClient(http, f"{tw.url}/agents/bot/mcp")
            await client.open()
            denied = (await client.rpc("tools/call", {"name": "files__delete", "arguments": {}}))["result"]
            assert denied["isError"] is True
            assert denied["content"][0]["text"].startswith("[tripwire] denied")
            assert denied["_meta"]["tripwire"]["guard"] == "tool_denied"
            first = (await client.rpc("tools/call", {"name": "files__read", "arguments": {}}))["result"]
            assert first["content"][0]["text"] == "ran read"
            limited = (await client.rpc("tools/call", {"name": "files__read", "arguments": {"n": 2}}))[
                "result"
            ]
            assert limited["content"][0]["text"].startswith("[tripwire] rate limited")
            assert [c["name"] for c in fake.calls] == ["read"]  # neither the denied nor the limited call


async def test_circuit_of_a_server_is_its_own_and_refuses_in_its_shape(start_tripwire: StartTripwire) -> None:
    dead, alive = FakeMCP([["boom"]]), FakeMCP([["fine"]])
    async with served(alive) as alive_url:
        async with served(dead) as dead_url:
            tw = await start_tripwire(
                mcp={"dead": {"url": dead_url}, "alive": {"url": alive_url}},
                guards={"circuit_breaker": {"open_after_failures": 2, "cooldown_seconds": 60}},
            )
            async with aiohttp.ClientSession() as http:
                client = RawClient(http, f"{tw.url}/mcp")
                await client.open()
                assert len((await client.rpc("tools/list"))["result"]["tools"]) == 2
        # `dead` is gone now: two failed calls open its circuit, the third is refused at once
        async with aiohttp.ClientSession() as http:
            client.http = http
            for _ in range(2):
                failed = await client.rpc("tools/call", {"name": "dead__boom", "arguments": {}})
                assert failed["error"]["code"] == jsonrpc.TRIPWIRE_UPSTREAM_ERROR
            refused = await client.rpc("tools/call", {"name": "dead__boom", "arguments": {}})
            assert refused["error"]["code"] == jsonrpc.TRIPWIRE_GUARD_ERROR
            assert refused["error"]["data"]["guardrail"] == "circuit_breaker"
            assert refused["error"]["data"]["retry_after"] > 0
            fine = await client.rpc("tools/call", {"name": "alive__fine", "arguments": {}})
            assert fine["result"]["content"][0]["text"] == "ran fine"
        await tw.flush()
        calls = [e for e in tw.events() if e["event_type"] == "TOOL_CALL"]
        assert [(c["name"], c["payload"]["status"]) for c in calls] == [
            ("dead__boom", "error"),
            ("dead__boom", "error"),
            ("alive__fine", "ok"),
        ]


async def test_idle_sessions_close_and_their_client_is_told_to_start_again(
    start_tripwire: StartTripwire, monkeypatch: Any
) -> None:
    from proxy.mcp.aggregate import server as aggregate_server

    fake = FakeMCP([["run"]])
    async with served(fake) as url:
        tw = await start_tripwire(mcp={"files": {"url": url}})
        async with aiohttp.ClientSession() as http:
            first = RawClient(http, f"{tw.url}/mcp")
            await first.open()
            assert (await first.rpc("tools/list"))["result"]["tools"]
            monkeypatch.setattr(aggregate_server, "SESSION_IDLE_S", 0.0)
            second = RawClient(http, f"{tw.url}/mcp")
            await second.open()  # a new session sweeps the idle ones
            body = {"jsonrpc": "2.0", "id": 9, "method": "tools/list", "params": {}}
            async with http.post(first.url, json=body, headers=first.headers) as r:
                assert r.status == 404  # the client starts a new session, as after a server restart
            assert (await second.rpc("tools/list"))["result"]["tools"]


async def test_a_session_is_its_agents_own_and_unknown_revisions_are_named(
    start_tripwire: StartTripwire,
) -> None:
    fake = FakeMCP([["run"]])
    async with served(fake) as url:
        tw = await start_tripwire(mcp={"files": {"url": url}})
        async with aiohttp.ClientSession() as http:
            mine = RawClient(http, f"{tw.url}/agents/a/mcp")
            await mine.open()
            body = {"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {}}
            for path in ("/agents/b/mcp", "/mcp"):  # another agent naming a's session: not found
                async with http.post(f"{tw.url}{path}", json=body, headers=mine.headers) as r:
                    assert r.status == 404
            assert (await mine.rpc("tools/list"))["result"]["tools"]
            future = {"MCP-Protocol-Version": "2099-01-01"}
            async with http.post(f"{tw.url}/mcp", json=body, headers=future) as r:
                answer = await r.json()
            assert r.status == 400 and answer["error"]["code"] == -32022
            assert "2026-07-28" in answer["error"]["data"]["supported"]


async def test_a_servers_own_list_timeout(start_tripwire: StartTripwire) -> None:
    """`list_timeout_s` on a server's entry is its own: a server known to list slowly is waited for."""
    slow, quick = FakeMCP([["late"]], list_delay=2.0), FakeMCP([["fast"]])
    async with served(slow) as slow_url, served(quick) as quick_url:
        tw = await start_tripwire(
            mcp={"slow": {"url": slow_url, "list_timeout_s": 60}, "quick": {"url": quick_url}},
            list_timeout_s=1.0,  # shorter than `slow` takes: its own 60 s decides
        )
        async with aiohttp.ClientSession() as http:
            client = RawClient(http, f"{tw.url}/mcp")
            await client.open()
            listed = (await client.rpc("tools/list"))["result"]["tools"]
            assert "slow__late" in {t["name"] for t in listed}
