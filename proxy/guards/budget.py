"""Budgets and limits of one session (SPEC §5.2): cost, tokens, time and call counts.

Every forwarded call first takes a `Reservation` (its estimated cost and tokens, and one call of
its kind) and holds it until its answer `settle()`s it to the real numbers, or `release()` gives it
back when the call never reached the upstream. A call is refused when what is settled plus what
*other* calls in flight have reserved has reached a limit, so N concurrent calls cannot all slip
past a limit together, while one call at a time still stops at the first call after the spend
reached it (LangSight). Count limits (AgentDbg max_llm_calls / max_tool_calls / max_events and
LangSight max_steps) refuse the call that would be the N+1-th, before it is forwarded.

Pure: no I/O, no asyncio, the monotonic clock passed in as `now`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Literal

from proxy.constants import (
    GUARD_MAX_COST_USD,
    GUARD_MAX_DURATION_S,
    GUARD_MAX_EVENTS,
    GUARD_MAX_LLM_CALLS,
    GUARD_MAX_STEPS,
    GUARD_MAX_TOKENS,
    GUARD_MAX_TOOL_CALLS,
    GUARD_MAX_WALL_TIME_SECONDS,
    GUARD_SOFT_ALERT_THRESHOLD_USD,
    TAG_BUDGET_EXCEEDED,
    TAG_BUDGET_WARNING,
)
from proxy.guards.config import BudgetConfig, LimitsConfig
from proxy.guards.decision import ALLOW, Action, Decision

CallKind = Literal["llm", "tool"]


def dollars(amount: float) -> str:
    """Dollars with enough digits to tell small amounts apart: $1.2500, $0.0000123 (never $0.0000)."""
    if amount == 0:
        return "$0"
    digits = max(4, min(10, 2 - math.floor(math.log10(abs(amount)))))
    return f"${amount:.{digits}f}"


@dataclass(slots=True)
class Reservation:
    """One call's hold on the budget (read-only once taken; not frozen: one is made per call, and a
    frozen dataclass pays a guarded setattr per field)."""

    id: int
    kind: CallKind
    usd: float
    tokens: int


_NONE_HELD: dict[int, Reservation] = {}  # (read only)


class SessionBudget:
    """Spend, tokens, counts and elapsed time of one session, held against its config."""

    __slots__ = (
        "budget",
        "limits",
        "max_steps",
        "started_at",
        "cost_usd",
        "tokens",
        "llm_calls",
        "tool_calls",
        "events",
        "soft_alerted",
        "_inflight",
        "_inflight_tokens",
        "_inflight_llm",
        "_inflight_tool",
        "_last_id",
        "_limited",
    )

    def __init__(
        self,
        budget: BudgetConfig,
        limits: LimitsConfig,
        max_steps: int | None = None,
        started_at: float = 0.0,
    ) -> None:
        self.budget = budget
        self.limits = limits
        self.max_steps = max_steps
        self.started_at = started_at
        self.cost_usd = 0.0  # settled
        self.tokens = 0  # settled
        self.llm_calls = 0  # forwarded and settled
        self.tool_calls = 0
        self.events = 0
        self.soft_alerted = False
        # the reservations of the calls in flight, by id (None when there is none: a session waiting
        # out its idle timeout keeps no emptied dict, issue 33)
        self._inflight: dict[int, Reservation] | None = None
        # what the calls in flight hold, kept as they come and go (a busy session has dozens in
        # flight: summing them per call was the budget's main cost); USD is summed when a cost
        # budget asks, in the order it always was, so the float is the same to the last bit
        self._inflight_tokens = 0
        self._inflight_llm = 0
        self._inflight_tool = 0
        self._last_id = 0  # the last reservation's id (1, 2, ...)
        self._limited = _any_limit(budget, limits, max_steps)

    def configure(self, budget: BudgetConfig, limits: LimitsConfig, max_steps: int | None) -> None:
        """A config change (admin API) applies from the next call; what was spent stays spent."""
        self.budget, self.limits, self.max_steps = budget, limits, max_steps
        self._limited = _any_limit(budget, limits, max_steps)

    # -- before a call ---------------------------------------------------------------------------

    def check(
        self,
        kind: CallKind,
        estimate_usd: float,
        now: float,
        *,
        estimate_tokens: int = 0,
        reserve_anyway: bool = False,
    ) -> tuple[Decision, Reservation | None]:
        """Can this call go? ALLOW with a reservation, or TERMINATE naming the guard that fired
        (ASK under `on_limit: ask`, with a reservation: approved, the call goes on as allowed).

        `reserve_anyway` (shadow mode): the call goes on whatever was decided, so it reserves too.
        """
        refusal = self.refusal(kind, now)
        if refusal is not None and not reserve_anyway and refusal.action is not Action.ASK:
            return refusal, None
        self._last_id += 1
        res = Reservation(
            self._last_id, kind, estimate_usd if estimate_usd > 0.0 else 0.0, max(0, estimate_tokens)
        )
        inflight = self._inflight
        if inflight is None:
            inflight = self._inflight = {}
        inflight[res.id] = res
        self._hold(res, 1)
        return refusal or ALLOW, res

    def _hold(self, res: Reservation, sign: int) -> None:
        """A reservation taken (+1) or given back / settled (-1): the in-flight counts follow."""
        self._inflight_tokens += sign * res.tokens
        if res.kind == "llm":
            self._inflight_llm += sign
        else:
            self._inflight_tool += sign

    def refusal(self, kind: CallKind, now: float) -> Decision | None:
        """The refusal `check()` would give, without reserving (for a call another guard refused)."""
        refusal = self._refusal(kind, now)
        if refusal is not None:
            on_limit = self.budget.on_limit if TAG_BUDGET_EXCEEDED in refusal.tags else self.limits.on_limit
            if on_limit == "ask":  # a person decides instead (SPEC §5.5a)
                return replace(refusal, action=Action.ASK)
        return refusal

    def _inflight_usd(self) -> float:
        usd = 0.0
        for r in (self._inflight or _NONE_HELD).values():
            usd += r.usd
        return float(usd)

    def _inflight_sum(self) -> tuple[float, int, int, int]:
        return self._inflight_usd(), self._inflight_tokens, self._inflight_llm, self._inflight_tool

    def _refusal(self, kind: CallKind, now: float) -> Decision | None:
        if not self._limited:  # no budget and no limit set (the default): nothing can refuse
            return None
        b, lim = self.budget, self.limits
        elapsed = now - self.started_at
        tokens, llm_inflight, tool_inflight = self._inflight_tokens, self._inflight_llm, self._inflight_tool

        if b.max_wall_time_seconds is not None and elapsed > b.max_wall_time_seconds:
            return _stop(
                GUARD_MAX_WALL_TIME_SECONDS,
                f"session wall time {elapsed:.1f}s exceeded {b.max_wall_time_seconds}s",
                b.max_wall_time_seconds,
                round(elapsed, 3),
                budget=True,
            )
        if b.max_cost_usd is not None and self.cost_usd + (usd := self._inflight_usd()) >= b.max_cost_usd:
            spent = round(self.cost_usd + usd, 6)
            return _stop(
                GUARD_MAX_COST_USD,
                f"session cost {dollars(spent)} reached the {dollars(b.max_cost_usd)} budget",
                b.max_cost_usd,
                spent,
                budget=True,
            )
        if b.max_tokens is not None and self.tokens + tokens >= b.max_tokens:
            used = self.tokens + tokens
            return _stop(
                GUARD_MAX_TOKENS,
                f"session used {used} tokens, budget {b.max_tokens}",
                b.max_tokens,
                used,
                budget=True,
            )
        if lim.max_duration_s is not None and elapsed >= lim.max_duration_s:
            return _stop(
                GUARD_MAX_DURATION_S,
                f"elapsed {elapsed:.1f}s >= {lim.max_duration_s}s",
                lim.max_duration_s,
                round(elapsed, 3),
            )
        if kind == "llm" and lim.max_llm_calls is not None:
            would_be = self.llm_calls + llm_inflight + 1
            if would_be > lim.max_llm_calls:
                return _stop(
                    GUARD_MAX_LLM_CALLS,
                    f"LLM call {would_be} > max_llm_calls {lim.max_llm_calls}",
                    lim.max_llm_calls,
                    would_be,
                )
        if kind == "llm" and self.tool_calls > 0:
            # function-calling tools run by the agent itself: the LLM request whose history holds
            # the N+1-th one is the call refused
            for guard, limit in (
                (GUARD_MAX_TOOL_CALLS, lim.max_tool_calls),
                (GUARD_MAX_STEPS, self.max_steps),
            ):
                if limit is not None and self.tool_calls > limit:
                    return _stop(
                        guard, f"tool call {self.tool_calls} > {guard} {limit}", limit, self.tool_calls
                    )
        if kind == "tool":
            would_be = self.tool_calls + tool_inflight + 1
            if lim.max_tool_calls is not None and would_be > lim.max_tool_calls:
                return _stop(
                    GUARD_MAX_TOOL_CALLS,
                    f"tool call {would_be} > max_tool_calls {lim.max_tool_calls}",
                    lim.max_tool_calls,
                    would_be,
                )
            if self.max_steps is not None and would_be > self.max_steps:
                return _stop(
                    GUARD_MAX_STEPS,
                    f"tool call {would_be} > max_steps {self.max_steps}",
                    self.max_steps,
                    would_be,
                )
        if lim.max_events is not None:
            # every forwarded call writes at least its own event
            would_be = self.events + llm_inflight + tool_inflight + 1
            if would_be > lim.max_events:
                return _stop(
                    GUARD_MAX_EVENTS,
                    f"event {would_be} > max_events {lim.max_events}",
                    lim.max_events,
                    would_be,
                )
        return None

    # -- after a call ----------------------------------------------------------------------------

    def settle(
        self, reservation: Reservation | None, cost_usd: float, tokens: int, now: float
    ) -> list[Decision]:
        """The call was answered: replace its estimate by the real cost; the soft alert fires once."""
        held = self._take(reservation)
        if held is not None:
            if held.kind == "llm":
                self.llm_calls += 1
            else:
                self.tool_calls += 1
        self.cost_usd += max(0.0, cost_usd)
        self.tokens += max(0, tokens)
        soft = self.budget.soft_alert_threshold_usd
        if soft is not None and not self.soft_alerted and self.cost_usd >= soft:
            self.soft_alerted = True
            return [
                Decision(
                    Action.WARN,
                    GUARD_SOFT_ALERT_THRESHOLD_USD,
                    f"session cost {dollars(self.cost_usd)} reached the {dollars(soft)} soft alert",
                    threshold=soft,
                    actual=round(self.cost_usd, 6),
                    tags=(TAG_BUDGET_WARNING,),
                )
            ]
        return []

    def release(self, reservation: Reservation | None) -> None:
        """The call never reached the upstream (refused later, or failed to connect): not counted."""
        self._take(reservation)

    def _take(self, reservation: Reservation | None) -> Reservation | None:
        """The reservation out of the calls in flight (None: not held, or already taken)."""
        inflight = self._inflight
        if reservation is None or inflight is None:
            return None
        held = inflight.pop(reservation.id, None)
        if held is not None:
            self._hold(held, -1)
            if not inflight:
                self._inflight = None
        return held

    def count_history_tool_calls(self, n: int) -> None:
        """Function-calling tool calls first seen in an LLM request's history (not via MCP)."""
        self.tool_calls += max(0, n)

    def count_event(self, n: int = 1) -> None:
        """One more trace event written for this session (for `max_events`)."""
        self.events += n

    def stats(self, now: float | None = None) -> dict[str, Any]:
        usd, tokens, llm, tool = self._inflight_sum()
        out: dict[str, Any] = {
            "cost_usd": round(self.cost_usd, 6),
            "tokens": self.tokens,
            "llm_calls": self.llm_calls,
            "tool_calls": self.tool_calls,
            "events": self.events,
            "in_flight": {"llm": llm, "tool": tool, "reserved_usd": round(usd, 6), "reserved_tokens": tokens},
            "soft_alerted": self.soft_alerted,
        }
        if now is not None:
            out["elapsed_s"] = round(now - self.started_at, 3)
        return out


def _any_limit(budget: BudgetConfig, limits: LimitsConfig, max_steps: int | None) -> bool:
    """Whether any budget or limit `SessionBudget._refusal` checks is set."""
    return max_steps is not None or any(
        value is not None
        for value in (
            budget.max_wall_time_seconds,
            budget.max_cost_usd,
            budget.max_tokens,
            limits.max_duration_s,
            limits.max_llm_calls,
            limits.max_tool_calls,
            limits.max_events,
        )
    )


def _stop(guard: str, message: str, threshold: Any, actual: Any, *, budget: bool = False) -> Decision:
    return Decision(
        Action.TERMINATE,
        guard,
        message,
        threshold=threshold,
        actual=actual,
        tags=(TAG_BUDGET_EXCEEDED,) if budget else (),
    )
