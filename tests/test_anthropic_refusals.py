"""Every refusal on the Anthropic route is Anthropic-shaped (SPEC §5.5, issue 14 item 3): budgets,
limits, terminate, an ended session and an open circuit answer `{"type": "error", "error": {...}}`,
which the real `anthropic` SDK parses into its own error with Tripwire's fields inside `error`."""

from __future__ import annotations

from typing import Any

import anthropic
import pytest

from tests.conftest import AGENT_KEY, StartTripwire
from tests.fakes import FakeUpstream, Reply
from tests.pipeline_errors import no_pipeline_errors  # noqa: F401 (autouse fixture)

HEADERS = {"X-Tripwire-Session": "claude-1"}
HELLO: list[Any] = [{"role": "user", "content": "hi"}]


def client(tw: Any) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(
        base_url=tw.url + "/llm/anthropic", api_key=AGENT_KEY, default_headers=HEADERS, max_retries=0
    )


async def ask(c: anthropic.AsyncAnthropic) -> Any:
    return await c.messages.create(model="claude-sonnet-4-5", max_tokens=50, messages=HELLO)


def assert_anthropic_error(e: anthropic.APIStatusError, guard: str, kind: str = "rate_limit_error") -> None:
    body = e.response.json()
    assert body["type"] == "error" and set(body) == {"type", "error"}
    assert body["error"]["type"] == kind
    assert body["error"]["guardrail"] == guard and body["error"]["message"].startswith("[tripwire]")
    assert e.response.headers["X-Tripwire-Guard"] == guard
    assert isinstance(e.body, dict) and e.body["error"]["guardrail"] == guard  # the SDK parsed it


async def test_a_limit_then_the_ended_session_are_anthropic_errors(
    start_tripwire: StartTripwire, fake_upstream: tuple[FakeUpstream, str]
) -> None:
    _, url = fake_upstream
    tw = await start_tripwire(llm={"anthropic": {"url": url}}, guards={"limits": {"max_llm_calls": 1}})
    c = client(tw)
    await ask(c)
    with pytest.raises(anthropic.RateLimitError) as refused:
        await ask(c)
    assert_anthropic_error(refused.value, "max_llm_calls")
    with pytest.raises(anthropic.RateLimitError) as ended:
        await ask(c)
    assert_anthropic_error(ended.value, "session_terminated")


async def test_a_cost_budget_is_an_anthropic_error(
    start_tripwire: StartTripwire, fake_upstream: tuple[FakeUpstream, str]
) -> None:
    fake, url = fake_upstream
    fake.default = Reply(text="pricey", prompt_tokens=400_000, completion_tokens=0)
    tw = await start_tripwire(llm={"anthropic": {"url": url}}, guards={"budget": {"max_cost_usd": 0.5}})
    c = client(tw)
    await ask(c)
    with pytest.raises(anthropic.RateLimitError) as refused:
        await ask(c)
    assert_anthropic_error(refused.value, "max_cost_usd")
    assert refused.value.body["error"]["threshold"] == 0.5  # type: ignore[index]


async def test_an_open_circuit_is_an_anthropic_error_with_retry_after(
    start_tripwire: StartTripwire, fake_upstream: tuple[FakeUpstream, str]
) -> None:
    fake, url = fake_upstream
    fake.default = Reply(status=500)
    guards = {"circuit_breaker": {"open_after_failures": 1, "cooldown_seconds": 30}}
    tw = await start_tripwire(llm={"anthropic": {"url": url}}, guards=guards)
    c = client(tw)
    with pytest.raises(anthropic.InternalServerError):
        await ask(c)
    with pytest.raises(anthropic.RateLimitError) as refused:
        await ask(c)
    assert_anthropic_error(refused.value, "circuit_breaker")
    assert int(refused.value.response.headers["Retry-After"]) >= 1


async def test_an_unreachable_upstream_is_an_anthropic_error(start_tripwire: StartTripwire) -> None:
    tw = await start_tripwire(llm={"anthropic": {"url": "http://127.0.0.1:9"}})
    with pytest.raises(anthropic.InternalServerError) as failed:
        await ask(client(tw))
    body = failed.value.response.json()
    assert body["type"] == "error" and body["error"]["type"] == "api_error"
    assert body["error"]["code"] == "upstream_unreachable"


async def test_the_openai_route_keeps_openais_shape(
    start_tripwire: StartTripwire, fake_upstream: tuple[FakeUpstream, str]
) -> None:
    import openai

    _, url = fake_upstream
    tw = await start_tripwire(upstream={"url": url}, guards={"limits": {"max_llm_calls": 1}})
    c = openai.AsyncOpenAI(base_url=tw.url + "/v1", api_key=AGENT_KEY, default_headers=HEADERS, max_retries=0)
    await c.chat.completions.create(model="gpt-4o-mini", messages=HELLO)
    with pytest.raises(openai.RateLimitError) as refused:
        await c.chat.completions.create(model="gpt-4o-mini", messages=HELLO)
    assert refused.value.response.json()["error"]["type"] == "tripwire_guard"
