"""Reading JSON-RPC messages out of an MCP answer while it is relayed (the Forwarder's observer).

An answer is either one JSON body (or a batch) or an SSE stream of `message` events. The kind is
sniffed from the first bytes (the Forwarder does not hand observers the headers). SSE is relayed
event by event as each event completes: nothing a client could already act on is held back, so a
server-to-client request (sampling) on a POST's stream reaches the client at once. Only whole events
are passed on, which is what lets Tripwire inject its own event between two of the server's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson

from proxy.mcp import jsonrpc
from proxy.sse import SSEDecoder, SSEEvent

# on_message(msg) -> a replacement message to send instead, or None to relay it unchanged
OnMessage = Callable[[dict[str, Any]], dict[str, Any] | None]
# on_endpoint(data) -> the rewritten `endpoint` event data (legacy HTTP+SSE)
OnEndpoint = Callable[[str], str]


class MessageObserver:
    def __init__(
        self,
        on_message: OnMessage,
        *,
        limit: int,
        on_endpoint: OnEndpoint | None = None,
        hold_json: Callable[[], bool] = lambda: False,
        take_injected: Callable[[], bytes] = lambda: b"",
    ) -> None:
        self.on_message = on_message
        self.on_endpoint = on_endpoint
        self.limit = limit
        self._hold_json = hold_json  # a JSON answer will be rewritten: hold it until complete
        self._take_injected = take_injected  # Tripwire's own events waiting to go out
        self.mode: str | None = None  # "json" | "sse"
        self._holding = False
        self._json = bytearray()
        self._decoder = SSEDecoder()
        self.messages_seen = 0
        self.resumable = False  # an SSE event carried an id: the client can resume with Last-Event-ID

    def hold_all_json(self) -> None:
        """A JSON answer is held until complete whatever `hold_json` says (its result may be
        replaced: proxy/stages/pins.py); before the answer's first byte only."""
        self._hold_json = lambda: True

    @property
    def rewrites(self) -> bool:
        """Read by the Forwarder once the upstream answered: a held JSON body loses its Content-Length."""
        return self._hold_json()

    def feed(self, chunk: bytes) -> bytes:
        if self.mode is None:
            head = chunk.lstrip()[:1]
            if not head:
                return chunk
            self.mode = "json" if head in (b"{", b"[") else "sse"
            self._holding = self.mode == "json" and self._hold_json()
        if self.mode == "json":
            if self._holding and len(self._json) + len(chunk) > self.limit:
                # too big to hold (and to parse): relay it whole as it comes, without the WARN block
                self._holding = False
                out = bytes(self._json) + chunk
                self._json += chunk
                return out
            if len(self._json) < self.limit:
                self._json += chunk
            return b"" if self._holding else chunk
        pieces = [self._take_injected()]
        pieces.extend(self._event(e) for e in self._decoder.feed(chunk))
        return b"".join(pieces)

    def flush(self) -> bytes:
        if self.mode == "json":
            return self._finish_json()
        if self.mode == "sse":
            return self._take_injected() + b"".join(e.raw for e in self._decoder.flush())
        return b""

    def _finish_json(self) -> bytes:
        body = bytes(self._json)
        parsed = jsonrpc.parse_body(body)
        if parsed is None:
            return body if self._holding else b""
        messages, batch = parsed
        changed = False
        out: list[Any] = []
        for msg in messages:
            replacement = self._message(msg)
            changed = changed or replacement is not None
            out.append(replacement if replacement is not None else msg)
        if not self._holding:
            return b""
        if not changed:
            return body
        return orjson.dumps(out if batch else out[0])

    def _message(self, msg: Any) -> dict[str, Any] | None:
        if not isinstance(msg, dict):
            return None
        self.messages_seen += 1
        return self.on_message(msg)

    def _event(self, event: SSEEvent) -> bytes:
        if event.id:
            self.resumable = True
        if event.data is None:
            return event.raw  # keep-alive comments, retry hints
        if event.type == "endpoint" and self.on_endpoint is not None:
            return _event_bytes(event, self.on_endpoint(event.data).encode())
        if event.type != "message":
            return event.raw
        try:
            data = orjson.loads(event.data)
        except orjson.JSONDecodeError:
            return event.raw
        if isinstance(data, list):
            replaced = [self._message(m) for m in data]
            if all(r is None for r in replaced):
                return event.raw
            merged = [r if r is not None else m for r, m in zip(replaced, data, strict=True)]
            return _event_bytes(event, orjson.dumps(merged))
        replacement = self._message(data)
        if replacement is None:
            return event.raw
        return _event_bytes(event, orjson.dumps(replacement))


def _event_bytes(event: SSEEvent, data: bytes) -> bytes:
    """Re-render an event with new data, keeping its type, id and retry."""
    lines = []
    if event.event is not None:
        lines.append(b"event: " + event.event.encode())
    if event.id is not None:
        lines.append(b"id: " + event.id.encode())
    if event.retry is not None:
        lines.append(b"retry: " + str(event.retry).encode())
    lines.extend(b"data: " + line for line in data.split(b"\n"))
    return b"\n".join(lines) + b"\n\n"
