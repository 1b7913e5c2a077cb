"""Builders for unit tests of the pipeline's middle: a request, an `Exchange`, an `Engine`, a session,
and canned upstream answers, all without a server (no TestServer, no sockets).

`make_request` builds a real aiohttp `web.Request` with aiohttp's own `make_mocked_request`;
`make_exchange` resolves its route with `proxy.routing.resolve` as the proxy handler does;
`make_engine` is a real `Engine` on a temporary data directory (an async context manager, or the
`engine_factory` fixture, which closes what it started). `play_upstream` does what the forward
stage leaves in an exchange once the upstream answered (the answer fed through the call's observer,
then the protocol's `after_forward`), so the stages after it can be tested alone.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import make_mocked_request
from multidict import CIMultiDict

from proxy.engine import Engine
from proxy.exchange import Exchange
from proxy.lifecycle import running_engine
from proxy.pipeline import BaseStage
from proxy.routing import Route, RouteError, resolve
from proxy.sessions import Refused, Session
from proxy.settings import Settings

CHAT = "/v1/chat/completions"
RESPONSES = "/v1/responses"
MESSAGES = "/v1/messages"

# --- requests and exchanges ------------------------------------------------------------------


def make_request(
    method: str = "POST",
    path: str = CHAT,
    headers: Mapping[str, str] | None = None,
    body: bytes | dict[str, Any] | None = None,
) -> web.Request:
    """A real `web.Request` without a server. The body is not readable from it (the pipeline reads
    `Exchange.body`, which the proxy handler filled); it is only used for Content-Length."""
    raw = _raw(body)
    hdrs = CIMultiDict(headers or {})
    if raw and "Content-Type" not in hdrs:
        hdrs["Content-Type"] = "application/json"
    return make_mocked_request(method, path, headers=hdrs)


def _raw(body: bytes | dict[str, Any] | list[Any] | None) -> bytes:
    if body is None:
        return b""
    if isinstance(body, bytes):
        return body
    return orjson.dumps(body)


def make_route(
    path: str,
    headers: Mapping[str, str] | None = None,
    *,
    default_agent: str = "default",
    llm_names: tuple[str, ...] = (),
    mcp_names: tuple[str, ...] = (),
) -> Route:
    route = resolve(
        path.split("?", 1)[0],
        headers or {},
        default_agent=default_agent,
        llm_names=llm_names,
        mcp_names=mcp_names,
    )
    assert not isinstance(route, RouteError), route
    return route


def make_exchange(
    method: str = "POST",
    path: str = CHAT,
    headers: Mapping[str, str] | None = None,
    body: bytes | dict[str, Any] | list[Any] | None = None,
    *,
    engine: Engine | None = None,
    started: float | None = None,
    started_wall: float | None = None,
) -> Exchange:
    """An `Exchange` as the proxy handler builds it: the request, its resolved route, its body.

    With an engine, the upstream names (and the default agent) are the engine's own."""
    request = make_request(method, path, headers, _raw(body))
    route = make_route(
        path,
        request.headers,
        default_agent=engine.settings.agent if engine is not None else "default",
        llm_names=engine.upstreams.names("llm") if engine is not None else (),
        mcp_names=engine.upstreams.names("mcp") if engine is not None else (),
    )
    return Exchange(
        request=request,
        route=route,
        body=_raw(body),
        started=time.monotonic() if started is None else started,
        started_wall=time.time() if started_wall is None else started_wall,
    )


# --- the engine and its sessions ---------------------------------------------------------------


def engine_settings(tmp_path: Path, **settings: Any) -> Settings:
    return Settings.model_validate({"data_dir": tmp_path / "data", "session_idle_timeout_s": 300, **settings})


@asynccontextmanager
async def make_engine(tmp_path: Path, **settings: Any) -> AsyncIterator[Engine]:
    """A started `Engine` on `tmp_path/data`, closed on exit (the lifecycle `serve` and the
    mitmproxy addon share, proxy/lifecycle.py). Settings are keyword overrides."""
    async with running_engine(engine_settings(tmp_path, **settings), argv=["tripwire", "serve"]) as engine:
        yield engine


EngineFactory = Callable[..., Awaitable[Engine]]


@pytest.fixture
async def engine_factory(tmp_path: Path) -> AsyncIterator[EngineFactory]:
    """`await engine_factory(**settings)`: a started Engine (each on its own data dir), closed at teardown."""
    started: list[Engine] = []
    async with AsyncExitStack() as running:  # each engine closed by the lifecycle serve uses

        async def start(**settings: Any) -> Engine:
            data_dir = settings.pop("data_dir", tmp_path / f"data{len(started) or ''}")
            engine = await running.enter_async_context(
                running_engine(engine_settings(tmp_path, data_dir=data_dir, **settings), argv=["tripwire"])
            )
            started.append(engine)
            return engine

        yield start


@pytest.fixture
async def engine(engine_factory: EngineFactory) -> Engine:
    """A started Engine with default settings."""
    return await engine_factory()


def make_session(engine: Engine, agent: str = "bot", session_id: str | None = "s1") -> Session:
    """The session (and its run) as the session stage opens it; `session_id=None`: automatic."""
    opened = engine.policy.open(agent, session_id)
    assert not isinstance(opened, Refused), opened
    return opened


async def read_events(engine: Engine, run_id: str) -> list[dict[str, Any]]:
    """The run's events on disk, after flushing the recorder."""
    await engine.recorder.flush()
    path = engine.data_dir / "runs" / run_id / "events.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


async def read_tripwire_json(engine: Engine, run_id: str) -> dict[str, Any]:
    """The run's tripwire.json (cost, tokens, health tags), after flushing the recorder."""
    await engine.recorder.flush()
    data: dict[str, Any] = json.loads((engine.data_dir / "runs" / run_id / "tripwire.json").read_text())
    return data


def kinds(events: list[dict[str, Any]]) -> list[str]:
    return [e["event_type"] for e in events]


# --- what the forward stage leaves behind ------------------------------------------------------


def play_upstream(
    ex: Exchange,
    body: bytes | dict[str, Any],
    *,
    status: int = 200,
    chunks: int = 1,
    after_forward: bool = True,
) -> bytes:
    """As if the forward stage had sent the call and relayed this answer: the answer goes through
    the exchange's observer (as the Forwarder feeds it), then the protocol reads the result.
    Returns what the observer passed on to the client."""
    raw = _raw(body)
    ex.forwarded = True
    ex.upstream_started = ex.started
    ex.upstream_status = status
    ex.first_byte_at = ex.started
    out = b""
    observer = ex.observer
    if observer is not None:
        if hasattr(observer, "status"):
            observer.status = status
        size = max(1, -(-len(raw) // chunks))
        for i in range(0, len(raw), size):
            out += observer.feed(raw[i : i + size])
        flush = getattr(observer, "flush", None)
        if flush is not None:
            out += flush()
    else:
        out = raw
    ex.upstream_done = ex.started
    if after_forward and ex.protocol is not None:
        ex.protocol.after_forward(ex)
    return out


# --- canned upstream answers -------------------------------------------------------------------

USER_ASK = [{"role": "user", "content": "weather in Paris?"}]


def chat_request(
    messages: list[dict[str, Any]] | None = None, *, stream: bool = False, **extra: Any
) -> dict[str, Any]:
    body: dict[str, Any] = {"model": "gpt-4o-mini", "messages": messages or list(USER_ASK)}
    if stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    return {**body, **extra}


def chat_tool_history(n: int, tool: str = "get_weather", args: dict[str, Any] | None = None) -> list[Any]:
    """A chat history where the model asked for the same tool `n` times and got each result."""
    arguments = json.dumps(args if args is not None else {"city": "Paris"})
    messages: list[dict[str, Any]] = list(USER_ASK)
    for i in range(n):
        call_id = f"call_{i}"
        messages.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": call_id, "type": "function", "function": {"name": tool, "arguments": arguments}}
                ],
            }
        )
        messages.append({"role": "tool", "tool_call_id": call_id, "content": "sunny, 21C"})
    return messages


def chat_completion(
    text: str = "Hello", *, prompt_tokens: int = 100, completion_tokens: int = 20, finish: str = "stop"
) -> dict[str, Any]:
    return {
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "created": 1700000000,
        "model": "gpt-4o-mini",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "finish_reason": finish,
                "logprobs": None,
            }
        ],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }


def chat_completion_sse(
    text: str = "Hello", *, prompt_tokens: int = 100, completion_tokens: int = 20, done: bool = True
) -> bytes:
    """A streamed Chat Completions answer (with the usage chunk), `data: [DONE]` unless `done=False`."""

    def chunk(choices: list[Any], usage: Any = None) -> dict[str, Any]:
        return {
            "id": "chatcmpl-fake",
            "object": "chat.completion.chunk",
            "created": 1700000000,
            "model": "gpt-4o-mini",
            "choices": choices,
            "usage": usage,
        }

    events = [chunk([{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}])]
    events += [
        chunk([{"index": 0, "delta": {"content": piece}, "finish_reason": None}])
        for piece in re.findall(r"\S+\s*", text)
    ]
    events.append(chunk([{"index": 0, "delta": {}, "finish_reason": "stop"}]))
    usage = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }
    events.append(chunk([], usage))
    out = b"".join(b"data: " + orjson.dumps(e) + b"\n\n" for e in events)
    return out + (b"data: [DONE]\n\n" if done else b"")


def responses_request(text: str = "hi", **extra: Any) -> dict[str, Any]:
    return {"model": "gpt-4o", "input": text, **extra}


def responses_answer(
    text: str = "Hello", *, response_id: str = "resp_fake1", input_tokens: int = 100, output_tokens: int = 20
) -> dict[str, Any]:
    return {
        "id": response_id,
        "object": "response",
        "created_at": 1700000000,
        "status": "completed",
        "model": "gpt-4o",
        "output": [
            {
                "type": "message",
                "id": "msg_fake",
                "status": "completed",
                "role": "assistant",
                "content": [{"type": "output_text", "text": text, "annotations": []}],
            }
        ],
        "usage": {
            "input_tokens": input_tokens,
            "output_tokens": output_tokens,
            "total_tokens": input_tokens + output_tokens,
        },
    }


def anthropic_request(text: str = "hi", **extra: Any) -> dict[str, Any]:
    return {
        "model": "claude-3-5-haiku-latest",
        "max_tokens": 256,
        "messages": [{"role": "user", "content": text}],
        **extra,
    }


def anthropic_message(
    text: str = "Hello", *, input_tokens: int = 100, output_tokens: int = 20
) -> dict[str, Any]:
    return {
        "id": "msg_fake",
        "type": "message",
        "role": "assistant",
        "model": "claude-3-5-haiku-latest",
        "content": [{"type": "text", "text": text}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": input_tokens, "output_tokens": output_tokens},
    }


def mcp_tools_call(name: str = "echo", arguments: Any = None, *, msg_id: Any = 1) -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "id": msg_id,
        "method": "tools/call",
        "params": {"name": name, "arguments": {"text": "again"} if arguments is None else arguments},
    }


def mcp_tool_result(text: str = "again", *, msg_id: Any = 1, is_error: bool = False) -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "id": msg_id,
        "result": {"content": [{"type": "text", "text": text}], "isError": is_error},
    }


def sse_message(msg: dict[str, Any], event_id: str | None = None) -> bytes:
    """One JSON-RPC message as an SSE `message` event (a Streamable HTTP POST answered as a stream)."""
    head = b"event: message\n" + (f"id: {event_id}\n".encode() if event_id else b"")
    return head + b"data: " + orjson.dumps(msg) + b"\n\n"


class CannedUpstream(BaseStage):
    """Stands where the forward stage stands in a pipeline: plays a canned answer (`play_upstream`)
    and lets the protocol wait for its result, as `ForwardStage` does, without any socket.
    `answers` are used in turn, the last one repeated."""

    name = "canned_upstream"

    def __init__(self, *answers: bytes | dict[str, Any], status: int = 200) -> None:
        self.answers = list(answers)
        self.status = status
        self.calls = 0

    async def request(self, ex: Exchange) -> None:
        answer = self.answers[min(self.calls, len(self.answers) - 1)]
        self.calls += 1
        self.passed_on = play_upstream(ex, answer, status=self.status, after_forward=False)
        if ex.protocol is not None:
            await ex.protocol.await_result(ex)
        if ex.protocol is not None:
            ex.protocol.after_forward(ex)
