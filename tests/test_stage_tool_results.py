"""`ToolResultsStage` alone: a function-calling result a request brings completes the call an
earlier answer asked for: one TOOL_CALL (child of that LLM_CALL), written before the guards judge the
request and seen by them; a result for no call Tripwire saw asked for, or brought again, writes nothing."""

from __future__ import annotations

from typing import Any

import orjson

from proxy.engine import Engine
from proxy.exchange import Exchange
from proxy.stages.llm_parse import LLMParseStage
from proxy.stages.record import RecordStage
from proxy.stages.session import SessionStage
from proxy.stages.tool_results import ToolResultsStage
from tests.factories import CHAT, EngineFactory, chat_completion, make_exchange, play_upstream, read_events

URL = "/agents/bot/sessions/s1" + CHAT
ASK = [{"role": "user", "content": "weather in Paris?"}]
CALL = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
}


def asking_answer() -> dict[str, Any]:
    answer = chat_completion("")
    answer["choices"][0]["message"] = {"role": "assistant", "content": None, "tool_calls": [CALL]}
    answer["choices"][0]["finish_reason"] = "tool_calls"
    return answer


async def attached(engine: Engine, messages: list[Any]) -> Exchange:
    ex = make_exchange("POST", URL, body={"model": "gpt-4o-mini", "messages": messages}, engine=engine)
    await LLMParseStage(engine.services).request(ex)
    await SessionStage(engine.services).request(ex)
    return ex


async def test_a_result_completes_the_call_its_answer_asked_for(engine_factory: EngineFactory) -> None:
    engine = await engine_factory()
    first = await attached(engine, ASK)
    play_upstream(first, asking_answer())
    await RecordStage(engine.services).finish(first)  # the LLM_CALL that asked for get_weather
    assert first.session is not None and first.session.guards is None

    history = [*ASK, {"role": "assistant", "content": None, "tool_calls": [CALL]}]
    result = {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}
    second = await attached(engine, [*history, result])
    stage = ToolResultsStage(engine.services)
    await stage.request(second)
    events = await read_events(engine, first.session.run_id)
    tool = [e for e in events if e["event_type"] == "TOOL_CALL"]
    assert len(tool) == 1
    assert tool[0]["name"] == "get_weather" and tool[0]["parent_id"] == first.llm_event_id
    assert tool[0]["payload"]["result"] == "sunny" and tool[0]["payload"]["tool_call_id"] == "call_1"
    assert first.session.conversation.tool_event_ids["call_1"] == tool[0]["event_id"]

    again = await attached(engine, [*history, result, {"role": "user", "content": "and Rome?"}])
    await stage.request(again)  # the same result brought again: already recorded
    assert (
        len([e for e in await read_events(engine, first.session.run_id) if e["event_type"] == "TOOL_CALL"])
        == 1
    )


async def test_a_result_for_a_call_never_seen_writes_nothing(engine: Engine) -> None:
    unknown = {"role": "tool", "tool_call_id": "call_9", "content": "x"}
    ex = await attached(
        engine, [*ASK, {"role": "assistant", "tool_calls": [CALL | {"id": "call_9"}]}, unknown]
    )
    await ToolResultsStage(engine.services).request(ex)
    assert ex.session is not None
    assert [e["event_type"] for e in await read_events(engine, ex.session.run_id)] == ["RUN_START"]


async def test_calls_without_a_session_pass(engine: Engine) -> None:
    ex = make_exchange("POST", URL, body=orjson.dumps({"model": "m", "messages": ASK}), engine=engine)
    await ToolResultsStage(engine.services).request(ex)  # not parsed: no protocol, nothing to do
    assert ex.answer is None
