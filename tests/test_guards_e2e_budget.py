"""Budgets, limits and the circuit breaker through the running proxy with the real `openai` SDK
(issue 4, acceptance 3, 4 and 6)."""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import AsyncIterator
from typing import Any

import openai
import pytest
from aiohttp.test_utils import TestServer

from tests.conftest import AGENT_KEY, Running, StartTripwire, serve_fake
from tests.fakes import FakeUpstream, Reply
from tests.pipeline_errors import no_pipeline_errors  # noqa: F401 (autouse fixture)
from tests.schema import assert_run_valid

CHAT = "/v1/chat/completions"
HELLO = [{"role": "user", "content": "hello"}]


def client(tw: Running, path: str = "/v1", session: str = "s1", **kw: Any) -> openai.AsyncOpenAI:
    headers = {"X-Tripwire-Session": session, "X-Tripwire-Agent": "spender"}
    return openai.AsyncOpenAI(base_url=tw.url + path, api_key=AGENT_KEY, default_headers=headers, **kw)


def only(events: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [e for e in events if e["event_type"] == kind]


async def trace(tw: Running) -> tuple[str, list[dict[str, Any]]]:
    await tw.flush()
    (run_id,) = tw.run_ids()
    _, events = assert_run_valid(tw.data_dir, run_id)
    return run_id, events


# --- budgets and limits -------------------------------------------------------------------------


async def test_cost_budget_refuses_with_429_and_ends_the_session(
    start_tripwire: StartTripwire, fake_upstream: tuple[FakeUpstream, str]
) -> None:
    fake, url = fake_upstream
    # gpt-4o: $2.50 / 1M input tokens, so each answer costs $0.25
    fake.default = Reply(text="expensive", prompt_tokens=100_000, completion_tokens=0)
    budget = {"max_cost_usd": 0.6, "soft_alert_threshold_usd": 0.3}
    tw = await start_tripwire(upstream={"url": url}, guards={"budget": budget})
    llm = client(tw)  # default max_retries=2: a 429 with x-should-retry false is not retried
    answers = 0
    with pytest.raises(openai.RateLimitError) as caught:
        for _ in range(10):
            await llm.chat.completions.create(model="gpt-4o", messages=HELLO)
            answers += 1
    # $0.25, $0.50, $0.75 settled: the call after the spend reached $0.60 is refused
    assert answers == 3
    assert len(fake.calls(CHAT)) == 3
    err = caught.value.response
    assert err.status_code == 429
    assert err.headers["x-should-retry"] == "false"
    assert err.headers["X-Tripwire-Guard"] == "max_cost_usd"
    body = err.json()["error"]
    assert body["type"] == "tripwire_guard" and body["code"] == body["guardrail"] == "max_cost_usd"
    assert body["threshold"] == 0.6
    assert body["actual"] == pytest.approx(0.75)

    run_id, events = await trace(tw)
    soft = [
        e for e in only(events, "STATE_UPDATE") if e["payload"].get("guardrail") == "soft_alert_threshold_usd"
    ]
    assert len(soft) == 1  # once per session, after the call that reached $0.30 (the 2nd)
    llm_calls = only(events, "LLM_CALL")
    assert events.index(llm_calls[1]) < events.index(soft[0]) < events.index(llm_calls[2])
    assert [e["event_type"] for e in events][-2:] == ["ERROR", "RUN_END"]
    assert events[-2]["payload"]["guardrail"] == "max_cost_usd"
    assert events[-1]["payload"]["status"] == "error"
    tags = tw.tripwire_json(run_id)["health_tags"]
    assert {"budget_warning", "budget_exceeded"} <= set(tags)
    assert "terminated" not in tags
    # the next call of the ended session is refused too, and never reaches the upstream
    with pytest.raises(openai.RateLimitError):
        await llm.chat.completions.create(model="gpt-4o", messages=HELLO)
    assert len(fake.calls(CHAT)) == 3


async def test_the_refusal_of_a_stopped_session_says_how_to_go_on_and_where_to_look(
    start_tripwire: StartTripwire, fake_upstream: tuple[FakeUpstream, str]
) -> None:
    """Issue 25: 'this session was terminated by a guard; start a new session' said neither how
    (which header, or how long the refusal lasts) nor where to see why."""
    _, url = fake_upstream
    tw = await start_tripwire(
        upstream={"url": url}, guards={"limits": {"max_llm_calls": 1}}, session_idle_timeout_s=300
    )

    async def stop_then_refusal(llm: openai.AsyncOpenAI) -> str:
        answer = await llm.chat.completions.create(model="gpt-4o-mini", messages=HELLO)
        # the conversation goes on (its history carries the answer), so an automatic session
        # continues too; a first request again would start a run of its own (SPEC §3)
        said = {"role": "assistant", "content": answer.choices[0].message.content}
        more = [*HELLO, said, {"role": "user", "content": "and then?"}]
        with pytest.raises(openai.RateLimitError):  # the limit stops the session
            await llm.chat.completions.create(model="gpt-4o-mini", messages=more)
        with pytest.raises(openai.RateLimitError) as caught:
            await llm.chat.completions.create(model="gpt-4o-mini", messages=more)
        error = caught.value.response.json()["error"]
        assert error["guardrail"] == "session_terminated"
        return str(error["message"])

    explicit = await stop_then_refusal(client(tw, session="s1"))
    await tw.flush()  # the run's folder is made by the writer, off the request path
    (run_id,) = tw.run_ids()
    assert explicit == (
        "[tripwire] refused: session 's1' of agent 'spender' was stopped and stays refused for 24 h. "
        "To go on, start a new session: send another session id (the X-Tripwire-Session header, or "
        "/agents/spender/sessions/<new id>/ in the base URL). "
        f"Why it was stopped: http://127.0.0.1:8714/?run={run_id}"
    )
    automatic = openai.AsyncOpenAI(base_url=tw.url + "/agents/auto/v1", api_key=AGENT_KEY, max_retries=0)
    text = await stop_then_refusal(automatic)
    await tw.flush()
    (auto_run,) = set(tw.run_ids()) - {run_id}
    assert text == (
        "[tripwire] refused: this conversation's session was stopped and stays refused until it has sent "
        "nothing for 5 min (each refused call starts that wait again). To go on, start a new conversation "
        "(it is recorded in a new run), or name a new session with the X-Tripwire-Session header. "
        f"Why it was stopped: http://127.0.0.1:8714/?run={auto_run}"
    )


async def test_unknown_model_is_charged_the_fallback_and_trips_the_budget(
    start_tripwire: StartTripwire, fake_upstream: tuple[FakeUpstream, str]
) -> None:
    fake, url = fake_upstream
    fake.default = Reply(text="who am I", prompt_tokens=10_000, completion_tokens=1_000)
    tw = await start_tripwire(upstream={"url": url}, guards={"budget": {"max_cost_usd": 0.1}})
    llm = client(tw, max_retries=0)
    await llm.chat.completions.create(model="acme-private-7b", messages=HELLO)  # $0.10 + $0.03
    with pytest.raises(openai.RateLimitError) as caught:
        await llm.chat.completions.create(model="acme-private-7b", messages=HELLO)
    assert caught.value.response.json()["error"]["actual"] == pytest.approx(0.13)
    _, events = await trace(tw)
    (call,) = only(events, "LLM_CALL")
    assert call["payload"]["cost_usd"] == pytest.approx(10_000 * 10 / 1e6 + 1_000 * 30 / 1e6)


async def test_unknown_model_warning_logs_the_calls_own_cost_once(
    start_tripwire: StartTripwire,
    fake_upstream: tuple[FakeUpstream, str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Issue 25: the warning said estimated_cost_usd=10.000000 (the reservation's 1M-token probe)
    for every unknown model, and fired for calls the upstream never answered."""
    fake, url = fake_upstream
    fake.default = Reply(text="who am I", prompt_tokens=10_000, completion_tokens=1_000)
    tw = await start_tripwire(
        upstream={"url": url},
        llm={"gone": {"url": "http://127.0.0.1:9"}},  # nothing listens on the discard port
        guards={"limits": {"max_llm_calls": 2}},
    )
    with caplog.at_level(logging.WARNING, logger="tripwire.pricing"):
        # refused by a guard (never forwarded) and unreachable (never answered): no warning
        gone = client(tw, "/llm/gone/v1", session="s0", max_retries=0)
        with pytest.raises(openai.APIStatusError):
            await gone.chat.completions.create(model="acme-never-answered", messages=HELLO)
        llm = client(tw, max_retries=0)
        await llm.chat.completions.create(model="acme-private-7b", messages=HELLO)  # $0.10 + $0.03
        await llm.chat.completions.create(model="acme-private-7b", messages=HELLO)
        with pytest.raises(openai.RateLimitError):
            await llm.chat.completions.create(model="acme-refused-9b", messages=HELLO)
        await tw.flush()
    lines = [r.getMessage() for r in caplog.records if r.name == "tripwire.pricing"]
    assert lines == [
        "budget.unknown_model_cost_estimated model_id=acme-private-7b estimated_cost_usd=0.130000 "
        'hint="Add this model to pricing_table to get accurate cost tracking"'
    ]


async def test_max_llm_calls_lets_exactly_n_through(
    start_tripwire: StartTripwire, fake_upstream: tuple[FakeUpstream, str]
) -> None:
    fake, url = fake_upstream
    tw = await start_tripwire(upstream={"url": url}, guards={"limits": {"max_llm_calls": 3}})
    llm = client(tw)
    for _ in range(3):
        await llm.chat.completions.create(model="gpt-4o-mini", messages=HELLO)
    with pytest.raises(openai.RateLimitError) as caught:
        await llm.chat.completions.create(model="gpt-4o-mini", messages=HELLO)
    assert len(fake.calls(CHAT)) == 3
    body = caught.value.response.json()["error"]
    assert body["guardrail"] == "max_llm_calls" and body["threshold"] == 3 and body["actual"] == 4
    run_id, events = await trace(tw)
    assert len(only(events, "LLM_CALL")) == 3
    assert [e["event_type"] for e in events][-2:] == ["ERROR", "RUN_END"]
    tags = tw.tripwire_json(run_id)["health_tags"]
    assert "budget_exceeded" not in tags  # a count limit is not a budget


# --- circuit breaker ----------------------------------------------------------------------------


@pytest.fixture
async def second_upstream() -> AsyncIterator[tuple[FakeUpstream, str]]:
    async with serve_fake(Reply(text="from the other upstream")) as pair:
        yield pair


def transitions(events: list[dict[str, Any]]) -> list[tuple[str, str]]:
    out = []
    for e in only(events, "STATE_UPDATE"):
        diff = e["payload"].get("diff", {}).get("circuit_breaker")
        if diff:
            out.append((diff["from"], diff["to"]))
    return out


async def test_circuit_opens_half_opens_and_closes(
    start_tripwire: StartTripwire,
    fake_upstream: tuple[FakeUpstream, str],
    second_upstream: tuple[FakeUpstream, str],
) -> None:
    fake, url = fake_upstream
    other, other_url = second_upstream
    fake.replies = [Reply(status=500)] * 5
    cb = {"open_after_failures": 5, "cooldown_seconds": 1, "half_open_max_calls": 3}
    tw = await start_tripwire(
        upstream={"url": url}, llm={"other": {"url": other_url}}, guards={"circuit_breaker": cb}
    )
    llm = client(tw, max_retries=0)
    for _ in range(5):
        with pytest.raises(openai.InternalServerError):
            await llm.chat.completions.create(model="gpt-4o-mini", messages=HELLO)
    assert len(fake.calls(CHAT)) == 5

    # open: refused at once with Retry-After, the upstream not called
    opened_at = time.monotonic()
    with pytest.raises(openai.RateLimitError) as caught:
        await llm.chat.completions.create(model="gpt-4o-mini", messages=HELLO)
    resp = caught.value.response
    assert resp.headers["X-Tripwire-Guard"] == "circuit_breaker"
    assert resp.headers["Retry-After"] == "1"
    assert resp.json()["error"]["guardrail"] == "circuit_breaker"
    assert len(fake.calls(CHAT)) == 5

    # another upstream's circuit (same agent, same session) is unaffected
    answer = await client(tw, path="/llm/other/v1", max_retries=0).chat.completions.create(
        model="gpt-4o-mini", messages=HELLO
    )
    assert answer.choices[0].message.content == "from the other upstream"

    # after the cooldown: of 5 calls arriving together, exactly 3 trials go
    await asyncio.sleep(max(0.0, 1.05 - (time.monotonic() - opened_at)))
    fake.default = Reply(text="back", chunk_delay=0.05)

    async def one() -> str:
        try:
            stream = await llm.chat.completions.create(model="gpt-4o-mini", messages=HELLO, stream=True)
            return "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
        except openai.RateLimitError:
            return "refused"

    results = await asyncio.gather(*(one() for _ in range(5)))
    assert sorted(results) == ["back"] * 3 + ["refused"] * 2
    assert len(fake.calls(CHAT)) == 8
    # closed again: calls go through
    fake.default = Reply(text="closed")
    again = await llm.chat.completions.create(model="gpt-4o-mini", messages=HELLO)
    assert again.choices[0].message.content == "closed"

    run_id, events = await trace(tw)
    assert transitions(events) == [("closed", "open"), ("open", "half_open"), ("half_open", "closed")]
    errors = [e for e in only(events, "ERROR") if e["payload"]["guardrail"] == "circuit_breaker"]
    assert len(errors) == 3  # one while open, two over the half-open limit
    assert all(e["payload"]["retry_after"] is not None for e in errors)
    assert "circuit_breaker_open" in tw.tripwire_json(run_id)["health_tags"]
    assert tw.run_json(run_id)["status"] == "running"  # a circuit refusal does not end the session


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_an_unreachable_upstream_is_named_and_logged_once_per_outage(
    start_tripwire: StartTripwire, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 25: the agent got `Tripwire could not reach the upstream: ClientConnectorError`, the
    log said nothing, and the circuit opened silently."""
    port = free_port()  # nothing listens there until the fake starts below
    cb = {"open_after_failures": 2, "cooldown_seconds": 0.2, "half_open_max_calls": 1}
    tw = await start_tripwire(
        llm={"flaky": {"url": f"http://127.0.0.1:{port}"}}, guards={"circuit_breaker": cb}
    )
    llm = client(tw, path="/llm/flaky/v1", max_retries=0)
    with caplog.at_level(logging.INFO, logger="tripwire"):
        for _ in range(2):
            with pytest.raises(openai.APIStatusError) as caught:
                await llm.chat.completions.create(model="gpt-4o-mini", messages=HELLO)
            assert caught.value.status_code == 502
            assert caught.value.response.json()["error"]["message"] == (
                f"Tripwire could not reach the upstream 'flaky' at 127.0.0.1:{port}: "
                "connection refused (ClientConnectorError)"
            )
        with pytest.raises(openai.RateLimitError):  # the circuit is open
            await llm.chat.completions.create(model="gpt-4o-mini", messages=HELLO)
        fake = FakeUpstream(default=Reply(text="back again"))
        server = TestServer(fake.app, host="127.0.0.1", port=port)
        await server.start_server()
        try:
            answer = None
            for _ in range(200):  # the cooldown passes, then the trial call closes the circuit
                try:
                    answer = await llm.chat.completions.create(model="gpt-4o-mini", messages=HELLO)
                    break
                except openai.RateLimitError:
                    await asyncio.sleep(0.05)
            assert answer is not None and answer.choices[0].message.content == "back again"
        finally:
            await server.close()
    lines = [
        (r.levelname, r.getMessage())
        for r in caplog.records
        if r.name in ("tripwire.forward", "tripwire.breaker")
    ]
    assert lines == [
        (
            "WARNING",
            f"Tripwire could not reach the upstream 'flaky' at 127.0.0.1:{port}: connection refused "
            "(ClientConnectorError); further failures are not logged until it answers again",
        ),
        (
            "WARNING",
            "circuit open for agent 'spender' calling upstream 'flaky': 2 consecutive failures; "
            "its calls are refused for 0.2s, then trial calls go through",
        ),
        (
            "INFO",
            "circuit half-open for agent 'spender' calling upstream 'flaky': cooldown elapsed; "
            "it lets 1 trial call through",
        ),
        ("INFO", "upstream 'flaky' answers again (2 calls failed to reach it)"),
        (
            "INFO",
            "circuit closed for agent 'spender' calling upstream 'flaky': trial call succeeded; "
            "calls go through again",
        ),
    ]


async def test_concurrent_calls_cannot_all_slip_past_a_limit(
    start_tripwire: StartTripwire, fake_upstream: tuple[FakeUpstream, str]
) -> None:
    fake, url = fake_upstream
    fake.default = Reply(text="slow answer", chunk_delay=0.05)
    tw = await start_tripwire(upstream={"url": url}, guards={"limits": {"max_llm_calls": 3}})
    llm = client(tw, max_retries=0)

    async def one() -> str:
        try:
            stream = await llm.chat.completions.create(model="gpt-4o-mini", messages=HELLO, stream=True)
            return "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
        except openai.RateLimitError as e:
            return e.response.json()["error"]["guardrail"]

    results = await asyncio.gather(*(one() for _ in range(6)))
    assert results.count("slow answer") == 3
    # the first refusal ends the session; calls after it are refused as a terminated session
    refused = [r for r in results if r != "slow answer"]
    assert "max_llm_calls" in refused and set(refused) <= {"max_llm_calls", "session_terminated"}
    assert len(fake.calls(CHAT)) == 3
    # the calls in flight when the session ended are still recorded, before its RUN_END
    run_id, events = await trace(tw)
    kinds = [e["event_type"] for e in events]
    assert kinds.count("LLM_CALL") == 3
    assert kinds[-1] == "RUN_END"


async def test_event_and_duration_limits(
    start_tripwire: StartTripwire, fake_upstream: tuple[FakeUpstream, str]
) -> None:
    fake, url = fake_upstream
    tw = await start_tripwire(upstream={"url": url}, guards={"limits": {"max_events": 3}})
    llm = client(tw, session="events", max_retries=0)
    for _ in range(2):  # RUN_START + 2 LLM_CALLs = 3 events
        await llm.chat.completions.create(model="gpt-4o-mini", messages=HELLO)
    with pytest.raises(openai.RateLimitError) as caught:
        await llm.chat.completions.create(model="gpt-4o-mini", messages=HELLO)
    assert caught.value.response.json()["error"]["guardrail"] == "max_events"

    tw2 = await start_tripwire(upstream={"url": url}, guards={"limits": {"max_duration_s": 0.3}})
    llm2 = client(tw2, session="slow", max_retries=0)
    await llm2.chat.completions.create(model="gpt-4o-mini", messages=HELLO)
    await asyncio.sleep(0.35)
    with pytest.raises(openai.RateLimitError) as late:
        await llm2.chat.completions.create(model="gpt-4o-mini", messages=HELLO)
    assert late.value.response.json()["error"]["guardrail"] == "max_duration_s"
    assert len(fake.calls(CHAT)) == 3


async def test_the_sdk_comes_back_after_retry_after_of_an_open_circuit(
    start_tripwire: StartTripwire, fake_upstream: tuple[FakeUpstream, str]
) -> None:
    """An open circuit's 429 has no `x-should-retry: false`: the openai SDK (default retries)
    waits Retry-After and its retry is a half-open trial, which closes the circuit."""
    fake, url = fake_upstream
    fake.replies = [Reply(status=500)]
    cb = {"open_after_failures": 1, "cooldown_seconds": 1}
    tw = await start_tripwire(upstream={"url": url}, guards={"circuit_breaker": cb})
    with pytest.raises(openai.InternalServerError):
        await client(tw, max_retries=0).chat.completions.create(model="gpt-4o-mini", messages=HELLO)
    answer = await client(tw).chat.completions.create(model="gpt-4o-mini", messages=HELLO)
    assert answer.choices[0].message.content == "Hello from the fake upstream"
    assert len(fake.calls(CHAT)) == 2
    _, events = await trace(tw)
    assert transitions(events) == [("closed", "open"), ("open", "half_open"), ("half_open", "closed")]


async def test_concurrent_calls_cannot_all_slip_past_the_token_budget(
    start_tripwire: StartTripwire, fake_upstream: tuple[FakeUpstream, str]
) -> None:
    """Each call reserves its prompt estimate plus its max_tokens against max_tokens too (SPEC §5.2):
    with ~110 tokens reserved per call, a 300-token budget admits three calls in flight, not six."""
    fake, url = fake_upstream
    fake.default = Reply(text="slow answer", chunk_delay=0.05)
    tw = await start_tripwire(upstream={"url": url}, guards={"budget": {"max_tokens": 300}})
    llm = client(tw, max_retries=0)

    async def one() -> str:
        try:
            stream = await llm.chat.completions.create(
                model="gpt-4o-mini", messages=HELLO, max_tokens=100, stream=True
            )
            return "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
        except openai.RateLimitError as e:
            return e.response.json()["error"]["guardrail"]

    results = await asyncio.gather(*(one() for _ in range(6)))
    assert results.count("slow answer") == 3
    assert "max_tokens" in results
    assert len(fake.calls(CHAT)) == 3
    run_id, events = await trace(tw)
    assert [e["event_type"] for e in events][-1] == "RUN_END"
    assert "budget_exceeded" in tw.tripwire_json(run_id)["health_tags"]
