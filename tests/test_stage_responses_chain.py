"""`ResponsesChainStage` alone, without a server: a previous_response_id stands for the chain's
history (which the guards then judge), an answered response continues the chain, a blocked answer's
synthetic id is never sent upstream, and non-Responses calls pass untouched."""

from __future__ import annotations

from typing import Any

import orjson

from proxy.engine import Engine
from proxy.exchange import Answer, Exchange
from proxy.stages.llm_parse import LLMParseStage
from proxy.stages.responses_chain import ResponsesChainStage
from proxy.stages.session import SessionStage
from tests.factories import (
    EngineFactory,
    chat_request,
    make_exchange,
    play_upstream,
    responses_answer,
    responses_request,
)

RESPONSES_URL = "/agents/bot/sessions/s1/v1/responses"
CHAT_URL = "/agents/bot/sessions/s1/v1/chat/completions"


def tool_answer(response_id: str, call_id: str, tool: str = "search") -> dict[str, Any]:
    answer = responses_answer(response_id=response_id)
    answer["output"] = [
        {
            "type": "function_call",
            "id": f"fc_{call_id}",
            "call_id": call_id,
            "name": tool,
            "arguments": '{"q": "paris"}',
            "status": "completed",
        }
    ]
    return answer


async def before_guards(
    engine: Engine, chain: ResponsesChainStage, path: str, body: dict[str, Any]
) -> Exchange:
    ex = make_exchange("POST", path, body=body, engine=engine)
    for stage in (LLMParseStage(engine.services), SessionStage(engine.services), chain):
        await stage.request(ex)
    return ex


async def test_a_continued_request_carries_the_chains_history(engine_factory: EngineFactory) -> None:
    engine = await engine_factory()
    chain = ResponsesChainStage(engine.guards)
    first = await before_guards(engine, chain, RESPONSES_URL, responses_request("find paris"))
    assert first.history is not None and first.history.steps == []
    play_upstream(first, tool_answer("resp_1", "call_1"))
    await chain.finish(first)

    output = [{"type": "function_call_output", "call_id": "call_1", "output": "sunny"}]
    second = await before_guards(
        engine, chain, RESPONSES_URL, responses_request(output, previous_response_id="resp_1")
    )
    assert second.history is not None
    assert [[c.name for c in step] for step in second.history.steps] == [["search"]]
    assert [r.tool_call_id for r in second.history.results] == ["call_1"]
    assert second.upstream_body is None  # a real parent: the body goes as the client sent it


async def test_a_request_continuing_a_blocked_answer_goes_to_the_real_parent(
    engine_factory: EngineFactory,
) -> None:
    engine = await engine_factory()
    chain = ResponsesChainStage(engine.guards)
    first = await before_guards(engine, chain, RESPONSES_URL, responses_request("go"))
    play_upstream(first, tool_answer("resp_real", "call_1"))
    await chain.finish(first)

    blocked = await before_guards(
        engine, chain, RESPONSES_URL, responses_request("again", previous_response_id="resp_real")
    )
    # what the guard stage leaves when it blocks: a synthetic answer and its text
    blocked.answer = Answer(200, orjson.dumps({"id": "resp_tripwire_0123abcd", "object": "response"}))
    blocked.block_text = "[tripwire] blocked: a loop"
    await chain.finish(blocked)

    after = await before_guards(
        engine, chain, RESPONSES_URL, responses_request("ok", previous_response_id="resp_tripwire_0123abcd")
    )
    assert after.upstream_body is not None
    sent = orjson.loads(after.upstream_body)
    assert sent["previous_response_id"] == "resp_real"
    assert b"resp_tripwire" not in after.upstream_body
    assert any("again" in orjson.dumps(item).decode() for item in sent["input"])  # the blocked input
    assert "[tripwire] blocked: a loop" in orjson.dumps(sent["input"]).decode()


async def test_a_forgotten_synthetic_parent_is_dropped(engine_factory: EngineFactory) -> None:
    engine = await engine_factory()
    chain = ResponsesChainStage(engine.guards)
    ex = await before_guards(
        engine, chain, RESPONSES_URL, responses_request("hi", previous_response_id="resp_tripwire_00ff")
    )
    assert ex.upstream_body is not None
    assert "previous_response_id" not in orjson.loads(ex.upstream_body)


async def test_a_failed_answer_does_not_continue_the_chain(engine_factory: EngineFactory) -> None:
    engine = await engine_factory()
    chain = ResponsesChainStage(engine.guards)
    ex = await before_guards(engine, chain, RESPONSES_URL, responses_request("go"))
    play_upstream(ex, {"error": {"message": "boom", "type": "server_error"}}, status=500)
    await chain.finish(ex)
    assert chain.chains.links == {}


async def test_other_calls_pass_untouched(engine_factory: EngineFactory) -> None:
    engine = await engine_factory()
    chain = ResponsesChainStage(engine.guards)
    ex = await before_guards(engine, chain, CHAT_URL, chat_request())
    assert ex.history is None and ex.upstream_body is None and ex.responses_body is None
    play_upstream(ex, {"id": "chatcmpl-1", "choices": []})
    await chain.finish(ex)
    assert chain.chains.links == {}
