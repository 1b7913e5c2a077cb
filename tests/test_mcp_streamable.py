"""MCP through Tripwire with the mcp 2.x SDK (MCPServer, Client / streamable_http_client): answers are
the same as direct, every tools/call is one TOOL_CALL, other methods are not recorded."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

mcp = pytest.importorskip("mcp")
pytest.importorskip("mcp.server.mcpserver")  # 2.x only; the mcp<2 environment runs test_mcp_v1.py

from mcp import Client  # noqa: E402

from tests.conftest import StartTripwire  # noqa: E402
from tests.mcp_servers import install_policy, serve, served_as_in_production  # noqa: E402


async def session_calls(url: str, mode: str) -> dict[str, Any]:
    """What an agent sees: the tool list and a few calls (one raising, one reporting progress)."""
    progress: list[float] = []

    async def on_progress(p: float, total: float | None, message: str | None) -> None:
        progress.append(p)

    async with Client(url, mode=mode, cache=None) as client:  # type: ignore[arg-type]
        tools = await client.list_tools()
        out = {
            "tools": sorted((t.name, t.description) for t in tools.tools),
            "add": (await client.call_tool("add", {"a": 2, "b": 40})).model_dump(),
            "add_again": (await client.call_tool("add", {"a": 2, "b": 40})).model_dump(),
            "explode": (await client.call_tool("explode", {"reason": "boom"})).model_dump(),
            "count": (
                await client.call_tool("slow_count", {"steps": 3}, progress_callback=on_progress)
            ).model_dump(),
        }
    out["progress"] = progress
    return out


def tool_events(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in events if e["event_type"] == "TOOL_CALL"]


@pytest.mark.parametrize(
    "mode", ["auto", "legacy"]
)  # auto speaks 2026-07-28, legacy the initialize handshake
@pytest.mark.parametrize(
    "json_response,stateless",
    [(False, False), (True, False), (False, True)],
    ids=["sse", "json", "stateless"],
)
async def test_same_answers_as_direct_and_recorded(
    start_tripwire: StartTripwire, mode: str, json_response: bool, stateless: bool
) -> None:
    from tests.schema import assert_run_valid

    with serve(json_response=json_response, stateless=stateless) as upstream:
        tw = await start_tripwire(mcp={"demo": {"url": upstream}})
        direct = await session_calls(upstream, mode)
        proxied = await session_calls(f"{tw.url}/agents/bot/sessions/s1/mcp/demo", mode)
        await tw.flush()

    assert proxied == direct
    assert proxied["add"]["structured_content"] == {"result": 42}
    assert proxied["explode"]["is_error"] is True
    if not json_response:  # progress notifications relayed on the POST's SSE stream
        assert proxied["progress"] == [1, 2, 3]
    (run_id,) = tw.run_ids()
    _, events = assert_run_valid(tw.data_dir, run_id)
    calls = tool_events(events)
    # four tools/call, nothing else (initialize, tools/list, progress notifications are not tool calls)
    assert [e["name"] for e in calls] == ["add", "add", "explode", "slow_count"]
    add = calls[0]["payload"]
    assert add["args"] == {"a": 2, "b": 40}
    assert add["result"]["structuredContent"] == {"result": 42}
    assert add["status"] == "ok" and add["source"] == "mcp" and add["server"] == "demo"
    assert add["error"] is None
    assert calls[2]["payload"]["status"] == "error"
    assert "explode" in calls[2]["payload"]["error"]["message"]
    assert calls[3]["payload"]["result"]["content"][0]["text"] == "counted to 3"
    assert all(isinstance(e["duration_ms"], int) for e in calls)
    assert events[0]["payload"]["agent_name"] == "bot"
    assert tw.run_json(run_id)["counts"]["tool_calls"] == 4


async def test_unknown_server_lists_names(start_tripwire: StartTripwire) -> None:
    import aiohttp

    tw = await start_tripwire(mcp={"demo": {"url": "http://127.0.0.1:9"}})
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{tw.url}/mcp/nope", json={}) as resp:
            assert resp.status == 404
            assert (await resp.json())["error"]["configured"] == ["demo"]


async def test_agent_loop_llm_and_mcp_in_one_run(start_tripwire: StartTripwire, fake_upstream: Any) -> None:
    """The model asks for a tool, the agent runs it through /mcp/NAME, then sends the result back:
    one run with LLM_CALL, TOOL_CALL (source mcp, recorded once), LLM_CALL."""
    import httpx2
    import openai
    from mcp.client.streamable_http import streamable_http_client

    from tests.fakes import Reply
    from tests.schema import assert_run_valid

    fake, llm_url = fake_upstream
    fake.replies = [Reply(tool_calls=[("call_1", "add", {"a": 2, "b": 3})]), Reply(text="2 + 3 = 5")]
    headers = {"X-Tripwire-Session": "loop-1", "X-Tripwire-Agent": "calc"}
    with serve() as upstream:
        tw = await start_tripwire(upstream={"url": llm_url}, mcp={"demo": {"url": upstream}})
        llm = openai.AsyncOpenAI(base_url=f"{tw.url}/v1", api_key="sk-test", default_headers=headers)
        async with (
            httpx2.AsyncClient(headers=headers) as http,
            Client(streamable_http_client(f"{tw.url}/mcp/demo", http_client=http), cache=None) as tools,
        ):
            messages: list[Any] = [{"role": "user", "content": "what is 2 + 3?"}]
            tool_list = [
                {"type": "function", "function": {"name": t.name, "parameters": t.input_schema}}
                for t in (await tools.list_tools()).tools
            ]
            while True:
                resp = await llm.chat.completions.create(
                    model="gpt-4o-mini", messages=messages, tools=tool_list
                )
                msg = resp.choices[0].message
                if not msg.tool_calls:
                    break
                messages.append(msg.model_dump(exclude_none=True))
                for tc in msg.tool_calls:
                    result = await tools.call_tool(tc.function.name, json.loads(tc.function.arguments))
                    messages.append(
                        {"role": "tool", "tool_call_id": tc.id, "content": result.content[0].text}
                    )
        await tw.flush()

    assert msg.content == "2 + 3 = 5"
    (run_id,) = tw.run_ids()
    _, events = assert_run_valid(tw.data_dir, run_id)
    assert [e["event_type"] for e in events] == ["RUN_START", "LLM_CALL", "TOOL_CALL", "LLM_CALL"]
    tool = events[2]["payload"]
    assert (tool["tool_name"], tool["source"], tool["server"], tool["args"]) == (
        "add",
        "mcp",
        "demo",
        {"a": 2, "b": 3},
    )
    assert events[0]["payload"]["agent_name"] == "calc" and events[0]["payload"]["session_id"] == "loop-1"


async def test_bad_input_and_server_down(start_tripwire: StartTripwire) -> None:
    import aiohttp

    tw = await start_tripwire(mcp={"down": {"url": "http://127.0.0.1:9/mcp"}})
    call = {"jsonrpc": "2.0", "id": "c-1", "method": "tools/call", "params": {"name": "add", "arguments": {}}}
    async with aiohttp.ClientSession() as http:
        async with http.post(
            f"{tw.url}/mcp/down", data=b"not json{", headers={"Content-Type": "application/json"}
        ) as r:
            assert r.status == 400
            body = await r.json()
            assert body["error"]["code"] == -32700 and body["id"] is None
        # the server is down: a JSON-RPC error naming it, same id, HTTP 200 (never an HTTP error)
        for msg in (call, {"jsonrpc": "2.0", "id": 7, "method": "tools/list"}):
            async with http.post(f"{tw.url}/mcp/down", json=msg) as r:
                assert r.status == 200
                body = await r.json()
                assert body["id"] == msg["id"]
                assert body["error"]["code"] == -32051
                assert "'down'" in body["error"]["message"]
                assert body["error"]["data"] == {"server": "down"}
    await tw.flush()
    (tool,) = [e for e in tw.events() if e["event_type"] == "TOOL_CALL"]
    assert tool["payload"]["status"] == "error"
    assert tool["payload"]["error"]["error_type"] == "UpstreamError"


async def test_batch_is_passed_through(start_tripwire: StartTripwire) -> None:
    """A batch on a revision that forbids it: the server says so, Tripwire does not."""
    import aiohttp

    with serve(json_response=True) as upstream:
        tw = await start_tripwire(mcp={"demo": {"url": upstream}})
        batch = [{"jsonrpc": "2.0", "id": 1, "method": "ping"}, {"jsonrpc": "2.0", "id": 2, "method": "ping"}]
        hdrs = {"Accept": "application/json, text/event-stream"}
        async with aiohttp.ClientSession() as http:
            async with http.post(upstream, json=batch, headers=hdrs) as r:
                direct = (r.status, await r.read())
            async with http.post(f"{tw.url}/mcp/demo", json=batch, headers=hdrs) as r:
                proxied = (r.status, await r.read())
    assert proxied[0] == direct[0]
    assert proxied[1] == direct[1]


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_sampling_mid_call_and_input_required(start_tripwire: StartTripwire, mode: str) -> None:
    """A tool that samples the client's LLM: on handshake revisions the server's sampling request
    rides the POST's SSE stream and must reach the client at once (no deadlock); on 2026-07-28 the
    server answers `input_required` and the client resends. Either way: one TOOL_CALL."""
    from mcp.types import CreateMessageResult, TextContent

    asked: list[str] = []

    async def sampler(context: Any, params: Any) -> CreateMessageResult:
        asked.append(params.messages[0].content.text)
        return CreateMessageResult(
            role="assistant", content=TextContent(type="text", text="it is fine"), model="fake"
        )

    with serve(sampling=True) as upstream:
        tw = await start_tripwire(mcp={"demo": {"url": upstream}})
        stage = install_policy(tw)  # only watches `summarize`
        rounds: list[Any] = []

        class Spy(dict):  # type: ignore[type-arg]
            def setdefault(self, key: Any, value: Any = None) -> Any:
                rounds.append(key)
                return super().setdefault(key, value)

        tw.engine.mcp.awaiting_input = Spy()
        url = f"{tw.url}/agents/bot/sessions/s1/mcp/demo"
        async with Client(url, mode=mode, cache=None, sampling_callback=sampler) as client:  # type: ignore[arg-type]
            result = await asyncio.wait_for(client.call_tool("summarize", {"topic": "tripwire"}), 20)
        await tw.flush()

    assert asked == ["summarize tripwire"]
    assert result.content[0].text == "summary of tripwire: it is fine"
    calls = [e for e in tw.events() if e["event_type"] == "TOOL_CALL"]
    assert len(calls) == 1
    assert calls[0]["payload"]["result"]["content"][0]["text"] == "summary of tripwire: it is fine"
    assert calls[0]["payload"]["args"] == {"topic": "tripwire"}
    # 2026-07-28: the first answer was input_required, the resend completed the same call
    assert len(rounds) == (1 if mode == "auto" else 0)
    assert stage.continues == ([False, True] if mode == "auto" else [False])  # what the guards are told
    assert not tw.engine.mcp.awaiting_input
    if mode == "auto":
        assert calls[0]["meta"]["mcp_protocol_version"] == "2026-07-28"


async def test_input_required_round_trip_is_one_call_for_the_limits(start_tripwire: StartTripwire) -> None:
    """2026-07-28: the resend after `input_required` continues the same call; with max_tool_calls 1
    it must go through (one TOOL_CALL, one call counted), not be refused as a second call."""
    from mcp.types import CreateMessageResult, TextContent

    async def sampler(context: Any, params: Any) -> CreateMessageResult:
        return CreateMessageResult(
            role="assistant", content=TextContent(type="text", text="fine"), model="fake"
        )

    with serve(sampling=True) as upstream:
        tw = await start_tripwire(mcp={"demo": {"url": upstream}}, guards={"limits": {"max_tool_calls": 1}})
        url = f"{tw.url}/agents/bot/sessions/s1/mcp/demo"
        async with Client(url, mode="auto", cache=None, sampling_callback=sampler) as client:  # type: ignore[arg-type]
            result = await asyncio.wait_for(client.call_tool("summarize", {"topic": "t"}), 20)
        await tw.flush()

    assert result.content[0].text == "summary of t: fine"
    assert [e["event_type"] for e in tw.events() if e["event_type"] in ("TOOL_CALL", "ERROR")] == [
        "TOOL_CALL"
    ]


async def test_result_after_the_server_closed_the_posts_stream_early(start_tripwire: StartTripwire) -> None:
    """2025-11-25 polling: the server ends the POST's SSE stream cleanly before the result (a priming
    event with an id and `retry`); the client resumes on a GET with Last-Event-ID and the result comes
    there. That is a disconnection, not an answer without a result: one TOOL_CALL, status ok."""
    with serve(resumable=True) as upstream:
        tw = await start_tripwire(mcp={"demo": {"url": upstream}})
        async with (
            served_as_in_production(tw) as base,
            Client(f"{base}/agents/bot/sessions/s1/mcp/demo", mode="legacy", cache=None) as client,
        ):
            # the SDK resumes over the POST's keep-alive connection unless Tripwire releases it
            result = await asyncio.wait_for(client.call_tool("poll_later", {}), 10)
        for _ in range(100):  # the POST's pipeline records once the resumed GET delivered the result
            await tw.flush()
            if tw.run_ids() and any(e["event_type"] == "TOOL_CALL" for e in tw.events()):
                break
            await asyncio.sleep(0.02)

    assert result.content[0].text == "ready after polling"
    (call,) = tool_events(tw.events())
    assert call["payload"]["status"] == "ok"
    assert call["payload"]["result"]["content"][0]["text"] == "ready after polling"


async def test_a_get_stream_the_client_left_is_closed_upstream(start_tripwire: StartTripwire) -> None:
    """A client that drops its GET stream and opens a new one: the server allows one GET stream per
    session, so Tripwire must end the upstream stream when its client leaves (else 409 Conflict)."""
    import aiohttp

    from tests.mcp_servers import served_as_in_production

    headers = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
    init = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": "t", "version": "1"},
        },
    }
    with serve() as upstream:
        tw = await start_tripwire(mcp={"demo": {"url": upstream}})
        async with served_as_in_production(tw) as base:
            url = f"{base}/mcp/demo"
            async with aiohttp.ClientSession() as http:
                async with http.post(url, json=init, headers=headers) as r:
                    session = {**headers, "Mcp-Session-Id": r.headers["Mcp-Session-Id"]}
                    await r.read()
                initialized = {"jsonrpc": "2.0", "method": "notifications/initialized"}
                async with http.post(url, json=initialized, headers=session) as r:
                    assert r.status == 202
            async with aiohttp.ClientSession() as http:
                first = await http.get(url, headers=session)
                assert first.status == 200
                first.close()  # the client goes away without a word
            statuses = []
            for _ in range(10):
                await asyncio.sleep(0.2)
                async with aiohttp.ClientSession() as http, http.get(url, headers=session) as again:
                    statuses.append(again.status)
                    if again.status == 200:
                        break
    assert statuses[-1] == 200, statuses
