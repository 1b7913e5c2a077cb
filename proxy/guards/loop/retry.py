"""retry_no_progress: the same tool failed with the same error `threshold` - 1 times in a row, and
no news came back since: this attempt is the T-th (whatever its arguments: a failure changes nothing
and teaches nothing new).
"""

from __future__ import annotations

import itertools

from proxy.guards.config import LoopDetectionConfig
from proxy.guards.loop.pattern import ACTIONS, MAX_EVIDENCE, Firing, Pattern, Streak
from proxy.guards.loop.turn import Attempt, Turn
from proxy.guards.signatures import error_fingerprint


class RetryWithoutProgress(Pattern):
    KINDS = {"retry_no_progress": "a failing tool call is being retried without progress"}

    def __init__(self) -> None:
        self.fails: dict[str, Streak] = {}  # tool -> identical failures in a row
        self._serials = itertools.count(1)

    def answered(self, attempt: Attempt, fingerprint: str, error: str | None, turn: Turn) -> None:
        if error is None:
            self.fails.pop(attempt.tool, None)
            return
        # a failure is no progress whatever its arguments: nothing changed, nothing was learned
        key = turn.same_as(f"{attempt.tool}\x00error", error_fingerprint(error) or "")
        fail = self.fails.get(attempt.tool)
        if fail is not None and fail.key == key and turn.last_news <= fail.at:
            fail.count += 1
        else:
            fail = self.fails[attempt.tool] = Streak(key, 1, next(self._serials), text=error)
        fail.at = attempt.known
        if attempt.evidence:
            fail.evidence.append(attempt.evidence)

    def forget(self) -> None:
        self.fails.clear()

    def judge(self, attempt: Attempt, turn: Turn, config: LoopDetectionConfig) -> Firing | None:
        threshold = config.threshold
        fail = self.fails.get(attempt.tool)
        if fail is None or fail.count + 1 < threshold or turn.last_news > fail.at:
            return None
        return Firing(
            "retry_no_progress",
            ("retry_no_progress", turn.number, fail.serial),
            ACTIONS[config.action],
            f"{attempt.tool} failed {fail.count} times in a row with the same error: {fail.text}",
            pattern=f"{attempt.tool}: {fail.text}",
            threshold=threshold,
            actual=fail.count + 1,
            repetitions=fail.count + 1,
            window_size=fail.count + 1,
            evidence=tuple(fail.evidence[-MAX_EVIDENCE:]),
        )
