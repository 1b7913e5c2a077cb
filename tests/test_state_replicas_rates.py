"""Issue 22 acceptance 3: rate limits exact across three replicas sharing one real Redis (SPEC §9,
§8). The windows are admitted in the admission round trip every call already makes: 60 concurrent
calls of one agent (several sessions) against 10 per 60 s let exactly 10 through whichever replica
serves them; the rest get 429 + Retry-After, and the openai SDK's own retry goes through once the
window moved, on another replica. The real mcp client reads when to retry."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import openai
import pytest

from proxy.constants import GUARD_RATE_LIMITED
from tests.conftest import StartTripwire
from tests.fakes import FakeUpstream
from tests.pipeline_errors import no_pipeline_errors  # noqa: F401 (autouse fixture)
from tests.redis_server import RedisServer
from tests.test_rate_limits import CHAT, HELLO, chat_client, concurrent_burst, errors_of, outcome, rate
from tests.test_state_replicas import expected_outage, health, settle_all, start_replicas, until


async def test_sixty_concurrent_calls_over_three_replicas_let_exactly_ten_through(
    start_tripwire: StartTripwire, fake_upstream: tuple[FakeUpstream, str], redis_url: str
) -> None:
    fake, url = fake_upstream
    replicas = await start_replicas(start_tripwire, url, redis_url, guards=rate("llm", 10, 60))
    await concurrent_burst(replicas, fake, 60, 10)
    await settle_all(replicas)
    errors = [e for r in replicas for e in errors_of(r)]
    assert len(errors) == 50 and {e["payload"]["guardrail"] for e in errors} == {GUARD_RATE_LIMITED}
    # a session whose first call is refused (its run has no guard state yet anywhere) goes on too
    assert isinstance(await outcome(chat_client(replicas[1], "fresh", max_retries=0)), openai.RateLimitError)
    # another agent has its own window
    assert await outcome(chat_client(replicas[2], "s1", agent="other", max_retries=0)) is None


async def test_the_sdk_retry_goes_through_on_another_replica_once_the_window_moves(
    start_tripwire: StartTripwire, fake_upstream: tuple[FakeUpstream, str], redis_url: str
) -> None:
    fake, url = fake_upstream
    replicas = await start_replicas(start_tripwire, url, redis_url, guards=rate("llm", 1, 3))
    # one call on each of two replicas at once: one goes through, the other is refused with
    # Retry-After, and the SDK's retry goes through once the window moved
    clients = [chat_client(r, "s1", max_retries=5) for r in replicas[:2]]
    answers = await asyncio.gather(
        *(c.chat.completions.create(model="gpt-4o", messages=HELLO) for c in clients)
    )
    assert all(a.choices[0].message.content for a in answers)
    assert len(fake.calls(CHAT)) == 2
    await settle_all(replicas)
    errors = [e for r in replicas for e in errors_of(r)]
    assert errors and {e["payload"]["guardrail"] for e in errors} == {GUARD_RATE_LIMITED}
    calls = sorted(
        e["payload"]["call_seq"]
        for r in replicas
        for run in r.run_ids()
        for e in r.events(run)
        if e["event_type"] == "LLM_CALL"
    )
    assert calls == [1, 2]  # one session, one run: the refused tries were no calls of it


async def test_an_mcp_client_over_replicas_reads_when_to_retry(
    start_tripwire: StartTripwire, redis_url: str
) -> None:
    pytest.importorskip("mcp.server.mcpserver")  # mcp 2.x
    from mcp import Client

    from tests.test_guards_e2e_mcp import shop
    from tests.test_rate_limits_mcp import SESSION_URL, refusal_of

    with shop() as upstream:
        replicas = [
            await start_tripwire(
                mcp={"shop": {"url": upstream}},
                guards=rate("shop__*", 2, 60),
                state={"url": redis_url},
            )
            for _ in range(3)
        ]
        async with contextlib.AsyncExitStack() as stack:
            clients = [
                await stack.enter_async_context(Client(r.url + SESSION_URL, cache=None)) for r in replicas
            ]
            results: list[Any] = await asyncio.gather(
                *(clients[i % 3].call_tool("fetch_user", {"user_id": i}) for i in range(6))
            )
    refused = [r for r in results if r.is_error]
    assert len(refused) == 4
    for r in refused:
        retry_after = refusal_of(r)
        assert retry_after is not None and 1 <= retry_after <= 60


async def test_with_redis_down_fail_open_enforces_each_replicas_own_windows(
    own_redis: RedisServer,  # first: it outlives the replicas (they close before it stops)
    start_tripwire: StartTripwire,
    fake_upstream: tuple[FakeUpstream, str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    fake, url = fake_upstream
    (tw,) = await start_replicas(start_tripwire, url, own_redis.url, n=1, guards=rate("llm", 2, 60))
    assert tw.engine.shared is not None
    tw.engine.shared.link.probe_interval_s = 0.1
    own_redis.stop()
    c = chat_client(tw, "s1", max_retries=0)
    results = [await outcome(c) for _ in range(4)]
    assert [r is None for r in results] == [True, True, False, False]
    for e in results[2:]:
        assert e is not None and e.response.headers["X-Tripwire-Guard"] == GUARD_RATE_LIMITED
    assert len(fake.calls(CHAT)) == 2
    own_redis.start()

    async def back() -> bool:
        return (await health(tw))["state"]["up"] is True

    await until(back, "the replica to see Redis back")
    expected_outage(caplog)
