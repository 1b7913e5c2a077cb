"""`GuardStage` on an `Exchange`, without a server: a refusal sets `ex.answer` in the call's own
protocol and writes LOOP_WARNING + ERROR through the engine's recorder; a WARN on an MCP call
appends its text to the result; `finish` settles budgets and moves the circuit breaker.

The stages around it are the real ones (parse, session, record); `CannedUpstream` stands where
the forward stage stands.
"""

from __future__ import annotations

from typing import Any

import orjson

from proxy.engine import Engine
from proxy.exchange import Exchange
from proxy.pipeline import Pipeline
from proxy.stages.breaker import BreakerStage
from proxy.stages.guards import GuardStage
from proxy.stages.llm_parse import LLMParseStage
from proxy.stages.mcp_parse import MCPParseStage
from proxy.stages.record import RecordStage
from proxy.stages.session import SessionStage
from tests.factories import (
    CHAT,
    CannedUpstream,
    EngineFactory,
    chat_completion,
    chat_request,
    chat_tool_history,
    kinds,
    make_exchange,
    make_session,
    mcp_tool_result,
    mcp_tools_call,
    read_events,
    read_tripwire_json,
)

MCP_URL = "/agents/bot/sessions/s1/mcp/demo"
CHAT_URL = "/agents/bot/sessions/s1" + CHAT
DEMO = {"demo": {"url": "http://127.0.0.1:9/mcp"}}


def mcp_pipeline(engine: Engine, upstream: CannedUpstream) -> tuple[Pipeline, GuardStage]:
    guards = GuardStage(engine.services)
    stages = [
        MCPParseStage(engine.services),
        SessionStage(engine.services),
        guards,
        upstream,
        RecordStage(engine.services),
    ]
    return Pipeline(stages), guards  # type: ignore[list-item]


def llm_pipeline(engine: Engine, upstream: CannedUpstream) -> Pipeline:
    stages = [
        LLMParseStage(engine.services),
        SessionStage(engine.services),
        GuardStage(engine.services),
        BreakerStage(engine.services),
        upstream,
        RecordStage(engine.services),
    ]
    return Pipeline(stages)  # type: ignore[arg-type]


async def call_tool(engine: Engine, pipeline: Pipeline, msg_id: int, **kw: Any) -> Exchange:
    ex = make_exchange("POST", MCP_URL, body=mcp_tools_call(msg_id=msg_id, **kw), engine=engine)
    await pipeline.run(ex)
    return ex


async def test_a_repetition_under_block_answers_with_the_synthetic_result_and_writes_its_events(
    engine_factory: EngineFactory,
) -> None:
    engine = await engine_factory(mcp=DEMO, guards={"loop_detection": {"threshold": 3, "action": "block"}})
    upstream = CannedUpstream(mcp_tool_result(msg_id=1), mcp_tool_result(msg_id=2))
    pipeline, _ = mcp_pipeline(engine, upstream)
    first = await call_tool(engine, pipeline, 1)
    second = await call_tool(engine, pipeline, 2)
    assert first.answer is None and second.answer is None and upstream.calls == 2

    blocked = await call_tool(engine, pipeline, 3)
    assert upstream.calls == 2  # the upstream never saw the third call
    assert blocked.answer is not None and blocked.answer.status == 200
    assert blocked.answer.headers["X-Tripwire-Guard"] == blocked.decisions[0].guard
    message = orjson.loads(blocked.answer.body)
    assert message["id"] == 3 and message["result"]["isError"] is True
    assert message["result"]["content"][0]["text"].startswith("[tripwire] blocked")
    assert blocked.reservation is None and not blocked.forwarded

    session = blocked.session
    assert session is not None and not session.terminated  # BLOCK: the session goes on
    events = await read_events(engine, session.run_id)
    assert kinds(events)[:3] == ["RUN_START", "TOOL_CALL", "TOOL_CALL"]
    rest = events[3:]
    assert rest[0]["event_type"] == "LOOP_WARNING" and kinds(rest).count("ERROR") == 1
    assert "TOOL_CALL" not in kinds(rest)  # a refused call is no TOOL_CALL
    (error,) = [e for e in rest if e["event_type"] == "ERROR"]
    warnings = [e["event_id"] for e in rest if e["event_type"] == "LOOP_WARNING"]
    assert error["parent_id"] == blocked.guard_event_id in warnings  # the ERROR points at its LOOP_WARNING
    assert error["payload"]["call"]["tool_name"] == "echo"
    assert "loop_detected" in (await read_tripwire_json(engine, session.run_id))["health_tags"]


async def test_a_repetition_under_block_on_an_llm_call_answers_a_synthetic_completion(
    engine_factory: EngineFactory,
) -> None:
    engine = await engine_factory(guards={"loop_detection": {"threshold": 3, "action": "block"}})
    upstream = CannedUpstream(chat_completion())
    ex = make_exchange("POST", CHAT_URL, body=chat_request(chat_tool_history(3)), engine=engine)
    await llm_pipeline(engine, upstream).run(ex)
    assert upstream.calls == 0
    assert ex.answer is not None and ex.answer.status == 200
    completion = orjson.loads(ex.answer.body)
    assert completion["object"] == "chat.completion"
    assert completion["choices"][0]["message"]["content"].startswith("[tripwire]")
    assert ex.session is not None
    events = await read_events(engine, ex.session.run_id)
    assert "LOOP_WARNING" in kinds(events) and kinds(events)[-1] == "ERROR"
    assert "LLM_CALL" not in kinds(events)  # refused: the record stage writes no call


async def test_a_warn_on_an_mcp_call_lets_it_through_with_the_text_appended(
    engine_factory: EngineFactory,
) -> None:
    engine = await engine_factory(mcp=DEMO, guards={"loop_detection": {"threshold": 2, "action": "warn"}})
    upstream = CannedUpstream(mcp_tool_result(msg_id=1), mcp_tool_result(msg_id=2))
    pipeline, _ = mcp_pipeline(engine, upstream)
    first = await call_tool(engine, pipeline, 1)
    assert first.call.append_text is None
    warned = await call_tool(engine, pipeline, 2)
    assert warned.answer is None and upstream.calls == 2
    assert warned.call.append_text is not None and warned.call.append_text.startswith("[tripwire]")
    relayed = orjson.loads(upstream.passed_on)  # what the client got: the result plus one text block
    texts = [block["text"] for block in relayed["result"]["content"]]
    assert texts == ["again", warned.call.append_text]
    assert warned.session is not None
    events = await read_events(engine, warned.session.run_id)
    assert kinds(events).count("TOOL_CALL") == 2 and "LOOP_WARNING" in kinds(events)
    assert "ERROR" not in kinds(events)


async def test_finish_settles_the_budget_with_the_calls_cost(engine_factory: EngineFactory) -> None:
    engine = await engine_factory(
        pricing_table={"gpt-4o-mini": (1.0, 2.0)}, guards={"budget": {"max_cost_usd": 100}}
    )
    ex = make_exchange("POST", CHAT_URL, body=chat_request(), engine=engine)
    await llm_pipeline(
        engine, CannedUpstream(chat_completion(prompt_tokens=1000, completion_tokens=500))
    ).run(ex)
    session = ex.session
    assert session is not None and session.guards is not None
    budget = session.guards.stats()["budget"]
    assert budget["cost_usd"] == ex.cost_usd > 0
    assert budget["llm_calls"] == 1
    assert kinds(await read_events(engine, session.run_id)) == ["RUN_START", "LLM_CALL"]


async def test_finish_releases_what_a_refused_call_reserved(engine_factory: EngineFactory) -> None:
    engine = await engine_factory(guards={"limits": {"max_llm_calls": 1}})
    upstream = CannedUpstream(chat_completion())
    pipeline = llm_pipeline(engine, upstream)
    ok = make_exchange("POST", CHAT_URL, body=chat_request(), engine=engine)
    await pipeline.run(ok)
    refused = make_exchange("POST", CHAT_URL, body=chat_request(), engine=engine)
    await pipeline.run(refused)
    assert upstream.calls == 1
    assert refused.answer is not None and refused.answer.status == 429
    session = refused.session
    assert session is not None and session.terminated and session.ended  # limits end the session
    assert session.inflight == 0
    assert session.guards.stats()["budget"]["llm_calls"] == 1
    events = await read_events(engine, session.run_id)
    assert kinds(events)[-2:] == ["ERROR", "RUN_END"]


async def test_finish_moves_the_breaker_and_an_open_circuit_refuses(engine_factory: EngineFactory) -> None:
    engine = await engine_factory(
        guards={"circuit_breaker": {"open_after_failures": 1, "cooldown_seconds": 60}}
    )
    failing = CannedUpstream({"error": {"message": "boom"}}, status=500)
    pipeline = llm_pipeline(engine, failing)
    broke = make_exchange("POST", CHAT_URL, body=chat_request(), engine=engine)
    await pipeline.run(broke)
    assert broke.upstream_failed() and broke.breaker_ticket is not None
    breaker = engine.breakers.get("bot", "llm:default", engine.guard_config("bot").circuit_breaker)
    assert str(breaker.state) == "open"

    refused = make_exchange("POST", CHAT_URL, body=chat_request(), engine=engine)
    await pipeline.run(refused)
    assert failing.calls == 1
    assert refused.answer is not None and refused.answer.status == 429
    assert refused.answer.headers["X-Tripwire-Guard"] == "circuit_breaker"
    assert "Retry-After" in refused.answer.headers
    assert refused.session is not None
    events = await read_events(engine, refused.session.run_id)
    updates = [e for e in events if e["event_type"] == "STATE_UPDATE"]
    assert updates[0]["payload"]["diff"]["circuit_breaker"] == {"from": "closed", "to": "open"}
    assert kinds(events)[-1] == "ERROR"


async def test_no_protocol_or_no_session_means_nothing_to_judge(engine_factory: EngineFactory) -> None:
    engine = await engine_factory()
    stage = GuardStage(engine.services)
    unparsed = make_exchange("GET", "/v1/models", engine=engine)
    await stage.request(unparsed)
    await stage.finish(unparsed)
    assert unparsed.answer is None and unparsed.decisions == []

    ex = make_exchange("POST", CHAT_URL, body=chat_request(), engine=engine)
    await LLMParseStage(engine.services).request(ex)  # parsed, but no session attached
    await stage.request(ex)
    assert ex.answer is None and ex.guard_trace is None


async def test_finish_ends_a_terminated_run_once_its_last_call_is_done(engine_factory: EngineFactory) -> None:
    engine = await engine_factory()
    session = make_session(engine, "bot", "s1")
    session.inflight = 2  # this call and another one in flight
    engine.policy.terminate(session, reason="guard:test", own_call=True)
    assert session.terminated and not session.ended  # RUN_END waits for the other call
    stage = GuardStage(engine.services)
    ex = make_exchange("POST", CHAT_URL, body=chat_request(), engine=engine)
    ex.session = session
    await stage.finish(ex)  # (its own call is still counted in flight: the session stage finishes later)
    assert not session.ended
    session.inflight = 1  # the other call is done
    await stage.finish(ex)
    assert session.ended
    events = await read_events(engine, session.run_id)
    assert events[-1]["event_type"] == "RUN_END"
