"""The aggregate `/mcp` and MCP 2026-07-28's routing headers (issue 34): what it sends each server
carries `Mcp-Method` and `Mcp-Name` matching that request's own body (the un-prefixed tool name,
not the client's `SERVER__TOOL`), so a server that checks them accepts it; and the client's W3C
trace context (`traceparent`, `tracestate`) goes with the request made for it."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

pytest.importorskip("mcp.server.mcpserver")  # mcp 2.x

from tests.conftest import StartTripwire  # noqa: E402
from tests.mcp_revision_servers import RevisionServer  # noqa: E402
from tests.mcp_servers import connect  # noqa: E402

TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
MODERN = "2026-07-28"


def calls(server: RevisionServer, method: str) -> list[tuple[Any, dict[str, str]]]:
    assert server.gate is not None
    return [
        (m, h)
        for m, h in zip(server.gate.posted, server.gate.headers, strict=False)
        if isinstance(m, dict) and m.get("method") == method
    ]


async def test_a_server_checking_mcp_name_accepts_the_aggregates_calls(start_tripwire: StartTripwire) -> None:
    with RevisionServer("stateless") as server:
        assert server.gate is not None
        server.gate.check_routing = True
        tw = await start_tripwire(mcp={"demo": {"url": server.url}})
        async with connect("auto", f"{tw.url}/mcp") as client:
            listed = {t.name for t in (await client.list_tools()).tools}
            result = await client.call_tool("demo__echo", {"text": "hi"})
    assert "demo__echo" in listed
    assert result.is_error is False and "echo: hi" in result.content[0].text
    ((message, headers),) = calls(server, "tools/call")
    assert message["params"]["name"] == "echo"
    assert headers["mcp-method"] == "tools/call" and headers["mcp-name"] == "echo"


async def test_the_clients_trace_context_goes_with_its_request(start_tripwire: StartTripwire) -> None:
    with RevisionServer("stateless") as server:
        tw = await start_tripwire(mcp={"demo": {"url": server.url}})
        body = {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "tools/call",
            "params": {
                "name": "demo__echo",
                "arguments": {"text": "traced"},
                "_meta": {"traceparent": TRACEPARENT},
            },
        }
        headers = {
            "MCP-Protocol-Version": MODERN,
            "Mcp-Method": "tools/call",
            "Mcp-Name": "demo__echo",
            "Accept": "application/json, text/event-stream",
            "traceparent": TRACEPARENT,
            "tracestate": "vendor=1",
        }
        async with aiohttp.ClientSession() as c, c.post(f"{tw.url}/mcp", json=body, headers=headers) as r:
            assert r.status == 200
            answer = await r.json()
        async with aiohttp.ClientSession() as c:
            untraced = {**body, "id": 2, "params": {"name": "demo__echo", "arguments": {"text": "plain"}}}
            plain = {k: v for k, v in headers.items() if k not in ("traceparent", "tracestate")}
            async with c.post(f"{tw.url}/mcp", json=untraced, headers=plain) as r:
                assert r.status == 200
    assert "echo: traced" in str(answer["result"]["content"])
    traced, untraced_call = calls(server, "tools/call")
    assert traced[1]["traceparent"] == TRACEPARENT and traced[1]["tracestate"] == "vendor=1"
    assert traced[0]["params"]["_meta"]["traceparent"] == TRACEPARENT  # SEP-414: _meta kept as sent
    assert "traceparent" not in untraced_call[1]  # not left over from the earlier request
