"""Opt-in upstream retries (settings.upstream_retries): connection errors, 502 and 503 are resent
with jittered back-off before the answer reaches the client or the circuit breaker counts it."""

from __future__ import annotations

import asyncio
import socket

import aiohttp
import openai
import pytest
from aiohttp.test_utils import TestServer

from proxy.forward import MAX_BACKOFF_S, backoff_delay, retryable_error
from tests.conftest import AGENT_KEY, Running, StartTripwire
from tests.fakes import FakeUpstream, Reply
from tests.pipeline_errors import no_pipeline_errors  # noqa: F401 (autouse fixture)

CHAT = "/v1/chat/completions"
HELLO = [{"role": "user", "content": "hello"}]
ONE_FAILURE_OPENS = {"circuit_breaker": {"open_after_failures": 1, "cooldown_seconds": 30}}


def llm(tw: Running) -> openai.AsyncOpenAI:
    # one run for a test's calls: each sends the same first request (alone, a run each: SPEC §3)
    return openai.AsyncOpenAI(
        base_url=tw.url + "/v1", api_key=AGENT_KEY, max_retries=0, default_headers={"X-Tripwire-Session": "s"}
    )


def test_backoff_doubles_with_jitter_and_a_cap() -> None:
    assert backoff_delay(1, 0.5, rand=lambda: 0.0) == 0.25
    assert backoff_delay(1, 0.5, rand=lambda: 0.999999) == pytest.approx(0.5, rel=1e-5)
    assert backoff_delay(3, 0.5, rand=lambda: 0.0) == 1.0
    assert backoff_delay(30, 0.5, rand=lambda: 0.0) == MAX_BACKOFF_S / 2
    assert retryable_error(aiohttp.ServerDisconnectedError())
    assert retryable_error(aiohttp.ConnectionTimeoutError())
    assert not retryable_error(aiohttp.SocketTimeoutError())  # the request may have been processed
    assert not retryable_error(aiohttp.ClientPayloadError())


async def test_503s_are_retried_and_the_breaker_never_sees_them(
    start_tripwire: StartTripwire, fake_upstream: tuple[FakeUpstream, str]
) -> None:
    fake, url = fake_upstream
    fake.replies = [Reply(status=503), Reply(status=502), Reply(text="third time lucky")]
    tw = await start_tripwire(
        upstream={"url": url}, upstream_retries=2, upstream_retry_base_s=0.01, guards=ONE_FAILURE_OPENS
    )
    answer = await llm(tw).chat.completions.create(model="gpt-4o-mini", messages=HELLO)
    assert answer.choices[0].message.content == "third time lucky"
    assert len(fake.calls(CHAT)) == 3
    again = await llm(tw).chat.completions.create(model="gpt-4o-mini", messages=HELLO)
    assert again.choices[0].message.content == "Hello from the fake upstream"  # circuit still closed
    await tw.flush()
    calls = [e for e in tw.events() if e["event_type"] == "LLM_CALL"]
    assert [c["payload"]["status"] for c in calls] == ["ok", "ok"]
    assert [c["meta"].get("upstream_retries") for c in calls] == [2, None]


async def test_retries_exhausted_relay_the_last_answer_and_count_one_failure(
    start_tripwire: StartTripwire, fake_upstream: tuple[FakeUpstream, str]
) -> None:
    fake, url = fake_upstream
    fake.replies = [Reply(status=503)] * 3
    tw = await start_tripwire(
        upstream={"url": url}, upstream_retries=2, upstream_retry_base_s=0.01, guards=ONE_FAILURE_OPENS
    )
    with pytest.raises(openai.InternalServerError) as caught:
        await llm(tw).chat.completions.create(model="gpt-4o-mini", messages=HELLO)
    assert caught.value.status_code == 503
    assert len(fake.calls(CHAT)) == 3
    with pytest.raises(openai.RateLimitError) as opened:  # one failure (after 3 attempts) opened it
        await llm(tw).chat.completions.create(model="gpt-4o-mini", messages=HELLO)
    assert opened.value.response.headers["X-Tripwire-Guard"] == "circuit_breaker"


async def test_no_retries_by_default_and_never_for_a_500(
    start_tripwire: StartTripwire, fake_upstream: tuple[FakeUpstream, str]
) -> None:
    fake, url = fake_upstream
    fake.replies = [Reply(status=503), Reply(status=500)]
    tw = await start_tripwire(upstream={"url": url})
    with pytest.raises(openai.InternalServerError):
        await llm(tw).chat.completions.create(model="gpt-4o-mini", messages=HELLO)
    assert len(fake.calls(CHAT)) == 1
    tw2 = await start_tripwire(upstream={"url": url}, upstream_retries=3, upstream_retry_base_s=0.01)
    with pytest.raises(openai.InternalServerError):
        await llm(tw2).chat.completions.create(model="gpt-4o-mini", messages=HELLO)
    assert len(fake.calls(CHAT)) == 2


async def test_a_refused_connection_is_retried_until_the_upstream_is_up(
    start_tripwire: StartTripwire,
) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    fake = FakeUpstream(default=Reply(text="up now"))
    server = TestServer(fake.app, host="127.0.0.1", port=port)
    tw = await start_tripwire(
        upstream={"url": f"http://127.0.0.1:{port}"}, upstream_retries=6, upstream_retry_base_s=0.05
    )

    async def start_later() -> None:
        await asyncio.sleep(0.15)
        await server.start_server()

    later = asyncio.create_task(start_later())
    try:
        answer = await llm(tw).chat.completions.create(model="gpt-4o-mini", messages=HELLO)
        assert answer.choices[0].message.content == "up now"
        assert len(fake.calls(CHAT)) == 1
    finally:
        await later
        await server.close()
