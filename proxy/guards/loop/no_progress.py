"""no_progress, Loop Guard's poll: the same call came back with the same result, without progress,
`no_progress_warn` times in a row: the next attempt warns (`no_progress_halt` ends the session).
"""

from __future__ import annotations

import itertools

from proxy.guards.config import LoopDetectionConfig
from proxy.guards.decision import Action
from proxy.guards.loop.pattern import MAX_EVIDENCE, Firing, Pattern, Streak
from proxy.guards.loop.turn import Attempt, Turn


class NoProgress(Pattern):
    KINDS = {"no_progress": "a call keeps returning the same result"}

    def __init__(self) -> None:
        self.same: dict[str, Streak] = {}  # identity -> identical results in a row, without progress
        self._serials = itertools.count(1)

    def answered(self, attempt: Attempt, fingerprint: str, error: str | None, turn: Turn) -> None:
        same = self.same.get(attempt.ident)
        if attempt.stale and not attempt.changed and same is not None and same.key == fingerprint:
            same.count += 1
        else:
            same = self.same[attempt.ident] = Streak(fingerprint, 1, next(self._serials))
        if attempt.evidence:
            same.evidence.append(attempt.evidence)

    def forget(self) -> None:
        self.same.clear()

    def judge(self, attempt: Attempt, turn: Turn, config: LoopDetectionConfig) -> Firing | None:
        if not attempt.presumed_stale:
            return None
        same = self.same.get(attempt.ident)
        if same is None:
            return None
        number = same.count + 1  # this attempt's number in the streak
        # judged before its own result: it fires once `no_progress_warn` results came back the same,
        # so a poll whose answer moves every 1-3 polls is never warned (its next result is unknown)
        if same.count >= config.no_progress_halt:
            action, limit = Action.TERMINATE, config.no_progress_halt
        elif same.count >= config.no_progress_warn:
            action, limit = Action.WARN, config.no_progress_warn
        else:
            return None
        times = "once" if same.count == 1 else f"{same.count} times in a row"
        return Firing(
            "no_progress",
            ("no_progress", turn.number, same.serial, action),
            action,
            f"{attempt.tool} returned the same result {times}; this is call {number}",
            pattern=attempt.sig,
            threshold=limit,
            actual=number,
            repetitions=number,
            window_size=number,
            evidence=tuple(same.evidence[-MAX_EVIDENCE:]),
        )
