"""The value every guard returns: what to do with one call, and why.

Guards never raise and never do I/O; they return a `Decision`, which the pipeline turns into
trace events and, for refusals, into an answer in the client's own protocol.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field
from typing import Any


class Action(enum.IntEnum):
    """Ordered by strictness, so `max()` picks the decision that wins."""

    ALLOW = 0
    WARN = 1
    ASK = 2  # hold the call until a person approves or denies it (SPEC §5.5a); a refusal beats it
    BLOCK = 3
    TERMINATE = 4


@dataclass(frozen=True)
class Decision:
    action: Action
    guard: str  # guardrail code (proxy.constants.GUARD_*), e.g. "loop_detection", "max_cost_usd"
    message: str = ""
    threshold: Any = None
    actual: Any = None
    # loop findings only: which pattern, and what the LOOP_WARNING event carries
    # repetition / ping_pong / retry_no_progress / identical_step / cycle / per_tool / no_progress
    kind: str | None = None
    pattern: str | None = None
    repetitions: int | None = None
    window_size: int | None = None
    evidence: tuple[str, ...] = ()
    # True the first time a streak fires, so one LOOP_WARNING is written per streak
    new_finding: bool = True
    retry_after: float | None = None  # circuit breaker: seconds left in the cooldown
    tags: tuple[str, ...] = field(default=())  # session health tags this decision adds
    resets_at: str | None = None  # budgets over time: when the window that refused resets (ISO, SPEC §9)


ALLOW = Decision(Action.ALLOW, guard="none")


def retry_after_seconds(seconds: float) -> int:
    """Retry-After in whole seconds: rounded up, at least 1 (SPEC §5.5).

    The one rounding for the HTTP `Retry-After` header, the JSON-RPC error's `data.retry_after` and
    the `[tripwire] ... Try again in Ns.` text.
    """
    return max(1, math.ceil(seconds))


def strictest(decisions: list[Decision]) -> Decision:
    """The decision that wins when several guards speak about one call (ties: the first)."""
    best = ALLOW
    for d in decisions:
        if d.action > best.action:
            best = d
    return best
