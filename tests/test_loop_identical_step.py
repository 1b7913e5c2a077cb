"""The identical step alone (proxy/guards/loop/identical_step.py): judged on a request's steps."""

from __future__ import annotations

from typing import Any

from proxy.guards.config import LoopDetectionConfig
from proxy.guards.decision import Action
from proxy.guards.loop import identical_step
from proxy.guards.loop.turn import Attempt
from proxy.guards.signatures import call_keys

CONFIG = LoopDetectionConfig(max_repeated_tool_steps=2, action="block")


def steps_of(*steps: list[tuple[str, dict[str, Any]]]) -> list[list[tuple[str, str, Any]]]:
    """Assistant steps of (tool, args) calls, their ids c<step>_<i>."""
    return [
        [(f"c{k}_{i}", tool, args) for i, (tool, args) in enumerate(step)] for k, step in enumerate(steps)
    ]


def judged(steps: list[list[tuple[str, str, Any]]], stale: bool) -> dict[str, Attempt]:
    """Every call as the detector judged it, its answer stale (or not)."""
    out = {}
    for step in steps:
        for call_id, tool, args in step:
            sig, ident = call_keys(tool, args)
            out[call_id] = Attempt(ident, sig, tool, call_id, 0, 0, True, False, stale)
    return out


def evidence(call_id: str) -> str:
    return f"ev-{call_id}"


def test_the_same_set_of_calls_in_consecutive_stale_steps_fires() -> None:
    pair = [("read_file", {"p": "a"}), ("grep", {"q": "x"})]
    steps = steps_of(pair, pair[::-1], pair)  # the order inside a step does not matter
    fired = identical_step.judge(steps, 0, CONFIG, judged(steps, stale=True), evidence)
    assert fired is not None and (fired.kind, fired.action, fired.actual, fired.repetitions) == (
        "identical_step",
        Action.BLOCK,
        2,
        3,
    )
    assert fired.key == ("identical_step", "c0_0") and len(fired.evidence) == 6
    assert identical_step.judge(steps[:2], 0, CONFIG, judged(steps, stale=True), evidence) is None


def test_a_step_in_the_middle_that_learned_something_is_progress() -> None:
    step = [("get_status", {"job": 1})]
    steps = steps_of(step, step, step)
    attempts = judged(steps, stale=True)
    attempts["c1_0"].stale = False
    assert identical_step.judge(steps, 0, CONFIG, attempts, evidence) is None


def test_steps_before_the_turn_do_not_count() -> None:
    step = [("get_status", {"job": 1})]
    steps = steps_of(step, step, step)
    assert identical_step.judge(steps, 1, CONFIG, judged(steps, stale=True), evidence) is None
