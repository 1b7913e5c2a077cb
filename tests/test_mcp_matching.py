"""Result matching on the wire, against a hand-written Streamable HTTP server that does what SDK
servers rarely do on cue: a server-to-client request reusing the call's id, a POST stream that breaks
before the result, and the result delivered on the resumed GET stream."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from tests.conftest import StartTripwire

# tests/mcp_servers imports the mcp SDK, which the mitmproxy environment does not install
pytest.importorskip("mcp")
from tests.mcp_servers import served_as_in_production  # noqa: E402

SESSION = "sess-42"
RESULT = {"content": [{"type": "text", "text": "done"}], "structuredContent": {"ok": True}}


class TrickyServer:
    def __init__(self) -> None:
        self.resume = asyncio.Event()
        self.hosts: list[str] = []
        self.app = web.Application()
        self.app.router.add_post("/mcp", self.post)
        self.app.router.add_get("/mcp", self.get)

    async def post(self, request: web.Request) -> web.StreamResponse:
        self.hosts.append(request.headers["Host"])
        msg = await request.json()
        args = msg["params"]["arguments"]
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Mcp-Session-Id": SESSION})
        await resp.prepare(request)

        def event(data: Any, event_id: str) -> bytes:
            return b"id: " + event_id.encode() + b"\nevent: message\ndata: " + orjson.dumps(data) + b"\n\n"

        # a server-to-client request with the same id as the call, and a notification: neither is the result
        await resp.write(event({"jsonrpc": "2.0", "id": msg["id"], "method": "roots/list"}, "e1"))
        await resp.write(b": keep-alive\n\n")
        await resp.write(event({"jsonrpc": "2.0", "method": "notifications/message", "params": {}}, "e2"))
        if args.get("mode") == "break":
            self.pending_id = msg["id"]
            self.resume.set()
            raise ConnectionResetError("stream breaks before the result")  # aiohttp drops the connection
        await resp.write(event({"jsonrpc": "2.0", "id": msg["id"], "result": RESULT}, "e3"))
        await resp.write_eof()
        return resp

    async def get(self, request: web.Request) -> web.StreamResponse:
        assert request.headers["Mcp-Session-Id"] == SESSION
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await self.resume.wait()
        result = {"jsonrpc": "2.0", "id": self.pending_id, "result": RESULT}
        await resp.write(b"id: e3\nevent: message\ndata: " + orjson.dumps(result) + b"\n\n")
        await resp.write_eof()
        return resp


@pytest.fixture
async def tricky() -> AsyncIterator[tuple[TrickyServer, str]]:
    server = TrickyServer()
    ts = TestServer(server.app, host="127.0.0.1")
    await ts.start_server()
    try:
        yield server, str(ts.make_url("/mcp"))
    finally:
        await ts.close()


def call(msg_id: Any, mode: str) -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "id": msg_id,
        "method": "tools/call",
        "params": {"name": "work", "arguments": {"mode": mode}},
    }


HEADERS = {"Accept": "application/json, text/event-stream", "Mcp-Session-Id": SESSION}


async def test_requests_and_notifications_are_not_results(
    start_tripwire: StartTripwire, tricky: tuple[TrickyServer, str]
) -> None:
    server, upstream = tricky
    tw = await start_tripwire(mcp={"t": {"url": upstream}})
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{tw.url}/mcp/t", json=call("x-1", "ok"), headers=HEADERS) as r,
    ):
        body = await r.read()
    await tw.flush()
    # relayed byte for byte, keep-alive comment and event ids included
    assert b": keep-alive\n\n" in body and b"id: e3\n" in body and body.count(b"event: message") == 3
    assert server.hosts[0] == upstream.split("/")[2]  # Host is the upstream's
    (tool,) = [e for e in tw.events() if e["event_type"] == "TOOL_CALL"]
    assert tool["payload"]["result"] == RESULT
    assert tool["meta"]["jsonrpc_id"] == "x-1" and tool["meta"]["mcp_session_id"] == SESSION


async def test_result_on_the_resumed_get_stream(
    start_tripwire: StartTripwire, tricky: tuple[TrickyServer, str]
) -> None:
    _, upstream = tricky
    tw = await start_tripwire(mcp={"t": {"url": upstream}})
    async with served_as_in_production(tw) as base, aiohttp.ClientSession() as http:
        post = asyncio.create_task(http.post(f"{base}/mcp/t", json=call(7, "break"), headers=HEADERS))
        async with http.get(f"{base}/mcp/t", headers={**HEADERS, "Last-Event-ID": "e2"}) as g:
            resumed = await g.read()
        async with await post as r:
            assert r.status == 200
            broken = await r.read()  # the POST's stream broke: Tripwire relays what came, ends it cleanly
    assert b"roots/list" in broken and b'"result"' not in broken
    assert b'"result"' in resumed
    for _ in range(100):  # the POST's pipeline records once the GET stream delivered the result
        await tw.flush()
        calls = [e for e in tw.events() if e["event_type"] == "TOOL_CALL"] if tw.run_ids() else []
        if calls:
            break
        await asyncio.sleep(0.02)
    (tool,) = calls
    assert tool["payload"]["status"] == "ok" and tool["payload"]["result"] == RESULT
    assert tool["meta"]["jsonrpc_id"] == 7


async def test_tool_calls_in_a_batch_are_recorded(start_tripwire: StartTripwire) -> None:
    """2025-03-26 batches: forwarded as they are (unguarded), each tools/call still one TOOL_CALL."""

    async def batch_server(request: web.Request) -> web.Response:
        msgs = await request.json()
        answers = [
            {
                "jsonrpc": "2.0",
                "id": m["id"],
                "result": {"content": [{"type": "text", "text": m["params"]["name"]}]},
            }
            for m in msgs
            if "id" in m
        ]
        return web.json_response(answers)

    app = web.Application()
    app.router.add_post("/mcp", batch_server)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    tw = await start_tripwire(mcp={"b": {"url": str(server.make_url("/mcp"))}})
    batch = [call(1, "a"), {**call(2, "b"), "params": {"name": "other"}}, {"jsonrpc": "2.0", "method": "x/y"}]
    async with aiohttp.ClientSession() as http, http.post(f"{tw.url}/mcp/b", json=batch) as r:
        answers = await r.json()
    await server.close()
    await tw.flush()
    assert [a["id"] for a in answers] == [1, 2]
    calls = [e for e in tw.events() if e["event_type"] == "TOOL_CALL"]
    assert [(e["name"], e["payload"]["result"]["content"][0]["text"]) for e in calls] == [
        ("work", "work"),
        ("other", "other"),
    ]
