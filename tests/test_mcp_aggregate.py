"""The aggregate endpoint `/mcp` (SPEC §3, issue 24) with real clients and real servers: the mcp 2.x
SDK's client in both revisions (and the legacy SSE transport), the SDK's own servers over HTTP, a
stdio child and a 2026-07-28-only server; each aggregated call one TOOL_CALL, as a direct one."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest

mcp = pytest.importorskip("mcp")
pytest.importorskip("mcp.server.mcpserver")  # 2.x only

from mcp import Client  # noqa: E402

from tests.conftest import StartTripwire  # noqa: E402
from tests.mcp_revision_servers import RevisionServer  # noqa: E402
from tests.mcp_servers import serve  # noqa: E402

SERVER = Path(__file__).parent / "mcp_servers.py"
DEMO_TOOLS = {"add", "echo", "slow_count", "explode"}


def tool_events(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in events if e["event_type"] == "TOOL_CALL"]


@pytest.mark.parametrize("mode", ["auto", "legacy"])  # auto speaks 2026-07-28, legacy the handshake
async def test_one_client_sees_the_union_and_calls_each_server(
    start_tripwire: StartTripwire, mode: str
) -> None:
    with serve() as alpha, serve(json_response=True) as beta, RevisionServer("stateless") as modern:
        tw = await start_tripwire(
            mcp={"alpha": {"url": alpha}, "beta": {"url": beta}, "modern": {"url": modern.url}},
            mcp_stdio={"local": {"command": f"{sys.executable} {SERVER} stdio"}},
        )
        await tw.engine.start_children()
        progress: list[float] = []

        async def on_progress(p: float, total: float | None, message: str | None) -> None:
            progress.append(p)

        async with Client(f"{tw.url}/agents/bot/sessions/s1/mcp", mode=mode, cache=None) as client:  # type: ignore[arg-type]
            listed = await client.list_tools()
            names = {t.name for t in listed.tools}
            for server in ("alpha", "beta", "modern", "local"):
                assert {f"{server}__{t}" for t in DEMO_TOOLS} <= names, names
            add = next(t for t in listed.tools if t.name == "beta__add")
            assert add.description == "Add two integers."
            assert add.input_schema["required"] == ["a", "b"]
            sums = {}
            for i, server in enumerate(("alpha", "beta", "modern", "local")):
                result = await client.call_tool(f"{server}__add", {"a": i, "b": 40})
                sums[server] = result.structured_content
            counted = await client.call_tool("alpha__slow_count", {"steps": 3}, progress_callback=on_progress)
        assert sums == {s: {"result": 40 + i} for i, s in enumerate(("alpha", "beta", "modern", "local"))}
        assert "counted to 3" in str(counted.content)
        assert progress == [1, 2, 3]
        await tw.flush()
        calls = tool_events(tw.events())
        assert [(c["name"], c["payload"]["server"], c["meta"]["server"]) for c in calls] == [
            ("alpha__add", "alpha", "alpha"),
            ("beta__add", "beta", "beta"),
            ("modern__add", "modern", "modern"),
            ("local__add", "local", "local"),
            ("alpha__slow_count", "alpha", "alpha"),
        ]
        assert [c["payload"]["tool_name"] for c in calls][0] == "alpha__add"
        assert all(c["payload"]["status"] == "ok" and c["meta"]["aggregate"] for c in calls)


async def test_a_server_killed_drops_out_and_returns_with_list_changed(start_tripwire: StartTripwire) -> None:
    """Acceptance 2: killed mid-session, its tools vanish, the others keep working, the session
    survives; restarted, its tools return and the client is told the list changed."""
    changed: list[str] = []

    async def on_message(message: Any) -> None:
        method = getattr(getattr(message, "root", message), "method", None)
        if isinstance(method, str):
            changed.append(method)

    with serve() as steady, RevisionServer("handshake") as flaky:
        tw = await start_tripwire(
            mcp={"steady": {"url": steady}, "flaky": {"url": flaky.url}}, list_timeout_s=3
        )
        async with Client(f"{tw.url}/mcp", mode="legacy", cache=None, message_handler=on_message) as client:  # type: ignore[arg-type]
            names = {t.name for t in (await client.list_tools()).tools}
            assert {"steady__add", "flaky__add", "flaky__grow"} <= names
            assert (await client.call_tool("flaky__add", {"a": 1, "b": 1})).structured_content == {
                "result": 2
            }

            flaky.stop()
            names = {t.name for t in (await client.list_tools()).tools}
            assert "steady__add" in names and not any(n.startswith("flaky__") for n in names)
            assert (await client.call_tool("steady__add", {"a": 2, "b": 2})).structured_content == {
                "result": 4
            }
            async with aiohttp.ClientSession() as http, http.get(f"{tw.admin_url}/healthz") as r:
                health = await r.json()
            assert "flaky" in health["mcp_aggregate"]["down"], health

            changed.clear()
            flaky.start()
            for _ in range(600):  # the aggregate probes the server until it answers
                if "notifications/tools/list_changed" in changed:
                    break
                await asyncio.sleep(0.05)
            assert "notifications/tools/list_changed" in changed
            names = {t.name for t in (await client.list_tools()).tools}
            assert {"steady__add", "flaky__add"} <= names
            assert (await client.call_tool("flaky__add", {"a": 3, "b": 3})).structured_content == {
                "result": 6
            }
        async with aiohttp.ClientSession() as http, http.get(f"{tw.admin_url}/healthz") as r:
            assert (await r.json())["mcp_aggregate"]["down"] == {}
        await tw.flush()
        assert [c["name"] for c in tool_events(tw.events())] == ["flaky__add", "steady__add", "flaky__add"]
