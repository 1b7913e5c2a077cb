"""Budgets over time of one agent, across all its sessions (SPEC §9 "Budgets over time").

Each `budget_windows` entry is a calendar period (day, ISO week starting Monday, month) of
`budget_timezone`. A window is named by its period and its first local day (`day:2026-11-27`,
`week:2026-W48`, `month:2026-11`); a call in a later window finds a new key and so starts from zero:
the reset at the boundary needs no timer. Like session budgets (proxy/guards/budget.py, SPEC §5.2) a
call reserves its estimate before it is forwarded and settles it to the real cost after, and a call
is refused when settled spend plus the reservations of calls in flight has reached the limit, so
50 concurrent calls stop exactly at it. The soft alert fires once per window.

A refusal does not end the session: the agent may go on in the next window or after a reset, so it
is the §5.5 budget refusal (429 + `x-should-retry: false`, a JSON-RPC error, a WebSocket `error`
event) with `resets_at`, and the session, its socket and its run stay open.

Pure: no I/O, the wall clock (Unix seconds) passed in as `now`.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

from proxy.constants import (
    GUARD_BUDGET_WINDOW_EXCEEDED,
    GUARD_BUDGET_WINDOW_SOFT_ALERT,
    TAG_BUDGET_EXCEEDED,
    TAG_BUDGET_WARNING,
)
from proxy.guards.budget import dollars
from proxy.guards.config import BudgetWindowConfig, Period
from proxy.guards.decision import Action, Decision


@dataclass(frozen=True, slots=True)
class Window:
    """One calendar period: its key, and its bounds as Unix seconds."""

    period: Period
    key: str
    start: float
    end: float

    def resets_at(self) -> str:
        """The end, as an ISO time in UTC (what the refusal and the API say)."""
        return iso(self.end)


def iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat().replace("+00:00", "Z")


def _midnight(day: date, tz: ZoneInfo) -> float:
    """The first instant of a local day. Local midnight may not exist (a DST gap at 00:00): the
    wall time is then read with the offset before the gap, which lands inside the gap's hour, so
    consecutive days never overlap and never leave a hole."""
    return datetime(day.year, day.month, day.day, tzinfo=tz).timestamp()


def window_of(period: Period, timezone: str, now: float) -> Window:
    """The window of `period` that holds `now`, in `timezone`'s calendar."""
    tz = ZoneInfo(timezone)
    today = datetime.fromtimestamp(now, tz).date()
    if period == "day":
        first, after = today, today + timedelta(days=1)
        key = f"day:{first.isoformat()}"
    elif period == "week":
        first = today - timedelta(days=today.weekday())  # ISO weeks start on Monday
        after = first + timedelta(days=7)
        year, week, _ = first.isocalendar()
        key = f"week:{year}-W{week:02d}"
    else:
        first = today.replace(day=1)
        after = date(first.year + (first.month == 12), first.month % 12 + 1, 1)
        key = f"month:{first.year}-{first.month:02d}"
    return Window(period, key, _midnight(first, tz), _midnight(after, tz))


@dataclass(slots=True)
class WindowSpend:
    """What one window of one agent holds: settled spend, and the reservations of calls in flight."""

    key: str
    spent_usd: float = 0.0
    tokens: int = 0
    alerted: bool = False
    reserved: dict[int, tuple[float, int]] = field(default_factory=dict)

    def reserved_usd(self) -> float:
        return float(sum(usd for usd, _ in self.reserved.values()))

    def reserved_tokens(self) -> int:
        return sum(tokens for _, tokens in self.reserved.values())


@dataclass(frozen=True, slots=True)
class WindowHold:
    """One call's reservation in each window it was admitted in: (period, window key) pairs."""

    id: int
    keys: tuple[tuple[Period, str], ...]
    usd: float
    tokens: int


def exceeded(config: BudgetWindowConfig, window: Window, spent: float, tokens: int) -> Decision | None:
    """The refusal of a call when `spent` / `tokens` (settled plus reserved) reached a limit."""
    limit = config.max_cost_usd
    if limit is not None and spent >= limit:
        return _refusal(
            window,
            f"{config.period} budget: {dollars(spent)} reached the {dollars(limit)} limit",
            limit,
            round(spent, 6),
        )
    if config.max_tokens is not None and tokens >= config.max_tokens:
        return _refusal(
            window,
            f"{config.period} budget: {tokens} tokens reached the {config.max_tokens} limit",
            config.max_tokens,
            tokens,
        )
    return None


def _refusal(window: Window, why: str, threshold: Any, actual: Any) -> Decision:
    resets = window.resets_at()
    return Decision(
        Action.BLOCK,  # refused, the session goes on (module docstring)
        GUARD_BUDGET_WINDOW_EXCEEDED,
        f"{why} for {window.key}; resets at {resets}",
        threshold=threshold,
        actual=actual,
        tags=(TAG_BUDGET_EXCEEDED,),
        resets_at=resets,
    )


def soft_alert(config: BudgetWindowConfig, window: Window, spent: float, tokens: int) -> Decision | None:
    """The soft alert when settled spend reached `soft_alert_pct` of a limit (the caller fires it once)."""
    pct = config.soft_alert_pct
    if pct is None:
        return None
    if config.max_cost_usd is not None and spent >= config.max_cost_usd * pct / 100:
        threshold: Any = round(config.max_cost_usd * pct / 100, 6)
        actual: Any = round(spent, 6)
        what = f"{dollars(spent)} of {dollars(config.max_cost_usd)}"
    elif config.max_tokens is not None and tokens >= config.max_tokens * pct / 100:
        threshold, actual = config.max_tokens * pct / 100, tokens
        what = f"{tokens} of {config.max_tokens} tokens"
    else:
        return None
    return Decision(
        Action.WARN,
        GUARD_BUDGET_WINDOW_SOFT_ALERT,
        f"{config.period} budget: {what} spent in {window.key} ({pct:g}% soft alert)",
        threshold=threshold,
        actual=actual,
        tags=(TAG_BUDGET_WARNING,),
        resets_at=window.resets_at(),
    )


class AgentWindows:
    """The windows of one agent in this process (the local backend's state, the shared backend's
    copy of what Redis said)."""

    def __init__(self) -> None:
        self.spends: dict[str, WindowSpend] = {}  # by period
        self._ids = itertools.count(1)

    def current(self, period: Period, key: str) -> WindowSpend:
        """The window's spend; a new key (the period moved on) starts from zero."""
        spend = self.spends.get(period)
        if spend is None or spend.key != key:
            spend = self.spends[period] = WindowSpend(key)
        return spend

    def check(
        self,
        configs: tuple[BudgetWindowConfig, ...],
        timezone: str,
        usd: float,
        tokens: int,
        now: float,
        *,
        reserve_anyway: bool = False,
    ) -> tuple[Decision | None, WindowHold | None]:
        """Can the call go? (None, a hold), or (the refusal, None); `reserve_anyway` (shadow): both."""
        refusal: Decision | None = None
        held: list[tuple[Period, str]] = []
        for config in configs:
            window = window_of(config.period, timezone, now)
            spend = self.current(config.period, window.key)
            held.append((config.period, window.key))
            if refusal is None:
                refusal = exceeded(
                    config,
                    window,
                    spend.spent_usd + spend.reserved_usd(),
                    spend.tokens + spend.reserved_tokens(),
                )
        if refusal is not None and not reserve_anyway:
            return refusal, None
        hold = WindowHold(next(self._ids), tuple(held), max(0.0, usd), max(0, tokens))
        for period, _ in held:
            self.spends[period].reserved[hold.id] = (hold.usd, hold.tokens)
        return refusal, hold

    def settle(
        self,
        hold: WindowHold,
        cost_usd: float,
        tokens: int,
        configs: tuple[BudgetWindowConfig, ...],
        timezone: str,
        now: float,
    ) -> list[Decision]:
        """The call was answered: its reservations become its real cost in the windows that admitted
        it (a window that ended meanwhile is gone: nothing to charge); soft alerts fire once each."""
        alerts: list[Decision] = []
        by_period = {c.period: c for c in configs}
        for period, key in hold.keys:
            spend = self.spends.get(period)
            if spend is None or spend.key != key:
                continue
            spend.reserved.pop(hold.id, None)
            spend.spent_usd += max(0.0, cost_usd)
            spend.tokens += max(0, tokens)
            config = by_period.get(period)
            if config is None or spend.alerted:
                continue
            window = window_of(period, timezone, now)
            if window.key != key:
                continue
            alert = soft_alert(config, window, spend.spent_usd, spend.tokens)
            if alert is not None:
                spend.alerted = True
                alerts.append(alert)
        return alerts

    def release(self, hold: WindowHold) -> None:
        """The call never reached the upstream: its reservations go back."""
        for period, key in hold.keys:
            spend = self.spends.get(period)
            if spend is not None and spend.key == key:
                spend.reserved.pop(hold.id, None)

    def reset(self, period: Period | None = None) -> None:
        """Spend back to zero (all windows, or one period's); calls in flight keep their reservations."""
        for name, spend in self.spends.items():
            if period is None or name == period:
                spend.spent_usd, spend.tokens, spend.alerted = 0.0, 0, False

    # -- persistence (settled spend only: reservations belong to calls of this process) ----------

    def dump(self) -> dict[str, Any]:
        return {
            period: {"key": s.key, "spent_usd": s.spent_usd, "tokens": s.tokens, "alerted": s.alerted}
            for period, s in self.spends.items()
        }

    @classmethod
    def load(cls, data: dict[str, Any]) -> AgentWindows:
        windows = cls()
        for period, s in data.items():
            if period in ("day", "week", "month") and isinstance(s, dict):
                windows.spends[period] = WindowSpend(
                    str(s.get("key", "")),
                    float(s.get("spent_usd", 0.0)),
                    int(s.get("tokens", 0)),
                    bool(s.get("alerted", False)),
                )
        return windows


def describe_windows(
    spends: dict[str, WindowSpend], configs: tuple[BudgetWindowConfig, ...], timezone: str, now: float
) -> list[dict[str, Any]]:
    """What `GET /api/agents/{name}/spend` shows of each configured window (zero for a new one)."""
    out: list[dict[str, Any]] = []
    for config in configs:
        window = window_of(config.period, timezone, now)
        spend = spends.get(config.period)
        if spend is None or spend.key != window.key:
            spend = WindowSpend(window.key)
        out.append(
            {
                "period": config.period,
                "key": window.key,
                "timezone": timezone,
                "spent_usd": round(spend.spent_usd, 6),
                "tokens": spend.tokens,
                "reserved": {"usd": round(spend.reserved_usd(), 6), "tokens": spend.reserved_tokens()},
                "max_cost_usd": config.max_cost_usd,
                "max_tokens": config.max_tokens,
                "soft_alert_pct": config.soft_alert_pct,
                "soft_alerted": spend.alerted,
                "starts_at": iso(window.start),
                "resets_at": window.resets_at(),
            }
        )
    return out
