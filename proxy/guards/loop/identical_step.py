"""identical_step (003's guard): the same set of calls in consecutive assistant steps of the turn,
each step after the first of the run stale (the same calls, the same results).

Judged on an LLM request's steps, once its new calls have been judged one by one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from proxy.guards.config import LoopDetectionConfig
from proxy.guards.loop.history import HistoryCall, call_tuple
from proxy.guards.loop.pattern import ACTIONS, MAX_EVIDENCE, Firing
from proxy.guards.loop.turn import Attempt
from proxy.guards.signatures import call_keys, split_identity

KINDS = {"identical_step": "the same set of tool calls was repeated step after step"}


def judge(
    steps: Sequence[Sequence[HistoryCall]],
    turn_start: int,
    config: LoopDetectionConfig,
    attempts: Mapping[str, Attempt],
    evidence_id: Callable[[str], str | None],
) -> Firing | None:
    """`attempts` are the calls judged so far by tool_call_id, `evidence_id` a call's evidence."""
    limit = config.max_repeated_tool_steps
    size = len(steps) - turn_start  # the turn's steps, read back from the last one only
    if size <= 0 or not steps[-1]:
        return None

    def step_at(back: int) -> list[tuple[str, str, Any]]:  # the turn's step `back` from the end
        return [call_tuple(c) for c in steps[len(steps) - 1 - back]]

    def ident_of(call: tuple[str, str, Any]) -> str:
        attempt = attempts.get(call[0])
        return attempt.ident if attempt is not None else split_identity(call_keys(call[1], call[2])[1])[0]

    def key(step: Sequence[tuple[str, str, Any]]) -> tuple[str, ...]:
        return tuple(sorted(ident_of(c) for c in step))

    # back from the last step while the steps repeat it: a long turn is not read whole per call
    last = key(step_at(0))
    run = 1
    while run < size and key(step_at(run)) == last:
        run += 1
    repeated = run - 1
    if repeated < limit:
        return None
    turn = [step_at(back) for back in range(run - 1, -1, -1)]  # the run, oldest first
    middle = [[attempts.get(c[0]) for c in step] for step in turn[1:-1]]
    if not all(a is not None and a.stale for row in middle for a in row):
        return None  # something new came back on the way: the agent is getting somewhere
    first_step = turn[0]
    ids = tuple(e for step in turn for c in step if (e := evidence_id(c[0])))
    return Firing(
        "identical_step",
        ("identical_step", first_step[0][0]),
        ACTIONS[config.action],
        f"the same tool calls were repeated in {run} consecutive steps and nothing new came back",
        pattern=" + ".join(last),
        threshold=limit,
        actual=repeated,
        repetitions=run,
        window_size=run,
        evidence=ids[-MAX_EVIDENCE:],
    )
