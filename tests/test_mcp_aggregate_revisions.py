"""Issue 24, acceptance 3 "mixed revisions both ways": a handshake-era client (the mcp 2.x SDK's
`Client` in `mode="legacy"`) through `/mcp` over a 2026-07-28-only server, and a 2026-07-28 client
(`mode="auto"`, which speaks 2026-07-28 to Tripwire) over a handshake-only server
(tests/mcp_revision_servers.py: the SDK's own server behind an era gate)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

pytest.importorskip("mcp.server.mcpserver")  # mcp 2.x

from mcp import Client  # noqa: E402

from tests.conftest import StartTripwire  # noqa: E402
from tests.mcp_revision_servers import RevisionServer, sibling_python, spawned  # noqa: E402

MIXED = [("legacy", "stateless"), ("auto", "handshake")]  # (client mode, the only era the server accepts)


def era_of_client(mode: str) -> str:
    return "stateless" if mode == "auto" else "handshake"


@pytest.mark.parametrize(("mode", "era"), MIXED)
async def test_a_client_of_one_era_lists_calls_and_gets_progress_from_a_server_of_the_other(
    start_tripwire: StartTripwire, mode: str, era: str
) -> None:
    with RevisionServer(era) as server:
        tw = await start_tripwire(mcp={"srv": {"url": server.url}})
        progress: list[float] = []

        async def on_progress(p: float, total: float | None, message: str | None) -> None:
            progress.append(p)

        async with Client(f"{tw.url}/agents/bot/sessions/s1/mcp", mode=mode, cache=None) as client:  # type: ignore[arg-type]
            listed = await client.list_tools()
            assert {"srv__add", "srv__echo", "srv__slow_count", "srv__grow"} <= {t.name for t in listed.tools}
            added = await client.call_tool("srv__add", {"a": 20, "b": 22})
            counted = await client.call_tool("srv__slow_count", {"steps": 3}, progress_callback=on_progress)
            failed = await client.call_tool("srv__explode", {"reason": "on purpose"})
        assert added.structured_content == {"result": 42}
        assert "counted to 3" in str(counted.content)
        assert progress == [1, 2, 3]
        assert failed.is_error and "explode" in str(failed.content)  # a tool error, in either era's words
        # the server was spoken to in its own era only: the gate saw no request of the other
        seen = [version for _, version in server.gate.seen]  # type: ignore[union-attr]
        if era == "stateless":
            assert set(seen) == {"2026-07-28"}
        else:
            assert None in seen  # the initialize
            assert set(seen) - {None} == {"2026-07-28", "2025-11-25"}  # one refused probe, then 2025-11-25
            assert seen.count("2026-07-28") == 1
        await tw.flush()
        calls = [e for e in tw.events() if e["event_type"] == "TOOL_CALL"]
        assert [c["payload"]["tool_name"] for c in calls] == ["srv__add", "srv__slow_count", "srv__explode"]
        assert [c["payload"]["status"] for c in calls] == ["ok", "ok", "error"]


async def test_a_2026_client_over_a_real_mcp1_server(start_tripwire: StartTripwire) -> None:
    """The handshake-only server here is no gate: mcp 1.x's FastMCP, in the repository's
    `.venv-mcp1`, which answers a 2026-07-28 `MCP-Protocol-Version` with its own 400."""
    python = sibling_python(".venv-mcp1")
    if python is None:
        pytest.skip("no .venv-mcp1 next to this environment (scripts/test.sh builds it)")
    with spawned(python, "v1") as url:
        tw = await start_tripwire(mcp={"old": {"url": url}})
        progress: list[float] = []

        async def on_progress(p: float, total: float | None, message: str | None) -> None:
            progress.append(p)

        async with Client(f"{tw.url}/mcp", mode="auto", cache=None) as client:  # type: ignore[arg-type]
            listed = await client.list_tools()
            assert {"old__add", "old__slow_count"} <= {t.name for t in listed.tools}
            added = await client.call_tool("old__add", {"a": 1, "b": 2})
            await client.call_tool("old__slow_count", {"steps": 2}, progress_callback=on_progress)
    assert added.structured_content == {"result": 3}
    assert progress == [1, 2]


async def test_a_handshake_client_hears_a_stateless_servers_list_change(
    start_tripwire: StartTripwire,
) -> None:
    """The 2026-07-28 server announces it only on a `subscriptions/listen` stream; the handshake
    client hears it on its GET stream, and the new tool is in its next `tools/list`."""
    with RevisionServer("stateless") as server:
        tw = await start_tripwire(mcp={"srv": {"url": server.url}})
        heard: list[str] = []

        async def on_message(message: Any) -> None:
            method = getattr(getattr(message, "root", message), "method", None) or getattr(
                message, "method", None
            )
            if isinstance(method, str):
                heard.append(method)

        async with Client(f"{tw.url}/mcp", mode="legacy", cache=None, message_handler=on_message) as client:  # type: ignore[arg-type]
            await client.list_tools()
            await asyncio.sleep(0.5)  # the upstream listen stream opens with the upstream session
            await client.call_tool("srv__grow", {"name": "sprout"})
            for _ in range(600):
                if any("list_changed" in m for m in heard):
                    break
                await asyncio.sleep(0.05)
            assert any("tools/list_changed" in m for m in heard), heard
            listed = await client.list_tools()
            assert "srv__sprout" in {t.name for t in listed.tools}


async def test_a_2026_client_hears_a_handshake_servers_list_change(start_tripwire: StartTripwire) -> None:
    """The handshake server announces it unasked on its GET stream; the 2026-07-28 client hears it on
    its `subscriptions/listen` stream, and the new tool is in its next `tools/list`."""
    with RevisionServer("handshake") as server:
        tw = await start_tripwire(mcp={"srv": {"url": server.url}})
        async with Client(f"{tw.url}/mcp", mode="auto", cache=None) as client:  # type: ignore[arg-type]
            await client.list_tools()
            async with client.listen(tools_list_changed=True) as sub:
                await asyncio.sleep(0.5)  # the upstream GET stream opens with the upstream session
                await client.call_tool("srv__grow", {"name": "shoot"})
                event = await asyncio.wait_for(sub.__anext__(), 60)
                assert "tools" in str(event).lower()
            listed = await client.list_tools()
            assert "srv__shoot" in {t.name for t in listed.tools}


@pytest.mark.parametrize(
    ("mode", "era"),
    [
        ("auto", "stateless"),
        ("auto", "handshake"),
        ("legacy", "stateless"),
        ("legacy", "handshake"),
    ],
)
async def test_a_servers_question_reaches_the_client_whatever_the_eras(
    start_tripwire: StartTripwire, mode: str, era: str
) -> None:
    """`summarize` samples the client's LLM: a 2026-07-28 server returns input_required, a handshake
    server sends sampling/createMessage on the POST's stream (held, as input_required, by the upstream
    session); either way the client's sampling callback answers and the tool's result comes back."""
    from mcp.types import CreateMessageResult, TextContent

    asked: list[str] = []

    async def sample(context: Any, params: Any) -> CreateMessageResult:
        asked.append(params.messages[0].content.text)
        return CreateMessageResult(
            role="assistant", content=TextContent(type="text", text="purr"), model="test"
        )

    with RevisionServer(era) as server:
        tw = await start_tripwire(mcp={"srv": {"url": server.url}})
        async with Client(f"{tw.url}/mcp", mode=mode, cache=None, sampling_callback=sample) as client:  # type: ignore[arg-type]
            result = await client.call_tool("srv__summarize", {"topic": "cats"})
    assert asked == ["summarize cats"]
    assert "summary of cats: purr" in str(result.content)
