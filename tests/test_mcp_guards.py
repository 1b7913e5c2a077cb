"""The real guards on MCP traffic, end to end with the mcp 2.x client: a repetition is blocked with a
tool result the SDK hands back normally, an open circuit refuses with a JSON-RPC error, both in
Streamable HTTP and legacy HTTP+SSE."""

from __future__ import annotations

import pytest

pytest.importorskip("mcp.server.mcpserver")  # mcp 2.x

from tests.conftest import StartTripwire  # noqa: E402
from tests.mcp_servers import connect, serve  # noqa: E402


@pytest.mark.parametrize("transport", ["streamable-http", "sse"])
async def test_repetition_blocked_as_a_tool_result(start_tripwire: StartTripwire, transport: str) -> None:
    guards = {"loop_detection": {"threshold": 3, "action": "block"}}
    with serve(transport) as upstream:
        tw = await start_tripwire(mcp={"demo": {"url": upstream}}, guards=guards)
        async with connect(transport, f"{tw.url}/agents/bot/sessions/s1/mcp/demo") as client:
            results = [await client.call_tool("echo", {"text": "again"}) for _ in range(3)]
            other = await client.call_tool("add", {"a": 1, "b": 2})
        await tw.flush()

    assert [r.is_error for r in results] == [False, False, True]
    blocked = results[2]
    assert blocked.content[0].text.startswith("[tripwire] blocked")
    assert blocked.model_dump(by_alias=True)["_meta"]["tripwire"]["loop_blocked"] is True
    assert other.structured_content == {"result": 3}  # doing something else goes through
    kinds = [(e["event_type"], e["name"]) for e in tw.events() if e["event_type"] != "RUN_START"]
    assert kinds[:2] == [("TOOL_CALL", "echo"), ("TOOL_CALL", "echo")]
    rest = [k for k, _ in kinds[2:]]
    # the blocked call is not a TOOL_CALL: LOOP_WARNING(s) for the pattern(s) that fired, one ERROR
    assert rest[0] == "LOOP_WARNING" and rest.count("ERROR") == 1 and rest.count("TOOL_CALL") == 1
    assert kinds[-1] == ("TOOL_CALL", "add")


async def test_open_circuit_is_a_jsonrpc_error(start_tripwire: StartTripwire) -> None:
    """A server failing with JSON-RPC internal errors trips its circuit; the next call is refused
    with a JSON-RPC error carrying retry_after, never an HTTP error."""
    import aiohttp
    from aiohttp import web
    from aiohttp.test_utils import TestServer

    async def failing(request: web.Request) -> web.Response:
        msg = await request.json()
        return web.json_response(
            {"jsonrpc": "2.0", "id": msg["id"], "error": {"code": -32603, "message": "db down"}}
        )

    app = web.Application()
    app.router.add_post("/mcp", failing)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    guards = {"circuit_breaker": {"open_after_failures": 2, "cooldown_seconds": 30}}
    tw = await start_tripwire(mcp={"db": {"url": str(server.make_url("/mcp"))}}, guards=guards)
    call = {"jsonrpc": "2.0", "method": "tools/call", "params": {"name": "query", "arguments": {"q": 1}}}
    answers = []
    async with aiohttp.ClientSession() as http:
        for i in range(3):
            async with http.post(f"{tw.url}/mcp/db", json={**call, "id": i}) as r:
                answers.append((r.status, await r.json()))
    await server.close()
    assert [s for s, _ in answers] == [200, 200, 200]
    assert [a["error"]["code"] for _, a in answers] == [-32603, -32603, -32050]
    refusal = answers[2][1]
    assert refusal["id"] == 2
    assert refusal["error"]["data"]["guardrail"] == "circuit_breaker"
    assert refusal["error"]["data"]["retry_after"] >= 1
