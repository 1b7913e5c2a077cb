"""What a held call's client sees while a person decides (SPEC §5.5a): nothing that reads as an
answer, keep-alives where the transport has them, and a hang-up noticed.

One `Watch` per process ticks once a second while anything is held (not a loop per held call):
it notices clients that hung up (their wait ends as withdrawn) and writes the keep-alives that
are due. A streamed LLM call's answer starts at once (`HeldStream`: the SSE head, then `:
keep-alive` comments); the real stream or Tripwire's own answer then goes into that same stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass
from typing import Any

import orjson
from multidict import CIMultiDict

from proxy.call_request import ClientAnswer
from proxy.constants import OVERHEAD_HEADER
from proxy.exchange import Exchange
from proxy.guards.decision import Decision
from proxy.guards.loop.history import call_tuple
from proxy.mcp import jsonrpc
from proxy.redact import sanitize

log = logging.getLogger("tripwire.approvals")

KEEPALIVE = b": keep-alive\n\n"
SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


class HeldStream:
    """A streamed LLM call's answer, started while the call is held."""

    def __init__(self, ex: Exchange) -> None:
        self.ex = ex
        self.response: ClientAnswer | None = None
        self.lane_maker = ex.answer_maker

    async def start(self) -> None:
        headers = CIMultiDict(SSE_HEADERS)
        headers[OVERHEAD_HEADER] = self.ex.overhead_ms(time.monotonic())  # the head goes now
        response = self.lane_maker(200, None, headers, True)
        await response.prepare(self.ex.request)
        self.response = response
        await self.keep_alive()

    async def keep_alive(self) -> None:
        if self.response is not None:
            await self.response.write(KEEPALIVE)

    def relay_into(self) -> None:
        """Approved: the forwarder relays the upstream's answer into the started stream (an answer
        that is not a stream, an upstream's error, ends it as the dialect's in-stream error)."""
        held = self

        def maker(status: int, reason: str | None, headers: CIMultiDict[str], stream: bool) -> ClientAnswer:
            assert held.response is not None
            return StartedAnswer(held.response) if stream else ErrorIntoStream(held.response, held.ex)

        self.ex.answer_maker = maker

    async def end_with(self, body: bytes, *, refusal: bool) -> None:
        """Tripwire's own answer into the started stream: a synthetic block's SSE body as it is, a
        refusal's JSON error as the dialect's in-stream error event; then the stream's end."""
        assert self.response is not None
        data = in_stream_error(self.ex, body) if refusal else body
        with contextlib.suppress(ConnectionResetError, RuntimeError):
            await self.response.write(data)
            await self.response.write_eof()
        self.ex.response = self.response


def in_stream_error(ex: Exchange, body: bytes) -> bytes:
    """A refusal's error JSON as the event a streaming SDK raises on: Anthropic's `error` event
    (its body is already Anthropic's error shape), or OpenAI's `data: {"error": ...}` (chat and
    Responses SDKs raise APIError on it)."""
    try:
        anthropic = orjson.loads(body).get("type") == "error"
    except (orjson.JSONDecodeError, AttributeError):
        anthropic = False
    if anthropic:
        return b"event: error\ndata: " + body + b"\n\n"
    return b"data: " + body + b"\n\n"


class StartedAnswer:
    """The started stream as the forwarder's answer: its head went out already (the lean lane's
    answer would write a second head if prepared again)."""

    def __init__(self, response: ClientAnswer) -> None:
        self.response = response

    async def prepare(self, request: Any) -> object:
        return None

    @property
    def prepared(self) -> bool:
        return True

    async def write(self, data: bytes) -> None:
        await self.response.write(data)

    async def write_eof(self, data: bytes = b"") -> None:
        await self.response.write_eof(data)

    def force_close(self) -> None:
        self.response.force_close()


class ErrorIntoStream:
    """The upstream answered a held stream with a whole body (an error): written into the stream
    as the dialect's in-stream error when it ends."""

    def __init__(self, response: ClientAnswer, ex: Exchange) -> None:
        self.response, self.ex = response, ex
        self.body = bytearray()

    async def prepare(self, request: Any) -> object:
        return None

    @property
    def prepared(self) -> bool:
        return True

    async def write(self, data: bytes) -> None:
        self.body += data

    async def write_eof(self, data: bytes = b"") -> None:
        self.body += data
        body = bytes(self.body) or b'{"error": {"message": "upstream error", "type": "upstream_error"}}'
        await self.response.write(in_stream_error(self.ex, body))
        await self.response.write_eof()

    def force_close(self) -> None:
        self.response.force_close()


@dataclass
class _Held:
    ex: Exchange
    gone: asyncio.Future[None]
    stream: HeldStream | None
    next_keepalive: float


class Watch:
    """Every held call of this process: hang-ups noticed, keep-alives written, one tick a second."""

    tick_s = 1.0
    keepalive_s = 15.0  # an SSE comment this often on a held stream (proxies cut silent streams)

    def __init__(self) -> None:
        self.held: dict[int, _Held] = {}
        self._task: asyncio.Task[None] | None = None

    def add(self, ex: Exchange, stream: HeldStream | None) -> asyncio.Future[None]:
        """The future that resolves if the client hangs up."""
        gone: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.held[id(ex)] = _Held(ex, gone, stream, time.monotonic() + self.keepalive_s)
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run(), name="tripwire-approvals-watch")
        return gone

    def remove(self, ex: Exchange) -> None:
        self.held.pop(id(ex), None)

    async def _run(self) -> None:
        while self.held:
            await asyncio.sleep(self.tick_s)
            now = time.monotonic()
            for held in list(self.held.values()):
                if held.gone.done():
                    continue
                if client_gone(held.ex, held.stream):
                    held.gone.set_result(None)
                    continue
                if held.stream is not None and now >= held.next_keepalive:
                    held.next_keepalive = now + self.keepalive_s
                    try:
                        await held.stream.keep_alive()
                    except (ConnectionResetError, RuntimeError, OSError):
                        held.gone.set_result(None)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task


def client_gone(ex: Exchange, stream: HeldStream | None = None) -> bool:
    """The held call's client hung up. An aggregated call (`/mcp`) runs on an in-process request
    without a connection of its own: its `client`, the aggregate client's request, is watched."""
    if isinstance(stream, HeldAccepted):
        request: Any = stream.watched.request
    else:
        request = getattr(ex.request, "client", None) or ex.request
    transport = request.transport
    return transport is None or transport.is_closing()


def held_stream_for(ex: Exchange) -> HeldStream | None:
    """The answer a held call starts at once (SPEC §5.5a), or None: it waits with no byte sent.

    A streamed LLM call: its SSE stream, with keep-alives. An MCP call whose client reads SSE
    answers (Streamable HTTP, every revision): an SSE answer with keep-alives, which the server's
    answer (JSON or SSE) or Tripwire's own goes on in. A legacy HTTP+SSE POST: its 202 at once (the
    answer comes on the session's stream). A Responses WebSocket call or a JSON-only client: nothing.
    """
    if ex.ws_call is not None:
        return None
    kind = getattr(ex.protocol, "kind", None)
    if kind == "llm":
        return HeldStream(ex) if getattr(ex.call, "stream", False) else None
    if kind != "mcp":
        return None
    legacy = getattr(ex.protocol, "legacy", None)
    if legacy is not None and legacy.exchange is not None:
        return HeldAccepted(ex, legacy.exchange)
    if "text/event-stream" in ex.request.headers.get("Accept", ""):
        return HeldMcpStream(ex)
    return None


class HeldMcpStream(HeldStream):
    """An MCP Streamable HTTP answer started while held: SSE comments, then one `message` event
    (the server's SSE relayed as it is, a JSON answer wrapped as an event)."""

    def relay_into(self) -> None:
        held = self

        def maker(status: int, reason: str | None, headers: CIMultiDict[str], stream: bool) -> ClientAnswer:
            assert held.response is not None
            return StartedAnswer(held.response) if stream else JsonIntoStream(held.response)

        self.ex.answer_maker = maker

    async def end_with(self, body: bytes, *, refusal: bool) -> None:
        assert self.response is not None
        with contextlib.suppress(ConnectionResetError, RuntimeError):
            if body.strip():
                await self.response.write(jsonrpc.sse_message(body.strip()))
            await self.response.write_eof()
        self.ex.response = self.response


class JsonIntoStream(ErrorIntoStream):
    """The server answered a held MCP call with JSON: one SSE `message` event in the started answer."""

    def __init__(self, response: ClientAnswer) -> None:
        self.response = response
        self.body = bytearray()

    async def write_eof(self, data: bytes = b"") -> None:
        self.body += data
        if bytes(self.body).strip():
            await self.response.write(jsonrpc.sse_message(bytes(self.body).strip()))
        await self.response.write_eof()


class HeldAccepted(HeldStream):
    """A legacy HTTP+SSE POST: its 202 goes at once, as the server's would; the call's answer comes
    on the session's stream (the server's result, or Tripwire's own injected). The POST's connection
    is closed after the 202 (aiohttp would serve the client's next request on it only after this
    handler returns); the client's hang-up is its stream's."""

    def __init__(self, ex: Exchange, stream_exchange: Exchange) -> None:
        super().__init__(ex)
        self.watched = stream_exchange

    async def start(self) -> None:
        response = self.lane_maker(
            202, "Accepted", CIMultiDict({"Content-Type": "text/plain; charset=utf-8"}), False
        )
        await response.prepare(self.ex.request)
        await response.write_eof(b"Accepted")
        self.response = response
        transport = self.ex.request.transport
        if transport is not None:
            transport.close()

    async def keep_alive(self) -> None:
        return None  # the session's stream has the server's own

    def relay_into(self) -> None:
        self.ex.answer_maker = lambda status, reason, headers, stream: Discarded()

    async def end_with(self, body: bytes, *, refusal: bool) -> None:
        self.ex.response = self.response  # the answer was injected into the stream


class Discarded:
    """The server's 202 to a legacy POST whose 202 went already."""

    async def prepare(self, request: Any) -> object:
        return None

    @property
    def prepared(self) -> bool:
        return True

    async def write(self, data: bytes) -> None:
        return None

    async def write_eof(self, data: bytes = b"") -> None:
        return None

    def force_close(self) -> None:
        return None


MAX_LISTED_CALLS = 20  # tool calls of the held step listed with an approval (the rest counted)


def held_call(ex: Exchange, max_field_bytes: int = 8192) -> dict[str, Any]:
    """What the person is asked about: the tool and its arguments (secrets redacted and long values
    cut as the trace keeps them: the API and the webhook show them), or the model and the tool
    calls of the step the request goes on from (the model's last step, which a loop repeats)."""
    call = ex.call
    if getattr(ex.protocol, "kind", None) == "mcp":
        arguments = sanitize(call.arguments, max_field_bytes)
        return {"tool": call.tool_name, "arguments": arguments, "server": ex.route.upstream}
    # a Responses previous_response_id stands for its chain's history (as the guards judged it)
    steps = ex.history.steps if ex.history is not None else getattr(call, "steps", None) or []
    last = [call_tuple(c) for c in steps[-1]] if steps else []
    listed = [
        {"name": name, "arguments": sanitize(arguments, max_field_bytes)}
        for _, name, arguments in last[:MAX_LISTED_CALLS]
    ]
    out: dict[str, Any] = {
        "model": getattr(call, "model", None),
        "stream": bool(getattr(call, "stream", False)),
        "tool_calls": listed,
    }
    if len(last) > MAX_LISTED_CALLS:
        out["tool_calls_not_listed"] = len(last) - MAX_LISTED_CALLS
    return out


def held_evidence(decision: Decision, max_field_bytes: int = 8192) -> dict[str, Any]:
    """What a loop pattern saw (as its LOOP_WARNING has it): the repeated pattern (its arguments'
    secrets redacted), how many times, and the events of the calls (TOOL_CALL event ids, which the
    run's timeline shows); {} for what is not a loop."""
    if decision.kind is None:
        return {}
    return {
        "pattern": sanitize(decision.pattern, max_field_bytes),
        "repetitions": decision.repetitions,
        "window_size": decision.window_size,
        "event_ids": list(decision.evidence),
    }
