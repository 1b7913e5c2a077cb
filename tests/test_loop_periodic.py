"""The periodic pattern alone (proxy/guards/loop/periodic.py): repetition and ping_pong."""

from __future__ import annotations

import pytest
from loop_turns import agent

from proxy.guards.decision import Action
from proxy.guards.loop.periodic import Periodic, trailing_stale


def test_repetition_fires_at_the_threshold_th_identical_call_without_progress() -> None:
    a = agent(Periodic(), threshold=4, action="block")
    got = a.calls(5, "read_file", {"path": "a"}, result="same")
    assert got[:3] == [None] * 3
    fired = got[3]
    assert fired is not None and fired.kind == "repetition" and fired.action is Action.BLOCK
    assert (fired.threshold, fired.actual, fired.window_size) == (4, 4, 4)
    assert fired.evidence == ("ev0", "ev1", "ev2", "ev3")
    again = got[4]
    assert again is not None and again.key == fired.key and again.actual == 5  # one finding, growing


def test_a_repeated_call_whose_result_changes_never_fires() -> None:
    a = agent(Periodic(), threshold=3)
    assert [a.call("get_status", {"job": 1}, result=f"{i}%") for i in range(20)] == [None] * 20


@pytest.mark.parametrize("period", [2, 3, 4, 5])
def test_a_cycle_of_m_calls_fires_as_ping_pong_after_two_rounds(period: int) -> None:
    a = agent(Periodic(), threshold=2)
    block = [(f"tool{i}", {"i": i}) for i in range(period)]
    got = [a.call(tool, args, result=tool) for tool, args in block * 3]
    first = next(i for i, f in enumerate(got) if f is not None)
    fired = got[first]
    assert fired is not None and fired.kind == "ping_pong" and first == 2 * period - 1
    assert fired.repetitions == 2 and fired.pattern.startswith('tool0({"i":0}) -> tool1(')


def test_a_block_that_repeats_a_shorter_period_is_that_period() -> None:
    a = agent(Periodic(), threshold=2)
    fired = [f for f in a.calls(6, "t", {}, result="same") if f is not None]
    assert fired and {f.kind for f in fired} == {"repetition"}


def test_trailing_stale_counts_back_from_the_call_before_the_current_one() -> None:
    a = agent(Periodic())
    a.calls(3, "t", {}, result="same")  # the first made progress, the next two were stale
    a.call("t", {}, result=None)  # in flight: presumed stale as it is judged
    assert trailing_stale(a.turn) == 2
    a.call("u", {}, result="new")
    assert trailing_stale(a.turn) == 3


def test_the_tail_counts_how_many_last_calls_repeat_with_each_period() -> None:
    a = agent(Periodic())
    for tool in ["a", "b", "a", "b", "a"]:
        a.call(tool, {}, result=tool)
    p = a.pattern
    assert isinstance(p, Periodic) and (p.tail[1], p.tail[2], p.tail[3]) == (1, 5, 3)
