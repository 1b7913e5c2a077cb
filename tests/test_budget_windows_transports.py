"""A budget window's refusal on every transport (SPEC §5.5, §9): a JSON-RPC error for an MCP call
(the real mcp client), the `error` event on the Responses WebSocket, each with `resets_at`; the
session, the MCP session and the socket go on, and the next window admits the agent again."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
from typing import Any

import aiohttp
import openai
import pytest
from aiohttp import WSMsgType

pytest.importorskip("mcp.server.mcpserver")  # mcp 2.x

from mcp import Client, MCPError  # noqa: E402

from proxy.mcp.jsonrpc import TRIPWIRE_GUARD_ERROR  # noqa: E402
from tests.conftest import AGENT_KEY, StartTripwire  # noqa: E402
from tests.fakes import FakeUpstream, Reply  # noqa: E402
from tests.pipeline_errors import no_pipeline_errors  # noqa: E402, F401 (autouse fixture)
from tests.test_guards_e2e_mcp import shop  # noqa: E402
from tests.test_websocket import BETA, next_json, until_done  # noqa: E402

NOON = dt.datetime(2026, 11, 27, 12, 0, tzinfo=dt.UTC).timestamp()
RESETS = "2026-11-28T00:00:00Z"
MODEL = "window-model"
GUARDS = {"budget_windows": [{"period": "day", "max_cost_usd": 1.0}]}
PRICES = {MODEL: [0.0, 100_000.0]}  # 10 output tokens: $1.00, the whole day


async def spend_the_day(url: str, agent: str) -> None:
    llm = openai.AsyncOpenAI(
        base_url=url + "/v1", api_key=AGENT_KEY, default_headers={"X-Tripwire-Agent": agent}
    )
    await llm.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=10
    )


async def test_an_mcp_call_over_the_agents_day_gets_a_json_rpc_error_and_the_session_goes_on(
    start_tripwire: StartTripwire, fake_upstream: tuple[FakeUpstream, str]
) -> None:
    fake, url = fake_upstream
    fake.default = Reply(text="ok", completion_tokens=10)
    with shop() as upstream:
        tw = await start_tripwire(
            upstream={"url": url}, mcp={"shop": {"url": upstream}}, pricing_table=PRICES, guards=GUARDS
        )
        tw.engine.windows.clock = lambda: NOON
        async with Client(tw.url + "/agents/bot/sessions/s1/mcp/shop", cache=None) as client:
            first = await client.call_tool("get_record", {"record_id": 1})
            await spend_the_day(tw.url, "bot")
            with pytest.raises(MCPError) as refused:
                await client.call_tool("get_record", {"record_id": 2})
            tw.engine.windows.clock = lambda: NOON + 86_400
            again = await client.call_tool("get_record", {"record_id": 3})
    assert not first.is_error and not again.is_error
    error = refused.value.error
    assert error.code == TRIPWIRE_GUARD_ERROR
    assert isinstance(error.data, dict)
    assert error.data["guardrail"] == "budget_window_exceeded" and error.data["resets_at"] == RESETS
    await tw.flush()
    events = [e for r in tw.run_ids() for e in tw.events(r)]
    assert not [e for e in events if e["event_type"] == "RUN_END"]
    assert [e["payload"]["tool_name"] for e in events if e["event_type"] == "TOOL_CALL"] == ["get_record"] * 2


async def test_a_responses_websocket_call_over_the_day_is_an_error_event_and_the_socket_stays(
    start_tripwire: StartTripwire, fake_upstream: tuple[FakeUpstream, str]
) -> None:
    fake, url = fake_upstream
    fake.default = Reply(text="ok", completion_tokens=10)
    tw = await start_tripwire(upstream={"url": url}, pricing_table=PRICES, guards=GUARDS)
    tw.engine.windows.clock = lambda: NOON
    headers = {
        "Authorization": f"Bearer {AGENT_KEY}",
        **BETA,
        "X-Tripwire-Session": "ws-1",
        "X-Tripwire-Agent": "codex",
    }

    def create(text: str) -> str:
        return json.dumps({"type": "response.create", "model": MODEL, "input": text, "max_output_tokens": 10})

    async with (
        aiohttp.ClientSession() as http,
        http.ws_connect(tw.url + "/v1/responses", headers=headers, autoping=False) as ws,
    ):
        await ws.send_str(create("one"))
        first: list[dict[str, Any]] = await until_done(ws)
        await ws.send_str(create("two"))
        refused = await next_json(ws)
        await ws.ping(b"still open?")
        pong = await asyncio.wait_for(ws.receive(), 30)
        tw.engine.windows.clock = lambda: NOON + 86_400
        await ws.send_str(create("three"))
        third = await until_done(ws)
    assert first[-1]["type"] == "response.completed" and third[-1]["type"] == "response.completed"
    assert refused["type"] == "error" and refused["status"] == 429
    assert refused["error"]["code"] == "budget_window_exceeded"
    assert refused["error"]["resets_at"] == RESETS
    assert pong.type == WSMsgType.PONG
    assert len(fake.ws_messages) == 2


async def test_an_anthropic_call_over_the_day_is_an_anthropic_error_with_resets_at(
    start_tripwire: StartTripwire, fake_upstream: tuple[FakeUpstream, str]
) -> None:
    import anthropic

    fake, url = fake_upstream
    fake.default = Reply(text="ok", completion_tokens=10)
    tw = await start_tripwire(llm={"anthropic": {"url": url}}, pricing_table=PRICES, guards=GUARDS)
    tw.engine.windows.clock = lambda: NOON
    claude = anthropic.AsyncAnthropic(
        base_url=tw.url + "/llm/anthropic", api_key=AGENT_KEY, default_headers={"X-Tripwire-Session": "c1"}
    )
    hello: list[Any] = [{"role": "user", "content": "hi"}]
    await claude.messages.create(model=MODEL, max_tokens=10, messages=hello)
    with pytest.raises(anthropic.RateLimitError) as refused:
        await claude.messages.create(model=MODEL, max_tokens=10, messages=hello)
    body = refused.value.response.json()
    assert body["type"] == "error" and body["error"]["type"] == "rate_limit_error"
    assert body["error"]["guardrail"] == "budget_window_exceeded" and body["error"]["resets_at"] == RESETS
    assert refused.value.response.headers["x-should-retry"] == "false"
    tw.engine.windows.clock = lambda: NOON + 86_400
    await claude.messages.create(model=MODEL, max_tokens=10, messages=hello)  # the same session goes on


@pytest.mark.parametrize("shared", [False, True], ids=["local", "redis"])
async def test_a_call_refused_by_a_rate_limit_reserves_nothing_in_the_windows(
    shared: bool,
    request: pytest.FixtureRequest,
    start_tripwire: StartTripwire,
    fake_upstream: tuple[FakeUpstream, str],
) -> None:
    fake, url = fake_upstream
    fake.default = Reply(text="ok", completion_tokens=10)
    guards = {
        "budget_windows": [{"period": "day", "max_cost_usd": 10.0}],
        "rate_limits": [{"match": "llm", "max_calls": 1, "per_s": 3600}],
    }
    state = {"state": {"url": request.getfixturevalue("redis_url")}} if shared else {}
    tw = await start_tripwire(upstream={"url": url}, pricing_table=PRICES, guards=guards, **state)
    tw.engine.windows.clock = lambda: NOON
    llm = openai.AsyncOpenAI(
        base_url=tw.url + "/v1", api_key=AGENT_KEY, default_headers={"X-Tripwire-Agent": "bot"}, max_retries=0
    )

    async def one() -> str:
        try:
            await llm.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=10
            )
        except openai.RateLimitError as e:
            return str(e.response.headers["X-Tripwire-Guard"])
        return "ok"

    outcomes = await asyncio.gather(one(), one(), one())
    assert sorted(outcomes) == ["ok", "rate_limited", "rate_limited"]
    await tw.flush()
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{tw.admin_url}/api/agents/bot/spend") as r:
            day = (await r.json())["windows"][0]
    assert day["spent_usd"] == pytest.approx(1.0) and day["reserved"]["usd"] == 0
