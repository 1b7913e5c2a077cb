"""`SessionStage` alone: a parsed call is attached to its session (the run starts on its first
call), a terminated session refuses in the call's own protocol, `inflight` counts the call while it
runs, and a Responses answer's id is remembered for the requests that continue it."""

from __future__ import annotations

from typing import Any

import orjson

from proxy.engine import Engine
from proxy.exchange import Exchange
from proxy.stages.llm_parse import LLMParseStage
from proxy.stages.session import SessionStage
from tests.factories import (
    CHAT,
    MESSAGES,
    RESPONSES,
    EngineFactory,
    anthropic_request,
    chat_request,
    kinds,
    make_exchange,
    make_session,
    play_upstream,
    read_events,
    responses_answer,
    responses_request,
)

EXPLICIT = "/agents/bot/sessions/s1"


async def parsed(
    engine: Engine, path: str, body: dict[str, Any], headers: dict[str, str] | None = None
) -> Exchange:
    ex = make_exchange("POST", path, headers, body, engine=engine)
    await LLMParseStage(engine.services).request(ex)
    assert ex.protocol is not None
    return ex


async def test_an_unparsed_call_opens_no_session(engine: Engine) -> None:
    ex = make_exchange("GET", "/v1/models", engine=engine)
    await SessionStage(engine.services).request(ex)
    assert ex.session is None and ex.answer is None
    assert engine.sessions.live() == []


async def test_the_first_call_starts_the_run_and_inflight_counts_the_call(engine: Engine) -> None:
    stage = SessionStage(engine.services)
    ex = await parsed(engine, EXPLICIT + CHAT, chat_request())
    await stage.request(ex)
    session = ex.session
    assert session is not None and session.agent == "bot" and session.session_id == "s1"
    assert session.explicit and session.inflight == 1
    seen = session.last_seen
    await stage.finish(ex)
    assert session.inflight == 0 and session.last_seen >= seen
    events = await read_events(engine, session.run_id)
    assert kinds(events) == ["RUN_START"]
    assert events[0]["payload"]["run_name"] == "weather in Paris?"  # what the run is about

    again = await parsed(engine, EXPLICIT + CHAT, chat_request())
    await stage.request(again)
    assert again.session is session and session.inflight == 1  # the same run, no second RUN_START
    await stage.finish(again)
    assert kinds(await read_events(engine, session.run_id)) == ["RUN_START"]


async def test_the_run_is_named_by_the_clients_title_or_else_the_users_ask(
    engine_factory: EngineFactory,
) -> None:
    """Issue 25: runs were all named `AGENT auto-337769a72f30`."""
    engine = await engine_factory()
    stage = SessionStage(engine.services)

    async def name_of(path: str, body: dict[str, Any], headers: dict[str, str] | None = None) -> str:
        ex = await parsed(engine, path, body, headers)
        await stage.request(ex)
        assert ex.session is not None
        await stage.finish(ex)
        (start,) = await read_events(engine, ex.session.run_id)
        assert start["name"] == start["payload"]["run_name"]
        return str(start["payload"]["run_name"])

    asked = [
        {"role": "user", "content": "Fix the failing test in tests/test_api.py and explain why it broke"}
    ]
    assert await name_of("/agents/a/sessions/1" + CHAT, chat_request(asked)) == (
        "Fix the failing test in tests/test_api.py and explain why…"
    )
    titled = {"X-Tripwire-Run-Name": "nightly eval #12"}
    assert await name_of("/agents/a/sessions/2" + CHAT, chat_request(asked), titled) == "nightly eval #12"
    # no conversation to read: the session's id, as before
    assert await name_of(
        "/agents/a/sessions/3" + CHAT, chat_request([{"role": "system", "content": "x"}])
    ) == ("a 3")
    quiet = await engine_factory(record_content=False)  # a prompt's words stay out of run.json
    quiet_stage = SessionStage(quiet.services)
    ex = await parsed(quiet, "/agents/q/sessions/1" + CHAT, chat_request(asked))
    await quiet_stage.request(ex)
    assert ex.session is not None
    await quiet_stage.finish(ex)
    (start,) = await read_events(quiet, ex.session.run_id)
    assert start["payload"]["run_name"] == "q 1"


async def test_a_terminated_session_refuses_in_the_protocols_shape(engine: Engine) -> None:
    session = make_session(engine, "bot", "s1")
    engine.policy.terminate(session, reason="guard:test", own_call=False)
    stage = SessionStage(engine.services)

    ex = await parsed(engine, EXPLICIT + CHAT, chat_request())
    await stage.request(ex)
    assert ex.session is None and session.inflight == 0
    assert ex.answer is not None and ex.answer.status == 429
    body = orjson.loads(ex.answer.body)
    assert body["error"]["code"] == "session_terminated"
    assert body["error"]["message"].startswith("[tripwire] refused")
    assert ex.answer.headers["X-Tripwire-Guard"] == "session_terminated"

    anthropic = await parsed(engine, EXPLICIT + MESSAGES, anthropic_request())
    await stage.request(anthropic)
    assert anthropic.answer is not None
    assert orjson.loads(anthropic.answer.body)["type"] == "error"  # Anthropic's own error shape
    await stage.finish(anthropic)  # nothing attached: nothing to count down
    assert session.inflight == 0


async def test_without_an_explicit_session_the_agents_automatic_run_is_used(engine: Engine) -> None:
    stage = SessionStage(engine.services)
    ex = await parsed(engine, "/agents/bot" + CHAT, chat_request())
    await stage.request(ex)
    assert ex.session is not None and not ex.session.explicit and ex.session.agent == "bot"
    await stage.finish(ex)


async def test_a_responses_answer_id_is_noted_for_the_call_that_continues_it(engine: Engine) -> None:
    stage = SessionStage(engine.services)
    ex = await parsed(engine, "/agents/bot" + RESPONSES, responses_request())
    await stage.request(ex)
    assert ex.session is not None
    play_upstream(ex, responses_answer(response_id="resp_first"))
    await stage.finish(ex)

    # a different conversation would start a new run; previous_response_id joins the first one
    follow = await parsed(
        engine, "/agents/bot" + RESPONSES, responses_request("more", previous_response_id="resp_first")
    )
    await stage.request(follow)
    assert follow.session is ex.session
    await stage.finish(follow)
