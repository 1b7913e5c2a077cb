"""A held MCP `tools/call` with the mcp 1.x SDK (SPEC §5.5a; issue 23 acceptance 2): approved, the
server's result; denied, the BLOCK result with the note. Runs in `.venv-mcp1` (`pytest -m mcp1`)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest

pytest.importorskip("mcp.server.fastmcp")  # mcp 1.x only

from mcp import ClientSession  # noqa: E402
from mcp.client.sse import sse_client  # noqa: E402
from mcp.client.streamable_http import streamablehttp_client  # noqa: E402

from tests.conftest import StartTripwire  # noqa: E402
from tests.mcp_servers import serve  # noqa: E402
from tests.test_approvals import approvals, decide, until  # noqa: E402

pytestmark = pytest.mark.mcp1
GUARDS = {"loop_detection": {"threshold": 3, "action": "ask"}}


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
@pytest.mark.parametrize("decision", ["approve", "deny"])
async def test_a_held_tool_call(
    start_tripwire: StartTripwire, transport: str, json_response: bool, stateless: bool, decision: str
) -> None:
    with serve(transport, json_response=json_response, stateless=stateless) as upstream:
        tw = await start_tripwire(mcp={"demo": {"url": upstream}}, guards=GUARDS, admin_token="hunter2")
        tw.engine.approvals.watch.tick_s = tw.engine.approvals.watch.keepalive_s = 0.05
        async with session(f"{tw.url}/agents/bot/sessions/v1/mcp/demo", transport) as s:
            for _ in range(2):
                assert not (await s.call_tool("add", {"a": 1, "b": 2})).isError
            held = asyncio.create_task(s.call_tool("add", {"a": 1, "b": 2}))
            (approval,) = await until(lambda: approvals(tw), "the tools/call held")
            await asyncio.sleep(0.2)  # keep-alive comments go out meanwhile
            assert not held.done()
            status, _ = await decide(tw, approval["id"], {"decision": decision, "note": "no more adding"})
            assert status == 200
            result: Any = await held
            after = await s.call_tool("echo", {"text": "still here"})
    assert not after.isError
    if decision == "approve":
        assert result.isError is False and result.content[0].text == "3"
    else:
        assert result.isError is True and "no more adding" in result.content[0].text
