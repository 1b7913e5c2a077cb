"""Admission as one ordered list (proxy/admission/): the list itself, and the backend contract of
the checks' shared-state twins, run on the memory backend and on a real Redis (the same cases).

The concurrent-calls check is the acceptance case of issue 30: one folder, one line in the list,
and here its twin on both backends (inside the APPEND, before the check goes in; released by its
own operation; a lease that ends a slot a dead replica never gave back).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from proxy.admission import ADMISSION, GATES, TWINS, Stores
from proxy.admission.concurrent_calls import rule
from proxy.admission.concurrent_calls.twin import RELEASE, TWIN, InFlight
from proxy.admission.rate_limit.twin import TWIN as RATES
from proxy.admission.rate_limit.twin import RateRequest
from proxy.constants import GUARD_CONCURRENT_CALLS, RETRYABLE_GUARDS
from proxy.guards.config import GuardConfig
from proxy.guards.rate_limit import rules_for
from proxy.state import keys, lua
from proxy.state.base import Append, CheckAsk, StateBackend
from proxy.state.memory import MemoryBackend
from proxy.state.redis_backend import RedisBackend

AGENT = "agent:with:colons"
KEY = keys.concurrent(AGENT)


@pytest.fixture(params=["memory", "redis"])
async def backend(request: pytest.FixtureRequest) -> AsyncIterator[StateBackend]:
    if request.param == "memory":
        yield MemoryBackend()
        return
    b = RedisBackend(request.getfixturevalue("redis_url"), twins=TWINS)
    try:
        yield b
    finally:
        await b.close()


def in_flight(member: str, limit: int = 2, lease_s: float = rule.LEASE_S) -> CheckAsk:
    return CheckAsk(TWIN, 1, InFlight(KEY, limit, member, lease_s))


async def admit(
    backend: StateBackend, member: str, *, since: int, limit: int = 2, lease_s: float = 60
) -> bool:
    """One check asking for a slot; True when it went into the log."""
    got = await backend.append(
        Append(
            AGENT, "run-1", [b'{"k":"c"}'], since=since, idle_s=60, checks=[in_flight(member, limit, lease_s)]
        )
    )
    refused, held = got.answers[0]
    assert refused == (1 in got.refused)
    assert [e.body for e in got.entries][-1:] == ([] if refused else [b'{"k":"c"}'])
    return not refused


def test_the_list_is_the_order_and_every_refusal_says_whether_to_retry() -> None:
    assert [c.name for c in ADMISSION] == [
        "concurrent_calls",
        "rate_limit",
        "permissions",
        "session_guards",
        "budget_window",
        "breaker",
    ]
    assert [name for name, _ in GATES] == ["concurrent_calls", "rate_limit"]
    for check in ADMISSION:
        for refusal in check.refusals:
            # what the answer renders (429 + Retry-After) and replay (decided again or not) read
            assert refusal.retryable == (refusal.code in RETRYABLE_GUARDS), refusal
    # the APPEND script is assembled from each twin's fragment, in the list's order
    script = lua.append_script([t.lua for t in TWINS])
    positions = [script.index(f"CHECKS.{t.name} = function") for t in TWINS]
    assert positions == sorted(positions) and [t.name for t in TWINS] == [
        "concurrent_calls",
        "rate_limit",
        "budget_window",
        "breaker",
    ]


def test_the_config_is_validated() -> None:
    assert GuardConfig.model_validate({"max_concurrent_calls": 3}).max_concurrent_calls == 3
    for bad in (0, -1, "many"):
        with pytest.raises(ValueError, match="max_concurrent_calls"):
            GuardConfig.model_validate({"max_concurrent_calls": bad})


async def test_calls_over_the_limit_are_refused_and_not_appended(backend: StateBackend) -> None:
    assert await admit(backend, "a", since=0)
    assert await admit(backend, "b", since=1)
    assert not await admit(backend, "c", since=2)  # two in flight: the third is refused
    # another agent counts its own
    other = InFlight(keys.concurrent("other"), 2, "x")
    got = await backend.append(
        Append("other", "run-2", [b"{}"], since=0, idle_s=60, checks=[CheckAsk(TWIN, 1, other)])
    )
    assert got.answers == [(False, 0)]
    # a call that ends gives its slot back: the next one goes through
    await backend.run(RELEASE, InFlight(KEY, 2, "a"))
    assert await admit(backend, "d", since=2)
    assert not await admit(backend, "e", since=3)


async def test_checks_of_one_append_see_each_other_and_a_refused_one_asks_no_later_gate(
    backend: StateBackend,
) -> None:
    config = GuardConfig.model_validate({"rate_limits": [{"match": "llm", "max_calls": 5, "per_s": 60}]})
    rules = rules_for(config.rate_limits, None)
    checks = []
    for n in range(1, 4):  # three checks, two slots: the third is refused before its rate limit
        checks += [
            CheckAsk(TWIN, n, InFlight(KEY, 2, f"m{n}")),
            CheckAsk(RATES, n, RateRequest(AGENT, f"m{n}", rules)),
        ]
    got = await backend.append(
        Append(AGENT, "run-1", [b'{"n":1}', b'{"n":2}', b'{"n":3}'], since=0, idle_s=60, checks=checks)
    )
    assert got.refused == {3}
    assert got.answers == [(False, 0), None, (False, 1), None, (True, 2), None]
    assert [e.body for e in got.entries] == [b'{"n":1}', b'{"n":2}']
    # the refused check took no rate slot: four more calls fit in the window of five
    (rate,) = [
        a
        for a in (
            await backend.append(
                Append(
                    AGENT,
                    "run-1",
                    [b"{}"],
                    since=2,
                    idle_s=60,
                    checks=[CheckAsk(RATES, 1, RateRequest(AGENT, "r", rules, (3,)))],
                )
            )
        ).answers
    ]
    assert rate is None


async def test_a_slot_whose_lease_ended_no_longer_counts(backend: StateBackend) -> None:
    # a replica that died with a call in flight never releases it: its lease ends it
    assert await admit(backend, "dead", since=0, limit=1, lease_s=0.2)
    since = 1
    for _ in range(200):
        got = await backend.append(
            Append(AGENT, "run-1", [b"{}"], since=since, idle_s=60, checks=[in_flight("next", 1, 60)])
        )
        since += len(got.entries)
        if not got.answers[0][0]:
            break
        await asyncio.sleep(0.02)
    else:
        pytest.fail("the lease never ended")


def test_the_local_store_applies_the_same_rule() -> None:
    stores = Stores()
    request = InFlight(KEY, 1, "a")
    assert TWIN.memory(stores, request, 10.0) == (False, (False, 0))
    refused, answer = TWIN.memory(stores, InFlight(KEY, 1, "b"), 11.0)
    assert refused
    decision = GATES[0][1].refusal(InFlight(KEY, 1, "b"), answer)
    assert decision.guard == GUARD_CONCURRENT_CALLS and decision.retry_after and decision.actual == 1
    RELEASE.memory(stores, request, 12.0)
    assert TWIN.memory(stores, InFlight(KEY, 1, "b"), 12.0)[0] is False
    GATES[0][1].sweep(stores.store("concurrent_calls"), 12.0 + rule.LEASE_S)  # idle agents: no memory
    assert stores.store("concurrent_calls") == {}
