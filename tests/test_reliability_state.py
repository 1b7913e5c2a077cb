"""Attacks on shared guard state (issue 26 item 3): Redis restarting empty must not resurrect a
terminated session, nor give a session its spent calls back, on a replica started after the restart.

Two replicas (in-process engines on loopback) share a real redis-server; the agent is the real
openai SDK. The data is lost with FLUSHALL (and SCRIPT FLUSH), as a restart without persistence
loses it; the replicas repair Redis in their session sweep, then a third replica is started.
"""

from __future__ import annotations

from collections.abc import Callable

import openai
import pytest

from tests.conftest import Running, StartTripwire
from tests.fakes import FakeUpstream
from tests.pipeline_errors import no_pipeline_errors  # noqa: F401 (autouse fixture)
from tests.redis_server import RedisServer
from tests.test_state_replicas import CHAT, HELLO, api, client, health, settle_all, start_replicas, until

AGENT = "researcher"
LIMIT = 10


async def outcome(c: openai.AsyncOpenAI) -> str:
    """'200', or the guard that refused the call."""
    try:
        await c.chat.completions.create(model="gpt-4o", messages=HELLO)
    except openai.RateLimitError as e:
        return str(e.response.headers["X-Tripwire-Guard"])
    return "200"


def run_of(tw: Running, session: str) -> str:
    (run_id,) = [r for r in tw.run_ids() if tw.tripwire_json(r)["session_id"] == session]
    return run_id


def count_sweeps(tw: Running, monkeypatch: pytest.MonkeyPatch) -> Callable[[], int]:
    """How many session sweeps (each after the shared state's keep-alive) the replica has done."""
    done = [0]
    sweep = tw.engine.sweep

    def counted(now: float) -> None:
        done[0] += 1
        sweep(now)

    monkeypatch.setattr(tw.engine, "sweep", counted)
    return lambda: done[0]


async def test_redis_restarted_empty_keeps_terminations_and_spent_calls_on_a_new_replica(
    own_redis: RedisServer,  # first: it outlives the replicas (they close before it stops)
    start_tripwire: StartTripwire,
    fake_upstream: tuple[FakeUpstream, str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake, url = fake_upstream
    limits = {"guards": {"limits": {"max_llm_calls": LIMIT}}}
    old = await start_replicas(start_tripwire, url, own_redis.url, n=2, **limits)
    # a session that used up max_llm_calls over both replicas (the 11th call terminated it)
    capped = [client(r, session="capped", max_retries=0) for r in old]
    assert [await outcome(capped[i % 2]) for i in range(LIMIT + 1)] == ["200"] * LIMIT + ["max_llm_calls"]
    # a session ended by the kill switch on replica 0, after a call on each replica
    killed = [client(r, session="killed", max_retries=0) for r in old]
    assert [await outcome(c) for c in killed] == ["200", "200"]
    await settle_all(old)
    status, _ = await api(old[0], "POST", f"/api/runs/{run_of(old[0], 'killed')}/terminate")
    assert status == 200
    # a session that spent 6 of its 10 calls, over both replicas
    spent = [client(r, session="spent", max_retries=0) for r in old]
    assert [await outcome(spent[i % 2]) for i in range(6)] == ["200"] * 6
    await settle_all(old)
    assert len(fake.calls(CHAT)) == LIMIT + 2 + 6

    sweeps = [count_sweeps(r, monkeypatch) for r in old]
    own_redis.flush()  # Redis loses everything (FLUSHALL, SCRIPT FLUSH)

    async def swept_twice() -> bool:  # the second sweep's keep-alive began after the flush
        return all(n() >= 2 for n in sweeps)

    await until(swept_twice, "two sweeps of each replica after the flush")
    # a replica that has never seen these sessions, started after the restart
    new = await start_tripwire(upstream={"url": url}, state={"url": own_redis.url}, **limits)
    assert await outcome(client(new, session="capped", max_retries=0)) == "session_terminated"
    assert await outcome(client(new, session="killed", max_retries=0)) == "session_terminated"
    more = client(new, session="spent", max_retries=0)
    assert [await outcome(more) for _ in range(5)] == ["200"] * 4 + ["max_llm_calls"]
    assert len(fake.calls(CHAT)) == LIMIT + 2 + 10
    # each old replica noticed the loss once and said so in /healthz
    assert [(await health(r))["state"]["repairs"] for r in old] == [1, 1]
