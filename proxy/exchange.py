"""The per-request state that rides through the pipeline (as mitmproxy's HTTPFlow)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from proxy.guards.decision import Decision
from proxy.routing import Route
from proxy.sessions import Session


@dataclass
class Answer:
    """A response Tripwire gives itself instead of forwarding (a guard fired, a bad request)."""

    status: int
    body: bytes
    content_type: str = "application/json"
    headers: dict[str, str] = field(default_factory=dict)

    def to_response(self) -> web.Response:
        resp = web.Response(status=self.status, body=self.body, headers=self.headers)
        resp.content_type = self.content_type.split(";")[0]
        if "charset=" in self.content_type or self.content_type.startswith(("application/json", "text/")):
            resp.charset = "utf-8"
        return resp


@dataclass
class Exchange:
    request: web.Request
    route: Route
    body: bytes
    started: float  # monotonic, for durations and proxy overhead
    started_wall: float  # epoch seconds, for event timestamps
    session: Session | None = None

    # parse: the protocol adapter for this call and what it understood of the request
    protocol: Any = None  # proxy.llm.LLMProtocol / the MCP adapter; None = forward unrecorded
    call: Any = None  # LLMRequest, or the MCP adapter's parsed message
    upstream_body: bytes | None = None  # a rewritten body to send instead of `body`

    # guards
    decisions: list[Decision] = field(default_factory=list)
    after_decisions: list[Decision] = field(default_factory=list)
    reservation: Any = None
    breaker_ticket: Any = None
    guard_event_id: str | None = None  # the LOOP_WARNING / ERROR written for a refusal
    guard_trace: Any = None  # proxy.guard_trace.GuardTrace: what the call's event keeps for replay

    # answering
    answer: Answer | None = None  # set to answer without the upstream
    response: web.StreamResponse | None = None  # what the client received (forwarded)

    # forward: what the upstream did
    forwarded: bool = False  # the upstream was called (even if it then failed)
    observer: Any = None  # stream observer fed every chunk (dialect accumulator)
    upstream_status: int | None = None
    upstream_started: float | None = None
    first_byte_at: float | None = None
    upstream_done: float | None = None
    upstream_error: str | None = None  # connection error, timeout, broken stream
    stream_complete: bool = True
    result: Any = None  # LLMResult or the MCP adapter's result
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def refused(self) -> bool:
        """Tripwire answered instead of the upstream (a guard, a bad request): not a recorded call."""
        return self.answer is not None and not self.forwarded

    def upstream_failed(self) -> bool:
        """Breaker failure: connection error, timeout, 5xx, a stream that broke (SPEC §5.3)."""
        if self.upstream_error is not None:
            return True
        return self.upstream_status is not None and self.upstream_status >= 500
