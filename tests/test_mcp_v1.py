"""MCP through Tripwire with the mcp 1.x SDK (FastMCP, streamablehttp_client, legacy sse_client).

Runs in the `.venv-mcp1` environment (`pytest -m mcp1`); skipped where mcp 2.x is installed.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest

pytest.importorskip("mcp.server.fastmcp")  # mcp 1.x only

from mcp import ClientSession  # noqa: E402
from mcp.client.sse import sse_client  # noqa: E402
from mcp.client.streamable_http import streamablehttp_client  # noqa: E402
from mcp.shared.exceptions import McpError  # noqa: E402

from tests.conftest import StartTripwire  # noqa: E402
from tests.mcp_servers import install_policy, serve  # noqa: E402

pytestmark = pytest.mark.mcp1


@asynccontextmanager
async def session(url: str, transport: str) -> AsyncIterator[ClientSession]:
    if transport == "sse":
        async with sse_client(url) as (read, write), ClientSession(read, write) as s:
            await s.initialize()
            yield s
    else:
        async with streamablehttp_client(url) as (read, write, _), ClientSession(read, write) as s:
            await s.initialize()
            yield s


async def session_calls(url: str, transport: str) -> dict[str, Any]:
    progress: list[float] = []

    async def on_progress(p: float, total: float | None, message: str | None) -> None:
        progress.append(p)

    async with session(url, transport) as s:
        tools = await s.list_tools()
        out = {
            "tools": sorted((t.name, t.description) for t in tools.tools),
            "add": (await s.call_tool("add", {"a": 2, "b": 40})).model_dump(),
            "explode": (await s.call_tool("explode", {"reason": "boom"})).model_dump(),
            "count": (
                await s.call_tool("slow_count", {"steps": 3}, progress_callback=on_progress)
            ).model_dump(),
        }
    out["progress"] = progress
    return out


@pytest.mark.parametrize(
    "transport,json_response,stateless",
    [
        ("streamable-http", False, False),
        ("streamable-http", True, False),
        ("streamable-http", False, True),
        ("sse", False, False),
    ],
    ids=["sse-answers", "json-answers", "stateless", "legacy-sse"],
)
async def test_same_answers_as_direct_and_recorded(
    start_tripwire: StartTripwire, transport: str, json_response: bool, stateless: bool
) -> None:
    from tests.schema import assert_run_valid

    with serve(transport, json_response=json_response, stateless=stateless) as upstream:
        tw = await start_tripwire(mcp={"demo": {"url": upstream}})
        direct = await session_calls(upstream, transport)
        proxied = await session_calls(f"{tw.url}/agents/bot/sessions/s1/mcp/demo", transport)
        await tw.flush()

    assert proxied == direct
    assert proxied["add"]["structuredContent"] == {"result": 42}
    assert proxied["explode"]["isError"] is True
    (run_id,) = tw.run_ids()
    _, events = assert_run_valid(tw.data_dir, run_id)
    calls = [e for e in events if e["event_type"] == "TOOL_CALL"]
    assert [e["name"] for e in calls] == ["add", "explode", "slow_count"]
    assert [e["payload"]["status"] for e in calls] == ["ok", "error", "ok"]
    assert calls[0]["payload"]["args"] == {"a": 2, "b": 40}
    assert calls[0]["payload"]["server"] == "demo" and calls[0]["payload"]["source"] == "mcp"
    expected = "legacy" if transport == "sse" else "streamable"
    assert all(e["meta"]["transport"] == expected for e in calls)


@pytest.mark.parametrize("transport", ["streamable-http", "sse"])
async def test_synthetic_answers_with_the_v1_client(start_tripwire: StartTripwire, transport: str) -> None:
    with serve(transport) as upstream:
        tw = await start_tripwire(mcp={"demo": {"url": upstream}})
        install_policy(tw)
        async with session(f"{tw.url}/mcp/demo", transport) as s:
            blocked = await s.call_tool("echo", {"text": "hi"})
            with pytest.raises(McpError) as refused:
                await s.call_tool("explode", {"reason": "x"})
            warned = await s.call_tool("add", {"a": 1, "b": 2})
    assert blocked.isError is True
    assert blocked.content[0].text == "[tripwire] blocked: same call 5 times"
    assert blocked.model_dump(by_alias=True)["_meta"]["tripwire"]["loop_blocked"] is True
    assert refused.value.error.data["guardrail"] == "circuit_breaker"
    assert [c.text for c in warned.content] == ["3", "[tripwire] warning: add called again"]


async def test_stdio_server_through_the_v1_client(start_tripwire: StartTripwire) -> None:
    import sys
    from pathlib import Path

    server = Path(__file__).with_name("mcp_servers.py")
    tw = await start_tripwire(mcp_stdio={"local": {"command": f"{sys.executable} {server} stdio"}})
    await tw.engine.start_children()
    try:
        async with session(f"{tw.url}/agents/bot/sessions/s1/mcp/local", "streamable-http") as s:
            tools = await s.list_tools()
            added = await s.call_tool("add", {"a": 1, "b": 1})
        await tw.flush()
    finally:
        await tw.engine.stop_children()
    assert {t.name for t in tools.tools} == {"add", "echo", "slow_count", "explode"}
    assert added.structuredContent == {"result": 2}
    (tool,) = [e for e in tw.events() if e["event_type"] == "TOOL_CALL"]
    assert tool["payload"]["server"] == "local" and tool["payload"]["status"] == "ok"
