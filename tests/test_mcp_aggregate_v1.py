"""Issue 24, acceptance 3 with the mcp 1.x SDK's client (handshake era only) through `/mcp` over a
2026-07-28-only server (mcp 2.x, in the repository's `.venv` next to this `.venv-mcp1`).

Runs in the `.venv-mcp1` environment (`pytest -m mcp1`); skipped where mcp 2.x is installed."""

from __future__ import annotations

import pytest

pytest.importorskip("mcp.server.fastmcp")  # mcp 1.x only

from mcp import ClientSession  # noqa: E402
from mcp.client.streamable_http import streamablehttp_client  # noqa: E402

from tests.conftest import StartTripwire  # noqa: E402
from tests.mcp_revision_servers import sibling_python, spawned  # noqa: E402

pytestmark = pytest.mark.mcp1


async def test_an_mcp1_client_over_a_2026_only_server(start_tripwire: StartTripwire) -> None:
    python = sibling_python(".venv")
    if python is None:
        pytest.skip("no .venv (mcp 2.x) next to this environment (scripts/test.sh builds it)")
    progress: list[float] = []

    async def on_progress(p: float, total: float | None, message: str | None) -> None:
        progress.append(p)

    with spawned(python, "stateless") as url:
        tw = await start_tripwire(mcp={"modern": {"url": url}})
        async with (
            streamablehttp_client(f"{tw.url}/mcp") as (read, write, _),
            ClientSession(read, write) as s,
        ):
            await s.initialize()
            listed = await s.list_tools()
            assert {"modern__add", "modern__slow_count"} <= {t.name for t in listed.tools}
            added = await s.call_tool("modern__add", {"a": 4, "b": 5})
            await s.call_tool("modern__slow_count", {"steps": 2}, progress_callback=on_progress)
    assert added.structuredContent == {"result": 9}
    assert progress == [1, 2]
    await tw.flush()
    calls = [e for e in tw.events() if e["event_type"] == "TOOL_CALL"]
    assert [c["payload"]["tool_name"] for c in calls] == ["modern__add", "modern__slow_count"]
