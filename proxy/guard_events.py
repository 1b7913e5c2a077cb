"""What a guard decision writes to the trace: one home for the LOOP_WARNING and ERROR payloads
(SPEC §4.1), used by the guard stage (before a call) and the engine (AgentDbg's cycle, after one)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from proxy.constants import GUARD_STATE_UNAVAILABLE, EventType
from proxy.exchange import Exchange
from proxy.guards.decision import Action, Decision
from proxy.guards.describe import describe
from proxy.guards.signatures import signature

if TYPE_CHECKING:
    from proxy.engine import Engine


def loop_warning(decision: Decision) -> tuple[str, dict[str, Any]]:
    """(event name, payload) of the LOOP_WARNING for a loop finding."""
    pattern = decision.pattern or decision.guard
    return pattern[:80], {
        "pattern": pattern,
        "repetitions": decision.repetitions,
        "window_size": decision.window_size,
        "evidence_event_ids": list(decision.evidence),
        "kind": decision.kind,
        "guardrail": decision.guard,
        "action": decision.action.name.lower(),
        "threshold": decision.threshold,
        "actual": decision.actual,
        "message": decision.message,
    }


def guard_error(decision: Decision, **extra: Any) -> dict[str, Any]:
    """The ERROR payload for a guard that refused a call or ended a session."""
    payload: dict[str, Any] = {
        "error_type": decision.guard,
        "message": decision.message or describe(decision, True),
        "stack": None,
        "guardrail": decision.guard,
        "threshold": decision.threshold,
        "actual": decision.actual,
        "action": decision.action.name.lower(),
        "kind": decision.kind,
    }
    if decision.retry_after is not None:
        payload["retry_after"] = round(decision.retry_after, 3)
    payload.update(extra)
    return payload


def is_tool_call(ex: Exchange) -> bool:
    return ex.protocol is not None and ex.protocol.kind == "mcp"


def call_summary(ex: Exchange) -> dict[str, Any]:
    """What was refused, for the ERROR event (the upstream never saw it)."""
    if is_tool_call(ex):
        return {
            "kind": "tool",
            "server": ex.route.upstream,
            "tool_name": ex.call.tool_name,
            "args": ex.call.arguments,
        }
    return {"kind": "llm", "upstream": ex.route.upstream, "model": ex.call.model, "endpoint": ex.call.dialect}


def write_refusal_error(engine: Engine, ex: Exchange, decision: Decision) -> None:
    """The ERROR of a call a guard (or the circuit) refused before it was forwarded: the call's own
    event (it carries the call's guard record), then the alert."""
    session = ex.session
    assert session is not None
    if is_tool_call(ex):
        # a refused MCP call is no TOOL_CALL (the server never saw it); nor is it one when its
        # answer comes back in the next LLM request's history as a function-calling result
        sigs = session.conversation.mcp_signatures
        sig = signature(ex.call.tool_name, ex.call.arguments)
        sigs[sig] = sigs.get(sig, 0) + 1
    payload = guard_error(decision, call=call_summary(ex))
    if ex.guard_trace is not None:
        payload.update(ex.guard_trace.payload())  # a refused call's event is this ERROR
    event_id = engine.write_event(
        session, EventType.ERROR, decision.guard, payload, parent_id=ex.guard_event_id
    )
    engine.observe_event(session, EventType.ERROR, decision.guard, event_id)
    engine.alerts.send(session, decision)


def refuse_unavailable(engine: Engine, ex: Exchange, retry_after_s: float) -> None:
    """Shared guard state unreachable under `fail_closed` (SPEC §8): the call is refused with guard
    code `state_unavailable`, 503 + Retry-After in the protocol's shape (a JSON-RPC error for MCP)."""
    decision = Decision(
        Action.BLOCK,
        GUARD_STATE_UNAVAILABLE,
        "the shared guard state is unreachable and this proxy refuses calls it cannot guard (fail_closed)",
        retry_after=retry_after_s,
    )
    engine.metrics.observe_decision(decision.guard, decision.action.name)
    if ex.session is not None:
        engine.write_event(
            ex.session, EventType.ERROR, decision.guard, guard_error(decision, call=call_summary(ex))
        )
    assert ex.protocol is not None  # only calls a protocol adapter parsed are guarded
    ex.answer = ex.protocol.render_refusal(ex, decision, f"[tripwire] refused: {decision.message}")
