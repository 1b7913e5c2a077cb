"""Budgets over time (SPEC §9, issue 22 acceptance 4) through the running proxy with the real
`openai` SDK against a fake upstream on 127.0.0.1: a daily budget of one agent across its sessions,
exact under 50 concurrent calls, kept across a restart, reset at the boundary (an injected clock)
and by the endpoint; another agent unaffected."""

from __future__ import annotations

import asyncio
import datetime as dt
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest

from tests.conftest import AGENT_KEY, Running, StartTripwire
from tests.fakes import FakeUpstream, Reply, webhook_receiver
from tests.pipeline_errors import no_pipeline_errors  # noqa: F401 (autouse fixture)
from tests.redis_server import RedisServer

CHAT = "/v1/chat/completions"
HELLO = [{"role": "user", "content": "hello"}]
MODEL = "window-model"
# no input price, $0.10 per output token: a call reserves max_tokens=10 -> $1.00 and the fake
# answers 10 completion tokens -> $1.00, so reservation and real cost are the same and the limit is
# reached after exactly N calls whatever the order they settle in
PRICES = {MODEL: [0.0, 100_000.0]}
LIMIT = 10.0
NOON = dt.datetime(2026, 11, 27, 12, 0, tzinfo=dt.UTC).timestamp()
TOMORROW = NOON + 86_400
AUTH = {"Authorization": "Bearer hunter2"}


def settings(url: str, **extra: Any) -> dict[str, Any]:
    window = {"period": "day", "max_cost_usd": LIMIT, "soft_alert_pct": 50}
    return {
        "upstream": {"url": url},
        "pricing_table": PRICES,
        "guards": {"budget_windows": [window]},
        **extra,
    }


def client(tw: Running, agent: str, session: str) -> openai.AsyncOpenAI:
    headers = {"X-Tripwire-Session": session, "X-Tripwire-Agent": agent}
    return openai.AsyncOpenAI(base_url=tw.url + "/v1", api_key=AGENT_KEY, default_headers=headers)


async def call(tw: Running, agent: str, session: str) -> bool:
    """One call: True when forwarded and answered, False when refused by the budget window."""
    try:
        await client(tw, agent, session).chat.completions.create(model=MODEL, messages=HELLO, max_tokens=10)
    except openai.RateLimitError as e:
        response = e.response
        assert response.headers["x-should-retry"] == "false"
        assert response.headers["X-Tripwire-Guard"] == "budget_window_exceeded"
        error = response.json()["error"]
        assert error["code"] == "budget_window_exceeded"
        now = dt.datetime.fromtimestamp(tw.engine.windows.clock(), dt.UTC)
        midnight = dt.datetime.combine(now.date() + dt.timedelta(days=1), dt.time(), dt.UTC)
        assert error["resets_at"] == midnight.isoformat().replace("+00:00", "Z")
        return False
    return True


async def spend(tw: Running, agent: str) -> dict[str, Any]:
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{tw.admin_url}/api/agents/{agent}/spend", headers=AUTH) as r:
            assert r.status == 200
            body: dict[str, Any] = await r.json()
            return body


def at(tw: Running, when: float) -> None:
    tw.engine.windows.clock = lambda: when  # the wall clock the windows read (proxy/guard_backend/windows.py)


async def test_a_daily_budget_trips_across_sessions_exactly_under_concurrency(
    start_tripwire: StartTripwire, fake_upstream: tuple[FakeUpstream, str]
) -> None:
    fake, url = fake_upstream
    fake.default = Reply(text="ok", prompt_tokens=7, completion_tokens=10)
    async with webhook_receiver() as webhook:
        tw = await start_tripwire(**settings(url, alert_webhook=webhook.url))
        await spend_a_day(tw, fake)
        for _ in range(1000):  # every alert posted (a condition, generously bounded)
            if len(webhook.got) >= 46 and not tw.engine.alerts.in_flight:
                break
            await asyncio.sleep(0.02)
    soft = [a for a in webhook.got if a["guardrail"] == "budget_window_soft_alert"]
    refused = [a for a in webhook.got if a["guardrail"] == "budget_window_exceeded"]
    assert len(soft) == 1 and soft[0]["agent"] == "spender" and soft[0]["resets_at"] == "2026-11-28T00:00:00Z"
    assert len(refused) == 45 and {a["resets_at"] for a in refused} == {"2026-11-28T00:00:00Z"}


async def spend_a_day(tw: Running, fake: FakeUpstream) -> None:
    """Several sessions of one agent spend its day, 50 of its calls at once; what holds after."""
    at(tw, NOON)
    # three sessions of one agent share its day: 2 + 2 calls, then 50 at once in 50 more sessions
    for session in ("s1", "s1", "s2", "s2"):
        assert await call(tw, "spender", session)
    results = await asyncio.gather(*(call(tw, "spender", f"c{i}") for i in range(50)))
    assert sum(results) == 6  # exactly to $10.00: 4 + 6 forwarded, 44 refused unforwarded
    assert len(fake.calls(CHAT)) == 10
    assert not await call(tw, "spender", "s1")  # the session that spent first is refused too
    # another agent's day is its own
    assert await call(tw, "other", "s1")
    await tw.flush()

    day = (await spend(tw, "spender"))["windows"][0]
    assert day["key"] == "day:2026-11-27" and day["period"] == "day"
    assert day["spent_usd"] == pytest.approx(LIMIT) and day["reserved"]["usd"] == 0
    assert day["max_cost_usd"] == LIMIT and day["resets_at"] == "2026-11-28T00:00:00Z"
    assert (await spend(tw, "other"))["windows"][0]["spent_usd"] == pytest.approx(1.0)

    # the refusal ends no session: no run has a RUN_END; each refused call wrote an ERROR naming
    # the window and when it resets
    run_ids = tw.run_ids()
    events = [e for r in run_ids for e in tw.events(r)]
    assert not [e for e in events if e["event_type"] == "RUN_END"]
    errors = [e for e in events if e["event_type"] == "ERROR"]
    assert len(errors) == 45
    assert {e["payload"]["guardrail"] for e in errors} == {"budget_window_exceeded"}
    assert {e["payload"]["resets_at"] for e in errors} == {"2026-11-28T00:00:00Z"}
    # the soft alert at 50 % fired once for the agent's day (the other agent spent 10 %)
    alerts = [
        e
        for e in events
        if e["event_type"] == "STATE_UPDATE" and e["payload"].get("guardrail") == "budget_window_soft_alert"
    ]
    assert len(alerts) == 1 and alerts[0]["payload"]["resets_at"] == "2026-11-28T00:00:00Z"
    metrics = await _metrics(tw)
    assert 'tripwire_budget_window_spent_usd{agent="spender",period="day"} 10.0' in metrics
    assert 'tripwire_budget_window_limit_usd{agent="spender",period="day"} 10.0' in metrics


async def _metrics(tw: Running) -> str:
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{tw.admin_url}/metrics", headers=AUTH) as r:
            return await r.text()


async def test_the_spend_survives_a_restart_and_resets_at_the_boundary_and_by_the_endpoint(
    start_tripwire: StartTripwire, fake_upstream: tuple[FakeUpstream, str], tmp_path: Path
) -> None:
    fake, url = fake_upstream
    fake.default = Reply(text="ok", prompt_tokens=7, completion_tokens=10)
    data_dir = tmp_path / "kept"
    tw = await start_tripwire(data_dir=data_dir, **settings(url))
    at(tw, NOON)
    results = [await call(tw, "spender", f"s{i}") for i in range(11)]
    assert results == [True] * 10 + [False]
    await tw.proxy.close()
    await tw.admin.close()
    await tw.engine.close()  # a clean shutdown writes what was settled

    again = await start_tripwire(data_dir=data_dir, **settings(url))
    at(again, NOON + 60)
    assert not await call(again, "spender", "after-restart")
    assert len(fake.calls(CHAT)) == 10
    # the boundary: tomorrow's window starts from zero, no timer involved
    at(again, TOMORROW)
    assert await call(again, "spender", "tomorrow")
    day = (await spend(again, "spender"))["windows"][0]
    assert day["key"] == "day:2026-11-28" and day["spent_usd"] == pytest.approx(1.0)
    # spend it, then reset by the endpoint
    while await call(again, "spender", "tomorrow"):
        pass
    async with aiohttp.ClientSession() as http:
        url_reset = f"{again.admin_url}/api/agents/spender/spend/reset"
        async with http.post(url_reset, json={"period": "week"}, headers=AUTH) as r:
            assert r.status == 200  # no weekly window: nothing to reset, the day stays spent
        assert not await call(again, "spender", "tomorrow")
        async with http.post(url_reset, json={"period": "year"}, headers=AUTH) as r:
            assert r.status == 400 and "period" in (await r.json())["detail"]
        async with http.post(url_reset, json={"period": "day"}, headers=AUTH) as r:
            assert r.status == 200
            assert (await r.json())["windows"][0]["spent_usd"] == 0
    assert await call(again, "spender", "tomorrow")


# --- with the shared state backend (a real redis-server) ------------------------------------------


async def replicas(start: StartTripwire, url: str, redis_url: str, n: int = 3) -> list[Running]:
    started = [await start(**settings(url, state={"url": redis_url})) for _ in range(n)]
    for r in started:
        at(r, NOON)
    return started


async def until_up(replicas: list[Running]) -> None:
    for _ in range(600):
        if all(r.engine.shared is not None and r.engine.shared.link.up for r in replicas):
            return
        await asyncio.sleep(0.05)
    raise AssertionError("the replicas did not see the state backend come back")


async def test_replicas_share_the_day_exactly_and_keep_it_through_flushall_and_a_redis_restart(
    own_redis: RedisServer,  # first: it outlives the replicas, which close before it stops
    start_tripwire: StartTripwire,
    fake_upstream: tuple[FakeUpstream, str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    fake, url = fake_upstream
    fake.default = Reply(text="ok", prompt_tokens=7, completion_tokens=10)
    three = await replicas(start_tripwire, url, own_redis.url)
    # 4 calls in two sessions, then 50 at once, spread round-robin over three replicas
    for i, session in enumerate(("s1", "s1", "s2", "s2")):
        assert await call(three[i % 3], "spender", session)
    results = await asyncio.gather(*(call(three[i % 3], "spender", f"c{i}") for i in range(50)))
    assert sum(results) == 6
    assert len(fake.calls(CHAT)) == 10
    assert await call(three[1], "other", "s1")  # another agent's day is its own
    for r in three:
        day = (await spend(r, "spender"))["windows"][0]
        assert day["spent_usd"] == pytest.approx(LIMIT) and day["reserved"]["usd"] == 0

    # Redis loses everything (FLUSHALL): the replicas write back what they saw
    own_redis.flush()
    for r in three:
        assert not await call(r, "spender", "after-flush")
    assert len(fake.calls(CHAT)) == 11  # (the other agent's one)

    # Redis restarts empty: refused during the outage (fail_open: from the replica's memory), and after
    own_redis.stop()
    assert not await call(three[0], "spender", "outage")
    own_redis.start()
    await until_up(three)
    for r in three:
        assert not await call(r, "spender", "after-restart")
    assert len(fake.calls(CHAT)) == 11
    caplog.clear()  # the outage was logged as an error (expected)

    # the boundary: tomorrow starts from zero on every replica
    for r in three:
        at(r, TOMORROW)
    assert await call(three[2], "spender", "tomorrow")
    # the endpoint on one replica resets the day for all
    while await call(three[0], "spender", "tomorrow"):
        pass
    async with aiohttp.ClientSession() as http:
        async with http.post(
            f"{three[1].admin_url}/api/agents/spender/spend/reset", json={"period": "day"}, headers=AUTH
        ) as r:
            assert r.status == 200
    assert await call(three[2], "spender", "tomorrow")
