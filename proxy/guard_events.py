"""What a guard decision writes to the trace: one home for the LOOP_WARNING and ERROR payloads
(SPEC §4.1), used by the guard stage (before a call) and the session policy (AgentDbg's cycle,
after one). Pure payload builders: the writing is proxy/refusals.py's and the stages'."""

from __future__ import annotations

from typing import Any

from proxy.exchange import Exchange
from proxy.guards.decision import Decision
from proxy.guards.describe import describe


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
    if decision.resets_at is not None:
        payload["resets_at"] = decision.resets_at
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
