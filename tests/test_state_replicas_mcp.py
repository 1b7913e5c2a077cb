"""Issue 13 acceptance, MCP side: a loop of MCP tool calls spread over three replicas that share one
Redis is caught at the same call as in one process (the real mcp 2.x client)."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest

pytest.importorskip("mcp.server.mcpserver")  # mcp 2.x

from mcp import Client  # noqa: E402

from tests.conftest import Running, StartTripwire  # noqa: E402
from tests.pipeline_errors import no_pipeline_errors  # noqa: E402, F401 (autouse fixture)
from tests.test_guards_e2e_mcp import shop  # noqa: E402

SESSION_URL = "/agents/bot/sessions/s1/mcp/shop"
LOOP = {"loop_detection": {"action": "block", "threshold": 3}}


async def blocked_at(replicas: list[Running]) -> list[bool]:
    """set_price with the same arguments five times, round-robin: which calls were blocked."""
    async with contextlib.AsyncExitStack() as stack:
        clients = [await stack.enter_async_context(Client(r.url + SESSION_URL, cache=None)) for r in replicas]
        out = []
        for i in range(5):
            result = await clients[i % len(clients)].call_tool("set_price", {"sku": "A1", "price": 1.0})
            out.append(bool(result.is_error))
            for r in replicas:  # the answer's settle reaches the shared log before the next call
                await r.flush()
                if r.engine.shared is not None:
                    await r.engine.shared.guards.flush()
        return out


async def test_an_mcp_loop_over_three_replicas_is_caught_at_the_same_call(
    start_tripwire: StartTripwire, redis_url: str
) -> None:
    with shop() as upstream:
        alone = await start_tripwire(mcp={"shop": {"url": upstream}}, guards=LOOP)
        one = await blocked_at([alone])
        replicas = [
            await start_tripwire(mcp={"shop": {"url": upstream}}, guards=LOOP, state={"url": redis_url})
            for _ in range(3)
        ]
        shared = await blocked_at(replicas)
    assert one == shared == [False, False, True, True, True]
    # one run id everywhere; the TOOL_CALLs of the two calls that went through, once each
    runs = {tuple(r.run_ids()) for r in replicas}
    assert len(runs) == 1
    tool_calls: list[Any] = [e for r in replicas for e in r.events() if e["event_type"] == "TOOL_CALL"]
    assert len(tool_calls) == 2
