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
from tests.mcp_servers import connect, serve  # noqa: E402

SERVER = Path(__file__).parent / "mcp_servers.py"
DEMO_TOOLS = {"add", "echo", "slow_count", "explode"}
# where a test is not about a slow server: a stdio child's first answer (a Python start and the SDK's
# import) can take longer than the default 5 s on a loaded machine, and would rightly drop out
LIST_TIMEOUT_S = 60


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
            list_timeout_s=LIST_TIMEOUT_S,
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


async def test_legacy_sse_client_through_the_aggregate(start_tripwire: StartTripwire) -> None:
    """An old client on the HTTP+SSE transport: `/mcp` is its SSE stream, answers come on it."""
    with serve() as alpha, RevisionServer("stateless") as modern:
        tw = await start_tripwire(
            mcp={"alpha": {"url": alpha}, "modern": {"url": modern.url}}, list_timeout_s=LIST_TIMEOUT_S
        )
        async with connect("sse", f"{tw.url}/agents/old/mcp") as client:
            names = {t.name for t in (await client.list_tools()).tools}
            assert {"alpha__add", "modern__add"} <= names
            assert (await client.call_tool("modern__add", {"a": 5, "b": 5})).structured_content == {
                "result": 10
            }
            assert (await client.call_tool("alpha__echo", {"text": "hi"})).structured_content == {
                "result": "echo: hi"
            }
        await tw.flush()
        calls = tool_events(tw.events())
        assert [(c["name"], c["meta"]["agent"]) for c in calls] == [
            ("modern__add", "old"),
            ("alpha__echo", "old"),
        ]


async def test_openai_agents_sdk_mcp_client_through_the_aggregate(start_tripwire: StartTripwire) -> None:
    """The OpenAI Agents SDK's own MCP client, given the one URL `/mcp`."""
    agents_mcp = pytest.importorskip("agents.mcp")
    with serve() as alpha, serve() as beta:
        tw = await start_tripwire(
            mcp={"alpha": {"url": alpha}, "beta": {"url": beta}}, list_timeout_s=LIST_TIMEOUT_S
        )
        server = agents_mcp.MCPServerStreamableHttp(
            {"url": f"{tw.url}/agents/planner/mcp", "timeout": 30}, cache_tools_list=False
        )
        await server.connect()
        try:
            names = {t.name for t in await server.list_tools()}
            assert {"alpha__add", "beta__echo"} <= names
            result = await server.call_tool("beta__echo", {"text": "agents"})
            assert "echo: agents" in str(result.content)
        finally:
            await server.cleanup()
        await tw.flush()
        assert [c["name"] for c in tool_events(tw.events())] == ["beta__echo"]


async def test_an_aggregated_call_in_llm_history_counts_once_and_is_guarded(
    start_tripwire: StartTripwire, fake_upstream: Any
) -> None:
    """The model asks for `alpha__add` (the name `/mcp` lists), the agent runs it through `/mcp`
    and sends the result back: each call counts once, so the 3rd MCP call is the one the loop guard
    blocks (the guards of `alpha`'s own pipeline), and each forwarded call is one TOOL_CALL."""
    import json

    import httpx2
    import openai
    from mcp.client.streamable_http import streamable_http_client

    from proxy.replay import replay_dir
    from tests.fakes import Reply
    from tests.schema import assert_run_valid

    fake, llm_url = fake_upstream
    fake.replies = [Reply(tool_calls=[(f"call_{i}", "alpha__add", {"a": 1, "b": 2})]) for i in range(3)]
    fake.default = Reply(text="three")
    headers = {"X-Tripwire-Session": "both-1", "X-Tripwire-Agent": "mixed"}
    guards = {"loop_detection": {"action": "block", "threshold": 3, "max_repeated_tool_steps": 10}}
    with serve() as alpha, serve() as beta:
        tw = await start_tripwire(
            upstream={"url": llm_url},
            mcp={"alpha": {"url": alpha}, "beta": {"url": beta}},
            guards=guards,
            list_timeout_s=LIST_TIMEOUT_S,
        )
        llm = openai.AsyncOpenAI(base_url=f"{tw.url}/v1", api_key="sk-test", default_headers=headers)
        texts: list[str] = []
        async with (
            httpx2.AsyncClient(headers=headers) as http,
            Client(streamable_http_client(f"{tw.url}/mcp", http_client=http), cache=None) as tools,
        ):
            messages: list[Any] = [{"role": "user", "content": "1 + 2?"}]
            for _ in range(6):
                answer = await llm.chat.completions.create(model="gpt-4o-mini", messages=messages)
                msg = answer.choices[0].message
                if not msg.tool_calls:
                    break
                messages.append(msg.model_dump(exclude_none=True))
                for tc in msg.tool_calls:
                    result = await tools.call_tool(tc.function.name, json.loads(tc.function.arguments))
                    texts.append(result.content[0].text)
                    messages.append(
                        {"role": "tool", "tool_call_id": tc.id, "content": result.content[0].text}
                    )
        await tw.flush()
        (run_id,) = tw.run_ids()
        _, events = assert_run_valid(tw.data_dir, run_id)
    assert texts[:2] == ["3", "3"] and texts[2].startswith("[tripwire] blocked:")
    calls = tool_events(events)
    assert [(c["payload"]["source"], c["payload"]["tool_name"]) for c in calls] == [("mcp", "alpha__add")] * 2
    # replay decides call for call what the live guards decided, the block included
    replay = replay_dir(tw.data_dir / "runs" / run_id)
    assert replay.live and replay.replayed_checks == replay.live
    assert "block" in {d.action for d in replay.decisions}


async def test_a_2026_client_listens_for_a_server_coming_back(start_tripwire: StartTripwire) -> None:
    """Acceptance 2 for a 2026-07-28 client: no GET stream, a `subscriptions/listen` stream instead;
    a server that comes back after being down is announced there."""
    with serve() as steady, RevisionServer("stateless") as flaky:
        tw = await start_tripwire(
            mcp={"steady": {"url": steady}, "flaky": {"url": flaky.url}}, list_timeout_s=3
        )
        async with Client(f"{tw.url}/mcp", mode="auto", cache=None) as client:  # type: ignore[arg-type]
            assert "flaky__add" in {t.name for t in (await client.list_tools()).tools}
            async with client.listen(tools_list_changed=True) as sub:
                flaky.stop()
                names = {t.name for t in (await client.list_tools()).tools}
                assert "steady__add" in names and "flaky__add" not in names
                assert (await client.call_tool("steady__add", {"a": 1, "b": 2})).structured_content == {
                    "result": 3
                }
                flaky.start()
                event = await asyncio.wait_for(sub.__anext__(), 60)
                assert "tools" in str(event).lower()
            names = {t.name for t in (await client.list_tools()).tools}
            assert {"steady__add", "flaky__add"} <= names
            assert (await client.call_tool("flaky__add", {"a": 2, "b": 2})).structured_content == {
                "result": 4
            }


def library(kind: str) -> Any:
    """An SDK server with a prompt, a resource and a resource template, its URIs its own (`kind://`)."""
    from mcp.server.mcpserver import MCPServer

    server = MCPServer(f"{kind}-library")

    @server.prompt()
    def greet(name: str) -> str:
        """Greet someone."""
        return f"Hello {name}, from {kind}"

    @server.resource(f"{kind}://index")
    def index() -> str:
        return f"the {kind} index"

    @server.resource(f"{kind}://item/{{item_id}}")
    def item(item_id: str) -> str:
        return f"{kind} item {item_id}"

    return server


async def test_prompts_prefixed_and_resources_routed_by_who_listed_them(
    start_tripwire: StartTripwire,
) -> None:
    from tests.mcp_servers import ServerThread

    threads = [ServerThread(library(kind).streamable_http_app()) for kind in ("books", "films")]
    urls = [t.start() + "/mcp" for t in threads]
    try:
        tw = await start_tripwire(
            mcp={"books": {"url": urls[0]}, "films": {"url": urls[1]}}, list_timeout_s=LIST_TIMEOUT_S
        )
        for mode in ("auto", "legacy"):
            async with Client(f"{tw.url}/mcp", mode=mode, cache=None) as client:  # type: ignore[arg-type]
                prompts = {p.name for p in (await client.list_prompts()).prompts}
                assert prompts == {"books__greet", "films__greet"}
                got = await client.get_prompt("films__greet", {"name": "Ada"})
                assert "Hello Ada, from films" in str(got.messages[0].content)
                resources = {str(r.uri) for r in (await client.list_resources()).resources}
                assert resources == {"books://index", "films://index"}
                read = await client.read_resource("films://index")
                assert read.contents[0].text == "the films index"  # type: ignore[union-attr]
                templates = {
                    t.uri_template for t in (await client.list_resource_templates()).resource_templates
                }
                assert templates == {"books://item/{item_id}", "films://item/{item_id}"}
                read = await client.read_resource("books://item/42")  # routed by its template's server
                assert read.contents[0].text == "books item 42"  # type: ignore[union-attr]
    finally:
        for t in threads:
            t.stop()


@pytest.mark.parametrize("era", ["handshake", "stateless"])
async def test_a_servers_own_list_changed_reaches_the_client(start_tripwire: StartTripwire, era: str) -> None:
    """`grow` adds a tool and announces it (GET stream, or subscriptions/listen at 2026-07-28): the
    handshake client hears it on its GET stream, and the grown tool is listed prefixed."""
    heard: list[str] = []

    async def on_message(message: Any) -> None:
        method = getattr(getattr(message, "root", message), "method", None)
        if isinstance(method, str):
            heard.append(method)

    with RevisionServer(era) as server:
        tw = await start_tripwire(mcp={"grower": {"url": server.url}}, list_timeout_s=LIST_TIMEOUT_S)
        async with Client(f"{tw.url}/mcp", mode="legacy", cache=None, message_handler=on_message) as client:  # type: ignore[arg-type]
            assert "grower__sprout" not in {t.name for t in (await client.list_tools()).tools}
            await client.call_tool("grower__grow", {"name": "sprout"})
            for _ in range(600):
                if "notifications/tools/list_changed" in heard:
                    break
                await asyncio.sleep(0.05)
            assert "notifications/tools/list_changed" in heard
            assert "grower__sprout" in {t.name for t in (await client.list_tools()).tools}


async def test_a_client_cancelling_a_call_cancels_it_upstream(start_tripwire: StartTripwire) -> None:
    """A client's `notifications/cancelled` cancels the aggregated call and its upstream request (a
    handshake server gets the notification): the server stops napping, so the call ends (recorded as
    failed, as on `/mcp/NAME`) long before its 600 s nap would."""
    import anyio

    with RevisionServer("handshake") as server:
        tw = await start_tripwire(mcp={"srv": {"url": server.url}}, list_timeout_s=LIST_TIMEOUT_S)
        async with Client(f"{tw.url}/mcp", mode="legacy", cache=None) as client:  # type: ignore[arg-type]
            await client.list_tools()
            with anyio.move_on_after(1.0):
                await client.call_tool("srv__nap", {"seconds": 600})
            assert (await client.call_tool("srv__add", {"a": 1, "b": 1})).structured_content == {"result": 2}
            for _ in range(1200):
                await tw.engine.recorder.flush()
                if any(e["name"] == "srv__nap" for e in tool_events(tw.events())):
                    break
                await asyncio.sleep(0.05)
        naps = [e for e in tool_events(tw.events()) if e["name"] == "srv__nap"]
        assert len(naps) == 1 and naps[0]["payload"]["status"] == "error"
