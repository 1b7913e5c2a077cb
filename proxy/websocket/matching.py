"""Which call an upstream event on a Responses socket belongs to, and what a client message is.

Pure (no sockets): the relay feeds it text. Events are matched to calls by stream: the `stream_id` a
`response.create` named (events echo it), each stream's queue first in, first out, one response at a time, as
the server runs them. An event is read cheaply: parsed whole up to HEAD_PARSE_LIMIT, else its type,
stream id and status found by regex in its head and tail (a final event repeats the whole output,
megabytes, and is relayed as it is).
"""

from __future__ import annotations

import re
from collections import deque
from typing import Any, Generic, Protocol, TypeVar

import orjson

from proxy import llm

TERMINAL = frozenset({"response.completed", "response.incomplete", "response.failed"})
# messages up to this size are parsed whole to find their type; larger ones by their head and tail
HEAD_PARSE_LIMIT = 256 * 1024
_TYPE = re.compile(r'"type"\s*:\s*"([A-Za-z0-9_.]+)"')
_STREAM_ID = re.compile(r'"stream_id"\s*:\s*"((?:[^"\\]|\\.)*)"')
_STATUS = re.compile(r'"status"\s*:\s*(\d{3})\b')


def event_head(text: str) -> tuple[str | None, str | None, int | None, str | None]:
    """(type, stream_id, status, response id) of an upstream message; cheap for large ones."""
    if len(text) <= HEAD_PARSE_LIMIT:
        try:
            data = orjson.loads(text)
        except orjson.JSONDecodeError:
            return None, None, None, None
        if not isinstance(data, dict):
            return None, None, None, None
        kind, stream_id, status = data.get("type"), data.get("stream_id"), data.get("status")
        response = data.get("response")
        rid = response.get("id") if isinstance(response, dict) else None
        return (
            kind if isinstance(kind, str) else None,
            stream_id if isinstance(stream_id, str) else None,
            status if isinstance(status, int) and not isinstance(status, bool) else None,
            rid if isinstance(rid, str) else None,
        )
    head, tail = text[:4096], text[-4096:]
    kind_m = _TYPE.search(head)
    stream_m = _STREAM_ID.search(head) or _STREAM_ID.search(tail)
    status_m = _STATUS.search(head) if kind_m and kind_m.group(1) == "error" else None
    return (
        kind_m.group(1) if kind_m else None,
        stream_m.group(1) if stream_m else None,
        int(status_m.group(1)) if status_m else None,
        None,
    )


def classify(raw: bytes) -> tuple[str, dict[str, Any] | None]:
    """("call" | "warmup" | "relay", the parsed message) for a client message on a Responses socket.

    A call is a `response.create` that generates, and anything the guards cannot read as another
    client event (not JSON, not an object, no type): judged like an HTTP body, never forwarded
    unjudged. Other client events (`response.steer`, `response.processed`, ...) are relayed.
    """
    try:
        body, _ = llm.read_body(raw)
    except ValueError:
        return "call", None
    if not isinstance(body, dict) or not isinstance(body.get("type"), str):
        return "call", None
    if body["type"] != "response.create":
        # `Response.Create`, `response.create ` (an upstream folding them would generate): judged
        return ("call", body) if body["type"].strip().casefold() == "response.create" else ("relay", body)
    if body.get("generate") is False:
        return "warmup", body
    return "call", body


class Matched(Protocol):
    """What matching asks of a call sent upstream (proxy.websocket.calls.SocketCall)."""

    started: bool  # an event of its response was seen
    response_id: str | None

    def feed(self, text: str, kind: str | None, response_id: str | None) -> None: ...

    def fail_with(self, text: str, status: int | None) -> None: ...

    def settle(self, *, upstream_error: str | None = None, reason: str | None = None) -> None: ...


C = TypeVar("C", bound=Matched)


class StreamQueues(Generic[C]):
    """The calls sent upstream and not yet answered, per `stream_id`, oldest first."""

    def __init__(self) -> None:
        self.by_id: dict[str | None, deque[C]] = {}
        # the call the last observed event settled (any terminal event), else None: with shared
        # state its terminal event is relayed only once the call is settled there (SPEC §8)
        self.settled: C | None = None

    def queue(self, stream_id: str | None) -> deque[C]:
        queue = self.by_id.get(stream_id)
        if queue is None:
            queue = self.by_id[stream_id] = deque()
        return queue

    def fail_all(self, why: str) -> None:
        for queue in self.by_id.values():
            while queue:
                queue.popleft().settle(upstream_error=why)

    def observe(self, text: str) -> C | None:
        """Feed an upstream event to the call it belongs to; settle the call on its last event.
        Returns the call a `response.completed` settled (a warm-up's links its chain), else None."""
        self.settled = None
        kind, stream_id, status, response_id = event_head(text)
        queue = self.by_id.get(stream_id)
        if not queue:
            self.by_id.pop(stream_id, None)
            return None
        if kind == "error":
            # a request-level error (it has an HTTP status) answers the oldest response.create
            # not yet started; a stream error belongs to the response running (its terminal follows)
            target = queue[0]
            if status is not None:
                target = next((c for c in queue if not c.started), queue[0])
            if target.started:
                target.feed(text, kind, None)
                return None
            queue.remove(target)
            target.fail_with(text, status)
            return None
        call = queue[0]
        if response_id is not None and call.response_id not in (None, response_id):
            # another response's events: the running one never ended, it broke
            queue.popleft()
            call.settle(upstream_error="the upstream started a new response before this one ended")
            if not queue:
                return None
            call = queue[0]
        call.feed(text, kind, response_id)
        if kind in TERMINAL:
            queue.popleft()
            call.settle()
            self.settled = call
            if kind == "response.completed":
                return call
        return None
