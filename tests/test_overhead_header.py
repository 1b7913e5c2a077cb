"""`x-tripwire-overhead-ms` (issue 32 item 7): every answer to an HTTP call carries the milliseconds
the call spent inside Tripwire up to the answer's head, the upstream's wait for its head left out,
as LiteLLM's and MLflow's gateways give theirs. On both lanes of the proxy listener (the lean lane
and aiohttp's), JSON and streamed answers (the header goes with the head), forwarded or Tripwire's
own (a refusal), through the real openai and anthropic SDKs.

The upstream here holds every answer's head back HEAD_DELAY_S: a header that left the upstream's
wait out is at least that much below what the client measured (an inequality that holds by
construction, whatever the machine's load)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

import anthropic
import openai
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from proxy.app import make_proxy_app
from tests.conftest import AGENT_KEY, AppTestServer, Running, StartTripwire
from tests.fakes import FakeUpstream, Reply
from tests.pipeline_errors import no_pipeline_errors  # noqa: F401 (autouse fixture)

HEAD_DELAY_S = 1.0
HEADERS = {"X-Tripwire-Session": "overhead-1", "X-Tripwire-Agent": "timer"}


class SlowHead(FakeUpstream):
    """The fake upstream, each answer's head held back HEAD_DELAY_S."""

    async def chat(self, request: web.Request) -> web.StreamResponse:
        await asyncio.sleep(HEAD_DELAY_S)
        return await super().chat(request)

    async def messages(self, request: web.Request) -> web.StreamResponse:
        await asyncio.sleep(HEAD_DELAY_S)
        return await super().messages(request)


@pytest.fixture
async def slow_upstream() -> AsyncIterator[str]:
    fake = SlowHead(default=Reply(text="hello"))
    server = TestServer(fake.app, host="127.0.0.1")
    await server.start_server()
    try:
        yield str(server.make_url("")).rstrip("/")
    finally:
        await server.close()


@contextlib.asynccontextmanager
async def lane(tw: Running, which: str) -> AsyncIterator[str]:
    """The proxy listener's base URL: `tripwire serve`'s (plain LLM calls on the lean lane), or the
    same app on aiohttp's runner alone."""
    if which == "lean":
        yield tw.url
        return
    alone = AppTestServer(make_proxy_app(tw.engine), host="127.0.0.1")
    await alone.start_server()
    try:
        yield str(alone.make_url("")).rstrip("/")
    finally:
        await alone.close()


def overhead(headers: Any) -> float:
    value = headers.get("x-tripwire-overhead-ms")
    assert value is not None, dict(headers)
    ms = float(value)
    assert ms >= 0.0
    return ms


LANES = pytest.mark.parametrize("which", ["lean", "aiohttp"])


@LANES
@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
async def test_a_forwarded_chat_answer_carries_the_overhead_without_the_upstreams_wait(
    start_tripwire: StartTripwire, slow_upstream: str, which: str, stream: bool
) -> None:
    tw = await start_tripwire(upstream={"url": slow_upstream})
    async with lane(tw, which) as base:
        o = openai.AsyncOpenAI(
            base_url=base + "/v1", api_key=AGENT_KEY, default_headers=HEADERS, max_retries=0
        )
        messages: Any = [{"role": "user", "content": "hi"}]
        started = time.monotonic()
        if stream:
            async with o.chat.completions.with_streaming_response.create(
                model="gpt-4o-mini", messages=messages, stream=True
            ) as response:
                head_ms = (time.monotonic() - started) * 1000  # the head is here, the body not read yet
                ms = overhead(response.headers)
                assert "[DONE]" in "".join([line async for line in response.iter_lines()])
        else:
            raw = await o.chat.completions.with_raw_response.create(model="gpt-4o-mini", messages=messages)
            head_ms = (time.monotonic() - started) * 1000
            ms = overhead(raw.headers)
            assert raw.parse().choices[0].message.content == "hello"
    assert head_ms - ms >= HEAD_DELAY_S * 1000  # the upstream's wait for its head is not Tripwire's


@LANES
async def test_an_anthropic_answer_carries_it(
    start_tripwire: StartTripwire, slow_upstream: str, which: str
) -> None:
    tw = await start_tripwire(llm={"anthropic": {"url": slow_upstream}})
    async with lane(tw, which) as base:
        a = anthropic.AsyncAnthropic(
            base_url=base + "/llm/anthropic", api_key=AGENT_KEY, default_headers=HEADERS, max_retries=0
        )
        started = time.monotonic()
        raw = await a.messages.with_raw_response.create(
            model="claude-sonnet-4-5", max_tokens=20, messages=[{"role": "user", "content": "hi"}]
        )
        head_ms = (time.monotonic() - started) * 1000
    assert head_ms - overhead(raw.headers) >= HEAD_DELAY_S * 1000


@LANES
async def test_tripwires_own_answer_carries_it(
    start_tripwire: StartTripwire, fake_upstream: tuple[FakeUpstream, str], which: str
) -> None:
    """A refusal (over max_llm_calls): the upstream never called, all of it is Tripwire's time."""
    fake, url = fake_upstream
    tw = await start_tripwire(upstream={"url": url}, guards={"limits": {"max_llm_calls": 1}})
    async with lane(tw, which) as base:
        o = openai.AsyncOpenAI(
            base_url=base + "/v1", api_key=AGENT_KEY, default_headers=HEADERS, max_retries=0
        )
        messages: Any = [{"role": "user", "content": "hi"}]
        await o.chat.completions.create(model="gpt-4o-mini", messages=messages)
        with pytest.raises(openai.RateLimitError) as refused:
            await o.chat.completions.create(model="gpt-4o-mini", messages=messages)
    overhead(refused.value.response.headers)
    assert len(fake.seen) == 1


async def test_a_held_streams_head_carries_it(
    start_tripwire: StartTripwire, fake_upstream: tuple[FakeUpstream, str]
) -> None:
    """A streamed call held for a person: its head goes out at once, with the overhead so far."""
    from tests.test_approvals import approvals, decide, until

    fake, url = fake_upstream
    guards = {"limits": {"max_llm_calls": 1, "on_limit": "ask"}}
    tw = await start_tripwire(upstream={"url": url}, guards=guards, admin_token="hunter2")
    o = openai.AsyncOpenAI(base_url=tw.url + "/v1", api_key=AGENT_KEY, default_headers=HEADERS, max_retries=0)
    messages: Any = [{"role": "user", "content": "hi"}]
    await o.chat.completions.create(model="gpt-4o-mini", messages=messages)
    async with o.chat.completions.with_streaming_response.create(
        model="gpt-4o-mini", messages=messages, stream=True
    ) as response:
        overhead(response.headers)  # the head came while the call is held
        (approval,) = await until(lambda: approvals(tw), "the call held")
        await decide(tw, approval["id"], {"decision": "approve"})
        assert "[DONE]" in "".join([line async for line in response.iter_lines()])
