"""Tool permission `ask` patterns hold the call for a person (SPEC §9, §5.5a): the `perms` helper's
`Decision(Action.ASK, guard=tool_ask)` goes through the same hold as any ask. Skipped until the tool
permissions (proxy.guards.session.tool_permission, issue 22 item 2) are on the branch."""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("mcp.server.mcpserver")  # mcp 2.x
session_module = pytest.importorskip("proxy.guards.session")
if not hasattr(session_module, "tool_permission"):
    pytest.skip("tool permissions not merged yet (issue 22 item 2)", allow_module_level=True)

from tests.conftest import StartTripwire  # noqa: E402
from tests.mcp_servers import connect, serve  # noqa: E402
from tests.test_approvals import approvals, decide, until  # noqa: E402


@pytest.mark.parametrize("decision", ["approve", "deny"])
async def test_an_ask_pattern_holds_the_tool_call(start_tripwire: StartTripwire, decision: str) -> None:
    guards = {"tools": {"ask": ["demo__add"]}}
    with serve("streamable-http") as upstream:
        tw = await start_tripwire(mcp={"demo": {"url": upstream}}, guards=guards, admin_token="hunter2")
        async with connect("auto", f"{tw.url}/agents/bot/sessions/tools/mcp/demo") as client:
            echoed = await client.call_tool("echo", {"text": "free"})  # not asked
            held = asyncio.create_task(client.call_tool("add", {"a": 1, "b": 2}))
            (approval,) = await until(lambda: approvals(tw), "the ask pattern's call held")
            assert approval["guard"] == "tool_ask" and approval["call"]["tool"] == "add"
            status, _ = await decide(tw, approval["id"], {"decision": decision, "note": "no sums today"})
            assert status == 200
            result = await held
    assert echoed.is_error is False
    if decision == "approve":
        assert result.structured_content == {"result": 3}
    else:
        assert result.is_error is True and "no sums today" in result.content[0].text
