"""The session's guards (SPEC §5): loop patterns, limits, budgets, `SessionGuards` (proxy/guards/,
pure). Their shared-state twin is the run's guard log: the call's check is appended in the
admission's round trip and every replica replays the log into its own copy (proxy/guard_log/).
Refusals: a loop pattern's BLOCK (the session goes on) or TERMINATE; a limit or a budget ends the
session (`max_*`, `max_cost_usd`, ...); a loop pattern's `ask` holds the call for a person."""

from __future__ import annotations

from proxy.admission.check import Check, Refusal
from proxy.constants import (
    GUARD_LOOP_DETECTION,
    GUARD_MAX_COST_USD,
    GUARD_MAX_DURATION_S,
    GUARD_MAX_EVENTS,
    GUARD_MAX_LLM_CALLS,
    GUARD_MAX_STEPS,
    GUARD_MAX_TIME_PER_TURN,
    GUARD_MAX_TOKENS,
    GUARD_MAX_TOOL_CALLS,
    GUARD_MAX_WALL_TIME_SECONDS,
    GUARD_SESSION_TERMINATED,
    GUARD_STOP_ON_LOOP,
)

_ENDS = (
    GUARD_STOP_ON_LOOP,
    GUARD_MAX_COST_USD,
    GUARD_MAX_TOKENS,
    GUARD_MAX_WALL_TIME_SECONDS,
    GUARD_MAX_LLM_CALLS,
    GUARD_MAX_TOOL_CALLS,
    GUARD_MAX_EVENTS,
    GUARD_MAX_DURATION_S,
    GUARD_MAX_STEPS,
    GUARD_SESSION_TERMINATED,
)

CHECK = Check(
    "session_guards",
    "loop patterns, the session's limits and budget (`loop_detection`, `limits`, `budget`)",
    (
        Refusal(GUARD_LOOP_DETECTION, retryable=False, ends_session=False),  # BLOCK; TERMINATE ends it
        Refusal(GUARD_MAX_TIME_PER_TURN, retryable=False, ends_session=False),
        *(Refusal(code, retryable=False, ends_session=True) for code in _ENDS),
    ),
)
