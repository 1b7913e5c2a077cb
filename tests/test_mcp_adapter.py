"""`MCPProtocol` (the MCP tools/call adapter) on an exchange, without a server: Tripwire's own
answers are JSON-RPC with the call's id (a BLOCK is a tool result with isError, any other refusal a
JSON-RPC error), `await_result` turns a failed upstream into a result and an answer, and an
`input_required` round trip is one TOOL_CALL.

The waits in `await_result` (a legacy stream's result, a resumed GET stream) need a live client
connection to release: end to end only (test_mcp_streamable.py, test_mcp_answers.py)."""

from __future__ import annotations

import orjson

from proxy.engine import Engine
from proxy.exchange import Exchange
from proxy.guards.decision import Action, Decision
from proxy.mcp import jsonrpc
from proxy.mcp.adapter import MCPProtocol, record_tool_call, waiting_key
from proxy.stages.mcp_parse import MCPParseStage
from tests.factories import (
    EngineFactory,
    kinds,
    make_exchange,
    make_session,
    mcp_tools_call,
    read_events,
)

URL = "/agents/bot/sessions/s1/mcp/demo"


async def parsed(
    engine_factory: EngineFactory, msg_id: object = 4, **settings: object
) -> tuple[Engine, Exchange]:
    engine = await engine_factory(mcp={"demo": {"url": "http://127.0.0.1:9/mcp"}}, **settings)
    ex = make_exchange("POST", URL, body=mcp_tools_call(msg_id=msg_id), engine=engine)
    await MCPParseStage(engine.services).request(ex)
    assert isinstance(ex.protocol, MCPProtocol)
    return engine, ex


async def test_a_block_is_a_tool_result_with_is_error(engine_factory: EngineFactory) -> None:
    _, ex = await parsed(engine_factory)
    decision = Decision(Action.BLOCK, "loop_detection", "same call again", threshold=3, actual=3)
    answer = ex.protocol.render_block(ex, decision, "[tripwire] blocked: same call again")
    assert answer.status == 200 and answer.headers["X-Tripwire-Guard"] == "loop_detection"
    message = orjson.loads(answer.body)
    assert message["id"] == 4 and message["result"]["isError"] is True
    assert message["result"]["content"][0]["text"] == "[tripwire] blocked: same call again"


async def test_a_refusal_is_a_jsonrpc_error_with_retry_after(engine_factory: EngineFactory) -> None:
    _, ex = await parsed(engine_factory, msg_id="abc", expose_guard_details=False)
    decision = Decision(Action.BLOCK, "circuit_breaker", "circuit open", retry_after=2.2)
    message = orjson.loads(ex.protocol.render_refusal(ex, decision, "[tripwire] circuit open").body)
    assert message["id"] == "abc" and message["error"]["code"] == jsonrpc.TRIPWIRE_GUARD_ERROR
    assert message["error"]["data"] == {"guardrail": "circuit_breaker", "retry_after": 3}


async def test_a_server_that_is_down_is_a_failed_result_and_a_jsonrpc_error(
    engine_factory: EngineFactory,
) -> None:
    _, ex = await parsed(engine_factory)
    ex.forwarded = True
    ex.upstream_error = "upstream connection failed"
    await ex.protocol.await_result(ex)
    assert ex.result.status == "error" and ex.result.upstream_failure
    assert (
        ex.answer is not None
        and orjson.loads(ex.answer.body)["error"]["code"] == jsonrpc.TRIPWIRE_UPSTREAM_ERROR
    )


async def test_an_http_error_without_a_result_is_a_failed_result(engine_factory: EngineFactory) -> None:
    _, ex = await parsed(engine_factory)
    ex.upstream_status = 503
    await ex.protocol.await_result(ex)
    assert ex.result.status == "error" and ex.result.upstream_failure and ex.answer is None
    _, client_error = await parsed(engine_factory)
    client_error.upstream_status = 404
    await client_error.protocol.await_result(client_error)
    assert client_error.result.status == "error" and not client_error.result.upstream_failure


async def test_an_answer_that_ended_without_the_result_is_a_failed_result(
    engine_factory: EngineFactory,
) -> None:
    _, ex = await parsed(engine_factory)
    ex.upstream_status = 200  # a complete JSON answer that carried no result for this id
    await ex.protocol.await_result(ex)
    assert ex.result.status == "error" and not ex.result.upstream_failure
    assert "without a result" in ex.result.error_text


async def test_an_input_required_round_trip_is_one_tool_call(engine_factory: EngineFactory) -> None:
    engine, ex = await parsed(engine_factory)
    session = make_session(engine, "bot", "s1")
    call = ex.call
    first = jsonrpc.tool_result(
        {"jsonrpc": "2.0", "id": 4, "result": {"resultType": "input_required", "inputRequests": {}}}
    )
    assert first.input_required
    assert record_tool_call(engine, engine.mcp, session, call, first, 1.0, 1000.0, 2.0) is None
    assert waiting_key(session.run_id, call) in engine.mcp.awaiting_input

    resend = jsonrpc.MCPToolCall(**{**call.__dict__, "continuation": True, "jsonrpc_id": 5})
    done = jsonrpc.tool_result(
        {"jsonrpc": "2.0", "id": 5, "result": {"content": [{"type": "text", "text": "ok"}]}}
    )
    event_id = record_tool_call(engine, engine.mcp, session, resend, done, 3.0, 1002.0, 4.0)
    assert event_id is not None and engine.mcp.awaiting_input == {}
    events = await read_events(engine, session.run_id)
    assert kinds(events) == ["RUN_START", "TOOL_CALL"]
    assert events[1]["duration_ms"] == 3000  # from the first round trip's start
    assert session.conversation.mcp_signatures  # an LLM history showing the call will not record it again
