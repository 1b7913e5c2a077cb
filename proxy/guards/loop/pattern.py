"""What a loop pattern is given and what it answers (docs/guards.md "Adding a loop pattern").

A pattern is judged on one tool call before it is forwarded (`AttemptPattern`): it is given the
attempt, the turn it belongs to (`turn.Turn`: the calls so far, what came back, the streaks) and the
loop-detection config, and answers a `Firing` or None. The detector composes the patterns in a list
(`detector.ATTEMPT_PATTERNS`, in order: the order of their decisions) and turns each firing into a
`Decision`, `new_finding` the first time its `key` fires. Two patterns judge other things: the
identical step judges a request's steps (`identical_step.judge`), AgentDbg's cycle the events
(`cycle.AgentDbgCycle`); both answer the same `Firing`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from proxy.constants import GUARD_LOOP_DETECTION, TAG_LOOP_DETECTED, TAG_TERMINATED
from proxy.guards.config import LoopDetectionConfig
from proxy.guards.decision import Action, Decision
from proxy.guards.loop.turn import Attempt, Turn

PATTERN_CHARS = 80
MAX_EVIDENCE = 50
ACTIONS = {"warn": Action.WARN, "block": Action.BLOCK, "terminate": Action.TERMINATE}
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


class AttemptPattern(Protocol):
    """Judged on each tool call of the turn before it is forwarded (its result not known yet).

    `KINDS`: the kinds of finding it answers -> what the agent reads when one fires (`describe`).
    """

    @property
    def KINDS(self) -> Mapping[str, str]: ...  # a constant of each pattern class

    def judge(self, attempt: Attempt, turn: Turn, config: LoopDetectionConfig) -> Firing | None: ...
