"""Tool permission `ask` patterns hold the call for a person (SPEC §9, §5.5a): the `perms` helper's
`Decision(Action.ASK, guard=tool_ask)` goes through the same hold as any ask, on a server's own
route and through the aggregate endpoint `/mcp` alike (SPEC §3)."""

from __future__ import annotations

import asyncio

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
