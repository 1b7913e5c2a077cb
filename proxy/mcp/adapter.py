"""The protocol adapter for MCP `tools/call`: render Tripwire's answers, wait for the result, record it.

The pipeline calls it as it calls the LLM adapter (proxy/llm.py): `render_block` / `render_refusal`
when a guard answers, `await_result` + `after_forward` once the call went upstream, `record` at
the end. Every answer Tripwire gives on `/mcp/*` is JSON-RPC in the client's own transport
(SPEC §5.5): a JSON body with HTTP 200 on Streamable HTTP; on legacy HTTP+SSE the POST gets its
usual 202 and the message is injected into the session's SSE stream.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any, Protocol

from proxy import guard_trace
from proxy.constants import EventType
from proxy.exchange import Answer, Exchange
from proxy.guards.decision import Decision, retry_after_seconds
from proxy.guards.signatures import signature
from proxy.mcp import jsonrpc
from proxy.mcp.hub import McpHub, Pending
from proxy.mcp.legacy import LegacyStream

if TYPE_CHECKING:
    from proxy.metrics import Metrics
    from proxy.session_policy import SessionPolicy
    from proxy.sessions import Session
    from proxy.settings import Settings

# A POST's SSE stream broke (or the server closed it early) before the result: the client may resume
# on a GET stream; wait this long.
RESUME_WAIT_S = 30.0


class AdapterEngine(Protocol):
    """What the adapter uses of the engine (proxy/engine.py satisfies it), so this module needs no import of it."""

    @property
    def settings(self) -> Settings: ...
    @property
    def metrics(self) -> Metrics: ...
    @property
    def policy(self) -> SessionPolicy: ...


class MCPProtocol:
    kind = "mcp"

    def __init__(
        self,
        engine: AdapterEngine,
        hub: McpHub,
        pending: Pending,
        session_key: str,
        legacy: LegacyStream | None,
    ) -> None:
        self.engine = engine
        self.hub = hub
        self.pending = pending
        self.session_key = session_key
        self.legacy = legacy

    # --- answers Tripwire gives itself ---------------------------------------------------------

    def render_block(self, ex: Exchange, decision: Decision, text: str) -> Answer:
        """BLOCK: a JSON-RPC *result* with isError, so the model sees it and the SDK does not raise."""
        call: jsonrpc.MCPToolCall = ex.call
        result = jsonrpc.blocked_result(
            text,
            decision.guard,
            decision.threshold,
            decision.actual,
            self.engine.settings.expose_guard_details,
        )
        if decision.retry_after is not None:  # a rate limit: when to try again (SPEC §9)
            result["_meta"]["tripwire"]["retry_after"] = retry_after_seconds(decision.retry_after)
        answer = self.answer(jsonrpc.render_result(call.jsonrpc_id, result))
        answer.headers["X-Tripwire-Guard"] = decision.guard
        return answer

    def render_refusal(self, ex: Exchange, decision: Decision, text: str) -> Answer:
        """Any other refusal: a JSON-RPC error with the same id, never an HTTP error."""
        call: jsonrpc.MCPToolCall = ex.call
        data: dict[str, Any] = {"guardrail": decision.guard}
        if self.engine.settings.expose_guard_details:
            data["threshold"] = decision.threshold
            data["actual"] = decision.actual
        if decision.retry_after is not None:
            data["retry_after"] = retry_after_seconds(decision.retry_after)
        if decision.resets_at is not None:
            data["resets_at"] = decision.resets_at
        body = jsonrpc.render_error(call.jsonrpc_id, jsonrpc.TRIPWIRE_GUARD_ERROR, text, data)
        answer = self.answer(body)
        answer.headers["X-Tripwire-Guard"] = decision.guard
        return answer

    def answer(self, message: bytes) -> Answer:
        """One JSON-RPC message in the client's transport."""
        if self.legacy is not None and self.legacy.exchange is not None:
            self.hub.legacy.inject(self.legacy, message)
            return Answer(202, b"Accepted", "text/plain")
        return Answer(200, message, "application/json")

    def reservation_estimate(self, ex: Exchange) -> float:
        return 0.0  # a tool call costs no tokens

    def continues(self, ex: Exchange) -> bool:
        """A 2026-07-28 resend of a call answered `input_required`: the same call going on, which
        the guards already admitted and counted (not a new call, not a repetition)."""
        call: jsonrpc.MCPToolCall = ex.call
        return (
            call.continuation
            and ex.session is not None
            and waiting_key(ex.session.run_id, call) in self.hub.awaiting_input
        )

    # --- after forwarding ----------------------------------------------------------------------

    async def await_result(self, ex: Exchange) -> None:
        """Set `ex.result` (and, when the server is down, a JSON-RPC error answer)."""
        call: jsonrpc.MCPToolCall = ex.call
        future = self.pending.future
        if ex.upstream_status is None:
            message = f"MCP server {call.server!r} failed: {ex.upstream_error or 'no answer'}"
            ex.result = jsonrpc.failure_result(message)
            ex.answer = self.answer(
                jsonrpc.render_error(
                    call.jsonrpc_id, jsonrpc.TRIPWIRE_UPSTREAM_ERROR, message, {"server": call.server}
                )
            )
            return
        if not future.done():
            if ex.upstream_status >= 400:
                ex.result = jsonrpc.failure_result(
                    f"MCP server {call.server!r} answered HTTP {ex.upstream_status}",
                    upstream_failure=ex.upstream_status >= 500,
                )
                return
            if self.legacy is not None:
                wait = self.engine.settings.ttfb_timeout_s
                # the client answers a server request (sampling) with a POST, maybe over this POST's
                # keep-alive connection: it must not queue behind this wait (the call needs the answer)
                if self.pending.server_asked:
                    release_client_connection(ex)
                else:
                    self.pending.on_server_request = lambda: release_client_connection(ex)
            elif not ex.stream_complete or (call.mcp_session_id and getattr(ex.observer, "resumable", False)):
                # broken, or closed early by the server (2025-11-25 polling): the client resumes on a GET
                wait = RESUME_WAIT_S
                release_client_connection(ex)
            else:
                ex.result = jsonrpc.failure_result(
                    f"MCP server {call.server!r} answered without a result for this call",
                    upstream_failure=False,
                )
                return
            try:
                await asyncio.wait_for(asyncio.shield(future), wait)
            except (TimeoutError, ConnectionError) as e:
                ex.result = jsonrpc.failure_result(
                    f"MCP server {call.server!r}: {e or 'no result in time'}", upstream_failure=True
                )
                return
        if ex.mcp_result_at is None:
            ex.mcp_result_at = time.monotonic()
        ex.result = jsonrpc.tool_result(future.result())

    def after_forward(self, ex: Exchange) -> None:
        return None  # everything was read in await_result

    # --- the trace -----------------------------------------------------------------------------

    def record(self, ex: Exchange, engine: AdapterEngine) -> None:
        """One TOOL_CALL per tools/call (an input_required round trip is one call)."""
        result: jsonrpc.MCPToolResult | None = ex.result
        session = ex.session
        if result is None or session is None:
            return
        ex.mcp_recorded = True
        end = ex.mcp_result_at or ex.upstream_done or time.monotonic()
        event_id = record_tool_call(
            engine,
            self.hub,
            session,
            ex.call,
            result,
            ex.started,
            ex.started_wall,
            end,
            guard_fields=guard_trace.call_fields(ex),
        )
        if event_id is not None:
            ex.tool_event_id = event_id


def release_client_connection(ex: Exchange) -> None:
    """The POST's answer has ended, but this handler waits on for the result. aiohttp serves the next
    request of a keep-alive connection only once the handler returns, so a client's next request over
    the same connection (a resume GET, the answer to a sampling request) would wait for the wait:
    close it, the client opens a fresh one."""
    transport = ex.request.transport
    if transport is not None and not transport.is_closing():
        transport.close()


def record_tool_call(
    engine: AdapterEngine,
    hub: McpHub,
    session: Session,
    call: jsonrpc.MCPToolCall,
    result: jsonrpc.MCPToolResult,
    started: float,
    started_wall: float,
    end: float,
    guard_fields: dict[str, Any] | None = None,
) -> str | None:
    """Write the TOOL_CALL of a completed call; None while it waits for an input_required resend.

    `guard_fields` (call_seq, fingerprints, guard_input) come from the round trip the guards judged:
    the first one when the call went through `input_required`.
    """
    key = waiting_key(session.run_id, call)
    if result.input_required:
        hub.await_input(key, started, started_wall, guard_fields)
        return None
    prior = hub.awaiting_input.pop(key, None) if call.continuation else None
    if prior is not None:
        started, started_wall = prior.started, prior.started_wall
        if prior.guard_fields:
            guard_fields = {**prior.guard_fields, "result_fingerprint": result.fingerprint}
    payload = {
        "tool_name": call.tool_name,
        "args": call.arguments,
        "result": result.result,
        "status": result.status,
        "error": result.error,
        "source": "mcp",
        "server": call.server,
        **(guard_fields or {}),
    }
    meta: dict[str, Any] = {
        "agent": session.agent,
        "session_id": session.session_id,
        "jsonrpc_id": call.jsonrpc_id,
        "mcp_session_id": call.mcp_session_id,
        "transport": call.transport,
    }
    if call.protocol_version:
        meta["mcp_protocol_version"] = call.protocol_version
    if call.aggregated:  # through `/mcp`: the tool is `SERVER__TOOL`, the server its owner
        meta["server"] = call.server
        meta["aggregate"] = True
    event_id = engine.policy.write_event(
        session,
        EventType.TOOL_CALL,
        call.tool_name,
        payload,
        duration_ms=max(0, int((end - started) * 1000)),
        meta=meta,
        ts=started_wall,
    )
    engine.policy.observe_event(session, EventType.TOOL_CALL, call.tool_name, event_id)
    sigs = session.conversation.mcp_signatures
    sig = key[-1]
    sigs[sig] = sigs.get(sig, 0) + 1
    engine.metrics.observe_tool(call.server, result.status, call.tool_name)
    return event_id


def waiting_key(run_id: str, call: jsonrpc.MCPToolCall) -> tuple[str, str, str | None, str]:
    """A call waiting for its `input_required` resend: same run, server, MCP session, tool and args."""
    return (run_id, call.server, call.mcp_session_id, signature(call.tool_name, call.arguments))
