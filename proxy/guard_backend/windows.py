"""Where an agent's budgets over time live (SPEC §9): `LocalWindows` (this process, persisted to the
data dir) or `SharedWindows` (Redis, proxy/state/windows.py). The guard stage reserves before a call
is forwarded and settles after, through `WindowBook`; the pure rules are proxy/guards/budget_window.py.

The wall clock is `clock` (a test sets it to move through a day boundary without waiting).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import orjson

from proxy.guards.budget_window import AgentWindows, WindowHold, describe_windows
from proxy.guards.config import GuardConfig, Period
from proxy.guards.decision import Decision
from proxy.metrics import Metrics
from proxy.storage import write_json_atomic

log = logging.getLogger("tripwire.windows")

WINDOWS_FILE = "budget-windows.json"  # in the data dir
PERSIST_AFTER_S = 0.5  # settled spend reaches the file this soon (and always at a clean shutdown)
RETRY_WRITE_S = 5.0  # after a failed write (a full or read-only data dir)


class WindowBook(Protocol):
    clock: Callable[[], float]

    async def start(self) -> None: ...
    async def close(self) -> None: ...
    async def reserve(
        self, agent: str, config: GuardConfig, usd: float, tokens: int, *, shadow: bool = False
    ) -> tuple[Decision | None, WindowHold | None]: ...
    async def settle(
        self, agent: str, config: GuardConfig, hold: WindowHold, cost_usd: float, tokens: int
    ) -> list[Decision]: ...
    async def release(self, agent: str, hold: WindowHold) -> None: ...
    async def spend(self, agent: str, config: GuardConfig) -> list[dict[str, Any]]: ...
    async def reset(self, agent: str, config: GuardConfig, period: Period | None = None) -> None: ...


def report_gauges(metrics: Metrics | None, agent: str, windows: list[dict[str, Any]]) -> None:
    """The per-agent, per-window gauges from what the book just showed (`describe_windows`)."""
    if metrics is None:
        return
    for w in windows:
        metrics.set_budget_window(agent, w["period"], w["spent_usd"], w["max_cost_usd"], w["reserved"]["usd"])


class LocalWindows:
    """Every agent's windows in this process; settled spend persisted to `path` (temp file +
    `os.replace`), written at most every PERSIST_AFTER_S and at close, so a restart keeps it."""

    def __init__(self, path: Path | None, metrics: Metrics | None = None) -> None:
        self.path = path
        self.metrics = metrics
        self.clock: Callable[[], float] = time.time
        self.agents: dict[str, AgentWindows] = {}
        self._dirty = asyncio.Event()
        self._writer: asyncio.Task[None] | None = None
        if path is not None and path.exists():
            self._load(path)

    def _load(self, path: Path) -> None:
        try:
            data = orjson.loads(path.read_bytes())
        except (OSError, orjson.JSONDecodeError) as e:
            log.error("budget_windows.unreadable path=%s error=%s (starting from zero)", path, e)
            return
        for agent, windows in (data.get("agents") or {}).items():
            if isinstance(windows, dict):
                self.agents[str(agent)] = AgentWindows.load(windows)

    def of(self, agent: str) -> AgentWindows:
        windows = self.agents.get(agent)
        if windows is None:
            windows = self.agents[agent] = AgentWindows()
        return windows

    async def start(self) -> None:
        if self.path is not None and self._writer is None:
            self._writer = asyncio.create_task(self._write_forever(), name="tripwire-budget-windows")

    async def close(self) -> None:
        if self._writer is not None:
            self._writer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._writer
            self._writer = None
        if self._dirty.is_set():
            try:
                self._write()  # a clean shutdown loses no settled call
            except OSError as e:
                log.error("budget_windows.write_failed path=%s error=%s", self.path, e)

    async def _write_forever(self) -> None:
        while True:
            await self._dirty.wait()
            await asyncio.sleep(PERSIST_AFTER_S)  # calls settling together: one write
            assert self.path is not None
            data = self._snapshot()  # on the loop: the settles change the windows there
            try:
                await asyncio.to_thread(write_json_atomic, self.path, data)
            except OSError as e:
                self._dirty.set()  # tried again, after a longer pause
                log.error("budget_windows.write_failed path=%s error=%s", self.path, e)
                await asyncio.sleep(RETRY_WRITE_S)

    def _snapshot(self) -> dict[str, Any]:
        self._dirty.clear()  # a settle after the snapshot marks it again
        return {"agents": {agent: w.dump() for agent, w in self.agents.items() if w.spends}}

    def _write(self) -> None:
        assert self.path is not None
        write_json_atomic(self.path, self._snapshot())

    def _changed(self, agent: str, config: GuardConfig) -> None:
        if self.path is not None:
            self._dirty.set()
        self._gauges(agent, config)

    def _gauges(self, agent: str, config: GuardConfig) -> None:
        if self.metrics is not None:
            windows = self.of(agent).spends
            report_gauges(
                self.metrics,
                agent,
                describe_windows(windows, config.budget_windows, config.budget_timezone, self.clock()),
            )

    async def reserve(
        self, agent: str, config: GuardConfig, usd: float, tokens: int, *, shadow: bool = False
    ) -> tuple[Decision | None, WindowHold | None]:
        refusal, hold = self.of(agent).check(
            config.budget_windows, config.budget_timezone, usd, tokens, self.clock(), reserve_anyway=shadow
        )
        self._gauges(agent, config)
        return refusal, hold

    async def settle(
        self, agent: str, config: GuardConfig, hold: WindowHold, cost_usd: float, tokens: int
    ) -> list[Decision]:
        alerts = self.of(agent).settle(
            hold, cost_usd, tokens, config.budget_windows, config.budget_timezone, self.clock()
        )
        self._changed(agent, config)
        return alerts

    async def release(self, agent: str, hold: WindowHold) -> None:
        self.of(agent).release(hold)

    async def spend(self, agent: str, config: GuardConfig) -> list[dict[str, Any]]:
        windows = self.agents.get(agent)
        return describe_windows(
            windows.spends if windows is not None else {},
            config.budget_windows,
            config.budget_timezone,
            self.clock(),
        )

    async def reset(self, agent: str, config: GuardConfig, period: Period | None = None) -> None:
        self.of(agent).reset(period)
        self._changed(agent, config)
