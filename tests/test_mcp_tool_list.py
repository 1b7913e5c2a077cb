"""A `tools/list` answer filtered by tool permissions (SPEC §9): the pure filter, and the hub
rewriting the answer to one request on whichever stream it comes."""

from __future__ import annotations

from typing import Any

from proxy.engine import Engine
from proxy.guards.config import ToolsConfig
from proxy.mcp import hub as hub_module
from proxy.mcp.tool_list import permitted_tools_list
from tests.factories import EngineFactory


def listing(*names: str, cursor: str | None = None, msg_id: Any = 3) -> dict[str, Any]:
    result: dict[str, Any] = {"tools": [{"name": n, "inputSchema": {"type": "object"}} for n in names]}
    if cursor is not None:
        result["nextCursor"] = cursor
    return {"jsonrpc": "2.0", "id": msg_id, "result": result}


def test_denied_tools_leave_a_page_which_keeps_its_cursor() -> None:
    tools = ToolsConfig(deny=("fs__write*",))
    out = permitted_tools_list(listing("read", "write", "write_all", cursor="p2"), "fs", tools)
    assert out == listing("read", cursor="p2")
    # a page that loses every tool is still a page: the client asks for the next one
    assert permitted_tools_list(listing("write", cursor="p3"), "fs", tools) == listing(cursor="p3")


def test_names_are_server_qualified_and_nothing_denied_is_no_rewrite() -> None:
    tools = ToolsConfig(deny=("fs__write",))
    assert permitted_tools_list(listing("read", "write"), "notes", tools) is None  # notes__write is allowed
    error = {"jsonrpc": "2.0", "id": 3, "error": {"code": -32601, "message": "no"}}
    assert permitted_tools_list(error, "fs", tools) is None
    assert permitted_tools_list(listing("read", "write"), "fs", ToolsConfig(allow=("fs__read",))) == listing(
        "read"
    )


async def test_the_hub_rewrites_the_answer_to_that_request_once(engine_factory: EngineFactory) -> None:
    engine: Engine = await engine_factory(mcp={"fs": {"url": "http://127.0.0.1:9/mcp"}})
    hub = engine.mcp
    tools = ToolsConfig(deny=("fs__write",))
    hub.rewrite_answer("fs", "s:a", 3, lambda m: permitted_tools_list(m, "fs", tools))
    assert hub.deliver("fs", "s:b", listing("read", "write")) is None  # another session's id 3
    assert hub.deliver("fs", "s:a", listing("read", "write", msg_id=4)) is None
    assert hub.deliver("fs", "s:a", listing("read", "write")) == listing("read")
    assert hub.deliver("fs", "s:a", listing("read", "write")) is None  # once


async def test_unanswered_rewrites_are_bounded(engine_factory: EngineFactory, monkeypatch: Any) -> None:
    monkeypatch.setattr(hub_module, "MAX_LIST_REWRITES", 2)
    engine: Engine = await engine_factory(mcp={"fs": {"url": "http://127.0.0.1:9/mcp"}})
    hub = engine.mcp
    for i in range(5):
        hub.rewrite_answer("fs", "s:a", i, lambda m: None)
    assert len(hub.rewrites) == 2 and ("fs", "s:a", hub_module.jsonrpc.id_key(4)) in hub.rewrites
