"""`McpHub`'s matching and bookkeeping without a server: results matched by (server, session key,
JSON-RPC id), only responses complete a call, a WARN's text appended to the delivered result,
server requests flagged, a closed legacy stream failing its calls, `input_required` memory pruned,
and a legacy `endpoint` event rewritten to point at Tripwire.

`handle_stream` (relaying a GET stream) needs a client connection and an upstream: end to end only."""

from __future__ import annotations

import pytest

from proxy.engine import Engine
from proxy.mcp.hub import INPUT_REQUIRED_TTL_S
from proxy.mcp.jsonrpc import MCPToolCall
from tests.factories import (
    EngineFactory,
    mcp_tool_result,
)


def call(msg_id: object = 1, server: str = "demo") -> MCPToolCall:
    return MCPToolCall(server, "echo", {"text": "hi"}, msg_id, None, None, "streamable")


@pytest.fixture
async def mcp_engine(engine_factory: EngineFactory) -> Engine:
    return await engine_factory(mcp={"demo": {"url": "http://127.0.0.1:9/base/mcp"}})


async def test_a_response_completes_the_call_with_its_id_on_its_session(mcp_engine: Engine) -> None:
    hub = mcp_engine.mcp
    pending = hub.register("s:a", call(1))
    assert hub.deliver("demo", "s:b", mcp_tool_result(msg_id=1)) is None  # another session
    assert hub.deliver("other", "s:a", mcp_tool_result(msg_id=1)) is None  # another server
    assert hub.deliver("demo", "s:a", mcp_tool_result(msg_id="1")) is None  # "1" is not 1
    assert not pending.future.done()
    assert hub.deliver("demo", "s:a", {"jsonrpc": "2.0", "method": "notifications/x"}) is None
    assert not pending.future.done()
    assert hub.deliver("demo", "s:a", mcp_tool_result("ok", msg_id=1)) is None
    assert pending.future.result() == mcp_tool_result("ok", msg_id=1)
    assert hub.pending == {}
    assert hub.deliver("demo", None, mcp_tool_result(msg_id=1)) is None  # no session: nothing to match


async def test_a_warned_call_gets_its_text_appended_to_the_delivered_result(mcp_engine: Engine) -> None:
    hub = mcp_engine.mcp
    warned = call(2)
    warned.append_text = "[tripwire] warning: repetition"
    hub.register("s:a", warned)
    replacement = hub.deliver("demo", "s:a", mcp_tool_result("ok", msg_id=2))
    assert replacement is not None
    assert [b["text"] for b in replacement["result"]["content"]] == ["ok", "[tripwire] warning: repetition"]


async def test_a_server_request_flags_the_calls_waiting_on_that_session(mcp_engine: Engine) -> None:
    hub = mcp_engine.mcp
    waiting = hub.register("s:a", call(1))
    elsewhere = hub.register("s:b", call(1))
    told: list[bool] = []
    waiting.on_server_request = lambda: told.append(True)
    hub.deliver("demo", "s:a", {"jsonrpc": "2.0", "id": 99, "method": "sampling/createMessage"})
    assert waiting.server_asked and told == [True] and not elsewhere.server_asked


async def test_a_closed_legacy_stream_fails_its_calls_and_forget_drops_one(mcp_engine: Engine) -> None:
    hub = mcp_engine.mcp
    a = hub.register("legacy:x", call(1))
    hub.register("legacy:x", call(2))
    hub.forget("legacy:x", call(2))
    hub.fail_session("demo", "legacy:x", "the legacy SSE stream closed")
    with pytest.raises(ConnectionError, match="closed"):
        a.future.result()
    assert hub.pending == {}


async def test_input_required_memory_is_pruned_after_its_ttl(mcp_engine: Engine) -> None:
    hub = mcp_engine.mcp
    hub.await_input(("run", "demo", None, "sig1"), 0.0, 1000.0)
    hub.await_input(("run", "demo", None, "sig1"), 5.0, 1005.0)  # kept from the first round trip
    assert hub.awaiting_input[("run", "demo", None, "sig1")].started == 0.0
    hub.await_input(("run", "demo", None, "sig2"), INPUT_REQUIRED_TTL_S + 1, 2000.0)
    assert list(hub.awaiting_input) == [("run", "demo", None, "sig2")]
