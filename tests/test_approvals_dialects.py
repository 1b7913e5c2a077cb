"""A held call in every LLM dialect (SPEC §5.5a), streamed and not: chat, Responses and Anthropic Messages,
with their SDKs. The answer's SSE head goes out at once, with `: keep-alive` comments while held
(the SDKs read through them); then the upstream's real stream, or Tripwire's own answer in the same
stream: the synthetic block, or, for a refusal (`ask_fallback: terminate`), the dialect's in-stream
error event, which the SDK raises as an API error."""

from __future__ import annotations

import asyncio
from typing import Any

import anthropic
import openai
import pytest

from tests.conftest import AGENT_KEY, StartTripwire
from tests.fakes import FakeUpstream, Reply
from tests.pipeline_errors import no_pipeline_errors  # noqa: F401 (autouse fixture)
from tests.test_approvals import approvals, decide, until

HEADERS = {"X-Tripwire-Session": "held-stream", "X-Tripwire-Agent": "streamer"}
ONE_CALL = {"limits": {"max_llm_calls": 1, "on_limit": "ask"}}


async def streamed(tw: Any, dialect: str, text: str, *, stream: bool = True) -> str:
    """One call through the dialect's SDK (streamed unless told); the text it read."""
    if dialect == "anthropic":
        a = anthropic.AsyncAnthropic(
            base_url=tw.url + "/llm/anthropic", api_key=AGENT_KEY, default_headers=HEADERS, max_retries=0
        )
        messages: Any = [{"role": "user", "content": text}]
        if not stream:
            whole = await a.messages.create(model="claude-sonnet-4-5", max_tokens=50, messages=messages)
            return str(whole.content[0].text)  # type: ignore[union-attr]
        async with a.messages.stream(model="claude-sonnet-4-5", max_tokens=50, messages=messages) as s:
            msg = await s.get_final_message()
        return str(msg.content[0].text)  # type: ignore[union-attr]
    o = openai.AsyncOpenAI(base_url=tw.url + "/v1", api_key=AGENT_KEY, default_headers=HEADERS, max_retries=0)
    if dialect == "responses":
        if not stream:
            return (await o.responses.create(model="gpt-4o-mini", input=text)).output_text
        async with o.responses.stream(model="gpt-4o-mini", input=text) as r:
            final = await r.get_final_response()
        return final.output_text
    chat: Any = [{"role": "user", "content": text}]
    if not stream:
        answer = await o.chat.completions.create(model="gpt-4o-mini", messages=chat)
        return str(answer.choices[0].message.content)
    async with o.chat.completions.stream(model="gpt-4o-mini", messages=chat) as c:
        done = await c.get_final_completion()
    return str(done.choices[0].message.content)


async def started(start_tripwire: StartTripwire, url: str, dialect: str, guards: dict[str, Any]) -> Any:
    where = {"llm": {"anthropic": {"url": url}}} if dialect == "anthropic" else {"upstream": {"url": url}}
    tw = await start_tripwire(**where, guards=guards, admin_token="hunter2")
    tw.engine.approvals.watch.tick_s = tw.engine.approvals.watch.keepalive_s = 0.05
    return tw


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "json"])
@pytest.mark.parametrize("dialect", ["chat", "responses", "anthropic"])
@pytest.mark.parametrize("decision", ["approve", "deny"])
async def test_held_call_in_each_dialect(
    start_tripwire: StartTripwire,
    fake_upstream: tuple[FakeUpstream, str],
    dialect: str,
    decision: str,
    stream: bool,
) -> None:
    fake, url = fake_upstream
    fake.replies = [Reply(text="first"), Reply(text="second, from upstream")]
    tw = await started(start_tripwire, url, dialect, ONE_CALL)
    assert await streamed(tw, dialect, "one") == "first"
    held = asyncio.create_task(streamed(tw, dialect, "two", stream=stream))
    (approval,) = await until(lambda: approvals(tw), "the second call held")
    assert approval["guard"] == "max_llm_calls" and approval["call"]["stream"] is stream
    await asyncio.sleep(0.2)  # a few keep-alive comments go out meanwhile (tick 0.05 s)
    assert not held.done()
    status, _ = await decide(tw, approval["id"], {"decision": decision, "note": "one is enough"})
    assert status == 200
    text = await held
    if decision == "approve":
        assert text == "second, from upstream"
        assert len(fake.seen) == 2
    else:
        assert text.startswith("[tripwire] blocked:") and "one is enough" in text
        assert len(fake.seen) == 1


@pytest.mark.parametrize("dialect", ["chat", "responses", "anthropic"])
async def test_a_refusal_after_the_stream_started_is_the_dialects_in_stream_error(
    start_tripwire: StartTripwire, fake_upstream: tuple[FakeUpstream, str], dialect: str
) -> None:
    fake, url = fake_upstream
    fake.replies = [Reply(text="first")]
    guards = {**ONE_CALL, "ask_timeout_s": 0.2, "ask_fallback": "terminate"}
    tw = await started(start_tripwire, url, dialect, guards)
    assert await streamed(tw, dialect, "one") == "first"
    error: type[Exception] = anthropic.APIError if dialect == "anthropic" else openai.APIError
    with pytest.raises(error) as raised:
        await streamed(tw, dialect, "two")
    assert "[tripwire]" in str(raised.value)
    assert len(fake.seen) == 1


@pytest.mark.parametrize("dialect", ["chat", "anthropic"])
async def test_an_upstream_error_after_an_approved_held_stream_ends_it_as_an_error_event(
    start_tripwire: StartTripwire, fake_upstream: tuple[FakeUpstream, str], dialect: str
) -> None:
    """Approved, the upstream answered the held stream with a JSON error (its head went out as a
    200 stream already): the error's body as the dialect's in-stream error event; the SDK raises."""
    fake, url = fake_upstream
    fake.replies = [Reply(text="first"), Reply(status=400)]
    tw = await started(start_tripwire, url, dialect, ONE_CALL)
    assert await streamed(tw, dialect, "one") == "first"
    error: type[Exception] = anthropic.APIError if dialect == "anthropic" else openai.APIError
    held = asyncio.create_task(streamed(tw, dialect, "two"))
    (approval,) = await until(lambda: approvals(tw), "the second call held")
    await decide(tw, approval["id"], {"decision": "approve"})
    with pytest.raises(error) as raised:
        await held
    assert ("fake error 400" if dialect == "anthropic" else "boom") in str(raised.value)
    assert len(fake.seen) == 2
