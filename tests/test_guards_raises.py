"""Raising a session's budgets and limits (proxy/guards/raises.py, SPEC §5.5a): only budget and
limit keys, never to a value the session has already reached; the raise applies from the next call,
outlives a config change, and replicas and replay apply it where it stands in the run."""

from __future__ import annotations

import time

import pytest

from proxy.guard_backend import SharedGuardBackend
from proxy.guard_log import entries
from proxy.guard_log.service import SharedState
from proxy.guards.config import GuardConfig
from proxy.guards.raises import RAISABLE, RaiseError, raised_sections, validate_raise
from proxy.guards.session import SessionGuards
from proxy.state.memory import MemoryBackend
from tests.factories import EngineFactory, read_events
from tests.test_guard_backend import admitted_call
from tests.test_state_replica import Log

LIMITED = GuardConfig.model_validate(
    {
        "budget": {"max_cost_usd": 0.05, "max_tokens": 1000, "max_wall_time_seconds": 600},
        "limits": {"max_llm_calls": 2, "max_tool_calls": 5, "max_events": 100, "max_duration_s": 600},
        "loop_detection": {"max_steps": 5},
    }
)


def spent_guards(calls: int = 2, cost: float = 0.02) -> SessionGuards:
    guards = SessionGuards(LIMITED, started_at=0.0)
    for _ in range(calls):
        verdict = guards.before_llm_call([], 0, {}, estimate_usd=0.0, now=1.0)
        guards.after_llm_call(verdict.reservation, cost_usd=cost, tokens=100, now=1.0)
    return guards


@pytest.mark.parametrize(
    ("raised", "says"),
    [
        ({"soft_alert_threshold_usd": 1.0}, "not a budget or limit key"),
        ({"threshold": 9}, "not a budget or limit key"),
        ({}, "non-empty object"),
        ([1], "non-empty object"),
        ({"max_cost_usd": "1"}, "positive number"),
        ({"max_cost_usd": True}, "positive number"),
        ({"max_cost_usd": -1}, "positive number"),
        ({"max_llm_calls": 2.5}, "whole number"),
        ({"max_cost_usd": 0.04}, "not above the session's 0.04 USD spent"),
        ({"max_llm_calls": 2}, "max_llm_calls 2 is not above the session's 2 LLM calls so far"),
        ({"max_tokens": 200}, "200 tokens used"),
    ],
)
def test_a_raise_names_only_budgets_and_limits_above_what_is_spent(raised: object, says: str) -> None:
    guards = spent_guards()
    with pytest.raises(RaiseError, match=says):
        validate_raise(raised, guards.config, guards.budget, 2.0)


def test_a_limit_the_session_does_not_have_cannot_be_raised() -> None:
    guards = SessionGuards(GuardConfig(), started_at=0.0)
    with pytest.raises(RaiseError, match="no max_cost_usd limit"):
        validate_raise({"max_cost_usd": 1.0}, guards.config, guards.budget, 0.0)


def test_every_raisable_key_is_a_limit_the_config_has() -> None:
    for key in RAISABLE:
        guards = SessionGuards(LIMITED, started_at=0.0)
        assert validate_raise({key: 10_000}, guards.config, guards.budget, 1.0) == {key: 10_000}


def test_a_raise_lets_the_session_go_on_to_the_new_limit_from_its_next_call() -> None:
    guards = spent_guards()
    refused = guards.before_llm_call([], 0, {}, estimate_usd=0.0, now=2.0)
    assert refused.refused and refused.decision.guard == "max_llm_calls"
    guards.raise_limits(validate_raise({"max_llm_calls": 4}, guards.config, guards.budget, 2.0))
    for _ in range(2):
        verdict = guards.before_llm_call([], 0, {}, estimate_usd=0.0, now=2.0)
        assert not verdict.refused
        guards.after_llm_call(verdict.reservation, cost_usd=0.001, tokens=1, now=2.0)
    fifth = guards.before_llm_call([], 0, {}, estimate_usd=0.0, now=2.0)
    assert fifth.refused and fifth.decision.threshold == 4
    assert guards.stats()["raised"] == {"max_llm_calls": 4}


def test_a_raise_outlives_a_config_change_and_never_lowers_a_limit() -> None:
    guards = spent_guards()
    guards.raise_limits({"max_llm_calls": 4, "max_cost_usd": 0.5})
    # the admin API changes another key: the raise stays
    guards.configure(
        LIMITED.model_copy(update={"limits": LIMITED.limits.model_copy(update={"max_events": 99})})
    )
    assert guards.budget.limits.max_llm_calls == 4 and guards.budget.limits.max_events == 99
    # a config with a higher limit wins; a raise below the config's value changes nothing
    higher = LIMITED.model_copy(update={"limits": LIMITED.limits.model_copy(update={"max_llm_calls": 10})})
    guards.configure(higher)
    assert guards.budget.limits.max_llm_calls == 10
    budget, limits, max_steps = raised_sections(LIMITED, {"max_tokens": 10, "max_steps": 9})
    assert budget.max_tokens == 1000 and max_steps == 9 and isinstance(max_steps, int)


def test_replicas_apply_a_raise_in_log_order() -> None:
    config = GuardConfig.model_validate({"limits": {"max_llm_calls": 1}})
    log = Log(config)
    replica = log.replica()
    one = replica.apply(log.add(entries.llm_check(entries.check_id(), [], 0, {}, 0.0, 0)))
    replica.apply(log.add(entries.settle_llm(str(entries.decode(log.items[0].body).check), 0.0, 0)))
    raised = replica.apply(log.add(entries.raise_limits({"max_llm_calls": 2})))
    two = replica.apply(log.add(entries.llm_check(entries.check_id(), [], 0, {}, 0.0, 0)))
    three = replica.apply(log.add(entries.llm_check(entries.check_id(), [], 0, {}, 0.0, 0)))
    assert one and one.verdict and not one.verdict.refused
    assert raised is not None and raised.kind == "raise"
    assert two and two.verdict and not two.verdict.refused
    assert three and three.verdict and three.verdict.refused
    decoded = entries.decode(entries.raise_limits({"max_cost_usd": 1.5}))
    assert isinstance(decoded, entries.RaiseLimits) and decoded.values == {"max_cost_usd": 1.5}


async def test_the_local_backend_raises_the_live_session_and_records_it(
    engine_factory: EngineFactory,
) -> None:
    engine = await engine_factory(guards={"limits": {"max_llm_calls": 1}})
    ex = await admitted_call(engine)
    session = ex.session
    assert session is not None
    with pytest.raises(RaiseError, match="max_steps"):
        await engine.policy.raise_limits(session, {"max_steps": 3})  # no such limit set
    assert await engine.policy.raise_limits(session, {"max_llm_calls": 3}, by="alice") == {"max_llm_calls": 3}
    assert session.guards is not None and session.guards.budget.limits.max_llm_calls == 3
    updates = [e for e in await read_events(engine, session.run_id) if e["event_type"] == "STATE_UPDATE"]
    assert [u["name"] for u in updates] == ["limits_raised"]
    payload = updates[0]["payload"]
    assert payload["raised"] == {"max_llm_calls": 3} and payload["by"] == "alice"
    assert payload["diff"] == {"max_llm_calls": {"from": 1, "to": 3}}


async def test_the_shared_backend_appends_the_raise_for_every_replica(engine_factory: EngineFactory) -> None:
    engine = await engine_factory(guards={"budget": {"max_cost_usd": 0.1}})
    memory = MemoryBackend()
    state = SharedState(engine.settings, engine.guard_store, engine.metrics, backend=memory)
    backend = SharedGuardBackend(state)
    try:
        ex = await admitted_call(engine)
        session = ex.session
        assert session is not None
        with pytest.raises(RaiseError, match="max_tokens"):
            await backend.raise_limits(session, {"max_tokens": 10}, time.monotonic())  # not set
        assert await backend.raise_limits(session, {"max_cost_usd": 1}, time.monotonic()) == {
            "max_cost_usd": 1.0
        }
        log = [entries.decode(e.body) for e in await memory.read(session.agent, session.run_id, since=0)]
        assert log == [entries.RaiseLimits(values={"max_cost_usd": 1.0})]
        # another replica's copy of the run: the raise applies there too
        other = SharedState(engine.settings, engine.guard_store, engine.metrics, backend=memory)
        try:
            channel = other.guards.channel(session.agent, session.run_id)
            for entry in await memory.read(session.agent, session.run_id, since=0):
                channel.replica.apply(entry)
            assert channel.replica.guards is not None
            assert channel.replica.guards.budget.budget.max_cost_usd == 1.0
        finally:
            await other.close()
    finally:
        await state.close()
