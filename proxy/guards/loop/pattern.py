"""What a loop pattern is given and what it answers (docs/guards.md "Adding a loop pattern").

A `Pattern` lives for one user turn (the detector makes one of each in `detector.ATTEMPT_PATTERNS`
per turn, so its state starts from nothing with the turn) and is told, for each tool call of the
turn, in this order: that it was made (`attempted`), then asked whether it fires before it is
forwarded (`judge`: a `Firing` or None), and later what came back (`answered`). Each time it is
given the attempt and the `turn.Turn` (the calls so far and what came back); `judge` also the
loop-detection config. The detector turns each firing into a `Decision`, `new_finding` the first
time its `key` fires. Two patterns judge other things: the identical step a request's steps
(`identical_step.judge`), AgentDbg's cycle the events (`cycle.AgentDbgCycle`); both answer the same
`Firing`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from proxy.constants import GUARD_LOOP_DETECTION, TAG_LOOP_DETECTED, TAG_TERMINATED
from proxy.guards.config import LoopDetectionConfig
from proxy.guards.decision import Action, Decision
from proxy.guards.loop.turn import Attempt, Turn

PATTERN_CHARS = 80
MAX_EVIDENCE = 50
ACTIONS = {"warn": Action.WARN, "ask": Action.ASK, "block": Action.BLOCK, "terminate": Action.TERMINATE}
_LOOP_TAGS = (TAG_LOOP_DETECTED,)
_STOP_TAGS = (TAG_LOOP_DETECTED, TAG_TERMINATED)


@dataclass(frozen=True, slots=True)
class Firing:
    """A loop pattern fired: its kind, what it saw (count, window, evidence) and what to do.

    `key` names the finding (a streak, a cycle from its start): one LOOP_WARNING per key.
    """

    kind: str
    key: Any
    action: Action
    message: str
    pattern: str
    threshold: Any
    actual: Any
    repetitions: int
    window_size: int
    evidence: tuple[str, ...]
    guard: str = GUARD_LOOP_DETECTION

    def decision(self, new_finding: bool = True) -> Decision:
        return Decision(
            self.action,
            self.guard,
            self.message,
            threshold=self.threshold,
            actual=self.actual,
            kind=self.kind,
            pattern=self.pattern[:PATTERN_CHARS],
            repetitions=self.repetitions,
            window_size=self.window_size,
            evidence=self.evidence,
            new_finding=new_finding,
            tags=_STOP_TAGS if self.action is Action.TERMINATE else _LOOP_TAGS,
        )


class Pattern:
    """A loop pattern judged on every tool call of one turn; override what it needs."""

    KINDS: ClassVar[Mapping[str, str]] = {}  # the kinds it answers -> what the agent reads (describe)

    def attempted(self, attempt: Attempt, turn: Turn) -> None:
        """A call was made (the turn has recorded it), before it is judged."""

    def judge(self, attempt: Attempt, turn: Turn, config: LoopDetectionConfig) -> Firing | None:
        """Before the call is forwarded (its result not known yet): does the pattern fire?"""
        return None

    def answered(self, attempt: Attempt, fingerprint: str, error: str | None, turn: Turn) -> None:
        """The call's answer came back (the turn has recorded it): `fingerprint` is the result's as
        the turn knows it (`Turn.same_as`), `error` the error text when it failed."""

    def forget(self) -> None:
        """The turn grew too large and forgot what came back: so does the pattern."""


@dataclass
class Streak:
    """Consecutive identical results (or failures), numbered for one warning each."""

    key: Any
    count: int
    serial: int
    evidence: list[str] = field(default_factory=list)
    at: int = 0  # the turn's answer epoch of its latest member
    text: str = ""  # what the streak repeats, as a message can show it
