"""The pattern interface (proxy/guards/loop/pattern.py) and how the detector composes patterns."""

from __future__ import annotations

import pytest

from proxy.constants import TAG_TERMINATED
from proxy.guards.config import LoopDetectionConfig
from proxy.guards.decision import Action
from proxy.guards.loop import detector
from proxy.guards.loop.pattern import PATTERN_CHARS, Firing, Pattern
from proxy.guards.loop.turn import Attempt, Turn


def firing(action: Action = Action.WARN, key: object = "k") -> Firing:
    return Firing("toy", key, action, "msg", "p" * 200, 3, 4, 4, 4, ("e1",))


def test_a_firing_becomes_a_loop_decision() -> None:
    d = firing().decision(new_finding=False)
    assert (d.guard, d.kind, d.action, d.threshold, d.actual, d.evidence) == (
        "loop_detection",
        "toy",
        Action.WARN,
        3,
        4,
        ("e1",),
    )
    assert len(d.pattern or "") == PATTERN_CHARS and not d.new_finding and TAG_TERMINATED not in d.tags
    assert TAG_TERMINATED in firing(Action.TERMINATE).decision().tags


class EveryThirdCall(Pattern):
    """A pattern added in one place: it fires on every third call of the turn."""

    KINDS = {"toy": "a toy pattern fired"}

    def judge(self, attempt: Attempt, turn: Turn, config: LoopDetectionConfig) -> Firing | None:
        return firing(key=("toy", turn.number)) if turn.count % 3 == 0 else None


def test_a_pattern_in_the_list_is_judged_on_every_call_one_finding_per_key(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(detector, "ATTEMPT_PATTERNS", (*detector.ATTEMPT_PATTERNS, EveryThirdCall))
    d = detector.LoopDetector(LoopDetectionConfig())
    got = [d.check_tool_call("t", {"i": i}, 0.0) for i in range(6)]
    assert [bool(g) for g in got] == [False, False, True, False, False, True]
    assert got[2][0].kind == "toy" and got[2][0].new_finding and not got[5][0].new_finding
    assert d.stats()["decisions"] == {"toy:warn": 2}


def test_every_kind_a_pattern_answers_says_what_the_agent_reads() -> None:
    assert set(detector.LOOP_KINDS) == {
        "repetition",
        "ping_pong",
        "no_progress",
        "retry_no_progress",
        "per_tool",
        "identical_step",
        "repeated_reply",
        "cycle",
    }
    assert all(detector.LOOP_KINDS.values())
