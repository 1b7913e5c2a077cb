"""retry_no_progress: the same tool failed with the same error `threshold` - 1 times in a row, and
no news came back since: this attempt is the T-th (whatever its arguments: a failure changes nothing
and teaches nothing new).
"""

from __future__ import annotations

from proxy.guards.config import LoopDetectionConfig
from proxy.guards.loop.pattern import ACTIONS, MAX_EVIDENCE, Firing
from proxy.guards.loop.turn import Attempt, Turn


class RetryWithoutProgress:
    KINDS = {"retry_no_progress": "a failing tool call is being retried without progress"}

    def judge(self, attempt: Attempt, turn: Turn, config: LoopDetectionConfig) -> Firing | None:
        threshold = config.threshold
        fail = turn.fails.get(attempt.tool)
        if fail is None or fail.count + 1 < threshold or turn.last_news > fail.at:
            return None
        return Firing(
            "retry_no_progress",
            ("retry_no_progress", fail.serial),
            ACTIONS[config.action],
            f"{attempt.tool} failed {fail.count} times in a row with the same error: {fail.text}",
            pattern=f"{attempt.tool}: {fail.text}",
            threshold=threshold,
            actual=fail.count + 1,
            repetitions=fail.count + 1,
            window_size=fail.count + 1,
            evidence=tuple(fail.evidence[-MAX_EVIDENCE:]),
        )
