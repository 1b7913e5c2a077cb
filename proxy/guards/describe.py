"""What the agent reads when a guard fires: one `[tripwire] ...` sentence per decision (SPEC §5.5).

The text goes to a model, so it says what happened and what to do instead. With
`expose_guard_details` off the agent learns only that a guard fired and which kind: no limits, no
counts (a model that knows the threshold can learn to stay one call below it).
"""

from __future__ import annotations

from proxy.constants import (
    GUARD_BUDGET_WINDOW_EXCEEDED,
    GUARD_BUDGET_WINDOW_SOFT_ALERT,
    GUARD_CIRCUIT_BREAKER,
    GUARD_CONCURRENT_CALLS,
    GUARD_MAX_COST_USD,
    GUARD_MAX_DURATION_S,
    GUARD_MAX_EVENTS,
    GUARD_MAX_LLM_CALLS,
    GUARD_MAX_STEPS,
    GUARD_MAX_TIME_PER_TURN,
    GUARD_MAX_TOKENS,
    GUARD_MAX_TOOL_CALLS,
    GUARD_MAX_WALL_TIME_SECONDS,
    GUARD_RATE_LIMITED,
    GUARD_SOFT_ALERT_THRESHOLD_USD,
    GUARD_TOOL_DENIED,
    RETRYABLE_GUARDS,
)
from proxy.guards.decision import Action, Decision, retry_after_seconds
from proxy.guards.loop.detector import LOOP_KINDS

_BUDGET = {
    GUARD_MAX_COST_USD: "the session's cost budget is spent",
    GUARD_MAX_TOKENS: "the session's token budget is spent",
    GUARD_MAX_WALL_TIME_SECONDS: "the session's time budget is spent",
    GUARD_SOFT_ALERT_THRESHOLD_USD: "the session's cost is close to its budget",
    GUARD_BUDGET_WINDOW_EXCEEDED: "the agent's budget for this period is spent",
    GUARD_BUDGET_WINDOW_SOFT_ALERT: "the agent's spend is close to its budget for this period",
}
_LIMITS = {
    GUARD_MAX_LLM_CALLS: "the session reached its limit of LLM calls",
    GUARD_MAX_TOOL_CALLS: "the session reached its limit of tool calls",
    GUARD_MAX_STEPS: "the session reached its limit of tool calls",
    GUARD_MAX_EVENTS: "the session reached its limit of recorded events",
    GUARD_MAX_DURATION_S: "the session reached its time limit",
    GUARD_MAX_TIME_PER_TURN: "this turn has run too long",
}


def _summary(d: Decision) -> str:
    if d.kind in LOOP_KINDS:
        return f"loop detected: {LOOP_KINDS[d.kind]}"
    if d.guard in _BUDGET:
        return _BUDGET[d.guard]
    if d.guard in _LIMITS:
        return _LIMITS[d.guard]
    if d.guard == GUARD_CIRCUIT_BREAKER:
        return "the upstream is failing and its circuit is open"
    if d.guard == GUARD_RATE_LIMITED:
        return "this agent made too many such calls in too short a time"
    if d.guard == GUARD_CONCURRENT_CALLS:
        return "this agent has too many calls in flight"
    return d.message or f"guard {d.guard} fired"


def _advice(d: Decision) -> str:
    if d.action is Action.TERMINATE:
        return "The session has been ended; do not retry it."
    if d.guard in RETRYABLE_GUARDS:
        # rounded up, as the Retry-After header and the JSON-RPC error's retry_after are
        left = f" in {retry_after_seconds(d.retry_after)}s" if d.retry_after is not None else " later"
        return f"Try again{left}."
    if d.guard == GUARD_BUDGET_WINDOW_EXCEEDED and d.resets_at is not None:
        return f"It resets at {d.resets_at}; do not retry before then."
    if d.guard == GUARD_MAX_TIME_PER_TURN:
        return "Stop calling tools and answer the user with what you have."
    if d.guard == GUARD_TOOL_DENIED:
        return "Do not call it again: use another tool, or answer the user with what you have."
    if d.kind is not None:
        return "Do not repeat this call: try a different approach, or answer the user with what you have."
    return ""


def describe(decision: Decision, expose_details: bool) -> str:
    """`[tripwire] blocked: ...` (or `warning:`, `denied:` for a tool the permissions deny, `rate
    limited:` for a retryable rate limit) for the agent; details only when exposed."""
    if decision.guard == GUARD_TOOL_DENIED:
        head = "[tripwire] denied"
    elif decision.guard in (GUARD_RATE_LIMITED, GUARD_CONCURRENT_CALLS):
        head = "[tripwire] rate limited"  # retryable: not blocked for good (SPEC §9)
    else:
        head = "[tripwire] warning" if decision.action <= Action.WARN else "[tripwire] blocked"
    what = decision.message if expose_details and decision.message else _summary(decision)
    text = f"{head}: {what}"
    if expose_details:
        details = [f"guard {decision.guard}"]
        if decision.kind:
            details.append(f"pattern {decision.kind}")
        if decision.threshold is not None:
            details.append(f"threshold {decision.threshold}")
        if decision.actual is not None:
            details.append(f"actual {decision.actual}")
        text += f" ({', '.join(details)})"
    advice = _advice(decision)
    return f"{text}. {advice}" if advice else f"{text}."


def _duration(seconds: float) -> str:
    if seconds >= 3600 and seconds % 360 == 0:
        return f"{seconds / 3600:g} h"
    if seconds >= 60 and seconds % 6 == 0:
        return f"{seconds / 60:g} min"
    return f"{seconds:g} s"


def describe_ended(
    agent: str,
    session_id: str | None,
    *,
    idle_timeout_s: float,
    terminated_ttl_s: float,
    run_url: str | None,
) -> str:
    """The refusal of a call to a session that was stopped (SPEC §3: it stays refused), saying how
    to go on and where to see why. `session_id`: the explicit session's id; None for an automatic
    one, whose conversation stays refused until it goes quiet for a whole idle timeout."""
    if session_id is not None:
        text = (
            f"[tripwire] refused: session {session_id!r} of agent {agent!r} was stopped and stays refused "
            f"for {_duration(terminated_ttl_s)}. To go on, start a new session: send another session id "
            f"(the X-Tripwire-Session header, or /agents/{agent}/sessions/<new id>/ in the base URL)."
        )
    else:
        text = (
            "[tripwire] refused: this conversation's session was stopped and stays refused until it has "
            f"sent nothing for {_duration(idle_timeout_s)} (each refused call starts that wait again). To go "
            "on, start a new conversation (it is recorded in a new run), or name a new session with the "
            "X-Tripwire-Session header."
        )
    return f"{text} Why it was stopped: {run_url}" if run_url else text
