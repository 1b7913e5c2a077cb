"""One `response.create` on a Responses socket (SPEC §4.2, §5.5): how its upstream events reach the
dialect's stream accumulator (as the SSE stream's events over HTTP), how it settles, and what the
client gets when Tripwire answers it itself (a refusal: the protocol's `error` event; a BLOCK: the
synthetic completed response's events).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any, cast

import orjson

from proxy.dialects.contract import Accumulator
from proxy.exchange import Answer, Exchange
from proxy.sse import SSEDecoder


def accumulator(ex: Exchange) -> Accumulator:
    """The dialect's stream accumulator the socket's parse stage set on a call's exchange."""
    assert ex.observer is not None
    return cast("Accumulator", ex.observer)


def sse_of(text: str) -> bytes:
    """A message as one SSE event, so the dialect's stream accumulator reads it as over HTTP.

    Raw line breaks can only be whitespace between JSON tokens: each line becomes a `data:` line,
    which the decoder joins back with `\\n`.
    """
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    return "".join(f"data: {line}\n" for line in lines).encode("utf-8", "surrogatepass") + b"\n"


def refusal_messages(answer: Answer, stream_id: str | None) -> list[str]:
    """What the client gets for a call Tripwire answered itself (SPEC §5.5).

    A BLOCK is the synthetic completed response, as the SSE stream's events; any other refusal is
    the Responses WebSocket `error` event: `{"type": "error", "status", "error": {...}, "headers"}`,
    the error object being the HTTP refusal's (code = the guard code, message, guardrail, ...).
    """
    messages: list[str] = []
    if answer.status < 400 and answer.content_type.startswith("text/event-stream"):
        decoder = SSEDecoder()
        for event in [*decoder.feed(answer.body), *decoder.flush()]:
            if event.data is None:
                continue
            data = orjson.loads(event.data)
            if stream_id is not None:
                data["stream_id"] = stream_id
            messages.append(orjson.dumps(data).decode())
        return messages
    try:
        body = orjson.loads(answer.body)
    except orjson.JSONDecodeError:
        body = None
    error = body.get("error") if isinstance(body, dict) else None
    if not isinstance(error, dict):
        text = answer.body[:2000].decode("utf-8", "replace")
        error = {"type": "tripwire_error", "code": None, "message": text}
    error = {**error, "param": error.get("param")}
    error_event: dict[str, Any] = {
        "type": "error",
        "status": answer.status,
        "error": error,
        "headers": {k.lower(): v for k, v in answer.headers.items()},
    }
    if stream_id is not None:
        error_event["stream_id"] = stream_id
    return [orjson.dumps(error_event).decode()]


class SocketCall:
    """One `response.create` on the socket: its exchange (None for a warm-up) and where it stands."""

    def __init__(self, send: Forward, frame: str | bytes, stream_id: str | None) -> None:
        self.send = send  # the forward stage's: sends the admitted message, waits for its response
        self.frame = frame
        self.stream_id = stream_id
        self.ex: Exchange | None = None
        self.warmup: dict[str, Any] | None = None  # a warm-up's message
        self.response_id: str | None = None
        loop = asyncio.get_running_loop()
        self.admitted: asyncio.Future[bool] = loop.create_future()  # sent upstream (True) or not
        self.done: asyncio.Future[None] = loop.create_future()  # its response settled
        self.task: asyncio.Task[None] | None = None
        self.started = False  # an event of its response was seen
        self.fed = False

    def admit(self, sent: bool) -> None:
        if not self.admitted.done():
            self.admitted.set_result(sent)

    def feed(self, text: str, kind: str | None, response_id: str | None) -> None:
        if kind is not None and kind.startswith("response."):
            self.started = True  # (not for other events in between, such as rate-limit notices)
        if response_id is not None and self.response_id is None:
            self.response_id = response_id
        ex = self.ex
        if ex is None:
            return
        if ex.first_byte_at is None:
            ex.first_byte_at = time.monotonic()
        accumulator(ex).feed(sse_of(text))
        self.fed = True

    def fail_with(self, text: str, status: int | None) -> None:
        """A request-level `error` event answers the call: read as an HTTP error answer is."""
        ex = self.ex
        if ex is not None:
            ex.upstream_status = status if status is not None else 500
            if ex.first_byte_at is None:
                ex.first_byte_at = time.monotonic()
            observer = accumulator(ex)
            if self.fed:
                observer.feed(sse_of(text))
            else:
                observer.status = ex.upstream_status
                observer.feed(text.encode("utf-8", "surrogatepass"))  # a plain body: an error answer
        self.settle()

    def settle(self, *, upstream_error: str | None = None, reason: str | None = None) -> None:
        """The response is over: cleanly (its terminal event), or cut (`upstream_error` when the
        upstream broke it, `reason` when the client or Tripwire ended the socket)."""
        self.admit(False)
        if self.done.done():
            return
        ex = self.ex
        if ex is not None:
            ex.upstream_done = time.monotonic()
            if upstream_error is not None and ex.upstream_error is None:
                ex.stream_complete = False
                ex.upstream_error = upstream_error
            elif reason is not None:
                ex.stream_complete = False
                if ex.incomplete_reason is None:
                    ex.incomplete_reason = reason
        self.done.set_result(None)

    async def forward(self) -> None:
        await self.send(self)


Forward = Callable[[SocketCall], Awaitable[None]]
