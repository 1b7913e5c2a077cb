"""Approvals shared by replicas (SPEC §5.5a, §8; issue 23 acceptance 4): two in-process replicas
over one real redis-server. A call held on one is listed and decided on the other, and released
where it is held; a replica that stops beating has its pending approvals marked abandoned."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp

from tests.conftest import Running, StartTripwire
from tests.fakes import FakeUpstream
from tests.pipeline_errors import no_pipeline_errors  # noqa: F401 (autouse fixture)
from tests.test_approvals import ASK_LOOP, AUTH, CHAT, agent_loop, loop_then, until


async def listed(tw: Running, *, decided: bool = False) -> list[dict[str, Any]]:
    async with aiohttp.ClientSession() as c:
        url = tw.admin_url + "/api/approvals" + ("?all=1" if decided else "")
        async with c.get(url, headers=AUTH) as r:
            assert r.status == 200
            return list((await r.json())["approvals"])


async def decide(tw: Running, approval_id: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    async with aiohttp.ClientSession() as c:
        async with c.post(tw.admin_url + f"/api/approvals/{approval_id}", json=body, headers=AUTH) as r:
            return r.status, await r.json()


async def two_replicas(start: StartTripwire, url: str, redis_url: str) -> tuple[Running, Running]:
    a = await start(upstream={"url": url}, state={"url": redis_url}, guards=ASK_LOOP, admin_token="hunter2")
    b = await start(upstream={"url": url}, state={"url": redis_url}, guards=ASK_LOOP, admin_token="hunter2")
    return a, b


async def test_decided_on_one_replica_released_on_the_other(
    start_tripwire: StartTripwire, fake_upstream: tuple[FakeUpstream, str], redis_url: str
) -> None:
    fake, url = fake_upstream
    loop_then(fake, 5, "the real answer, via replica a")
    a, b = await two_replicas(start_tripwire, url, redis_url)
    agent = asyncio.create_task(agent_loop(a.url))
    (approval,) = await until(lambda: listed(b), "the approval listed on replica b")
    assert approval["replica"] == a.engine.approvals.book.replica  # type: ignore[attr-defined]
    assert len(fake.calls(CHAT)) == 5
    status, body = await decide(b, approval["id"], {"decision": "approve", "note": "ok from b"})
    assert status == 200 and body["status"] == "approved"
    answer = await agent
    assert answer.choices[0].message.content == "the real answer, via replica a"
    assert len(fake.calls(CHAT)) == 6
    status, body = await decide(a, approval["id"], {"decision": "deny"})  # decided: on every replica
    assert status == 409
    assert [x["status"] for x in await listed(a, decided=True)] == ["approved"]


async def test_denied_on_the_other_replica(
    start_tripwire: StartTripwire, fake_upstream: tuple[FakeUpstream, str], redis_url: str
) -> None:
    fake, url = fake_upstream
    loop_then(fake, 5, "never sent")
    a, b = await two_replicas(start_tripwire, url, redis_url)
    agent = asyncio.create_task(agent_loop(a.url))
    (approval,) = await until(lambda: listed(b), "the approval listed on replica b")
    status, _ = await decide(b, approval["id"], {"decision": "deny", "note": "not today"})
    assert status == 200
    answer = await agent
    assert "not today" in answer.choices[0].message.content
    assert len(fake.calls(CHAT)) == 5


async def test_a_replica_that_stops_beating_has_its_approvals_abandoned(
    start_tripwire: StartTripwire, fake_upstream: tuple[FakeUpstream, str], redis_url: str
) -> None:
    fake, url = fake_upstream
    loop_then(fake, 5, "never sent")
    a, b = await two_replicas(start_tripwire, url, redis_url)
    agent = asyncio.create_task(agent_loop(a.url))
    (approval,) = await until(lambda: listed(b), "the approval listed on replica b")
    # replica a "dies": its heartbeat stops (its process would take its clients' connections along)
    book = a.engine.approvals.book
    for task in book._tasks:  # type: ignore[attr-defined]
        task.cancel()

    async def abandoned() -> bool:
        return [x["status"] for x in await listed(b, decided=True)] == ["abandoned"]

    await until(abandoned, "replica b marks the approval abandoned")
    status, body = await decide(b, approval["id"], {"decision": "approve"})
    assert status == 409 and "abandoned" in body["detail"]
    agent.cancel()
    await asyncio.gather(agent, return_exceptions=True)
    assert len(fake.calls(CHAT)) == 5
