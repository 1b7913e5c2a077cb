"""no_progress, Loop Guard's poll: the same call came back with the same result, without progress,
`no_progress_warn` - 1 times in a row: the next attempt warns (`no_progress_halt` ends the session).
"""

from __future__ import annotations

from proxy.guards.config import LoopDetectionConfig
from proxy.guards.decision import Action
from proxy.guards.loop.pattern import MAX_EVIDENCE, Firing
from proxy.guards.loop.turn import Attempt, Turn


class NoProgress:
    KINDS = {"no_progress": "a call keeps returning the same result"}

    def judge(self, attempt: Attempt, turn: Turn, config: LoopDetectionConfig) -> Firing | None:
        if not attempt.presumed_stale:
            return None
        same = turn.same.get(attempt.ident)
        if same is None:
            return None
        number = same.count + 1  # this attempt's number in the streak
        if number >= config.no_progress_halt:
            action, limit = Action.TERMINATE, config.no_progress_halt
        elif number >= config.no_progress_warn:
            action, limit = Action.WARN, config.no_progress_warn
        else:
            return None
        times = "once" if same.count == 1 else f"{same.count} times in a row"
        return Firing(
            "no_progress",
            ("no_progress", same.serial, action),
            action,
            f"{attempt.tool} returned the same result {times}; this is call {number}",
            pattern=attempt.sig,
            threshold=limit,
            actual=number,
            repetitions=number,
            window_size=number,
            evidence=tuple(same.evidence[-MAX_EVIDENCE:]),
        )
