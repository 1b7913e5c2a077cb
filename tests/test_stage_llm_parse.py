"""`LLMParseStage` alone: the dialect is chosen by the path, an unreadable body is answered 400 in
the protocol's own error shape (and recorded as an ERROR in the session's run when there is one),
unknown endpoints are forwarded unrecorded."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from proxy.engine import Engine
from proxy.llm import BodyCollector, LLMProtocol
from proxy.stages.llm_parse import LLMParseStage
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
    read_events,
    responses_request,
)


@pytest.mark.parametrize(
    ("path", "body", "dialect"),
    [
        (CHAT, chat_request(), "openai_chat"),
        ("/llm/azure/openai/deployments/gpt/chat/completions", chat_request(), "openai_chat"),
        (RESPONSES, responses_request(), "openai_responses"),
        (MESSAGES, anthropic_request(), "anthropic"),
        ("/v1/embeddings", {"model": "text-embedding-3-small", "input": "hi"}, "embeddings"),
    ],
)
async def test_the_dialect_is_chosen_by_the_path(
    engine_factory: EngineFactory, path: str, body: dict[str, Any], dialect: str
) -> None:
    engine = await engine_factory(llm={"azure": {"url": "http://127.0.0.1:9"}})
    ex = make_exchange("POST", path, body=body, engine=engine)
    await LLMParseStage(engine.services).request(ex)
    assert isinstance(ex.protocol, LLMProtocol) and ex.protocol.kind == "llm"
    assert ex.call.dialect == dialect
    assert ex.request_json == body
    assert ex.answer is None
    assert isinstance(ex.observer, BodyCollector)  # not streamed: the answer is kept to parse


async def test_a_streamed_call_gets_the_dialects_stream_accumulator(engine: Engine) -> None:
    ex = make_exchange("POST", CHAT, body=chat_request(stream=True), engine=engine)
    await LLMParseStage(engine.services).request(ex)
    assert ex.call.stream and not isinstance(ex.observer, BodyCollector)
    assert hasattr(ex.observer, "feed") and hasattr(ex.observer, "finish")


@pytest.mark.parametrize(("method", "path"), [("GET", "/v1/models"), ("POST", "/v1/files"), ("GET", CHAT)])
async def test_unknown_endpoints_are_forwarded_unrecorded(engine: Engine, method: str, path: str) -> None:
    ex = make_exchange(method, path, body=b"" if method == "GET" else b"{}", engine=engine)
    await LLMParseStage(engine.services).request(ex)
    assert ex.protocol is None and ex.call is None and ex.answer is None and ex.observer is None


async def test_an_unreadable_body_is_a_400_in_the_openai_shape(engine: Engine) -> None:
    ex = make_exchange("POST", CHAT, body=b"{not json", engine=engine)
    await LLMParseStage(engine.services).request(ex)
    assert ex.protocol is None  # refused here: nothing further to judge or record
    assert ex.answer is not None and ex.answer.status == 400
    assert ex.answer.headers["x-should-retry"] == "false"
    error = orjson.loads(ex.answer.body)["error"]
    assert error["type"] == "invalid_request_error"
    assert error["message"].startswith("[tripwire] the request body is not valid JSON")


async def test_a_body_that_is_not_an_object_is_a_400_in_the_anthropic_shape(engine: Engine) -> None:
    ex = make_exchange("POST", MESSAGES, body=b"[1, 2]", engine=engine)
    await LLMParseStage(engine.services).request(ex)
    assert ex.answer is not None and ex.answer.status == 400
    body = orjson.loads(ex.answer.body)
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert body["error"]["message"] == "[tripwire] the request body must be a JSON object"


async def test_an_unreadable_body_is_recorded_in_the_named_session(engine: Engine) -> None:
    session = make_session(engine, "bot", "s1")
    ex = make_exchange("POST", "/agents/bot/sessions/s1" + CHAT, body=b"\xff\xfe", engine=engine)
    await LLMParseStage(engine.services).request(ex)
    assert ex.answer is not None and ex.answer.status == 400
    events = await read_events(engine, session.run_id)
    assert kinds(events) == ["RUN_START", "ERROR"]
    assert events[1]["name"] == "invalid_request_body"
    assert events[1]["payload"]["http_status"] == 400 and events[1]["payload"]["endpoint"] == "openai_chat"


async def test_a_body_with_fields_of_the_wrong_type_is_still_judged(engine: Engine) -> None:
    # valid JSON, but `messages` is not a list: judged without its history, never forwarded unjudged
    ex = make_exchange(
        "POST", CHAT, body={"model": "gpt-4o-mini", "messages": 42, "stream": True}, engine=engine
    )
    await LLMParseStage(engine.services).request(ex)
    assert ex.answer is None and isinstance(ex.protocol, LLMProtocol)
    assert ex.call.model == "gpt-4o-mini" and ex.call.stream is True and ex.call.messages == []
