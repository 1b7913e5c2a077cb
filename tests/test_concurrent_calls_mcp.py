"""Concurrent calls per agent on MCP `tools/call` (SPEC §9): the real mcp 2.x client sees the BLOCK
result saying when to try again while the agent's calls are in flight (a tool that waits), the
session goes on, and the next call goes through once a call ended."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

pytest.importorskip("mcp.server.mcpserver")  # mcp 2.x

from mcp import Client  # noqa: E402
from mcp.server.mcpserver import MCPServer  # noqa: E402

from proxy.constants import GUARD_CONCURRENT_CALLS  # noqa: E402
from tests.conftest import StartTripwire  # noqa: E402
from tests.mcp_servers import ServerThread  # noqa: E402
from tests.pipeline_errors import no_pipeline_errors  # noqa: E402, F401 (autouse fixture)
from tests.test_rate_limits import errors_of  # noqa: E402

SESSION_URL = "/agents/bot/sessions/s1/mcp/jobs"
WAIT_S = 30.0


@contextmanager
def jobs(release: threading.Event, started: threading.Semaphore) -> Iterator[str]:
    server = MCPServer("tripwire-jobs")

    @server.tool()
    async def run_job(name: str) -> str:
        """Run a job until the test lets it finish."""
        started.release()
        while not release.is_set():  # noqa: ASYNC110 (a thread sets it)
            await asyncio.sleep(0.01)
        return f"{name} done"

    @server.tool()
    def status() -> str:
        """A quick one."""
        return "idle"

    thread = ServerThread(server.streamable_http_app())
    base = thread.start()
    try:
        yield base + "/mcp"
    finally:
        release.set()
        thread.stop()


def guard_of(result: Any) -> str | None:
    if not result.is_error:
        return None
    meta = result.model_dump(by_alias=True)["_meta"]["tripwire"]
    assert meta["retry_after"] == 1
    (text,) = [c.text for c in result.content]
    assert text.startswith("[tripwire] rate limited:") and text.endswith("Try again in 1s.")
    return str(meta["guard"])


async def test_an_mcp_call_over_the_limit_gets_a_block_result_and_the_next_goes_through(
    start_tripwire: StartTripwire,
) -> None:
    release, started = threading.Event(), threading.Semaphore(0)
    with jobs(release, started) as upstream:
        tw = await start_tripwire(mcp={"jobs": {"url": upstream}}, guards={"max_concurrent_calls": 1})
        async with Client(tw.url + SESSION_URL, cache=None) as client:
            running = asyncio.ensure_future(client.call_tool("run_job", {"name": "a"}))
            assert await asyncio.to_thread(started.acquire, True, WAIT_S)  # the job runs: one in flight
            assert guard_of(await client.call_tool("status", {})) == GUARD_CONCURRENT_CALLS
            release.set()
            assert not (await running).is_error
            # its slot came back before its result reached the client: the next call goes through
            result = await client.call_tool("status", {})
            assert guard_of(result) is None and [c.text for c in result.content] == ["idle"]
        await tw.flush()
        assert [e["payload"]["guardrail"] for e in errors_of(tw)] == [GUARD_CONCURRENT_CALLS]
