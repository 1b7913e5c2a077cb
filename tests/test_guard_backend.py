"""`proxy/guard_backend/` alone: the engine chooses one backend at start; the local one judges a
call with the session's own guards (a session ended meanwhile is refused without reading the call);
the shared one puts the call's check into the run's guard log and, after the answer, its settle."""

from __future__ import annotations

import time

import pytest

from proxy.constants import GUARD_CONCURRENT_CALLS
from proxy.engine import Engine
from proxy.exchange import Exchange
from proxy.guard_backend import (
    CallInputs,
    GuardBackend,
    LocalGuardBackend,
    SharedGuardBackend,
    guard_backend_for,
)
from proxy.guard_log import entries
from proxy.guard_log.service import SharedState
from proxy.stages.guards import call_inputs
from proxy.stages.llm_parse import LLMParseStage
from proxy.stages.session import SessionStage
from proxy.state.memory import MemoryBackend
from proxy.state.redis_backend import RedisBackend
from tests.factories import EngineFactory, chat_request, make_exchange


async def admitted_call(engine: Engine) -> Exchange:
    ex = make_exchange(body=chat_request(), engine=engine, headers={"X-Tripwire-Session": "s1"})
    await LLMParseStage(engine.services).request(ex)
    await SessionStage(engine.services).request(ex)
    assert ex.session is not None
    return ex


async def test_the_engine_chooses_one_backend_at_start(engine: Engine) -> None:
    assert isinstance(engine.guards, LocalGuardBackend) and engine.shared is None
    shared = SharedState(engine.settings, engine.guard_store, engine.metrics, backend=MemoryBackend())
    assert isinstance(guard_backend_for(shared, engine.guard_store), SharedGuardBackend)
    assert isinstance(guard_backend_for(None, engine.guard_store), LocalGuardBackend)


async def test_the_local_backend_judges_with_the_sessions_guards(engine: Engine) -> None:
    ex = await admitted_call(engine)
    admitted = await engine.guards.admit(ex, lambda: call_inputs(ex, 0.0, False), time.monotonic())
    assert ex.session is not None and admitted.guards is ex.session.guards
    assert admitted.verdict is not None and not admitted.verdict.refused
    assert admitted.ended is None and admitted.taken is None and not admitted.record_results


async def test_a_session_ended_before_its_call_is_judged_is_refused_without_reading_the_call(
    engine: Engine,
) -> None:
    ex = await admitted_call(engine)
    assert ex.session is not None
    engine.policy.terminate(ex.session, reason="guard:test")
    read: list[bool] = []

    def inputs() -> CallInputs:
        read.append(True)
        return call_inputs(ex, 0.0, False)

    admitted = await engine.guards.admit(ex, inputs, time.monotonic())
    assert admitted.ended is not None and admitted.verdict is None and not admitted.elsewhere
    assert read == []


async def test_the_shared_backend_logs_the_check_and_then_its_settle(engine: Engine) -> None:
    memory = MemoryBackend()
    state = SharedState(engine.settings, engine.guard_store, engine.metrics, backend=memory)
    backend = SharedGuardBackend(state)
    try:
        ex = await admitted_call(engine)
        session = ex.session
        assert session is not None
        admitted = await backend.admit(ex, lambda: call_inputs(ex, 0.01, False), time.monotonic())
        assert admitted.verdict is not None and not admitted.verdict.refused
        assert admitted.taken == [] and ex.shared_check is not None  # the round trip took no results
        await backend.settle(ex, lambda *_: None)  # never forwarded: its reservation is released
        await state.guards.flush()
        log = [entries.decode(e.body) for e in await memory.read(session.agent, session.run_id, since=0)]
        check, release = log
        assert isinstance(check, entries.LlmCheck) and check.check == ex.shared_check
        assert check.estimate_usd == 0.01
        assert isinstance(release, entries.Release) and release.ref == ex.shared_check
    finally:
        await state.close()


@pytest.mark.parametrize("where", ["local", "shared-memory", "shared-redis"])
async def test_every_backend_asks_the_admission_s_gates_alike(
    engine_factory: EngineFactory, request: pytest.FixtureRequest, where: str
) -> None:
    """The concurrent-calls gate (proxy/admission/) through each backend: a call holds a slot until
    it ends, a second one meanwhile is refused before any session guard sees it, the slot comes back
    at the end (`release`), however the backend keeps it."""
    engine = await engine_factory(guards={"max_concurrent_calls": 1})
    state = None
    backend: GuardBackend = engine.guards
    if where != "local":
        store = (
            MemoryBackend()
            if where == "shared-memory"
            else RedisBackend(request.getfixturevalue("redis_url"))
        )
        state = SharedState(engine.settings, engine.guard_store, engine.metrics, backend=store)
        backend = SharedGuardBackend(state)
    try:
        first, second, third = [await admitted_call(engine) for _ in range(3)]
        one = await backend.admit(first, lambda: call_inputs(first, 0.0, False), time.monotonic())
        assert one.refused is None and one.verdict is not None and len(first.admission_holds) == 1
        two = await backend.admit(second, lambda: call_inputs(second, 0.0, False), time.monotonic())
        assert two.refused is not None and two.verdict is None and second.admission_holds == ()
        assert two.refused.guard == GUARD_CONCURRENT_CALLS and two.refused.retry_after == 1.0
        await backend.release(first)
        assert first.admission_holds == ()
        three = await backend.admit(third, lambda: call_inputs(third, 0.0, False), time.monotonic())
        assert three.refused is None
    finally:
        if state is not None:
            await state.close()
