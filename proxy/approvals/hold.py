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
from proxy.exchange import Exchange

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
        response = self.lane_maker(200, None, CIMultiDict(SSE_HEADERS), True)
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
                if client_gone(held.ex):
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


def client_gone(ex: Exchange) -> bool:
    transport = ex.request.transport
    return transport is None or transport.is_closing()


def held_streamed(ex: Exchange) -> bool:
    """A streamed LLM call: its answer starts while held, with keep-alives (SPEC §5.5a)."""
    if ex.ws_call is not None:  # a Responses WebSocket call: nothing is sent until decided
        return False
    return getattr(ex.protocol, "kind", None) == "llm" and bool(getattr(ex.call, "stream", False))


def held_call(ex: Exchange) -> dict[str, Any]:
    """What the person is asked about: the tool and its arguments, or the model."""
    call = ex.call
    if getattr(ex.protocol, "kind", None) == "mcp":
        return {"tool": call.tool_name, "arguments": call.arguments, "server": ex.route.upstream}
    return {"model": getattr(call, "model", None), "stream": bool(getattr(call, "stream", False))}
