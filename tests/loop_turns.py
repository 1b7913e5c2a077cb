"""One turn driven call by call, for the tests of one loop pattern alone (no detector around it).

`Agent.call` makes a call as the detector does (recorded in the `Turn`, told to the pattern, judged
by it before its result), then answers it (recorded, told), unless `result` is None (the call stays
in flight).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from proxy.guards.config import LoopDetectionConfig
from proxy.guards.loop.pattern import Firing, Pattern
from proxy.guards.loop.turn import Attempt, Turn
from proxy.guards.signatures import call_keys, result_fingerprint

# every pattern's thresholds out of reach, for a test to lower the one it is about
QUIET: dict[str, Any] = {
    "threshold": 100,
    "idempotent": (100, 100, 100),
    "mutating": (100, 100, 100),
    "no_progress_warn": 100,
    "no_progress_halt": 100,
}


@dataclass
class Agent:
    pattern: Pattern
    config: LoopDetectionConfig
    turn: Turn = field(default_factory=lambda: Turn(1, 0.0))
    attempts: list[Attempt] = field(default_factory=list)

    def call(
        self, tool: str, args: Any = None, result: str | None = "ok", error: str | None = None
    ) -> Firing | None:
        sig, ident = call_keys(tool, args if args is not None else {})
        attempt = self.turn.attempt(tool, sig, ident, f"ev{self.turn.count}")
        self.pattern.attempted(attempt, self.turn)
        self.attempts.append(attempt)
        fired = self.pattern.judge(attempt, self.turn, self.config)
        if result is not None:
            self.answer(attempt, result, error)
        return fired

    def answer(self, attempt: Attempt, result: str, error: str | None = None) -> None:
        known = self.turn.same_as(attempt.tool, result_fingerprint(result))
        self.turn.resolve(attempt, known)
        self.turn.apply(attempt, known, error)
        self.pattern.answered(attempt, known, error, self.turn)

    def calls(
        self, n: int, tool: str, args: Any = None, result: str = "ok", error: str | None = None
    ) -> list[Firing | None]:
        return [self.call(tool, args, result, error) for _ in range(n)]


def agent(pattern: Pattern, **config: Any) -> Agent:
    return Agent(pattern, LoopDetectionConfig(**{**QUIET, **config}))
