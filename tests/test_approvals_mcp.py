"""A held MCP `tools/call` (SPEC §5.5a; issue 23 acceptance 2) with the mcp 2.x client in every
transport it speaks: 2026-07-28 (stateless requests), the handshake era (SSE or JSON answers),
legacy HTTP+SSE. Approved: the server's real result; denied: the BLOCK result carrying the note."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest

pytest.importorskip("mcp.server.mcpserver")  # mcp 2.x

from tests.conftest import StartTripwire  # noqa: E402
from tests.mcp_servers import connect, serve  # noqa: E402
from tests.test_approvals import AUTH, approvals, decide, until  # noqa: E402

TRANSPORTS = pytest.mark.parametrize(
    "transport,json_response",
    [("auto", False), ("legacy", False), ("legacy", True), ("sse", False)],
    ids=["2026-07-28", "handshake", "handshake-json-answers", "legacy-sse"],
)
GUARDS = {"loop_detection": {"threshold": 3, "action": "ask"}}
assert AUTH


async def held_then(tw: Any, client: Any, decision: dict[str, Any]) -> Any:
    """Call echo until the third identical call is held; decide it; return its result."""
    for _ in range(2):
        assert not (await client.call_tool("echo", {"text": "again"})).is_error
    held = asyncio.create_task(client.call_tool("echo", {"text": "again"}))
    found = await until(lambda: approvals(tw), "the tools/call held")
    (approval,) = found
    assert approval["call"]["tool"] == "echo" and approval["call"]["arguments"] == {"text": "again"}
    assert approval["call"]["server"] == "demo"
    assert not held.done()
    status, _ = await decide(tw, approval["id"], decision)
    assert status == 200
    return await held


@TRANSPORTS
async def test_approved_tool_call_gets_the_servers_result(
    start_tripwire: StartTripwire, transport: str, json_response: bool
) -> None:
    server_transport = "sse" if transport == "sse" else "streamable-http"
    with serve(server_transport, json_response=json_response) as upstream:
        tw = await start_tripwire(mcp={"demo": {"url": upstream}}, guards=GUARDS, admin_token="hunter2")
        tw.engine.approvals.watch.tick_s = tw.engine.approvals.watch.keepalive_s = (
            0.05  # comments read through
        )
        async with connect(transport, f"{tw.url}/agents/bot/sessions/s1/mcp/demo") as client:
            result = await held_then(tw, client, {"decision": "approve"})
            after = await client.call_tool("add", {"a": 1, "b": 2})
        await tw.flush()
    assert result.is_error is False
    assert result.content[0].text == "echo: again"
    assert after.structured_content == {"result": 3}
    tools = [e["name"] for e in tw.events() if e["event_type"] == "TOOL_CALL"]
    assert tools == ["echo", "echo", "echo", "add"]


@TRANSPORTS
async def test_denied_tool_call_gets_the_block_result_with_the_note(
    start_tripwire: StartTripwire, transport: str, json_response: bool
) -> None:
    server_transport = "sse" if transport == "sse" else "streamable-http"
    with serve(server_transport, json_response=json_response) as upstream:
        tw = await start_tripwire(mcp={"demo": {"url": upstream}}, guards=GUARDS, admin_token="hunter2")
        tw.engine.approvals.watch.tick_s = tw.engine.approvals.watch.keepalive_s = (
            0.05  # comments read through
        )
        async with connect(transport, f"{tw.url}/agents/bot/sessions/s1/mcp/demo") as client:
            result = await held_then(tw, client, {"decision": "deny", "note": "read the cache instead"})
            after = await client.call_tool("add", {"a": 1, "b": 2})
        await tw.flush()
    assert result.is_error is True
    assert result.content[0].text.startswith("[tripwire] blocked")
    assert "read the cache instead" in result.content[0].text
    assert after.structured_content == {"result": 3}
    tools = [e["name"] for e in tw.events() if e["event_type"] == "TOOL_CALL"]
    assert tools == ["echo", "echo", "add"]


@contextlib.asynccontextmanager
async def json_server() -> AsyncIterator[str]:
    """A minimal MCP server on 127.0.0.1 answering every tools/call with JSON (no session needed)."""
    from aiohttp import web
    from aiohttp.test_utils import TestServer

    async def mcp(request: web.Request) -> web.Response:
        msg = await request.json()
        text = "echo: " + msg["params"]["arguments"]["text"]
        return web.json_response(
            {"jsonrpc": "2.0", "id": msg["id"], "result": {"content": [{"type": "text", "text": text}]}}
        )

    app = web.Application()
    app.router.add_post("/mcp", mcp)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        yield str(server.make_url("/mcp"))
    finally:
        await server.close()


CALL = {"jsonrpc": "2.0", "method": "tools/call", "params": {"name": "echo", "arguments": {"text": "x"}}}
STATELESS = {"Accept": "application/json, text/event-stream", "MCP-Protocol-Version": "2026-07-28"}


async def approve_the_one(tw: Any) -> None:
    (approval,) = await until(lambda: approvals(tw), "held")
    status, _ = await decide(tw, approval["id"], {"decision": "approve"})
    assert status == 200


@pytest.mark.parametrize("accept", ["application/json, text/event-stream", "application/json"])
async def test_raw_held_call_keepalives_then_one_message(start_tripwire: StartTripwire, accept: str) -> None:
    """A client that reads SSE answers gets the answer's head and `: keep-alive` comments while held,
    then one `message` event; a JSON-only client gets nothing until the decision, then the JSON."""
    import aiohttp
    import orjson

    guards = {"loop_detection": {"threshold": 2, "action": "ask"}}
    async with json_server() as upstream:
        tw = await start_tripwire(mcp={"demo": {"url": upstream}}, guards=guards, admin_token="hunter2")
        tw.engine.approvals.watch.tick_s = tw.engine.approvals.watch.keepalive_s = 0.05
        url = f"{tw.url}/agents/bot/sessions/raw/mcp/demo"
        headers = {**STATELESS, "Accept": accept}
        async with aiohttp.ClientSession() as http:
            async with http.post(url, json={**CALL, "id": 1}, headers=headers) as r:
                assert r.status == 200
                first = await r.read()
            if accept.startswith("application/json, "):
                async with http.post(url, json={**CALL, "id": 2}, headers=headers) as r:
                    assert r.headers["Content-Type"].startswith("text/event-stream")
                    seen = b""
                    while seen.count(b": keep-alive") < 3:
                        seen += await r.content.readany()
                    assert b"event: message" not in seen
                    await approve_the_one(tw)
                    seen += await r.read()
            else:

                async def post() -> bytes:
                    async with http.post(url, json={**CALL, "id": 2}, headers=headers) as r:
                        return await r.read()

                held = asyncio.create_task(post())
                await approve_the_one(tw)
                seen = await held
    assert orjson.loads(first)["result"]["content"][0]["text"] == "echo: x"
    if accept.startswith("application/json, "):
        (event,) = [part for part in seen.split(b"\n\n") if part.startswith(b"event: message")]
        message = orjson.loads(event.split(b"data: ", 1)[1])
    else:
        message = orjson.loads(seen)
    assert message["id"] == 2 and message["result"]["content"][0]["text"] == "echo: x"


async def test_a_client_hanging_up_on_a_held_tool_call_withdraws_it(start_tripwire: StartTripwire) -> None:
    import aiohttp

    guards = {"loop_detection": {"threshold": 2, "action": "ask"}}
    async with json_server() as upstream:
        tw = await start_tripwire(mcp={"demo": {"url": upstream}}, guards=guards, admin_token="hunter2")
        tw.engine.approvals.watch.tick_s = 0.05
        url = f"{tw.url}/agents/bot/sessions/gone/mcp/demo"
        async with aiohttp.ClientSession() as http:
            async with http.post(url, json={**CALL, "id": 1}, headers=STATELESS) as r:
                await r.read()
            request = asyncio.create_task(http.post(url, json={**CALL, "id": 2}, headers=STATELESS))
            (approval,) = await until(lambda: approvals(tw), "held")
            request.cancel()
            await asyncio.gather(request, return_exceptions=True)

        async def withdrawn() -> bool:
            return [a["status"] for a in await approvals(tw, decided=True)] == ["withdrawn"]

        await until(withdrawn, "withdrawn")
        status, _ = await decide(tw, approval["id"], {"decision": "approve"})
        assert status == 409
        await tw.flush()
    assert [e["name"] for e in tw.events() if e["event_type"] == "TOOL_CALL"] == ["echo"]


async def test_the_listed_arguments_are_redacted_as_the_trace_keeps_them(
    start_tripwire: StartTripwire,
) -> None:
    import aiohttp

    guards = {"loop_detection": {"threshold": 2, "action": "ask"}}
    secret = {**CALL, "params": {"name": "echo", "arguments": {"text": "my password=hunter22 ok"}}}
    async with json_server() as upstream:
        tw = await start_tripwire(mcp={"demo": {"url": upstream}}, guards=guards, admin_token="hunter2")
        url = f"{tw.url}/agents/bot/sessions/secret/mcp/demo"
        async with aiohttp.ClientSession() as http:
            async with http.post(url, json={**secret, "id": 1}, headers=STATELESS) as r:
                await r.read()
            request = asyncio.create_task(http.post(url, json={**secret, "id": 2}, headers=STATELESS))
            (approval,) = await until(lambda: approvals(tw), "held")
            assert "hunter22" not in str(approval)
            assert approval["call"]["arguments"]["text"] == "my password=__REDACTED__ ok"
            await decide(tw, approval["id"], {"decision": "deny"})
            (await request).close()
