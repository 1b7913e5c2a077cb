"""`SharedWindows`: the agents' budgets over time in the shared state (placeholder)."""

from __future__ import annotations

from proxy.guard_backend.windows import LocalWindows
from proxy.metrics import Metrics
from proxy.state.service import SharedState


class SharedWindows(LocalWindows):
    def __init__(self, state: SharedState, metrics: Metrics | None = None) -> None:
        super().__init__(None, metrics)
        self.state = state
