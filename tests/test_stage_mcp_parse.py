"""`MCPParseStage` alone: a single `tools/call` gets the MCP protocol adapter and a pending entry in
the hub (its result matched as the answer goes by), anything else is forwarded unrecorded, a body
that is not JSON is a JSON-RPC parse error, and a batch's tool calls are watched and recorded."""

from __future__ import annotations

import orjson

from proxy.engine import Engine
from proxy.forward import json_error
from proxy.mcp import jsonrpc
from proxy.mcp.adapter import MCPProtocol
from proxy.stages.mcp_parse import MCPParseStage, tool_call
from tests.factories import (
    EngineFactory,
    kinds,
    make_exchange,
    mcp_tool_result,
    mcp_tools_call,
    play_upstream,
    read_events,
    sse_message,
)

DEMO = {"demo": {"url": "http://127.0.0.1:9/mcp"}}
URL = "/agents/bot/sessions/s1/mcp/demo"


async def mcp_engine(engine_factory: EngineFactory) -> Engine:
    return await engine_factory(mcp=DEMO)


async def test_a_tools_call_gets_the_adapter_and_its_result_is_matched_on_the_answer(
    engine_factory: EngineFactory,
) -> None:
    engine = await mcp_engine(engine_factory)
    stage = MCPParseStage(engine.services)
    headers = {"Mcp-Session-Id": "abc", "MCP-Protocol-Version": "2025-06-18"}
    ex = make_exchange(
        "POST", URL, headers, mcp_tools_call("echo", {"text": "hi"}, msg_id="r1"), engine=engine
    )
    await stage.request(ex)
    assert isinstance(ex.protocol, MCPProtocol) and ex.protocol.kind == "mcp"
    call = ex.call
    assert (call.server, call.tool_name, call.arguments, call.jsonrpc_id) == (
        "demo",
        "echo",
        {"text": "hi"},
        "r1",
    )
    assert call.mcp_session_id == "abc" and call.protocol_version == "2025-06-18"
    assert ex.mcp_session_key == "s:abc" and len(engine.mcp.pending) == 1

    # a notification on the stream completes nothing; the response with the call's id does
    notification = {"jsonrpc": "2.0", "method": "notifications/progress", "params": {}}
    relayed = play_upstream(ex, sse_message(notification) + sse_message(mcp_tool_result("hi", msg_id="r1")))
    assert relayed == sse_message(notification) + sse_message(mcp_tool_result("hi", msg_id="r1"))
    assert ex.result is not None and ex.result.status == "ok"
    assert engine.mcp.pending == {}
    await stage.finish(ex)


async def test_other_messages_are_forwarded_unrecorded(engine_factory: EngineFactory) -> None:
    engine = await mcp_engine(engine_factory)
    stage = MCPParseStage(engine.services)
    for body in (
        {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}},
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"arguments": {}}},  # no name
    ):
        ex = make_exchange("POST", URL, body=body, engine=engine)
        await stage.request(ex)
        assert ex.protocol is None and ex.answer is None and ex.observer is None, body
    get = make_exchange("GET", URL, engine=engine)
    await stage.request(get)
    assert get.protocol is None and get.answer is None


async def test_a_tools_list_answer_is_read_for_the_pins_unless_they_are_off(
    engine_factory: EngineFactory,
) -> None:
    """Its answer is judged against the server's pinned tool definitions (docs/mcp.md "Changed
    tools"): read as it passes, a JSON answer held whole; with every pin action off, not read."""
    listing = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}
    engine = await mcp_engine(engine_factory)
    ex = make_exchange("POST", URL, body=listing, engine=engine)
    await MCPParseStage(engine.services).request(ex)
    assert ex.protocol is None and ex.observer is not None and ex.observer.rewrites
    off = {"tool_changes": "off", "tool_added": "off", "hidden_instructions": "off"}
    engine = await engine_factory(mcp=DEMO, guards={"tool_pins": off})
    ex = make_exchange("POST", URL, body=listing, engine=engine)
    await MCPParseStage(engine.services).request(ex)
    assert ex.protocol is None and ex.observer is None


async def test_a_body_that_is_not_json_is_a_jsonrpc_parse_error(engine_factory: EngineFactory) -> None:
    engine = await mcp_engine(engine_factory)
    ex = make_exchange("POST", URL, body=b"{nope", engine=engine)
    await MCPParseStage(engine.services).request(ex)
    assert ex.answer is not None and ex.answer.status == 400
    error = orjson.loads(ex.answer.body)
    assert error["id"] is None and error["error"]["code"] == jsonrpc.PARSE_ERROR


async def test_a_batch_is_forwarded_unguarded_and_its_tool_calls_are_recorded(
    engine_factory: EngineFactory,
) -> None:
    engine = await mcp_engine(engine_factory)
    stage = MCPParseStage(engine.services)
    batch = [mcp_tools_call("echo", {"text": "a"}, msg_id=1), mcp_tools_call("echo", {"text": "b"}, msg_id=2)]
    ex = make_exchange("POST", URL, {"Mcp-Session-Id": "abc"}, batch, engine=engine)
    await stage.request(ex)
    assert ex.protocol is None and len(ex.mcp_batch) == 2
    play_upstream(ex, [mcp_tool_result("a", msg_id=1), mcp_tool_result("b", msg_id=2)])
    await stage.finish(ex)
    (session,) = engine.sessions.live()
    events = await read_events(engine, session.run_id)
    assert kinds(events) == ["RUN_START", "TOOL_CALL", "TOOL_CALL"]
    assert [e["payload"]["args"] for e in events[1:]] == [{"text": "a"}, {"text": "b"}]
    assert engine.mcp.pending == {}


async def test_a_server_that_is_down_is_a_jsonrpc_error_for_a_waiting_request(
    engine_factory: EngineFactory,
) -> None:
    engine = await mcp_engine(engine_factory)
    stage = MCPParseStage(engine.services)
    ex = make_exchange("POST", URL, body={"jsonrpc": "2.0", "id": 5, "method": "tools/list"}, engine=engine)
    await stage.request(ex)
    # what the forward stage leaves when the connection failed
    ex.forwarded = True
    ex.upstream_error = "upstream connection failed: ClientConnectorError"
    ex.answer = json_error(502, "unreachable", "upstream_unreachable", "upstream_unreachable")
    await stage.finish(ex)
    assert ex.answer.status == 200
    message = orjson.loads(ex.answer.body)
    assert message["id"] == 5 and message["error"]["code"] == jsonrpc.TRIPWIRE_UPSTREAM_ERROR
    assert message["error"]["data"] == {"server": "demo"}


def test_tool_call_reads_only_tools_call_requests() -> None:
    call = tool_call(
        mcp_tools_call("echo", None, msg_id=1) | {"params": {"name": "echo"}}, "demo", True, None, {}
    )
    assert call is not None and call.arguments == {} and call.transport == "legacy"
    resend = mcp_tools_call("echo", msg_id=1)
    resend["params"]["requestState"] = "x"
    assert tool_call(resend, "demo", False, None, {}).continuation  # type: ignore[union-attr]
    assert (
        tool_call({"jsonrpc": "2.0", "method": "tools/call", "params": {"name": "x"}}, "d", False, None, {})
        is None
    )
    assert tool_call(["not", "a", "dict"], "d", False, None, {}) is None
