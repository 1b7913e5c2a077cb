"""Rate limits in one process (SPEC §9, issue 22 item 3): the real openai, anthropic and mcp SDKs
through Tripwire to fakes on 127.0.0.1. A call over the agent's limit is refused retryably (429 +
Retry-After without `x-should-retry: false`; the MCP BLOCK result saying when), the session goes
on, and the SDK's own retry goes through once the window has moved."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import anthropic
import openai
import pytest
from aiohttp import WSMsgType

from proxy.constants import GUARD_RATE_LIMITED
from tests.conftest import AGENT_KEY, Running, StartTripwire
from tests.fakes import FakeUpstream, Reply
from tests.pipeline_errors import no_pipeline_errors  # noqa: F401 (autouse fixture)

CHAT = "/v1/chat/completions"
HELLO: list[Any] = [{"role": "user", "content": "hello"}]


def rate(match: str, max_calls: int, per_s: float) -> dict[str, Any]:
    return {"rate_limits": [{"match": match, "max_calls": max_calls, "per_s": per_s}]}


def chat_client(tw: Running, session: str, agent: str = "researcher", **kw: Any) -> openai.AsyncOpenAI:
    headers = {"X-Tripwire-Agent": agent, "X-Tripwire-Session": session}
    return openai.AsyncOpenAI(base_url=tw.url + "/v1", api_key=AGENT_KEY, default_headers=headers, **kw)


async def outcome(c: openai.AsyncOpenAI) -> openai.RateLimitError | None:
    try:
        await c.chat.completions.create(model="gpt-4o", messages=HELLO)
    except openai.RateLimitError as e:
        return e
    return None


def assert_rate_limited(e: openai.RateLimitError | anthropic.RateLimitError, window_s: float) -> None:
    headers = e.response.headers
    assert headers["X-Tripwire-Guard"] == GUARD_RATE_LIMITED
    assert "x-should-retry" not in headers  # the SDK may retry it by itself
    assert 1 <= int(headers["Retry-After"]) <= window_s


def errors_of(tw: Running) -> list[dict[str, Any]]:
    return [e for run in tw.run_ids() for e in tw.events(run) if e["event_type"] == "ERROR"]


async def concurrent_burst(replicas: list[Running], fake: FakeUpstream, calls: int, limit: int) -> None:
    """`calls` concurrent calls of one agent, several sessions, spread over `replicas`: exactly
    `limit` reach the upstream, every other one is a retryable 429, and no session ends."""
    clients = [chat_client(replicas[i % len(replicas)], f"s{i % 4}", max_retries=0) for i in range(calls)]
    results = await asyncio.gather(*(outcome(c) for c in clients))
    refused = [e for e in results if e is not None]
    assert len(fake.calls(CHAT)) == limit
    assert len(refused) == calls - limit
    for e in refused:
        assert_rate_limited(e, 60)
        body = e.body
        assert isinstance(body, dict) and body["code"] == GUARD_RATE_LIMITED
        assert body["message"].startswith("[tripwire] rate limited:") and "Try again in" in body["message"]


async def test_sixty_concurrent_calls_let_exactly_ten_through(
    start_tripwire: StartTripwire, fake_upstream: tuple[FakeUpstream, str]
) -> None:
    fake, url = fake_upstream
    tw = await start_tripwire(upstream={"url": url}, guards=rate("llm", 10, 60))
    await concurrent_burst([tw], fake, 60, 10)
    await tw.flush()
    errors = errors_of(tw)
    assert len(errors) == 50 and {e["payload"]["guardrail"] for e in errors} == {GUARD_RATE_LIMITED}
    async with aiohttp.ClientSession() as http, http.get(tw.admin_url + "/metrics") as resp:
        metrics = await resp.text()
    (counted,) = [
        line
        for line in metrics.splitlines()
        if line.startswith("tripwire_guard_decisions_total{") and f'guard="{GUARD_RATE_LIMITED}"' in line
    ]
    assert 'action="block"' in counted and counted.endswith(" 50.0")
    runs = tw.run_ids()
    assert len(runs) == 4
    for run_id in runs:  # refused calls do not end their sessions
        assert tw.run_json(run_id)["status"] != "error"
    # another agent has its own window
    assert await outcome(chat_client(tw, "s1", agent="other", max_retries=0)) is None


async def test_the_openai_sdk_retries_by_itself_once_the_window_moves(
    start_tripwire: StartTripwire, fake_upstream: tuple[FakeUpstream, str]
) -> None:
    fake, url = fake_upstream
    tw = await start_tripwire(upstream={"url": url}, guards=rate("llm", 1, 3))
    c = chat_client(tw, "s1", max_retries=5)
    # two at once: one goes through, the other is refused with Retry-After, which the SDK waits for,
    # then it goes through
    answers = await asyncio.gather(
        *(c.chat.completions.create(model="gpt-4o", messages=HELLO) for _ in range(2))
    )
    assert all(a.choices[0].message.content for a in answers)
    assert len(fake.calls(CHAT)) == 2
    await tw.flush()
    errors = errors_of(tw)
    assert errors and {e["payload"]["guardrail"] for e in errors} == {GUARD_RATE_LIMITED}
    assert all(e["payload"].get("retry_after") for e in errors)
    llm_calls = [e for e in tw.events() if e["event_type"] == "LLM_CALL"]
    # the refused tries were no calls of the session: the two that went through are calls 1 and 2
    assert [e["payload"]["call_seq"] for e in llm_calls] == [1, 2]


async def test_an_anthropic_call_gets_its_own_rate_limit_error(
    start_tripwire: StartTripwire, fake_upstream: tuple[FakeUpstream, str]
) -> None:
    _, url = fake_upstream
    tw = await start_tripwire(llm={"anthropic": {"url": url}}, guards=rate("llm", 1, 60))
    c = anthropic.AsyncAnthropic(
        base_url=tw.url + "/llm/anthropic",
        api_key=AGENT_KEY,
        default_headers={"X-Tripwire-Session": "c1"},
        max_retries=0,
    )
    await c.messages.create(model="claude-sonnet-4-5", max_tokens=50, messages=HELLO)
    with pytest.raises(anthropic.RateLimitError) as refused:
        await c.messages.create(model="claude-sonnet-4-5", max_tokens=50, messages=HELLO)
    assert_rate_limited(refused.value, 60)
    body = refused.value.response.json()
    assert body["type"] == "error" and body["error"]["type"] == "rate_limit_error"
    assert body["error"]["code"] == GUARD_RATE_LIMITED


async def test_a_tool_pattern_does_not_count_llm_calls(
    start_tripwire: StartTripwire, fake_upstream: tuple[FakeUpstream, str]
) -> None:
    fake, url = fake_upstream
    tw = await start_tripwire(upstream={"url": url}, guards=rate("*", 1, 60))
    c = chat_client(tw, "s1", max_retries=0)
    for _ in range(3):
        assert await outcome(c) is None
    assert len(fake.calls(CHAT)) == 3


async def test_the_responses_websocket_gets_the_error_event_and_stays_open(
    start_tripwire: StartTripwire, fake_upstream: tuple[FakeUpstream, str]
) -> None:
    from tests.test_websocket import EVENT_WAIT_S, auth, create, next_json, until_done

    fake, url = fake_upstream
    tw = await start_tripwire(upstream={"url": url}, guards=rate("llm", 1, 60))
    async with (
        aiohttp.ClientSession() as http,
        http.ws_connect(tw.url + "/v1/responses", headers=auth(), autoping=False) as ws,
    ):
        await ws.send_str(create(input="one"))
        assert (await until_done(ws))[-1]["type"] == "response.completed"
        await ws.send_str(create(input="two"))
        refused = await next_json(ws)
        await ws.ping(b"still open?")
        pong = await asyncio.wait_for(ws.receive(), EVENT_WAIT_S)
    assert refused["type"] == "error" and refused["status"] == 429
    assert refused["error"]["code"] == GUARD_RATE_LIMITED
    assert 1 <= int(refused["headers"]["retry-after"]) <= 60 and "x-should-retry" not in refused["headers"]
    assert pong.type == WSMsgType.PONG  # the socket (and the session) go on
    assert len(fake.ws_messages) == 1


def tool_round(call_id: str, city: str) -> list[Any]:
    """The messages of one function-calling round: the model's call and the agent's result."""
    return [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": call_id,
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": f'{{"city": "{city}"}}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": call_id, "content": "sunny"},
    ]


async def test_a_function_calling_tool_is_counted_when_its_result_comes_back(
    start_tripwire: StartTripwire, fake_upstream: tuple[FakeUpstream, str]
) -> None:
    """get_weather at most once a minute: the request bringing its second result waits (429);
    the conversation's requests that bring no new result are not held back."""
    fake, url = fake_upstream
    tw = await start_tripwire(upstream={"url": url}, guards=rate("get_weather", 1, 60))
    c = chat_client(tw, "s1", max_retries=0)
    ask: list[Any] = [{"role": "user", "content": "weather in Paris, then Rome?"}]
    await c.chat.completions.create(model="gpt-4o", messages=ask)  # the model asks for get_weather
    first = ask + tool_round("call_1", "Paris")
    await c.chat.completions.create(model="gpt-4o", messages=first)  # brings one result: its slot
    second = first + tool_round("call_2", "Rome")
    with pytest.raises(openai.RateLimitError) as refused:
        await c.chat.completions.create(model="gpt-4o", messages=second)
    assert_rate_limited(refused.value, 60)
    assert "get_weather" in str(refused.value.body)
    assert len(fake.calls(CHAT)) == 2
    # a new turn brings no new result: not held back
    await c.chat.completions.create(model="gpt-4o", messages=[*first, {"role": "user", "content": "thanks"}])
    assert len(fake.calls(CHAT)) == 3


async def test_a_responses_chain_counts_the_outputs_it_brings(
    start_tripwire: StartTripwire, fake_upstream: tuple[FakeUpstream, str]
) -> None:
    fake, url = fake_upstream
    fake.replies = [
        Reply(tool_calls=[("call_1", "get_weather", {"city": "Paris"})]),
        Reply(tool_calls=[("call_2", "get_weather", {"city": "Rome"})]),
    ]
    tw = await start_tripwire(upstream={"url": url}, guards=rate("get_*", 1, 60))
    c = chat_client(tw, "s1", max_retries=0)
    first = await c.responses.create(model="gpt-4o", input="weather in Paris, then Rome?")
    second = await c.responses.create(
        model="gpt-4o",
        previous_response_id=first.id,
        input=[{"type": "function_call_output", "call_id": "call_1", "output": "sunny"}],
    )
    with pytest.raises(openai.RateLimitError) as refused:
        await c.responses.create(
            model="gpt-4o",
            previous_response_id=second.id,
            input=[{"type": "function_call_output", "call_id": "call_2", "output": "rainy"}],
        )
    assert_rate_limited(refused.value, 60)
    assert len(fake.calls("/v1/responses")) == 2
