"""Shared constants: one home for the spec version, markers, file names, event types, session health
tags and guard codes.

The trace-format part mirrors agentdbg.constants (AgentDbg 0.3.0) so traces written by Tripwire open in
AgentDbg's viewer. This module imports nothing but the standard library, so every layer (proxy/guards/
included) may import it.
"""

from __future__ import annotations

from enum import StrEnum

# AgentDbg trace spec version written into every run.json and event.
SPEC_VERSION = "0.1"

# AgentDbg's markers: a redacted secret value, and the tail of a string cut at max_field_bytes.
REDACTED_MARKER = "__REDACTED__"
TRUNCATED_MARKER = "__TRUNCATED__"

# Default cap on any string field, in UTF-8 bytes (AgentDbg's default).
DEFAULT_MAX_FIELD_BYTES = 20000

# Nesting deeper than this is replaced by TRUNCATED_MARKER (guards against pathological payloads).
DEPTH_LIMIT = 64

# On-disk layout: <data_dir>/runs/<run_id>/{run.json, events.jsonl, tripwire.json}
RUNS_DIR = "runs"
RUN_JSON = "run.json"
EVENTS_JSONL = "events.jsonl"
TRIPWIRE_JSON = "tripwire.json"


class EventType(StrEnum):
    """AgentDbg 0.1 event types (the schema's enum; no others are allowed)."""

    RUN_START = "RUN_START"
    RUN_END = "RUN_END"
    LLM_CALL = "LLM_CALL"
    TOOL_CALL = "TOOL_CALL"
    STATE_UPDATE = "STATE_UPDATE"
    ERROR = "ERROR"
    LOOP_WARNING = "LOOP_WARNING"


# run.json status values.
STATUS_RUNNING = "running"
STATUS_OK = "ok"
STATUS_ERROR = "error"

# Which run.json counter an event type increments (others increment none).
COUNT_FOR_EVENT: dict[str, str] = {
    EventType.LLM_CALL: "llm_calls",
    EventType.TOOL_CALL: "tool_calls",
    EventType.ERROR: "errors",
    EventType.LOOP_WARNING: "loop_warnings",
}

# RUN_END reasons written by the trace store itself (callers pass their own, e.g. "idle_timeout").
REASON_INTERRUPTED = "interrupted"  # found still "running" at start-up: the proxy died mid-run
REASON_SHUTDOWN = "shutdown"  # still open when the recorder was closed (clean shutdown)

# Session health tags (SPEC §5.6), kept sorted in tripwire.json["health_tags"].
TAG_LOOP_DETECTED = "loop_detected"
TAG_BUDGET_WARNING = "budget_warning"
TAG_BUDGET_EXCEEDED = "budget_exceeded"
TAG_CIRCUIT_BREAKER_OPEN = "circuit_breaker_open"
TAG_TERMINATED = "terminated"
TAG_SHADOW_FIRED = "shadow_fired"
TAG_AWAITING_APPROVAL = "awaiting_approval"  # a call of the run is held for a person (SPEC §5.5a)

# Guard codes (SPEC §5): Decision.guard, the `guardrail` of an ERROR / LOOP_WARNING event, the
# `X-Tripwire-Guard` header and the `code` of a refusal.
GUARD_LOOP_DETECTION = "loop_detection"
GUARD_STOP_ON_LOOP = "stop_on_loop"
GUARD_MAX_TIME_PER_TURN = "max_time_per_turn"
GUARD_MAX_COST_USD = "max_cost_usd"
GUARD_MAX_TOKENS = "max_tokens"
GUARD_MAX_WALL_TIME_SECONDS = "max_wall_time_seconds"
GUARD_SOFT_ALERT_THRESHOLD_USD = "soft_alert_threshold_usd"
GUARD_MAX_LLM_CALLS = "max_llm_calls"
GUARD_MAX_TOOL_CALLS = "max_tool_calls"
GUARD_MAX_EVENTS = "max_events"
GUARD_MAX_DURATION_S = "max_duration_s"
GUARD_MAX_STEPS = "max_steps"
GUARD_CIRCUIT_BREAKER = "circuit_breaker"
GUARD_KILL_SWITCH = "kill_switch"
GUARD_SESSION_TERMINATED = "session_terminated"
GUARD_STATE_UNAVAILABLE = "state_unavailable"  # shared state unreachable under fail_closed (SPEC §8)
# gateway (SPEC §9)
GUARD_TOOL_DENIED = "tool_denied"  # a tool permission's deny (or an allow-list that leaves it out)
GUARD_TOOL_ASK = "tool_ask"  # a tool permission's ask pattern: held for a person (§5.5a)
GUARD_RATE_LIMITED = "rate_limited"
# an MCP tool whose definition changed since it was pinned: its call held or refused (docs/mcp.md)
GUARD_TOOL_CHANGED = "tool_changed"
GUARD_BUDGET_WINDOW_EXCEEDED = "budget_window_exceeded"
GUARD_BUDGET_WINDOW_SOFT_ALERT = "budget_window_soft_alert"
GUARD_CONCURRENT_CALLS = "concurrent_calls"  # over the agent's max_concurrent_calls
# refusals the agent may retry later (429 + Retry-After; MCP: the BLOCK result saying when); a replay
# does not decide them again (they depend on other calls than the run's); proxy/admission/ names each
RETRYABLE_GUARDS = frozenset({GUARD_CIRCUIT_BREAKER, GUARD_RATE_LIMITED, GUARD_CONCURRENT_CALLS})


def default_counts() -> dict[str, int]:
    """A fresh run.json counts object (AgentDbg's four counters)."""
    return {"llm_calls": 0, "tool_calls": 0, "errors": 0, "loop_warnings": 0}


# on every answer Tripwire gives an HTTP call (forwarded or its own): the milliseconds the call spent
# inside Tripwire up to the answer's head, the upstream's wait for its head left out (docs/metrics.md)
OVERHEAD_HEADER = "x-tripwire-overhead-ms"
