"""The synthetic-answer path: a stage in the MCP pipeline answers a tools/call itself (SPEC §5.5),
in the client's own transport, with the mcp 2.x client over Streamable HTTP and legacy HTTP+SSE.

The policy here is a test-only stage; the guards plug their own decisions into the same calls
(`render_block`, `render_refusal`, `MCPToolCall.append_text`).
"""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("mcp.server.mcpserver")  # mcp 2.x

from mcp import MCPError  # noqa: E402

from proxy.mcp.jsonrpc import TRIPWIRE_GUARD_ERROR  # noqa: E402
from tests.conftest import StartTripwire  # noqa: E402
from tests.mcp_servers import connect, install_policy, serve  # noqa: E402


@pytest.mark.parametrize(
    "transport,json_response",
    [("auto", False), ("legacy", False), ("legacy", True), ("sse", False)],
    ids=["2026-07-28", "handshake", "handshake-json-answers", "legacy-sse"],
)
async def test_block_refuse_warn_in_the_clients_transport(
    start_tripwire: StartTripwire, transport: str, json_response: bool
) -> None:
    server_transport = "sse" if transport == "sse" else "streamable-http"
    with serve(server_transport, json_response=json_response) as upstream:
        tw = await start_tripwire(mcp={"demo": {"url": upstream}})
        stage = install_policy(tw)
        async with connect(transport, f"{tw.url}/agents/bot/sessions/s1/mcp/demo") as client:
            blocked = await client.call_tool("echo", {"text": "hi"})
            with pytest.raises(MCPError) as refused:
                await client.call_tool("explode", {"reason": "x"})
            warned = await client.call_tool("add", {"a": 1, "b": 2})
            after = await client.call_tool("slow_count", {"steps": 1})
        await tw.flush()

    # BLOCK: a normal tool result the model can read, not an exception
    assert blocked.is_error is True
    assert blocked.content[0].text == "[tripwire] blocked: same call 5 times"
    assert blocked.result_type == "complete"
    dumped: dict[str, Any] = blocked.model_dump(by_alias=True)
    assert dumped["_meta"]["tripwire"] == {
        "loop_blocked": True,
        "guard": "loop_detection",
        "threshold": 5,
        "actual": 5,
    }
    # any other refusal: a JSON-RPC error with Tripwire's code and the guard's data
    assert refused.value.error.code == TRIPWIRE_GUARD_ERROR
    assert refused.value.error.data["guardrail"] == "circuit_breaker"
    assert refused.value.error.data["retry_after"] == 13
    # WARN: forwarded, the result carries the warning block after the server's content
    assert warned.structured_content == {"result": 3}
    assert [c.text for c in warned.content] == ["3", "[tripwire] warning: add called again"]
    assert after.content[0].text == "counted to 1"
    # the parsed call the guards get
    first = stage.seen[0]
    assert (first.tool_name, first.arguments, first.server) == ("echo", {"text": "hi"}, "demo")
    assert first.transport == ("legacy" if transport == "sse" else "streamable")
    assert first.jsonrpc_id is not None
    # refused calls are not TOOL_CALLs (the upstream never saw them); forwarded ones are
    calls = [e for e in tw.events() if e["event_type"] == "TOOL_CALL"]
    assert [e["name"] for e in calls] == ["add", "slow_count"]
    assert calls[0]["payload"]["result"]["content"][0]["text"] == "3"


async def test_warned_json_answer_larger_than_max_body_bytes_reaches_the_client_whole(
    start_tripwire: StartTripwire,
) -> None:
    """A WARN holds a JSON answer to append its block; past max_body_bytes it must be relayed whole."""
    import asyncio

    import aiohttp
    import orjson
    from aiohttp import web
    from aiohttp.test_utils import TestServer

    big = "x" * 6000

    async def tool_server(request: web.Request) -> web.StreamResponse:
        msg = await request.json()
        body = orjson.dumps(
            {"jsonrpc": "2.0", "id": msg["id"], "result": {"content": [{"type": "text", "text": big}]}}
        )
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        await resp.prepare(request)
        for i in range(0, len(body), 1000):  # several chunks, as a real server's large answer comes
            await resp.write(body[i : i + 1000])
            await asyncio.sleep(0.01)
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_post("/mcp", tool_server)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        tw = await start_tripwire(mcp={"big": {"url": str(server.make_url("/mcp"))}}, max_body_bytes=2500)
        install_policy(tw)  # warns on `add`
        call = {"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "add", "arguments": {}}}
        async with aiohttp.ClientSession() as http, http.post(f"{tw.url}/mcp/big", json=call) as r:
            body = await r.read()
    finally:
        await server.close()
    answer = orjson.loads(body)  # the whole answer, not the first max_body_bytes of it
    assert answer["id"] == 3
    assert answer["result"]["content"][0]["text"] == big


async def test_sampling_during_a_legacy_sse_call(start_tripwire: StartTripwire) -> None:
    """Legacy HTTP+SSE: the tool's sampling request comes on the SSE stream and the client answers it
    with a POST, over the keep-alive connection of its tools/call POST, whose handler still waits for
    the result: Tripwire lets that connection go, so the answer reaches the server (no deadlock)."""
    import asyncio

    from mcp import Client
    from mcp.client.sse import sse_client
    from mcp.types import CreateMessageResult, TextContent

    from tests.mcp_servers import served_as_in_production

    async def sampler(context: Any, params: Any) -> CreateMessageResult:
        return CreateMessageResult(
            role="assistant", content=TextContent(type="text", text="fine"), model="fake"
        )

    with serve("sse", sampling=True) as upstream:
        tw = await start_tripwire(mcp={"demo": {"url": upstream}})
        async with (
            served_as_in_production(tw) as base,
            Client(
                sse_client(f"{base}/mcp/demo"), mode="legacy", cache=None, sampling_callback=sampler
            ) as client,
        ):
            result = await asyncio.wait_for(client.call_tool("summarize", {"topic": "t"}), 10)
            again = await client.call_tool("add", {"a": 1, "b": 2})  # the session goes on
        await tw.flush()

    assert result.content[0].text == "summary of t: fine"
    assert again.structured_content == {"result": 3}
    calls = [e for e in tw.events() if e["event_type"] == "TOOL_CALL"]
    assert [(e["name"], e["payload"]["status"]) for e in calls] == [("summarize", "ok"), ("add", "ok")]
