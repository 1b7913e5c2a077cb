"""The no-progress poll alone (proxy/guards/loop/no_progress.py)."""

from __future__ import annotations

from loop_turns import agent

from proxy.guards.decision import Action
from proxy.guards.loop.no_progress import NoProgress


def test_the_same_result_warns_at_no_progress_warn_and_ends_at_no_progress_halt() -> None:
    """Judged before its own result: it fires once `no_progress_warn` results came back the same
    (issue 31: a poll whose answer moves every 1-3 polls is never warned)."""
    a = agent(NoProgress(), no_progress_warn=3, no_progress_halt=5)
    got = a.calls(7, "get_status", {"job": 1}, result="pending")
    assert got[:3] == [None, None, None]
    warn, halt = got[3], got[5]
    assert warn is not None and (warn.kind, warn.action, warn.threshold, warn.actual) == (
        "no_progress",
        Action.WARN,
        3,
        4,
    )
    assert warn.message == "get_status returned the same result 3 times in a row; this is call 4"
    assert got[4] is not None and got[4].key == warn.key  # the same streak: one warning
    assert (
        halt is not None and (halt.action, halt.threshold) == (Action.TERMINATE, 5) and halt.key != warn.key
    )
    assert warn.evidence == ("ev0", "ev1", "ev2")  # the calls that came back the same


def test_a_new_result_starts_a_new_streak() -> None:
    a = agent(NoProgress(), no_progress_warn=3, no_progress_halt=10)
    a.calls(3, "get_status", {"job": 1}, result="pending")
    assert a.call("get_status", {"job": 1}, result="running") is not None  # judged before its result
    assert a.call("get_status", {"job": 1}, result="running") is None  # 2nd of the new streak
    assert a.call("get_status", {"job": 1}, result="running") is None  # 3rd
    fired = a.call("get_status", {"job": 1}, result="running")
    assert fired is not None and fired.evidence == ("ev3", "ev4", "ev5")


def test_a_status_that_moves_every_third_poll_is_never_warned() -> None:
    a = agent(NoProgress(), no_progress_warn=4, no_progress_halt=8)
    assert [a.call("get_status", {"job": 1}, result=f"stage {i // 3}") for i in range(30)] == [None] * 30


def test_checking_again_after_news_is_not_judged() -> None:
    a = agent(NoProgress(), no_progress_warn=2, no_progress_halt=10)
    for i in range(6):  # a write that changes something, then the same check
        assert a.call("write_file", {"v": i}) is None
        assert a.call("get_status", {"job": 1}, result="failed") is None


def test_forgetting_drops_the_streaks() -> None:
    a = agent(NoProgress(), no_progress_warn=3, no_progress_halt=10)
    a.calls(2, "get_status", {"job": 1}, result="pending")
    a.pattern.forget()
    assert a.call("get_status", {"job": 1}, result="pending") is None
