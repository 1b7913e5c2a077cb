"""Per-tool escalation alone (proxy/guards/loop/per_tool.py); classification is in test_guards_loop.py."""

from __future__ import annotations

from loop_turns import agent

from proxy.guards.decision import Action
from proxy.guards.loop.per_tool import PerTool, classify_tool


def test_calls_without_progress_escalate_warn_block_terminate() -> None:
    a = agent(PerTool(), idempotent=(2, 3, 4))
    got = a.calls(5, "read_file", {"p": 1}, result="same")  # the first is progress: 4 stale after it
    assert [f.action if f else None for f in got] == [None, None, Action.WARN, Action.BLOCK, Action.TERMINATE]
    assert (
        got[2] is not None
        and got[2].message == "idempotent tool read_file was called without progress 2 times in this turn"
    )
    assert got[4] is not None and got[4].evidence == ("ev0", "ev1", "ev2", "ev3", "ev4")


def test_new_arguments_are_progress_unless_count_mode() -> None:
    a = agent(PerTool(), mutating=(2, 3, 4))
    assert [a.call("shell", {"cmd": i}, result=str(i)) for i in range(6)] == [None] * 6
    a = agent(PerTool(), mutating=(2, 3, 4), per_tool_mode="count")
    got = [a.call("shell", {"cmd": i}, result=str(i)) for i in range(4)]
    assert [f.action if f else None for f in got] == [None, Action.WARN, Action.BLOCK, Action.TERMINATE]
    assert got[1] is not None and got[1].message == "mutating tool shell was called 2 times in this turn"


def test_the_kind_of_tool_picks_the_thresholds() -> None:
    a = agent(PerTool(), idempotent=(3, 3, 3), mutating=(2, 2, 2))
    assert classify_tool("write_file", a.config) == "mutating"
    got = a.calls(3, "write_file", {"p": 1}, result="same")
    assert got[2] is not None and got[2].threshold == 2


def test_progress_mode_counts_the_streak_since_the_tools_last_news() -> None:
    """A CI poll whose status moves every second poll: each news starts the count again, so a long
    turn of it never reaches the warning (issue 31: it was warned at poll 9-12, blocked at 18)."""
    a = agent(PerTool(), idempotent=(3, 5, 8))
    got = [a.call("get_pipeline", {"id": 7}, result=f"stage {i // 2}: running") for i in range(40)]
    assert got == [None] * 40
    # without news, the streak still grows: the 40th poll was stale, so the third stale one warns
    got = a.calls(4, "get_pipeline", {"id": 7}, result="stage 19: running")
    assert [f.action if f else None for f in got] == [None, Action.WARN, Action.WARN, Action.BLOCK]
