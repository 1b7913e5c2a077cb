"""Three replicas' shared session guards over one real Redis: limits hold across them, and the
failure policy holds when Redis stops mid-run and recovers when it comes back."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from proxy.guard_log import entries
from proxy.guard_log.channel import Admission, SharedGuards
from proxy.guard_log.configs import SharedConfigs
from proxy.guards.config import GuardConfig
from proxy.guards.decision import Action
from proxy.state.base import StateUnavailable
from proxy.state.link import Policy, StateLink
from proxy.state.redis_backend import RedisBackend
from tests.redis_server import RedisServer

AGENT = "research-agent"
RUN = "6f1f5b8e-3c1d-4a51-9f43-2d7c0f1e9a10"
LIMIT_20 = GuardConfig.model_validate({"limits": {"max_llm_calls": 20}})
WAIT_S = 20.0  # generous bound on conditions waited for (a busy 2-core machine)


def replica(url: str, config: GuardConfig, policy: Policy = "fail_open") -> SharedGuards:
    backend = RedisBackend(url)
    return SharedGuards(
        StateLink(backend, policy, probe_interval_s=0.05), SharedConfigs(backend, config), idle_s=300
    )


@pytest.fixture
async def replicas_factory() -> AsyncIterator[Callable[..., list[SharedGuards]]]:
    made: list[SharedGuards] = []

    def make(url: str, config: GuardConfig, n: int = 3, policy: Policy = "fail_open") -> list[SharedGuards]:
        out = [replica(url, config, policy) for _ in range(n)]
        made.extend(out)
        return out

    yield make
    for r in made:
        await r.close()
        await r.link.close()


async def until(condition: Callable[[], Awaitable[bool]], what: str) -> None:
    deadline = asyncio.get_running_loop().time() + WAIT_S
    while not await condition():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


def admitted(a: Admission) -> bool:
    return a.applied.verdict is not None and not a.applied.verdict.refused


async def llm_call(r: SharedGuards, cost: float = 0.0, tokens: int = 0) -> Admission:
    ch = r.channel(AGENT, RUN)
    cid = entries.check_id()
    got = await ch.admit(entries.llm_check(cid, [], 0, {}, 0.001, 10))
    if admitted(got):
        ch.queue([entries.settle_llm(cid, cost, tokens)])
    return got


async def test_fifty_concurrent_calls_over_three_replicas_never_exceed_twenty(
    redis_url: str, replicas_factory: Callable[..., list[SharedGuards]]
) -> None:
    replicas = replicas_factory(redis_url, LIMIT_20)
    got = await asyncio.gather(
        *(
            replicas[i % 3]
            .channel(AGENT, RUN)
            .admit(entries.llm_check(entries.check_id(), [], 0, {}, 0.0, 0))
            for i in range(50)
        )
    )
    assert sum(admitted(a) for a in got) == 20
    assert all(a.shared for a in got)
    # every replica agrees on which calls went through (same log, same order, same decisions)
    for r in replicas:
        await r.channel(AGENT, RUN).admit(entries.llm_check(entries.check_id(), [], 0, {}, 0.0, 0))
    seen = [r.channel(AGENT, RUN).replica.guards for r in replicas]
    assert all(g is not None for g in seen)
    assert len({(g.calls_seen, g.budget.stats()["in_flight"]["llm"]) for g in seen if g is not None}) == 1


async def test_round_robin_calls_stop_at_exactly_the_limit(
    redis_url: str, replicas_factory: Callable[..., list[SharedGuards]]
) -> None:
    config = GuardConfig.model_validate({"limits": {"max_llm_calls": 10}})
    replicas = replicas_factory(redis_url, config)
    outcomes = []
    for i in range(14):
        got = await llm_call(replicas[i % 3])
        outcomes.append(admitted(got))
        await replicas[i % 3].flush()
    assert outcomes == [True] * 10 + [False] * 4
    last = replicas[13 % 3].channel(AGENT, RUN)
    ended = await last.admit(entries.llm_check(entries.check_id(), [], 0, {}, 0.0, 0))
    assert ended.applied.ended_by is not None and ended.applied.ended_by.guard == "max_llm_calls"


async def test_a_budget_trips_at_the_same_call_as_one_process(
    redis_url: str, replicas_factory: Callable[..., list[SharedGuards]]
) -> None:
    config = GuardConfig.model_validate({"budget": {"max_cost_usd": 0.05}})
    shared = replicas_factory(redis_url, config)
    alone = replicas_factory(redis_url, config, n=1)[0]

    async def first_refused(replicas: list[SharedGuards], run: str) -> int:
        for i in range(1, 40):
            r = replicas[i % len(replicas)]
            ch = r.channel(AGENT, run)
            cid = entries.check_id()
            got = await ch.admit(entries.llm_check(cid, [], 0, {}, 0.002, 0))
            if not admitted(got):
                assert got.applied.verdict is not None
                assert got.applied.verdict.decision.guard == "max_cost_usd"
                return i
            ch.queue([entries.settle_llm(cid, 0.007, 100)])
            await r.flush()  # the answer's settle lands before the next call (see docs: the race)
        raise AssertionError("the budget never tripped")

    assert await first_refused(shared, "run-shared") == await first_refused([alone], "run-alone") == 9


async def test_a_loop_is_caught_at_the_same_call(
    redis_url: str, replicas_factory: Callable[..., list[SharedGuards]]
) -> None:
    config = GuardConfig.model_validate({"loop_detection": {"threshold": 4, "action": "block"}})

    async def first_blocked(replicas: list[SharedGuards], run: str) -> int:
        for i in range(1, 20):
            r = replicas[i % len(replicas)]
            ch = r.channel(AGENT, run)
            cid = entries.check_id()
            got = await ch.admit(entries.tool_check(cid, "search", {"q": "same"}, "docs", 0.0))
            assert got.applied.verdict is not None
            if got.applied.verdict.decision.action >= Action.BLOCK:
                assert got.applied.verdict.decision.kind is not None
                return i
            ch.queue([entries.settle_tool(cid, "same-result", None)])
            await r.flush()
        raise AssertionError("the loop was never caught")

    shared = replicas_factory(redis_url, config)
    alone = replicas_factory(redis_url, config, n=1)
    assert await first_blocked(shared, "run-loop-shared") == await first_blocked(alone, "run-loop-alone")


async def test_a_config_put_on_one_replica_applies_on_all_at_the_next_call(
    redis_url: str, replicas_factory: Callable[..., list[SharedGuards]]
) -> None:
    replicas = replicas_factory(redis_url, GuardConfig())
    for r in replicas:
        assert admitted(await llm_call(r))
        await r.flush()
    strict = GuardConfig.model_validate({"limits": {"max_llm_calls": 3}})
    await replicas[0].configs.publish(strict, {})
    got = await llm_call(replicas[2])  # the 4th call, on a replica that never saw the PUT
    assert got.applied.verdict is not None and got.applied.verdict.decision.guard == "max_llm_calls"


async def test_redis_stopped_mid_run_fail_open_guards_locally_and_recovers(
    own_redis: RedisServer, replicas_factory: Callable[..., list[SharedGuards]]
) -> None:
    config = GuardConfig.model_validate({"limits": {"max_llm_calls": 6}})
    a, b = replicas_factory(own_redis.url, config, n=2)
    for r in (a, b, a):
        assert admitted(await llm_call(r))
        await r.flush()
    own_redis.stop()  # and it comes back empty: it persists nothing
    # fail_open: calls go on, judged from this replica's memory (3 calls so far)
    for _ in range(2):
        during = await llm_call(a)
        assert admitted(during) and not during.shared
    assert not a.link.up and a.link.health()["up"] is False
    assert a.link.health()["calls_while_down"] >= 1
    own_redis.start()
    await until(lambda: asyncio.sleep(0, a.link.up), "replica a to see Redis back")
    await a.flush()  # a puts the run's log back, with the 2 calls it served meanwhile
    assert await a.backend.read(AGENT, RUN, since=0)
    sixth = await llm_call(b)
    assert admitted(sixth) and sixth.shared
    assert sixth.applied.verdict is not None and sixth.applied.verdict.call_seq == 6
    await b.flush()
    seventh = await llm_call(a)
    assert seventh.shared and not admitted(seventh)
    assert seventh.applied.verdict is not None and seventh.applied.verdict.decision.guard == "max_llm_calls"


async def test_redis_stopped_mid_run_fail_closed_refuses_and_recovers(
    own_redis: RedisServer, replicas_factory: Callable[..., list[SharedGuards]]
) -> None:
    (a,) = replicas_factory(own_redis.url, GuardConfig(), n=1, policy="fail_closed")
    assert admitted(await llm_call(a))
    await a.flush()
    own_redis.stop()
    with pytest.raises(StateUnavailable):
        await llm_call(a)
    with pytest.raises(StateUnavailable):  # while down, refused at once (no round trip tried)
        await llm_call(a)
    assert a.link.calls_while_down >= 1 and a.link.retry_after_s() >= 1
    own_redis.start()
    await until(lambda: asyncio.sleep(0, a.link.up), "the replica to see Redis back")
    got = await llm_call(a)
    assert admitted(got) and got.shared
    await a.flush()
    guards = a.channel(AGENT, RUN).replica.guards
    assert guards is not None and guards.budget.llm_calls == 2  # the refused calls never counted
