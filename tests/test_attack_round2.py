"""Attack round 2 (issue 30): a hostile agent's attempts against the classified gateway. Each
attempt sends a denied tool by another road; the invariant is the same for all: the denied name
never reaches the fake upstream (LLM) or the MCP server, in any form, in the raw bytes it received.
docs/gateway.md "Attack round 2" tallies them (the MCP attempts: tests/test_attack_round2_mcp.py)."""

from __future__ import annotations

import asyncio
import gzip
import json
import zlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from multidict import CIMultiDict
from yarl import URL

from tests.conftest import AGENT_KEY, StartTripwire
from tests.fakes import FakeUpstream, Reply

HEADERS = {"Authorization": f"Bearer {AGENT_KEY}", "X-Tripwire-Agent": "bot", "X-Tripwire-Session": "a2"}
DENY = ["shell", "bash", "str_replace_based_edit_tool", "fs__rm"]
WAIT_S = 30
HOSTED = "http://127.0.0.1:9/"  # a remote MCP server the upstream would call itself


class RawUpstream(FakeUpstream):
    """The fake LLM upstream, keeping every request's raw bytes (a duplicate key survives in them)."""

    def __init__(self) -> None:
        super().__init__(default=Reply(text="ok"))
        self.raw: list[tuple[str, str, bytes]] = []

    async def _seen(self, request: web.Request) -> Any:
        self.raw.append((request.method, request.path_qs, await request.read()))
        return await super()._seen(request)

    def reached(self, name: str) -> list[str]:
        return [f"{m} {p}" for m, p, raw in self.raw if name.encode() in raw]


@asynccontextmanager
async def serve(app: web.Application) -> AsyncIterator[str]:
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        yield str(server.make_url("")).rstrip("/")
    finally:
        await server.close()


@pytest.fixture
async def upstream() -> AsyncIterator[tuple[RawUpstream, str]]:
    fake = RawUpstream()
    async with serve(fake.app) as url:
        yield fake, url


def function(name: str) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "parameters": {"type": "object"}}}


def chat(*tools: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {
        "model": "gpt-4o-mini",
        "messages": [{"role": "user", "content": "hi"}],
        "tools": list(tools),
        **extra,
    }


def responses(*tools: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"model": "gpt-4o", "input": "hi", "tools": list(tools), **extra}


def anthropic(*tools: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {
        "model": "claude-sonnet-4-5",
        "max_tokens": 64,
        "messages": [{"role": "user", "content": "hi"}],
        "tools": list(tools),
        **extra,
    }


SEARCH = function("search")
RAW_DUP_TOOLS = (
    b'{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}],'
    b'"tools":[{"type":"function","function":{"name":"shell"}}],'
    b'"tools":[{"type":"function","function":{"name":"search"}}]}'
)
RAW_DUP_FUNCTION = (
    b'{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}],'
    b'"tools":[{"type":"function","function":{"name":"shell"},"function":{"name":"search"}}]}'
)
RAW_DUP_NAME = b'{"model":"gpt-4o","input":"hi","tools":[{"type":"function","name":"shell","name":"search"}]}'
RAW_DUP_NAME_INNER = (
    b'{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}],'
    b'"tools":[{"type":"function","function":{"name":"shell","name":"search"}}]}'
)
# (id, method, path, extra headers, body (dict: JSON; bytes: as is), the denied name to look for)
LLM_ATTEMPTS: list[tuple[str, str, str, dict[str, str], Any, str]] = [
    ("get-with-body", "GET", "/v1/chat/completions", {}, chat(function("shell")), "shell"),
    (
        "method-override",
        "GET",
        "/v1/chat/completions",
        {"X-HTTP-Method-Override": "POST"},
        chat(function("shell")),
        "shell",
    ),
    ("put", "PUT", "/v1/chat/completions", {}, chat(function("shell")), "shell"),
    (
        "patch-responses",
        "PATCH",
        "/v1/responses",
        {},
        responses({"type": "function", "name": "shell"}),
        "shell",
    ),
    ("dup-tools-key", "POST", "/v1/chat/completions", {}, RAW_DUP_TOOLS, "shell"),
    ("dup-function-key", "POST", "/v1/chat/completions", {}, RAW_DUP_FUNCTION, "shell"),
    ("dup-name-key", "POST", "/v1/responses", {}, RAW_DUP_NAME, "shell"),
    ("dup-inner-name-key", "POST", "/v1/chat/completions", {}, RAW_DUP_NAME_INNER, "shell"),
    ("gzip", "POST", "/v1/chat/completions", {"Content-Encoding": "gzip"}, chat(function("shell")), "shell"),
    (
        "deflate",
        "POST",
        "/v1/chat/completions",
        {"Content-Encoding": "deflate"},
        chat(function("shell")),
        "shell",
    ),
    ("query-string", "POST", "/v1/chat/completions?stream=false&x=%2F", {}, chat(function("shell")), "shell"),
    ("double-encoded", "POST", "/v1/chat%252Fcompletions", {}, chat(function("shell")), "shell"),
    ("dot-dot-encoded", "POST", "/v1/x/%2e%2e/chat/completions", {}, chat(function("shell")), "shell"),
    ("dot-dot-double", "POST", "/v1/x/%252e%252e/chat/completions", {}, chat(function("shell")), "shell"),
    (
        "form-content-type",
        "POST",
        "/v1/chat/completions",
        {"Content-Type": "application/x-www-form-urlencoded"},
        chat(function("shell")),
        "shell",
    ),
    (
        "chat-legacy-functions",
        "POST",
        "/v1/chat/completions",
        {},
        {**chat(), "functions": [{"name": "shell"}], "function_call": {"name": "shell"}},
        "shell",
    ),
    (
        "chat-custom",
        "POST",
        "/v1/chat/completions",
        {},
        chat({"type": "custom", "custom": {"name": "shell"}}),
        "shell",
    ),
    (
        "chat-allowed-tools-choice",
        "POST",
        "/v1/chat/completions",
        {},
        chat(
            SEARCH,
            function("shell"),
            tool_choice={
                "type": "allowed_tools",
                "allowed_tools": {
                    "mode": "required",
                    "tools": [{"type": "function", "function": {"name": "shell"}}],
                },
            },
        ),
        "shell",
    ),
    (
        "responses-function",
        "POST",
        "/v1/responses",
        {},
        responses({"type": "function", "name": "shell"}),
        "shell",
    ),
    (
        "responses-custom",
        "POST",
        "/v1/responses",
        {},
        responses({"type": "custom", "name": "shell"}),
        "shell",
    ),
    ("responses-hosted-shell", "POST", "/v1/responses", {}, responses({"type": "shell"}), "shell"),
    (
        "responses-namespace",
        "POST",
        "/v1/responses",
        {},
        responses({"type": "namespace", "name": "ns", "tools": [{"type": "function", "name": "shell"}]}),
        "shell",
    ),
    (
        "responses-mcp-allowed",
        "POST",
        "/v1/responses",
        {},
        responses(
            {
                "type": "mcp",
                "server_label": "fs",
                "server_url": HOSTED,
                "allowed_tools": ["rm"],
            }
        ),
        HOSTED,
    ),
    (
        "responses-mcp-all",
        "POST",
        "/v1/responses",
        {},
        responses({"type": "mcp", "server_label": "fs", "server_url": HOSTED}),
        HOSTED,
    ),
    (
        "anthropic-custom",
        "POST",
        "/v1/messages",
        {},
        anthropic({"type": "custom", "name": "shell", "input_schema": {}}),
        "shell",
    ),
    (
        "anthropic-bash",
        "POST",
        "/v1/messages",
        {},
        anthropic({"type": "bash_20250124", "name": "bash"}),
        "bash",
    ),
    (
        "anthropic-text-editor",
        "POST",
        "/v1/messages",
        {},
        anthropic({"type": "text_editor_20250728", "name": "str_replace_based_edit_tool"}),
        "str_replace_based_edit_tool",
    ),
    (
        "anthropic-choice",
        "POST",
        "/v1/messages",
        {},
        anthropic({"name": "shell", "input_schema": {}}, tool_choice={"type": "tool", "name": "shell"}),
        "shell",
    ),
    (
        "anthropic-mcp-connector",
        "POST",
        "/v1/messages",
        {"anthropic-beta": "mcp-client-2025-04-04"},
        anthropic(
            mcp_servers=[
                {
                    "type": "url",
                    "url": HOSTED,
                    "name": "fs",
                    "tool_configuration": {"allowed_tools": ["rm"]},
                }
            ]
        ),
        HOSTED,
    ),
    ("chunked", "POST", "/v1/chat/completions", {"x-attack": "chunked"}, chat(function("shell")), "shell"),
    (
        "two-content-types",
        "POST",
        "/v1/chat/completions",
        {"x-attack": "two-content-types"},
        chat(function("shell")),
        "shell",
    ),
    (
        "responses-allowed-tools-choice",
        "POST",
        "/v1/responses",
        {},
        responses(
            {"type": "function", "name": "shell"},
            tool_choice={
                "type": "allowed_tools",
                "mode": "required",
                "tools": [{"type": "function", "name": "shell"}],
            },
        ),
        "shell",
    ),
    (
        "chat-function-a-string",
        "POST",
        "/v1/chat/completions",
        {},
        chat({"type": "function", "function": "shell"}),
        "shell",
    ),
    (
        "responses-name-a-list",
        "POST",
        "/v1/responses",
        {},
        responses({"type": "function", "name": ["shell"]}),
        "shell",
    ),
    (
        "chat-name-an-object",
        "POST",
        "/v1/chat/completions",
        {},
        chat({"type": "function", "function": {"name": {"shell": 1}}}),
        "shell",
    ),
    (
        "history-chat-call",
        "POST",
        "/v1/chat/completions",
        {},
        {
            "model": "gpt-4o-mini",
            "messages": [
                {"role": "user", "content": "go"},
                {
                    "role": "assistant",
                    "tool_calls": [
                        {"id": "c1", "type": "function", "function": {"name": "shell", "arguments": "{}"}}
                    ],
                },
                {"role": "tool", "tool_call_id": "c1", "content": "done"},
            ],
        },
        "shell",
    ),
    (
        "history-responses-call",
        "POST",
        "/v1/responses",
        {},
        {
            "model": "gpt-4o",
            "input": [
                {"type": "function_call", "call_id": "c1", "name": "shell", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "c1", "output": "done"},
            ],
        },
        "shell",
    ),
    (
        "history-anthropic-tool-use",
        "POST",
        "/v1/messages",
        {},
        {
            "model": "claude-sonnet-4-5",
            "max_tokens": 64,
            "messages": [
                {"role": "user", "content": "go"},
                {
                    "role": "assistant",
                    "content": [{"type": "tool_use", "id": "t1", "name": "bash", "input": {}}],
                },
                {
                    "role": "user",
                    "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "done"}],
                },
            ],
        },
        "bash",
    ),
]


async def pieces(raw: bytes) -> AsyncIterator[bytes]:
    for at in range(0, len(raw), 7):
        yield raw[at : at + 7]


def encoded(body: Any, headers: dict[str, str]) -> bytes:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    coding = headers.get("Content-Encoding")
    if coding == "gzip":
        return gzip.compress(raw)
    if coding == "deflate":
        return zlib.compress(raw)
    return raw


@pytest.mark.parametrize(
    ("method", "path", "headers", "body", "name"),
    [a[1:] for a in LLM_ATTEMPTS],
    ids=[a[0] for a in LLM_ATTEMPTS],
)
async def test_llm_attempt(
    start_tripwire: StartTripwire,
    upstream: tuple[RawUpstream, str],
    method: str,
    path: str,
    headers: dict[str, str],
    body: Any,
    name: str,
) -> None:
    fake, url = upstream
    tw = await start_tripwire(upstream={"url": url}, guards={"tools": {"deny": DENY}})
    attack = headers.get("x-attack")
    sent = CIMultiDict({"Content-Type": "application/json", **HEADERS, **headers})
    if path.startswith("/v1/messages"):
        sent["anthropic-version"] = "2023-06-01"
    data: Any = encoded(body, headers)
    if attack == "chunked":  # sent in pieces, Transfer-Encoding: chunked
        data = pieces(data)
    elif attack == "two-content-types":
        sent.add("Content-Type", "text/plain")
    async with (
        aiohttp.ClientSession(auto_decompress=False) as http,
        http.request(method, URL(tw.url + path, encoded=True), data=data, headers=sent) as r,
    ):
        await r.read()
    assert fake.reached(name) == []


WS_HEADERS = {**HEADERS, "openai-beta": "responses_websockets=2026-02-06"}
SHELL = {"type": "function", "name": "shell"}
WS_ATTEMPTS: list[tuple[str, Any]] = [
    (
        "warmup",
        {"type": "response.create", "generate": False, "model": "gpt-4o", "input": "hi", "tools": [SHELL]},
    ),
    ("type-case", {"type": "Response.Create", "model": "gpt-4o", "input": "hi", "tools": [SHELL]}),
    ("type-space", {"type": "response.create ", "model": "gpt-4o", "input": "hi", "tools": [SHELL]}),
    ("session-update", {"type": "session.update", "session": {"tools": [SHELL]}}),
    ("array-of-events", [{"type": "response.create", "model": "gpt-4o", "input": "hi", "tools": [SHELL]}]),
    (
        "binary-frame",
        {"type": "response.create", "model": "gpt-4o", "input": "hi", "tools": [SHELL], "binary": True},
    ),
    (
        "nested-and-top",
        {
            "type": "response.create",
            "model": "gpt-4o",
            "input": "hi",
            "tools": [SHELL],
            "response": {"tools": [SHELL]},
        },
    ),
]


@pytest.mark.parametrize("message", [a[1] for a in WS_ATTEMPTS], ids=[a[0] for a in WS_ATTEMPTS])
async def test_socket_attempt(
    start_tripwire: StartTripwire, upstream: tuple[RawUpstream, str], message: Any
) -> None:
    fake, url = upstream
    tw = await start_tripwire(upstream={"url": url}, guards={"tools": {"deny": DENY}})
    binary = isinstance(message, dict) and message.pop("binary", False)
    async with (
        aiohttp.ClientSession() as http,
        http.ws_connect(tw.url + "/v1/responses", headers=WS_HEADERS) as ws,
    ):
        data = json.dumps(message)
        await (ws.send_bytes(data.encode()) if binary else ws.send_str(data))
        # then an ordinary call: once it is answered, the attempt before it was handled
        await ws.send_str(json.dumps({"type": "response.create", "model": "gpt-4o", "input": "next"}))
        while True:
            msg = await asyncio.wait_for(ws.receive(), WAIT_S)
            if msg.type != aiohttp.WSMsgType.TEXT:
                break
            event = json.loads(msg.data)
            if event.get("type") == "response.completed" and event["response"].get("id", "").endswith(
                str(len(fake.ws_messages))
            ):
                break
    assert [m for m in fake.ws_messages if "shell" in json.dumps(m)] == []


async def test_what_is_permitted_still_reaches_the_upstream(
    start_tripwire: StartTripwire, upstream: tuple[RawUpstream, str]
) -> None:
    """The fixes refuse or filter only what could not be judged: a hosted MCP server whose
    allowed tools are all permitted stays, a pretty-printed body (its keys each once) is forwarded
    byte for byte, a socket's `session.update` without tools is relayed as sent."""
    fake, url = upstream
    tw = await start_tripwire(upstream={"url": url}, guards={"tools": {"deny": DENY}})
    hosted = {"type": "mcp", "server_label": "fs", "server_url": HOSTED, "allowed_tools": ["ls"]}
    connector = {"type": "url", "url": HOSTED, "name": "fs", "tool_configuration": {"allowed_tools": ["ls"]}}
    async with aiohttp.ClientSession() as http:
        async with http.post(tw.url + "/v1/responses", json=responses(hosted), headers=HEADERS) as r:
            assert r.status == 200
        anthropic_headers = {**HEADERS, "anthropic-version": "2023-06-01"}
        async with http.post(
            tw.url + "/v1/messages", json=anthropic(mcp_servers=[connector]), headers=anthropic_headers
        ) as r:
            assert r.status == 200
        pretty = json.dumps(chat(SEARCH), indent=2).encode()
        async with http.post(
            tw.url + "/v1/chat/completions",
            data=pretty,
            headers={**HEADERS, "Content-Type": "application/json"},
        ) as r:
            assert r.status == 200
    (responses_raw,) = [raw for _, p, raw in fake.raw if p == "/v1/responses"]
    assert json.loads(responses_raw)["tools"] == [hosted]
    (messages_raw,) = [raw for _, p, raw in fake.raw if p == "/v1/messages"]
    assert json.loads(messages_raw)["mcp_servers"] == [connector]
    (chat_raw,) = [raw for _, p, raw in fake.raw if p == "/v1/chat/completions"]
    assert chat_raw == pretty
