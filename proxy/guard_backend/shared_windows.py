"""`SharedWindows`: the agents' budgets over time in the shared state (SPEC §8, §9), so every replica
reserves against, settles into and refuses by the same numbers.

Keys `tripwire:window:<agent>:<period key>` (proxy/state/keys.py), one Lua script per operation
(proxy/state/lua.py `WINDOW_*`): a call's reservation is checked and placed in one atomic step, so
50 concurrent calls through any number of replicas stop exactly at the limit. Each key expires a
day after its window ends. Redis lost them (restart, FLUSHALL): the next script a replica runs puts
back what that replica last saw of the window (`seen`) before anything else, as the replicas write
back runs' logs (proxy/guard_log/service.py). Backend down: `fail_open` counts in this replica's memory
(`LocalWindows`, from what it last saw) until it is back; `fail_closed` raises `StateUnavailable`
(the guard stage refuses with `state_unavailable`).
"""

from __future__ import annotations

import itertools
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from proxy.guard_backend.windows import LocalWindows, report_gauges
from proxy.guard_log.service import SharedState
from proxy.guards.budget_window import (
    Window,
    WindowHold,
    WindowSpend,
    describe_windows,
    exceeded,
    soft_alert,
    window_of,
)
from proxy.guards.config import BudgetWindowConfig, GuardConfig, Period
from proxy.guards.decision import Decision
from proxy.metrics import Metrics
from proxy.state import keys
from proxy.state.base import StateUnavailable
from proxy.state.windows import Reserved, WindowRequest

log = logging.getLogger("tripwire.windows")

KEEP_AFTER_END_S = 86_400.0  # a window's key outlives its end by a day (the API can still read it)
STALE_RESERVATION_S = 900.0  # a reservation older than this belongs to a call that died with its replica


@dataclass(frozen=True, slots=True)
class Pending:
    """A call's reservation, prepared (`SharedWindows.prepare`), then decided from the answer."""

    agent: str
    config: GuardConfig
    now: float
    windows: list[tuple[BudgetWindowConfig, Window]]
    hold: WindowHold
    request: WindowRequest
    shadow: bool


class SharedWindows:
    def __init__(self, state: SharedState, metrics: Metrics | None = None) -> None:
        self.state = state
        self.metrics = metrics
        self.clock: Callable[[], float] = time.time
        self.replica = uuid.uuid4().hex[:12]  # hold ids are this replica's: unique across replicas
        self._ids = itertools.count(1)
        # what this replica last saw of each window key: (spent, tokens, alerted), written back if
        # Redis lost the key
        self.seen: dict[str, tuple[float, int, bool]] = {}
        self.local = LocalWindows(None)  # fail_open during an outage: this replica's own count
        self._local_holds: set[WindowHold] = set()
        self.store = state.backend.windows

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        return None

    def _seen(self, key: str) -> dict[str, Any]:
        spent, tokens, alerted = self.seen.get(key, (0.0, 0, False))
        return {"spent": spent, "tokens": tokens, "alerted": alerted}

    @staticmethod
    def _ttl(window_end: float, now: float) -> int:
        return max(1, int((window_end - now + KEEP_AFTER_END_S) * 1000))

    async def _run(self, op: Callable[[], Any]) -> Any:
        return await self.state.link.call(op)

    def _hold_id(self, hold: WindowHold) -> str:
        return f"{self.replica}:{hold.id}"

    def prepare(
        self, agent: str, config: GuardConfig, usd: float, tokens: int, *, shadow: bool = False
    ) -> Pending:
        """A call's reservation in its agent's windows, to make in the admission's round trip
        (`Append.windows`) or in one of its own (`reserve`)."""
        now = self.clock()
        windows = [(c, window_of(c.period, config.budget_timezone, now)) for c in config.budget_windows]
        names = [keys.window(agent, w.key) for _, w in windows]
        hold = WindowHold(
            next(self._ids), tuple((w.period, w.key) for _, w in windows), max(0.0, usd), max(0, tokens)
        )
        header = {
            "id": self._hold_id(hold),
            "usd": hold.usd,
            "tok": hold.tokens,
            "now": now,
            "stale": STALE_RESERVATION_S,
            "place": True,
            "force": shadow,
            "w": [
                {
                    "max_usd": c.max_cost_usd if c.max_cost_usd is not None else -1,
                    "max_tok": c.max_tokens if c.max_tokens is not None else -1,
                    "ttl": self._ttl(w.end, now),
                    **self._seen(name),
                }
                for (c, w), name in zip(windows, names, strict=True)
            ],
        }
        return Pending(agent, config, now, windows, hold, WindowRequest(names, header), shadow)

    def decide(
        self, pending: Pending, reserved: Reserved | None
    ) -> tuple[Decision | None, WindowHold | None]:
        """What the backend answered (None: it was not reached, fail_open: this replica counts)."""
        if reserved is None:
            return self._reserve_locally(pending)
        refused, rows = reserved
        config, windows, names = pending.config, pending.windows, pending.request.keys
        spends: dict[str, WindowSpend] = {}
        for (c, w), name, (spent, used, rusd, rtok, alerted) in zip(windows, names, rows, strict=True):
            self.seen[name] = (spent, used, alerted)
            spends[c.period] = WindowSpend(w.key, spent, used, alerted, {0: (rusd, rtok)})
        report_gauges(
            self.metrics,
            pending.agent,
            describe_windows(spends, config.budget_windows, config.budget_timezone, pending.now),
        )
        refusal = None
        if refused:
            c, w = windows[refused - 1]
            s = spends[c.period]
            refusal = exceeded(c, w, s.spent_usd + s.reserved_usd(), s.tokens + s.reserved_tokens())
            if not pending.shadow:
                return refusal, None
        return refusal, pending.hold

    async def reserve(
        self, agent: str, config: GuardConfig, usd: float, tokens: int, *, shadow: bool = False
    ) -> tuple[Decision | None, WindowHold | None]:
        """In a round trip of its own (the shared backend reserves in the admission's: `prepare`)."""
        pending = self.prepare(agent, config, usd, tokens, shadow=shadow)
        request = pending.request
        try:
            reserved = await self._run(lambda: self.store.reserve(request.keys, request.header))
        except StateUnavailable:
            if not self.state.link.fail_open:
                raise
            reserved = None
        return self.decide(pending, reserved)

    def _reserve_locally(self, pending: Pending) -> tuple[Decision | None, WindowHold | None]:
        agent, config, now = pending.agent, pending.config, pending.now
        usd, tokens, shadow = pending.hold.usd, pending.hold.tokens, pending.shadow
        windows = self.local.of(agent)
        for c in config.budget_windows:  # from what this replica last saw of each window
            key = window_of(c.period, config.budget_timezone, now).key
            spend = windows.current(c.period, key)
            seen = self.seen.get(keys.window(agent, key))
            if seen is not None and not spend.reserved and seen[0] > spend.spent_usd:
                spend.spent_usd, spend.tokens, spend.alerted = seen
        self.local.clock = self.clock
        refusal, hold = windows.check(
            config.budget_windows, config.budget_timezone, usd, tokens, now, reserve_anyway=shadow
        )
        if hold is not None:
            self._local_holds.add(hold)
        return refusal, hold

    async def settle(
        self, agent: str, config: GuardConfig, hold: WindowHold, cost_usd: float, tokens: int
    ) -> list[Decision]:
        now = self.clock()
        if hold in self._local_holds:
            self._local_holds.discard(hold)
            self.local.clock = self.clock
            return await self.local.settle(agent, config, hold, cost_usd, tokens)
        by_period = {c.period: c for c in config.budget_windows}
        names = [keys.window(agent, key) for _, key in hold.keys]
        w_args = []
        for (period, _), name in zip(hold.keys, names, strict=True):
            c = by_period.get(period)
            pct = c.soft_alert_pct if c is not None else None
            alert_usd = c.max_cost_usd * pct / 100 if c and pct and c.max_cost_usd is not None else -1
            alert_tok = c.max_tokens * pct / 100 if c and pct and c.max_tokens is not None else -1
            end = window_of(period, config.budget_timezone, now).end
            w_args.append(
                {
                    "ttl": self._ttl(end, now),
                    "alert_usd": alert_usd,
                    "alert_tok": alert_tok,
                    **self._seen(name),
                }
            )
        header = {"id": self._hold_id(hold), "usd": max(0.0, cost_usd), "tok": max(0, tokens), "w": w_args}
        rows = await self._run(lambda: self.store.settle(names, header))
        alerts: list[Decision] = []
        for (period, key), name, (spent, used, crossed) in zip(hold.keys, names, rows, strict=True):
            self.seen[name] = (spent, used, crossed or self.seen.get(name, (0, 0, False))[2])
            c = by_period.get(period)
            if crossed and c is not None:
                window = window_of(period, config.budget_timezone, now)
                alert = soft_alert(c, window, spent, used) if window.key == key else None
                if alert is not None:
                    alerts.append(alert)
        return alerts

    async def release(self, agent: str, hold: WindowHold) -> None:
        if hold in self._local_holds:
            self._local_holds.discard(hold)
            await self.local.release(agent, hold)
            return
        names = [keys.window(agent, key) for _, key in hold.keys]
        try:
            await self._run(lambda: self.store.release(names, {"id": self._hold_id(hold)}))
        except StateUnavailable:
            return  # the reservation goes stale and is dropped (STALE_RESERVATION_S)

    async def spend(self, agent: str, config: GuardConfig) -> list[dict[str, Any]]:
        now = self.clock()
        windows = [(c, window_of(c.period, config.budget_timezone, now)) for c in config.budget_windows]
        if not windows:
            return []
        names = [keys.window(agent, w.key) for _, w in windows]
        header = {
            "id": "",
            "usd": 0,
            "tok": 0,
            "now": now,
            "stale": STALE_RESERVATION_S,
            "place": False,
            "force": False,
            "w": [
                {"max_usd": -1, "max_tok": -1, "ttl": self._ttl(w.end, now), **self._seen(name)}
                for (_, w), name in zip(windows, names, strict=True)
            ],
        }
        _, rows = await self._run(lambda: self.store.reserve(names, header))
        spends: dict[str, WindowSpend] = {}
        for (c, w), name, (spent, used, rusd, rtok, alerted) in zip(windows, names, rows, strict=True):
            self.seen[name] = (spent, used, alerted)
            spends[c.period] = WindowSpend(w.key, spent, used, alerted, {0: (rusd, rtok)})
        described = describe_windows(spends, config.budget_windows, config.budget_timezone, now)
        report_gauges(self.metrics, agent, described)
        return described

    async def reset(self, agent: str, config: GuardConfig, period: Period | None = None) -> None:
        now = self.clock()
        windows = [
            window_of(c.period, config.budget_timezone, now)
            for c in config.budget_windows
            if period is None or c.period == period
        ]
        self.local.of(agent).reset(period)
        if not windows:
            return
        names = [keys.window(agent, w.key) for w in windows]
        for name in names:
            self.seen[name] = (0.0, 0, False)
        await self._run(
            lambda: self.store.reset(names, {"w": [{"ttl": self._ttl(w.end, now)} for w in windows]})
        )
