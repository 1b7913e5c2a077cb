"""`BreakerStage` alone, without a server (SPEC §5.3): a failure opens the circuit, an open circuit
refuses the next call before it is forwarded and gives the guards' reservation back, a call that never
reached the upstream is released, not counted as a failure, and calls no guard judged have no breaker."""

from __future__ import annotations

from proxy.stages.breaker import BreakerStage
from proxy.stages.guards import GuardStage
from proxy.stages.llm_parse import LLMParseStage
from proxy.stages.session import SessionStage
from tests.factories import EngineFactory, chat_request, make_exchange, read_events

CHAT_URL = "/agents/bot/sessions/s1/v1/chat/completions"
BREAKER = {"circuit_breaker": {"open_after_failures": 1, "cooldown_seconds": 60, "half_open_max_calls": 1}}


async def judged(engine, stages):  # type: ignore[no-untyped-def]
    ex = make_exchange("POST", CHAT_URL, body=chat_request(), engine=engine)
    for stage in stages:
        await stage.request(ex)
        if ex.answer is not None:
            break
    return ex


async def test_a_failure_opens_the_circuit_and_the_next_call_is_refused(
    engine_factory: EngineFactory,
) -> None:
    engine = await engine_factory(guards=BREAKER)
    stages = [
        LLMParseStage(engine.services),
        SessionStage(engine.services),
        GuardStage(engine.services),
        BreakerStage(engine.services),
    ]
    breaker_stage = stages[-1]
    first = await judged(engine, stages)
    assert first.answer is None and first.breaker_ticket is not None
    first.forwarded, first.upstream_status = True, 503  # what ForwardStage would leave
    await breaker_stage.finish(first)
    breaker = engine.breakers.get("bot", "llm:default", engine.guard_config("bot").circuit_breaker)
    assert str(breaker.state) == "open"
    assert first.breaker_ticket.breaker is breaker  # the answer went back to the circuit that admitted it

    refused = await judged(engine, stages)
    assert refused.answer is not None and refused.answer.status == 429
    assert refused.answer.headers["X-Tripwire-Guard"] == "circuit_breaker"
    assert refused.reservation is None  # the guards' reservation went back
    assert refused.guard_trace is not None and refused.guard_trace.fields["breaker"] is True
    assert refused.session is not None
    events = await read_events(engine, refused.session.run_id)
    assert [e["payload"].get("guardrail") for e in events if e["event_type"] == "ERROR"] == [
        "circuit_breaker"
    ]
    assert [
        e["payload"]["diff"]["circuit_breaker"]["to"] for e in events if e["event_type"] == "STATE_UPDATE"
    ] == ["open"]


async def test_a_call_that_never_reached_the_upstream_gives_its_trial_back(
    engine_factory: EngineFactory,
) -> None:
    engine = await engine_factory(guards=BREAKER)
    stages = [
        LLMParseStage(engine.services),
        SessionStage(engine.services),
        GuardStage(engine.services),
        BreakerStage(engine.services),
    ]
    ex = await judged(engine, stages)
    assert ex.breaker_ticket is not None
    await stages[-1].finish(ex)  # not forwarded (e.g. a connect error before any byte)
    breaker = engine.breakers.get("bot", "llm:default", engine.guard_config("bot").circuit_breaker)
    assert str(breaker.state) == "closed"
    again = await judged(engine, stages)
    assert again.answer is None  # nothing was counted against it


async def test_calls_no_guard_judged_have_no_breaker(engine_factory: EngineFactory) -> None:
    engine = await engine_factory(guards=BREAKER)
    unparsed = make_exchange("GET", "/v1/models", engine=engine)
    stage = BreakerStage(engine.services)
    await stage.request(unparsed)
    await stage.finish(unparsed)
    assert unparsed.breaker_ticket is None and unparsed.answer is None
