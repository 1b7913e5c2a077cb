"""Tool permissions end to end (issue 22, acceptance 2; SPEC §9) with the real SDKs against servers on
127.0.0.1: a denied MCP tool is absent from `tools/list` and its call is blocked unforwarded; a denied
function tool never reaches the model's `tools` (every dialect and the Responses WebSocket); an
allow-list denies the rest; a history showing a denied call is a BLOCK."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import aiohttp
import anthropic
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from proxy.replay import replay_dir
from tests.conftest import AGENT_KEY, Running, StartTripwire
from tests.schema import assert_run_valid

SESSION = {"X-Tripwire-Session": "perm-1", "X-Tripwire-Agent": "bot"}
FAKE_TEXT = "Hello from the fake upstream"  # tests/conftest.py's fake_upstream answers this


def function(name: str) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {"name": name, "parameters": {"type": "object", "properties": {}}},
    }


async def one_run(tw: Running) -> list[dict[str, Any]]:
    await tw.flush()
    (run_id,) = tw.run_ids()
    _, events = assert_run_valid(tw.data_dir, run_id)
    return events


def denied_count(tw: Running) -> float:
    text = tw.engine.metrics.render().decode()
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "tripwire_guard_decisions_total" and s.labels.get("guard") == "tool_denied":
                return s.value
    return 0.0


# --- LLM calls: the request's `tools` -----------------------------------------------------------


async def test_chat_denied_tools_never_reach_the_model(start_tripwire: StartTripwire, fake_upstream) -> None:
    fake, url = fake_upstream
    tw = await start_tripwire(upstream={"url": url}, guards={"tools": {"deny": ["shell", "fs__*"]}})
    client = openai.AsyncOpenAI(base_url=tw.url + "/v1", api_key=AGENT_KEY, default_headers=SESSION)
    answer = await client.chat.completions.create(
        model="gpt-4o-mini",
        messages=[{"role": "user", "content": "hi"}],
        tools=[function("search"), function("shell"), function("fs__write")],  # type: ignore[list-item]
        tool_choice={"type": "function", "function": {"name": "shell"}},
    )
    assert answer.choices[0].message.content == FAKE_TEXT
    (seen,) = fake.calls("/v1/chat/completions")
    assert [t["function"]["name"] for t in seen.body["tools"]] == ["search"]
    assert "tool_choice" not in seen.body  # it named a removed tool: the upstream would refuse it
    assert int(seen.headers["Content-Length"]) == len(json.dumps(seen.body, separators=(",", ":")).encode())
    # a call declaring only allowed tools is forwarded as the client sent it
    await client.chat.completions.create(
        model="gpt-4o-mini", messages=[{"role": "user", "content": "again"}], tools=[function("search")]
    )
    assert fake.calls("/v1/chat/completions")[1].body["tools"] == [function("search")]


async def test_chat_allow_list_denies_the_rest(start_tripwire: StartTripwire, fake_upstream) -> None:
    fake, url = fake_upstream
    tw = await start_tripwire(upstream={"url": url}, guards={"tools": {"allow": ["search", "read_*"]}})
    client = openai.AsyncOpenAI(base_url=tw.url + "/v1", api_key=AGENT_KEY, default_headers=SESSION)
    await client.chat.completions.create(
        model="gpt-4o-mini",
        messages=[{"role": "user", "content": "hi"}],
        tools=[function(n) for n in ("search", "read_file", "write_file", "shell")],  # type: ignore[misc]
        stream=False,
    )
    (seen,) = fake.calls("/v1/chat/completions")
    assert [t["function"]["name"] for t in seen.body["tools"]] == ["search", "read_file"]


async def test_responses_denied_tools_never_reach_the_model(
    start_tripwire: StartTripwire, fake_upstream
) -> None:
    fake, url = fake_upstream
    tw = await start_tripwire(upstream={"url": url}, guards={"tools": {"deny": ["shell", "web_search"]}})
    client = openai.AsyncOpenAI(base_url=tw.url + "/v1", api_key=AGENT_KEY, default_headers=SESSION)
    stream = await client.responses.create(
        model="gpt-4o",
        input="hi",
        tools=[
            {"type": "function", "name": "search", "parameters": {}, "strict": False},
            {"type": "function", "name": "shell", "parameters": {}, "strict": False},
            {"type": "web_search"},
        ],
        tool_choice="required",
        stream=True,
    )
    async for _event in stream:
        pass
    (seen,) = fake.calls("/v1/responses")
    assert [t.get("name", t["type"]) for t in seen.body["tools"]] == ["search"]
    assert seen.body["tool_choice"] == "required"  # a tool is left to call


async def test_responses_websocket_denied_tools_never_reach_the_model(
    start_tripwire: StartTripwire, fake_upstream
) -> None:
    fake, url = fake_upstream
    tw = await start_tripwire(upstream={"url": url}, guards={"tools": {"deny": ["shell"]}})
    headers = {
        "Authorization": f"Bearer {AGENT_KEY}",
        "openai-beta": "responses_websockets=2026-02-06",
        **SESSION,
    }
    create = {
        "type": "response.create",
        "model": "gpt-4o",
        "input": "hi",
        "tools": [{"type": "function", "name": "search"}, {"type": "function", "name": "shell"}],
        "tool_choice": {"type": "function", "name": "shell"},
    }
    async with (
        aiohttp.ClientSession() as http,
        http.ws_connect(tw.url + "/v1/responses", headers=headers) as ws,
    ):
        await ws.send_str(json.dumps(create))
        while True:
            event = json.loads((await asyncio.wait_for(ws.receive(), 30)).data)
            if event["type"] in ("response.completed", "error"):
                break
    assert event["type"] == "response.completed"
    (sent,) = fake.ws_messages
    assert sent["tools"] == [{"type": "function", "name": "search"}]
    assert "tool_choice" not in sent


async def test_anthropic_denied_tools_never_reach_the_model(
    start_tripwire: StartTripwire, fake_upstream
) -> None:
    fake, url = fake_upstream
    tw = await start_tripwire(upstream={"url": url}, guards={"tools": {"deny": ["shell"]}})
    client = anthropic.AsyncAnthropic(base_url=tw.url, api_key=AGENT_KEY, default_headers=SESSION)
    await client.messages.create(
        model="claude-tripwire-test",
        max_tokens=100,
        messages=[{"role": "user", "content": "hi"}],
        tools=[
            {"name": "search", "input_schema": {"type": "object"}},
            {"name": "shell", "input_schema": {"type": "object"}},
        ],
        tool_choice={"type": "tool", "name": "shell"},
    )
    (seen,) = fake.calls("/v1/messages")
    assert [t["name"] for t in seen.body["tools"]] == ["search"]
    assert "tool_choice" not in seen.body


async def test_shadow_mode_filters_nothing(start_tripwire: StartTripwire, fake_upstream) -> None:
    fake, url = fake_upstream
    tw = await start_tripwire(upstream={"url": url}, guards={"shadow": True, "tools": {"deny": ["shell"]}})
    client = openai.AsyncOpenAI(base_url=tw.url + "/v1", api_key=AGENT_KEY, default_headers=SESSION)
    await client.chat.completions.create(
        model="gpt-4o-mini", messages=[{"role": "user", "content": "hi"}], tools=[function("shell")]
    )
    assert fake.calls("/v1/chat/completions")[0].body["tools"] == [function("shell")]


async def test_a_history_showing_a_denied_call_is_blocked(
    start_tripwire: StartTripwire, fake_upstream
) -> None:
    """The agent ran a denied tool anyway (it was not offered): the request carrying its result gets
    the synthetic assistant answer, the upstream is not called, and replay decides the same."""
    fake, url = fake_upstream
    tw = await start_tripwire(upstream={"url": url}, guards={"tools": {"deny": ["shell"]}})
    client = openai.AsyncOpenAI(base_url=tw.url + "/v1", api_key=AGENT_KEY, default_headers=SESSION)
    messages: list[Any] = [
        {"role": "user", "content": "clean up"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "shell", "arguments": '{"cmd":"rm"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "done"},
    ]
    raw = await client.chat.completions.with_raw_response.create(model="gpt-4o-mini", messages=messages)
    answer = raw.parse()
    assert raw.headers["X-Tripwire-Guard"] == "tool_denied"
    assert answer.choices[0].finish_reason == "stop"
    text = answer.choices[0].message.content or ""
    assert text.startswith("[tripwire] denied:") and "shell" in text
    assert fake.calls("/v1/chat/completions") == []
    # the agent goes on from the blocked answer: that call is not judged again
    messages += [{"role": "assistant", "content": text}, {"role": "user", "content": "ok, go on"}]
    answer = await client.chat.completions.create(model="gpt-4o-mini", messages=messages)
    assert answer.choices[0].message.content == FAKE_TEXT
    events = await one_run(tw)
    (error,) = [e for e in events if e["event_type"] == "ERROR"]
    assert error["payload"]["guardrail"] == "tool_denied"
    assert denied_count(tw) == 1
    (replayed,) = replay_dir(tw.data_dir / "runs" / tw.run_ids()[0]).decisions
    assert (replayed.guard, replayed.action) == ("tool_denied", "block")


# --- MCP: tools/list and tools/call -------------------------------------------------------------


class Recording:
    """An ASGI app's request bodies, as the MCP server received them."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.bodies: list[bytes] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def recorded() -> Any:
            msg = await receive()
            if msg["type"] == "http.request" and msg.get("body"):
                self.bodies.append(msg["body"])
            return msg

        await self.app(scope, recorded, send)

    def tool_calls(self) -> list[str]:
        names = []
        for body in self.bodies:
            try:
                msg = json.loads(body)
            except ValueError:
                continue
            for m in msg if isinstance(msg, list) else [msg]:
                if isinstance(m, dict) and m.get("method") == "tools/call":
                    names.append(m["params"]["name"])
        return names


@contextmanager
def recorded_server(transport: str, json_response: bool) -> Iterator[tuple[str, Recording]]:
    pytest.importorskip("mcp.server.mcpserver")  # mcp 2.x
    from tests.mcp_servers import ServerThread, build_server

    server = build_server()
    app = server.sse_app() if transport == "sse" else server.streamable_http_app(json_response=json_response)
    recording = Recording(app)
    thread = ServerThread(recording)
    base = thread.start()
    try:
        yield base + ("/sse" if transport == "sse" else "/mcp"), recording
    finally:
        thread.stop()


@pytest.mark.parametrize(
    ("transport", "json_response"), [("streamable-http", False), ("streamable-http", True), ("sse", False)]
)
async def test_a_denied_mcp_tool_is_unlisted_and_its_call_blocked_unforwarded(
    start_tripwire: StartTripwire, transport: str, json_response: bool
) -> None:
    from tests.mcp_servers import connect

    guards = {"tools": {"deny": ["demo__echo", "other__add"]}}  # another server's add stays allowed
    with recorded_server(transport, json_response) as (upstream, server):
        tw = await start_tripwire(mcp={"demo": {"url": upstream}}, guards=guards)
        async with connect(transport, f"{tw.url}/agents/bot/sessions/s1/mcp/demo") as client:
            listed = await client.list_tools()
            denied = await client.call_tool("echo", {"text": "hi"})
            allowed = await client.call_tool("add", {"a": 1, "b": 2})
        await tw.flush()

    names = [t.name for t in listed.tools]
    assert "echo" not in names and {"add", "slow_count", "explode"} <= set(names)
    assert denied.is_error and denied.content[0].text.startswith("[tripwire] denied: tool 'demo__echo'")
    meta = denied.model_dump(by_alias=True)["_meta"]["tripwire"]
    assert meta["guard"] == "tool_denied"
    assert allowed.structured_content == {"result": 3}
    assert server.tool_calls() == ["add"]  # the denied call never reached the server
    events = [e for e in tw.events() if e["event_type"] != "RUN_START"]
    assert [(e["event_type"], e["name"]) for e in events] == [("ERROR", "tool_denied"), ("TOOL_CALL", "add")]
    assert events[0]["payload"]["guardrail"] == "tool_denied"
    assert denied_count(tw) == 1


async def test_an_mcp_allow_list_denies_the_rest(start_tripwire: StartTripwire) -> None:
    from tests.mcp_servers import connect

    with recorded_server("streamable-http", False) as (upstream, server):
        tw = await start_tripwire(mcp={"demo": {"url": upstream}}, guards={"tools": {"allow": ["demo__add"]}})
        async with connect("streamable-http", f"{tw.url}/agents/bot/sessions/s1/mcp/demo") as client:
            listed = await client.list_tools()
            refused = await client.call_tool("explode", {"reason": "x"})
        await tw.flush()
    assert [t.name for t in listed.tools] == ["add"]
    assert refused.is_error and refused.content[0].text.startswith("[tripwire] denied")
    assert server.tool_calls() == []
    # replay decides as live: the server reaches the guards through the call's guard_input
    (replayed,) = replay_dir(tw.data_dir / "runs" / tw.run_ids()[0]).decisions
    assert (replayed.guard, replayed.action, replayed.call_index) == ("tool_denied", "block", 1)


async def test_a_denied_mcp_call_is_blocked_with_shared_state(
    start_tripwire: StartTripwire, redis_url: str
) -> None:
    """With the state backend the check goes through the shared log's replica: the same decision."""
    from tests.mcp_servers import connect

    with recorded_server("streamable-http", False) as (upstream, server):
        tw = await start_tripwire(
            mcp={"demo": {"url": upstream}},
            guards={"tools": {"deny": ["demo__echo"]}},
            state={"url": redis_url},
        )
        async with connect("streamable-http", f"{tw.url}/agents/bot/sessions/s1/mcp/demo") as client:
            denied = await client.call_tool("echo", {"text": "hi"})
            allowed = await client.call_tool("add", {"a": 2, "b": 2})
        await tw.flush()
    assert denied.is_error and denied.content[0].text.startswith("[tripwire] denied")
    assert allowed.structured_content == {"result": 4}
    assert server.tool_calls() == ["add"]


async def test_shadow_mode_forwards_a_denied_mcp_call_and_records_it(start_tripwire: StartTripwire) -> None:
    from tests.mcp_servers import connect

    guards = {"shadow": True, "tools": {"deny": ["demo__echo"]}}
    with recorded_server("streamable-http", False) as (upstream, server):
        tw = await start_tripwire(mcp={"demo": {"url": upstream}}, guards=guards)
        async with connect("streamable-http", f"{tw.url}/agents/bot/sessions/s1/mcp/demo") as client:
            listed = await client.list_tools()
            result = await client.call_tool("echo", {"text": "hi"})
        await tw.flush()
    assert "echo" in [t.name for t in listed.tools]
    assert not result.is_error and server.tool_calls() == ["echo"]
    (error,) = [e for e in tw.events() if e["event_type"] == "ERROR"]
    assert error["payload"]["guardrail"] == "tool_denied" and error["payload"]["shadow"] is True


async def test_a_batched_tools_list_is_filtered_too(start_tripwire: StartTripwire) -> None:
    """A 2025-03-26 batch holding a `tools/list`: its answer loses the denied tools. (A batch holding a
    `tools/call` is refused while policy applies: tests/test_classify_mcp.py.)"""
    from aiohttp import web
    from aiohttp.test_utils import TestServer

    def answer(msg: dict[str, Any]) -> dict[str, Any]:
        if msg["method"] == "tools/list":
            return {
                "jsonrpc": "2.0",
                "id": msg["id"],
                "result": {"tools": [{"name": "read"}, {"name": "rm"}]},
            }
        return {"jsonrpc": "2.0", "id": msg["id"], "result": {"content": [{"type": "text", "text": "ok"}]}}

    async def handle(request: web.Request) -> web.Response:
        batch = await request.json()
        return web.json_response([answer(m) for m in batch])

    app = web.Application()
    app.router.add_post("/mcp", handle)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    tw = await start_tripwire(
        mcp={"fs": {"url": str(server.make_url("/mcp"))}}, guards={"tools": {"deny": ["fs__rm"]}}
    )
    batch = [
        {"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
        {"jsonrpc": "2.0", "id": 2, "method": "ping"},
    ]
    async with aiohttp.ClientSession() as http, http.post(f"{tw.url}/mcp/fs", json=batch) as r:
        got = await r.json()
    await server.close()
    assert got[0]["result"]["tools"] == [{"name": "read"}]
    assert got[1]["result"]["content"][0]["text"] == "ok"


async def test_an_agent_override_put_through_the_api_applies_to_its_next_call(
    start_tripwire: StartTripwire, fake_upstream
) -> None:
    fake, url = fake_upstream
    tw = await start_tripwire(upstream={"url": url})
    path = tw.admin_url + "/api/agents/bot/prevention-config"
    async with aiohttp.ClientSession() as http:
        async with http.put(path, json={"tools": {"deny": ["a[b"]}}) as r:
            assert r.status == 422 and "tools.deny" in await r.text()  # refused naming the field
        async with http.put(path, json={"tools": {"allow": ["search"]}}) as r:
            assert r.status == 200, await r.text()
    for agent in ("bot", "someone-else"):
        client = openai.AsyncOpenAI(
            base_url=f"{tw.url}/agents/{agent}/v1",
            api_key=AGENT_KEY,
            default_headers={"X-Tripwire-Session": agent},
        )
        await client.chat.completions.create(
            model="gpt-4o-mini",
            messages=[{"role": "user", "content": "hi"}],
            tools=[function("search"), function("shell")],  # type: ignore[list-item]
        )
    bot, other = fake.calls("/v1/chat/completions")
    assert [t["function"]["name"] for t in bot.body["tools"]] == ["search"]
    assert [t["function"]["name"] for t in other.body["tools"]] == ["search", "shell"]
