"""Tool permission `ask` patterns hold the call for a person (SPEC §9, §5.5a): the `perms` helper's
`Decision(Action.ASK, guard=tool_ask)` goes through the same hold as any ask, on a server's own
route and through the aggregate endpoint `/mcp` alike (SPEC §3)."""

from __future__ import annotations

import asyncio
import json

import pytest

pytest.importorskip("mcp.server.mcpserver")  # mcp 2.x

from tests.conftest import StartTripwire  # noqa: E402
from tests.mcp_servers import connect, serve  # noqa: E402
from tests.test_approvals import approvals, decide, until  # noqa: E402


@pytest.mark.parametrize("route", ["direct", "aggregate"])
@pytest.mark.parametrize("decision", ["approve", "deny"])
async def test_an_ask_pattern_holds_the_tool_call(
    start_tripwire: StartTripwire, decision: str, route: str
) -> None:
    guards = {"tools": {"ask": ["demo__add"]}}
    path, prefix = ("/mcp/demo", "") if route == "direct" else ("/mcp", "demo__")
    with serve("streamable-http") as upstream:
        tw = await start_tripwire(mcp={"demo": {"url": upstream}}, guards=guards, admin_token="hunter2")
        async with connect("auto", f"{tw.url}/agents/bot/sessions/tools{path}") as client:
            echoed = await client.call_tool(prefix + "echo", {"text": "free"})  # not asked
            held = asyncio.create_task(client.call_tool(prefix + "add", {"a": 1, "b": 2}))
            (approval,) = await until(lambda: approvals(tw), "the ask pattern's call held")
            assert approval["guard"] == "tool_ask" and approval["call"]["tool"] == prefix + "add"
            status, _ = await decide(tw, approval["id"], {"decision": decision, "note": "no sums today"})
            assert status == 200
            result = await held
    assert echoed.is_error is False
    if decision == "approve":
        assert result.structured_content == {"result": 3}
    else:
        assert result.is_error is True and "no sums today" in result.content[0].text


async def test_the_aggregate_keeps_a_held_call_alive_with_sse_comments(
    start_tripwire: StartTripwire, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A call held for a person through `/mcp` (any transport: the server's pipeline holds it in
    process) starts its answer as SSE and sends `: keep-alive` comments until the decision, as a
    server's own route does (docs/approvals.md), so a client's read timeout does not end it; the
    result then comes as the stream's one message."""
    import aiohttp

    from proxy.mcp.aggregate import server as aggregate_server

    monkeypatch.setattr(aggregate_server, "KEEPALIVE_S", 0.05)
    body = {
        "jsonrpc": "2.0",
        "id": 7,
        "method": "tools/call",
        "params": {"name": "demo__add", "arguments": {"a": 1, "b": 2}},
    }
    headers = {"MCP-Protocol-Version": "2026-07-28", "Accept": "application/json, text/event-stream"}
    with serve("streamable-http") as upstream:
        tw = await start_tripwire(
            mcp={"demo": {"url": upstream}}, guards={"tools": {"ask": ["demo__add"]}}, admin_token="hunter2"
        )
        async with aiohttp.ClientSession() as http:
            # the answer's head comes before the decision (bounded: without it this would wait forever)
            posting = http.post(f"{tw.url}/agents/bot/sessions/s1/mcp", json=body, headers=headers)
            resp = await asyncio.wait_for(posting, 30)
            assert resp.status == 200 and resp.content_type == "text/event-stream"
            assert await resp.content.readline() == b": keep-alive\n"  # before anyone decided
            (approval,) = await until(lambda: approvals(tw), "the aggregated call held")
            status, _ = await decide(tw, approval["id"], {"decision": "approve"})
            assert status == 200
            rest = (await resp.content.read()).decode()
            resp.release()
    data = [line.removeprefix("data: ") for line in rest.splitlines() if line.startswith("data: ")]
    (answer,) = [json.loads(d) for d in data]
    assert answer["id"] == 7 and answer["result"]["structuredContent"] == {"result": 3}
