"""Raising a session's budgets and limits for the rest of the session (SPEC §5.5a: an approval's
`raise`, `POST /api/runs/{run_id}/resume`).

A raise names budget or limit keys and their new values. It is validated against what the session
has already spent or counted (`validate_raise`: a value not above it would refuse the very next
call, so it is refused, with a message for a 400), then kept by the session's guards beside the
config in force (`raised_sections`): a raise never lowers a limit (the larger of the config's value
and the raised one applies), survives a config change through the admin API (a config that sets a
higher limit wins; one that removes the limit removes it), and a key the session has no limit for
cannot be raised. `soft_alert_threshold_usd` is not raisable: it refuses nothing.

Pure: no I/O, the monotonic clock passed in as `now`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from proxy.guards.config import BudgetConfig, GuardConfig, LimitsConfig

if TYPE_CHECKING:
    from proxy.guards.budget import CallKind, SessionBudget
    from proxy.guards.decision import Decision

Section = Literal["budget", "limits", "loop_detection"]


@dataclass(frozen=True, slots=True)
class Raisable:
    section: Section
    integer: bool  # a count (tokens, calls, events, steps): whole numbers only
    what: str  # what the session has spent or counted of it, for the messages


# the keys a raise may name: every budget and limit that refuses a call (SessionBudget._refusal)
RAISABLE: dict[str, Raisable] = {
    "max_cost_usd": Raisable("budget", False, "USD spent"),
    "max_tokens": Raisable("budget", True, "tokens used"),
    "max_wall_time_seconds": Raisable("budget", False, "seconds elapsed"),
    "max_llm_calls": Raisable("limits", True, "LLM calls"),
    "max_tool_calls": Raisable("limits", True, "tool calls"),
    "max_events": Raisable("limits", True, "events"),
    "max_duration_s": Raisable("limits", False, "seconds elapsed"),
    "max_steps": Raisable("loop_detection", True, "tool calls"),
}


class RaiseError(ValueError):
    """A raise refused: its message says why (the admin API answers it as a 400)."""


def limit_of(config: GuardConfig, key: str) -> float | None:
    """The config's value of a raisable key (None: no such limit)."""
    section = getattr(config, RAISABLE[key].section)
    value: float | None = getattr(section, key)
    return value


def used_of(budget: SessionBudget, key: str, now: float) -> float:
    """What the session has spent or counted against a raisable key (settled, plus what the calls in
    flight hold, as the refusal counts it)."""
    stats = budget.stats(now)
    held = stats["in_flight"]
    if key == "max_cost_usd":
        return float(stats["cost_usd"] + held["reserved_usd"])
    if key == "max_tokens":
        return float(stats["tokens"] + held["reserved_tokens"])
    if key in ("max_wall_time_seconds", "max_duration_s"):
        return float(stats["elapsed_s"])
    if key == "max_llm_calls":
        return float(stats["llm_calls"] + held["llm"])
    if key in ("max_tool_calls", "max_steps"):
        return float(stats["tool_calls"] + held["tool"])
    return float(stats["events"])  # max_events


def validate_raise(raised: Any, config: GuardConfig, budget: SessionBudget, now: float) -> dict[str, float]:
    """The raise as `{key: value}` (counts as whole numbers), or RaiseError naming the first problem:
    not an object, an unknown key, a value that is not a positive number, a limit the session does
    not have, a value not above what the session has already spent or counted."""
    if not isinstance(raised, Mapping) or not raised:
        raise RaiseError("raise must be a non-empty object of budget or limit keys and their new values")
    out: dict[str, float] = {}
    for key, value in raised.items():
        spec = RAISABLE.get(key) if isinstance(key, str) else None
        if spec is None:
            raise RaiseError(
                f"raise: {key!r} is not a budget or limit key (one of {', '.join(sorted(RAISABLE))})"
            )
        if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
            raise RaiseError(f"raise: {key} must be a positive number, got {value!r}")
        if spec.integer and value != int(value):
            raise RaiseError(f"raise: {key} must be a whole number, got {value!r}")
        if limit_of(config, key) is None:
            raise RaiseError(f"raise: this session has no {key} limit to raise")
        used = used_of(budget, key, now)
        if not value > used:
            raise RaiseError(f"raise: {key} {value:g} is not above the session's {used:g} {spec.what} so far")
        out[key] = int(value) if spec.integer else float(value)
    return out


def raised_sections(
    config: GuardConfig, raised: Mapping[str, float]
) -> tuple[BudgetConfig, LimitsConfig, int | None]:
    """The budget, limits and max_steps in force for a session with these raises: the larger of
    the config's value and the raised one, for each limit the config sets."""
    budget: dict[str, Any] = {}
    limits: dict[str, Any] = {}
    max_steps = config.loop_detection.max_steps
    for key, value in raised.items():
        current = limit_of(config, key)
        if current is None or value <= current:
            continue
        spec = RAISABLE[key]
        if spec.integer:
            value = int(value)
        section = spec.section
        if section == "budget":
            budget[key] = value
        elif section == "limits":
            limits[key] = value
        else:
            max_steps = int(value)
    return (
        config.budget.model_copy(update=budget) if budget else config.budget,
        config.limits.model_copy(update=limits) if limits else config.limits,
        max_steps,
    )


def still_refused(ended_by: Decision | None, budget: SessionBudget, now: float) -> Decision | None:
    """The budget or limit that ended a session and would refuse its next call still (a resume that
    does not raise it would be refused at once), or None."""
    if ended_by is None or ended_by.guard not in RAISABLE:
        return None
    kind: CallKind = "tool" if ended_by.guard in ("max_tool_calls", "max_steps") else "llm"
    refusal = budget.refusal(kind, now)
    return refusal if refusal is not None and refusal.guard == ended_by.guard else None
