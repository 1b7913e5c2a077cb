"""The ERROR a refused call writes (a guard, the circuit, shared state unreachable), then its alert;
and the refusals the guard and hold stages both answer with (`refuse`, `refuse_ended`).

Used by the guard, hold, breaker and session stages; the payloads are proxy/guard_events.py's.
"""

from __future__ import annotations

from proxy.constants import GUARD_STATE_UNAVAILABLE, TAG_BUDGET_EXCEEDED, TAG_TERMINATED, EventType
from proxy.exchange import Exchange
from proxy.guard_events import call_summary, guard_error, is_tool_call
from proxy.guards.decision import Action, Decision
from proxy.guards.describe import describe
from proxy.guards.signatures import signature
from proxy.session_policy import SessionPolicy


def write_refusal_error(policy: SessionPolicy, ex: Exchange, decision: Decision) -> None:
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
    event_id = policy.write_event(
        session, EventType.ERROR, decision.guard, payload, parent_id=ex.guard_event_id
    )
    policy.observe_event(session, EventType.ERROR, decision.guard, event_id)
    policy.alerts.send(session, decision)


def refuse_unavailable(policy: SessionPolicy, ex: Exchange, retry_after_s: float) -> None:
    """Shared guard state unreachable under `fail_closed` (SPEC §8): the call is refused with guard
    code `state_unavailable`, 503 + Retry-After in the protocol's shape (a JSON-RPC error for MCP)."""
    decision = Decision(
        Action.BLOCK,
        GUARD_STATE_UNAVAILABLE,
        "the shared guard state is unreachable and this proxy refuses calls it cannot guard (fail_closed)",
        retry_after=retry_after_s,
    )
    policy.metrics.observe_decision(decision.guard, decision.action.name)
    if ex.session is not None:
        policy.write_event(
            ex.session, EventType.ERROR, decision.guard, guard_error(decision, call=call_summary(ex))
        )
    assert ex.protocol is not None  # only calls a protocol adapter parsed are guarded
    ex.answer = ex.protocol.render_refusal(ex, decision, f"[tripwire] refused: {decision.message}")


def refuse(
    policy: SessionPolicy,
    ex: Exchange,
    decision: Decision,
    *,
    expose: bool,
    loop_events: bool,
    note: str = "",
) -> None:
    """BLOCK answers with a synthetic result and the session goes on; TERMINATE ends it.
    `note`: what a person (or nobody, in time) decided about a held call, for the agent."""
    session = ex.session
    assert session is not None
    protocol = ex.protocol
    assert session is not None and protocol is not None
    text = describe(decision, expose) + note
    write_refusal_error(policy, ex, decision)
    if decision.action == Action.BLOCK:
        ex.answer = protocol.render_block(ex, decision, text)
        ex.block_text = text  # a Responses chain goes on from the blocked answer (stages/responses_chain.py)
        return
    ex.answer = protocol.render_refusal(ex, decision, text)
    budget = TAG_BUDGET_EXCEEDED in decision.tags
    limit = decision.kind is None and not budget
    policy.terminate(
        session, reason=f"guard:{decision.guard}", tag=None if (budget or limit) else TAG_TERMINATED
    )


def refuse_ended(
    policy: SessionPolicy, ex: Exchange, decision: Decision, *, expose: bool, elsewhere: bool
) -> None:
    """The session ended while this call was being judged (here, or on another replica: this
    replica's copy ends too): refused like every later call."""
    session = ex.session
    assert session is not None and ex.protocol is not None
    policy.metrics.observe_decision(decision.guard, decision.action.name)
    ex.answer = ex.protocol.render_refusal(ex, decision, describe(decision, expose))
    if elsewhere and not session.terminated:
        policy.terminate(session, reason=f"guard:{decision.guard}", tag=None)
