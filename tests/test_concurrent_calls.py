"""Concurrent calls per agent (`max_concurrent_calls`, SPEC §9; issue 30's acceptance check): the
real openai SDK through Tripwire to a fake upstream on 127.0.0.1 that holds its streams open. Over
the limit a call is refused retryably (429 + Retry-After, `concurrent_calls`), the session goes on,
and a slot comes back when its call ends: answered, failed, or cut by its client. With shared state
the calls of an agent count across replicas."""

from __future__ import annotations

import asyncio
from typing import Any

import openai

from proxy.constants import GUARD_CONCURRENT_CALLS
from tests.conftest import Running, StartTripwire
from tests.fakes import FakeUpstream, Reply
from tests.pipeline_errors import no_pipeline_errors  # noqa: F401 (autouse fixture)
from tests.test_rate_limits import CHAT, HELLO, chat_client, errors_of
from tests.test_state_replicas import settle_all, start_replicas

LIMIT = {"max_concurrent_calls": 2}
WAIT_S = 30.0


def paused(resume: asyncio.Event) -> Reply:
    """A stream that sends its first chunk, then nothing until `resume` is set: a call in flight."""
    return Reply(text="hello there, in pieces", pause_after_chunks=1, resume=resume)


async def in_flight(c: openai.AsyncOpenAI) -> Any:
    """A streamed call whose first chunk arrived (the upstream holds the rest back)."""
    stream = await c.chat.completions.create(model="gpt-4o", messages=HELLO, stream=True)
    await stream.__anext__()
    return stream


async def finish(stream: Any) -> str:
    return "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])


def assert_refused(e: openai.RateLimitError) -> None:
    headers = e.response.headers
    assert headers["X-Tripwire-Guard"] == GUARD_CONCURRENT_CALLS
    assert "x-should-retry" not in headers and headers["Retry-After"] == "1"  # the SDK may retry
    body = e.body
    assert isinstance(body, dict) and body["code"] == GUARD_CONCURRENT_CALLS
    assert body["message"].startswith("[tripwire] rate limited:") and "Try again in 1s" in body["message"]


async def until_admitted(c: openai.AsyncOpenAI) -> str | None:
    """A call, tried again (refused: its slot is not back yet) within generous bounds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT_S
    while True:
        try:
            answer = await c.chat.completions.create(model="gpt-4o", messages=HELLO)
            return answer.choices[0].message.content
        except openai.RateLimitError as e:
            assert_refused(e)
            assert loop.time() < deadline, "the slot never came back"
            await asyncio.sleep(0.05)


async def test_a_third_call_in_flight_is_refused_and_the_slots_come_back(
    start_tripwire: StartTripwire, fake_upstream: tuple[FakeUpstream, str]
) -> None:
    fake, url = fake_upstream
    tw: Running = await start_tripwire(upstream={"url": url}, guards=LIMIT)
    resume = asyncio.Event()
    fake.replies = [paused(resume), paused(resume)]
    streams = [await in_flight(chat_client(tw, s)) for s in ("s1", "s2")]
    # two in flight: a third call of the agent, in either session, is refused before the upstream
    refused = chat_client(tw, "s1", max_retries=0)
    try:
        await refused.chat.completions.create(model="gpt-4o", messages=HELLO)
        raise AssertionError("not refused")
    except openai.RateLimitError as e:
        assert_refused(e)
    assert len(fake.calls(CHAT)) == 2
    # another agent has its own slots
    other = chat_client(tw, "o1", agent="other", max_retries=0)
    assert (await other.chat.completions.create(model="gpt-4o", messages=HELLO)).choices[0].message.content
    # the streams end: their slots come back, and the agent's next call (its answer's end waited
    # for the slot to be given back) goes through at once
    resume.set()
    texts = [await finish(s) for s in streams]
    assert all(t.endswith("in pieces") for t in texts)
    for _ in range(3):
        answer = await refused.chat.completions.create(model="gpt-4o", messages=HELLO)
        assert answer.choices[0].message.content == "Hello from the fake upstream"
    await tw.flush()
    errors = errors_of(tw)
    assert [e["payload"]["guardrail"] for e in errors] == [GUARD_CONCURRENT_CALLS]
    # the session went on: no run ended, no terminated tag
    for run in tw.run_ids():
        assert not [e for e in tw.events(run) if e["event_type"] == "RUN_END"]


async def test_a_failed_call_gives_its_slot_back(
    start_tripwire: StartTripwire, fake_upstream: tuple[FakeUpstream, str]
) -> None:
    fake, url = fake_upstream
    tw = await start_tripwire(upstream={"url": url}, guards={"max_concurrent_calls": 1})
    fake.replies = [Reply(status=500), Reply(status=500)]
    c = chat_client(tw, "s1", max_retries=0)
    for _ in range(2):
        try:
            await c.chat.completions.create(model="gpt-4o", messages=HELLO)
            raise AssertionError("the upstream failed")
        except openai.InternalServerError:
            pass
    answer = await c.chat.completions.create(model="gpt-4o", messages=HELLO)
    assert answer.choices[0].message.content == "Hello from the fake upstream"
    assert len(fake.calls(CHAT)) == 3


async def test_a_call_its_client_cut_gives_its_slot_back(
    start_tripwire: StartTripwire, fake_upstream: tuple[FakeUpstream, str]
) -> None:
    fake, url = fake_upstream
    tw = await start_tripwire(upstream={"url": url}, guards={"max_concurrent_calls": 1})
    resume = asyncio.Event()
    fake.replies = [paused(resume)]
    stream = await in_flight(chat_client(tw, "s1"))
    c = chat_client(tw, "s2", max_retries=0)
    try:
        await c.chat.completions.create(model="gpt-4o", messages=HELLO)
        raise AssertionError("not refused")
    except openai.RateLimitError as e:
        assert_refused(e)
    await stream.close()  # the client hangs up mid-stream
    resume.set()  # (Tripwire learns it when it relays the next chunk)
    assert await until_admitted(c) == "Hello from the fake upstream"


async def test_two_replicas_count_one_agent_s_calls_together(
    start_tripwire: StartTripwire, fake_upstream: tuple[FakeUpstream, str], redis_url: str
) -> None:
    fake, url = fake_upstream
    replicas = await start_replicas(start_tripwire, url, redis_url, n=2, guards=LIMIT)
    resume = asyncio.Event()
    fake.replies = [paused(resume), paused(resume)]
    streams = [await in_flight(chat_client(replicas[0], s)) for s in ("s1", "s2")]
    # both on the first replica: the second replica refuses the agent's third call
    c = chat_client(replicas[1], "s3", max_retries=0)
    try:
        await c.chat.completions.create(model="gpt-4o", messages=HELLO)
        raise AssertionError("not refused")
    except openai.RateLimitError as e:
        assert_refused(e)
    assert len(fake.calls(CHAT)) == 2
    resume.set()
    for s in streams:
        await finish(s)
    # the first replica gave the slots back in Redis before the answers ended
    for _ in range(2):
        answer = await c.chat.completions.create(model="gpt-4o", messages=HELLO)
        assert answer.choices[0].message.content == "Hello from the fake upstream"
    await settle_all(replicas)
    errors = [e for r in replicas for e in errors_of(r)]
    assert [e["payload"]["guardrail"] for e in errors] == [GUARD_CONCURRENT_CALLS]
