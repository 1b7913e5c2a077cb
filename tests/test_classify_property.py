"""Issue 30's property: whatever the path's spelling, the tools' shapes or the JSON-RPC batch, no
denied tool reaches the fake LLM upstream or the MCP server. Hypothesis draws the calls; one Tripwire
(with tool permissions) per drawn list, the fakes record everything they receive."""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import quote

import aiohttp
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from yarl import URL

from tests.conftest import AGENT_KEY, StartTripwire, serve_fake
from tests.fakes import Reply
from tests.test_classify_mcp import RecordingMCP, served

DENIED = "shell"
GUARDS = {"tools": {"deny": [DENIED, "fs__rm", "fs__fs__rm"]}}


@st.composite
def segment(draw: st.DrawFn, word: str) -> str:
    """One path segment, spelled as a client might: case, percent-encoding, `;params`, whitespace."""
    out = ""
    for ch in word:
        ch = ch.upper() if draw(st.booleans()) and draw(st.booleans()) else ch
        out += f"%{ord(ch):02X}" if draw(st.integers(0, 5)) == 0 else ch
    if draw(st.integers(0, 4)) == 0:
        out += ";" + draw(st.sampled_from(["x=1", "a", "v=%2F"]))
    if draw(st.integers(0, 4)) == 0:
        out += draw(st.sampled_from(["%20", "%09", "%20%20", "%0A"]))
    return out


@st.composite
def llm_path(draw: st.DrawFn, words: tuple[str, ...]) -> str:
    parts = ["v1" if draw(st.integers(0, 3)) else "%76%31"]
    for word in words:
        parts.append(draw(st.sampled_from(["/", "/", "//", "%2F", "%2f"])) + draw(segment(word)))
    tail = draw(st.sampled_from(["", "", "/", "%20"]))
    return "/" + parts[0] + "".join(parts[1:]) + tail


DENIED_TOOLS: list[dict[str, Any]] = [
    {"type": "function", "function": {"name": DENIED, "parameters": {}}},
    {"type": "function", "name": "harmless", "function": {"name": DENIED}},
    {"type": "function", "name": DENIED, "function": {"name": "harmless"}},
    {"type": "function", "name": DENIED, "parameters": {}},
    {"type": "custom", "custom": {"name": DENIED}},
    {"type": "custom", "name": DENIED},
    {"name": DENIED, "input_schema": {"type": "object"}},
    {"type": "namespace", "name": "ns", "tools": [{"type": "function", "name": DENIED}]},
]
ALLOWED_TOOL = {"type": "function", "function": {"name": "search", "parameters": {}}}


@st.composite
def llm_call(draw: st.DrawFn) -> tuple[str, dict[str, str], dict[str, Any]]:
    endpoint = draw(st.sampled_from([("chat", "completions"), ("responses",), ("messages",)]))
    path = draw(llm_path(endpoint))
    tools = draw(st.lists(st.sampled_from([*DENIED_TOOLS, ALLOWED_TOOL]), min_size=1, max_size=4))
    body: dict[str, Any] = {"model": "gpt-4o-mini", "tools": tools, "max_tokens": 5}
    if endpoint == ("responses",):
        body["input"] = "hi"
    else:
        body["messages"] = [{"role": "user", "content": "hi"}]
    if endpoint == ("chat", "completions") and draw(st.booleans()):
        body["functions"] = [{"name": DENIED, "parameters": {}}]
    choice = draw(st.sampled_from([None, "required", "named"]))
    if choice == "required":
        body["tool_choice"] = "required"
    elif choice == "named" and any(DENIED in json.dumps(t) for t in tools):
        body["tool_choice"] = {"type": "function", "function": {"name": DENIED}, "name": DENIED}
    headers = {"anthropic-version": "2023-06-01"} if endpoint == ("messages",) else {}
    return path, headers, body


def tools_call(name: str, msg_id: int | None) -> dict[str, Any]:
    msg: dict[str, Any] = {
        "jsonrpc": "2.0",
        "method": "tools/call",
        "params": {"name": name, "arguments": {}},
    }
    if msg_id is not None:
        msg["id"] = msg_id
    return msg


@st.composite
def mcp_message(draw: st.DrawFn) -> dict[str, Any]:
    msg_id = draw(st.one_of(st.none(), st.integers(1, 10**6)))
    kind = draw(st.sampled_from(["call", "call", "list", "ping", "note"]))
    if kind == "call":
        return tools_call(draw(st.sampled_from(["rm", "fs__rm", "ls"])), msg_id)
    if kind == "note":
        return {"jsonrpc": "2.0", "method": "notifications/progress", "params": {}}
    return {"jsonrpc": "2.0", "id": msg_id or 1, "method": "tools/list" if kind == "list" else "ping"}


@st.composite
def mcp_body(draw: st.DrawFn) -> Any:
    messages = draw(st.lists(mcp_message(), min_size=1, max_size=5))
    return messages if len(messages) > 1 or draw(st.booleans()) else messages[0]


@settings(
    max_examples=8,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    derandomize=True,  # the same draws every run: a failure is found again
    phases=[Phase.explicit, Phase.generate],  # (shrinking restarts Tripwire per try)
)
@given(
    llm_calls=st.lists(llm_call(), min_size=1, max_size=10),
    mcp_bodies=st.lists(mcp_body(), min_size=1, max_size=8),
)
async def test_no_denied_tool_reaches_the_upstream_or_server(
    start_tripwire: StartTripwire,
    llm_calls: list[tuple[str, dict[str, str], dict[str, Any]]],
    mcp_bodies: list[Any],
) -> None:
    mcp = RecordingMCP(["rm", "fs__rm", "ls"])
    async with serve_fake(Reply(text="ok")) as (fake, url), served(mcp) as (mcp_url,):
        tw = await start_tripwire(upstream={"url": url}, mcp={"fs": {"url": mcp_url}}, guards=GUARDS)
        headers = {"Authorization": f"Bearer {AGENT_KEY}", "Accept": "application/json, text/event-stream"}
        async with aiohttp.ClientSession() as http:
            for i, (path, extra, body) in enumerate(llm_calls):
                session = {"X-Tripwire-Session": f"p{i}"}
                target = URL(tw.url + path, encoded=True)
                async with http.post(target, json=body, headers={**headers, **extra, **session}) as r:
                    await r.read()
                    assert r.status < 500, (path, r.status)
            for i, body in enumerate(mcp_bodies):
                path = "/mcp/" + quote(["fs", "fs/", "fs"][i % 3], safe="/")
                async with http.post(tw.url + path, json=body, headers=headers) as r:
                    await r.read()
    leaked = [(s.method, s.path) for s in fake.seen if DENIED in json.dumps(s.body)]
    assert leaked == []
    ran = [p["name"] for p in mcp.ran("tools/call")]
    assert "rm" not in ran and "fs__rm" not in ran, ran
