"""Resume with shared state (SPEC §5.5a, §8): three replicas on one real Redis, the real openai SDK
spread round-robin. A session killed on one replica and refused by the others is resumed through
one replica's API: every replica then serves it in the new run, spend and counts carried over."""

from __future__ import annotations

from typing import Any

import openai
import pytest

from tests.conftest import StartTripwire
from tests.fakes import FakeUpstream
from tests.pipeline_errors import no_pipeline_errors  # noqa: F401 (autouse fixture)
from tests.redis_server import RedisServer
from tests.test_state_replicas import (
    CHAT,
    HELLO,
    api,
    client,
    expected_outage,
    health,
    settle_all,
    start_replicas,
    until,
)


async def test_a_killed_session_resumed_on_one_replica_goes_on_on_all(
    start_tripwire: StartTripwire, fake_upstream: tuple[FakeUpstream, str], redis_url: str
) -> None:
    fake, url = fake_upstream
    replicas = await start_replicas(start_tripwire, url, redis_url, guards={"limits": {"max_llm_calls": 4}})
    clients = [client(r, max_retries=0) for r in replicas]
    for c in clients[:2]:
        await c.chat.completions.create(model="gpt-4o", messages=HELLO)
    await settle_all(replicas)
    (old,) = replicas[0].run_ids()
    status, _ = await api(replicas[0], "POST", f"/api/runs/{old}/terminate")
    assert status == 200
    await settle_all(replicas)
    for c in clients[1:]:  # every replica refuses the killed session
        with pytest.raises(openai.RateLimitError):
            await c.chat.completions.create(model="gpt-4o", messages=HELLO)
    await settle_all(replicas)

    status, body = await api(replicas[0], "POST", f"/api/runs/{old}/resume")
    assert status == 200, body
    new = body["run_id"]
    # each replica serves the session again, in the new run; the 2 calls before count toward 4
    for c in (clients[1], clients[2]):
        await c.chat.completions.create(model="gpt-4o", messages=HELLO)
        await settle_all(replicas)
    with pytest.raises(openai.RateLimitError) as refused:
        await clients[0].chat.completions.create(model="gpt-4o", messages=HELLO)
    assert refused.value.response.headers["X-Tripwire-Guard"] == "max_llm_calls"
    assert len(fake.calls(CHAT)) == 4
    await settle_all(replicas)
    for r in replicas[1:]:
        assert new in r.run_ids()
        served = [e for e in r.events(new) if e["event_type"] == "LLM_CALL"]
        assert len(served) == 1
    assert replicas[0].events(new)[0]["payload"]["resumed_from"] == old
    assert replicas[0].tripwire_json(old)["resumed_as"] == new


async def test_a_resume_while_redis_is_down_changes_nothing_and_works_once_it_is_back(
    own_redis: RedisServer,  # first: it outlives the replicas (they close before it stops)
    start_tripwire: StartTripwire,
    fake_upstream: tuple[FakeUpstream, str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    fake, url = fake_upstream
    replicas = await start_replicas(start_tripwire, url, own_redis.url, n=2)
    for r in replicas:
        assert r.engine.shared is not None
        r.engine.shared.link.probe_interval_s = 0.1
    clients = [client(r, max_retries=0) for r in replicas]
    await clients[0].chat.completions.create(model="gpt-4o", messages=HELLO)
    await settle_all(replicas)
    (old,) = replicas[0].run_ids()
    assert (await api(replicas[0], "POST", f"/api/runs/{old}/terminate"))[0] == 200
    await settle_all(replicas)
    own_redis.stop()
    status, body = await api(replicas[0], "POST", f"/api/runs/{old}/resume")
    assert status == 503 and "not resumed" in body["detail"]
    with pytest.raises(openai.RateLimitError):  # still refused
        await clients[0].chat.completions.create(model="gpt-4o", messages=HELLO)
    own_redis.start()

    async def back() -> bool:
        return (await health(replicas[0]))["state"]["up"] is True

    await until(back, "replica 0 to see Redis back")
    expected_outage(caplog)
    await settle_all(replicas)
    status, body = await api(replicas[0], "POST", f"/api/runs/{old}/resume")
    assert status == 200, body
    for c in clients:
        await c.chat.completions.create(model="gpt-4o", messages=HELLO)
        await settle_all(replicas)
    assert len(fake.calls(CHAT)) == 3


async def test_an_automatic_session_resumed_is_found_by_its_lineage_on_other_replicas(
    start_tripwire: StartTripwire, fake_upstream: tuple[FakeUpstream, str], redis_url: str
) -> None:
    """No session header: the conversation's next request, on a replica that never saw it, finds
    the new run by the history digests and answers the old run named (moved to the new one)."""
    fake, url = fake_upstream
    replicas = await start_replicas(start_tripwire, url, redis_url, guards={"limits": {"max_llm_calls": 2}})
    clients = [client(r, session=None, agent="auto", max_retries=0) for r in replicas]
    messages: list[dict[str, Any]] = [{"role": "user", "content": "plan a trip"}]

    async def step(c: openai.AsyncOpenAI, i: int) -> None:
        answer = await c.chat.completions.create(model="gpt-4o", messages=messages)
        messages.extend(
            [
                answer.choices[0].message.model_dump(exclude_none=True),
                {"role": "user", "content": f"and {i}?"},
            ]
        )
        await settle_all(replicas)

    for i in range(2):
        await step(clients[0], i)
    with pytest.raises(openai.RateLimitError):
        await clients[0].chat.completions.create(model="gpt-4o", messages=messages)
    await settle_all(replicas)
    (old,) = replicas[0].run_ids()
    status, body = await api(replicas[0], "POST", f"/api/runs/{old}/resume", {"raise": {"max_llm_calls": 4}})
    assert status == 200, body
    new = body["run_id"]
    await step(clients[1], 2)
    await step(clients[2], 3)
    with pytest.raises(openai.RateLimitError) as refused:  # 2 + 2: the raised limit, across replicas
        await clients[0].chat.completions.create(model="gpt-4o", messages=messages)
    assert refused.value.response.headers["X-Tripwire-Guard"] == "max_llm_calls"
    assert len(fake.calls(CHAT)) == 4
    for r in replicas[1:]:
        assert r.run_ids() == [new]
