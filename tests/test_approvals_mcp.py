"""A held MCP `tools/call` (SPEC §5.5a; issue 23 acceptance 2) with the mcp 2.x client in every
transport it speaks: 2026-07-28 (stateless requests), the handshake era (SSE or JSON answers),
legacy HTTP+SSE. Approved: the server's real result; denied: the BLOCK result carrying the note."""

from __future__ import annotations

import asyncio
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
