"""Retry without progress alone (proxy/guards/loop/retry.py)."""

from __future__ import annotations

from loop_turns import agent

from proxy.guards.decision import Action
from proxy.guards.loop.retry import RetryWithoutProgress


def test_the_threshold_th_attempt_after_identical_failures_fires_whatever_the_arguments() -> None:
    a = agent(RetryWithoutProgress(), threshold=3, action="block")
    assert a.call("deploy", {"v": 1}, error="HTTP 503") is None
    assert a.call("deploy", {"v": 2}, error="HTTP 503") is None
    fired = a.call("deploy", {"v": 3}, result=None)
    assert fired is not None and (fired.kind, fired.action, fired.actual) == (
        "retry_no_progress",
        Action.BLOCK,
        3,
    )
    assert fired.pattern == "deploy: HTTP 503" and fired.evidence == ("ev0", "ev1")


def test_a_success_or_another_error_resets_the_streak() -> None:
    a = agent(RetryWithoutProgress(), threshold=3)
    a.calls(2, "deploy", error="boom")
    assert a.call("deploy", result="fine") is not None  # the 3rd attempt, judged before it succeeded
    assert a.call("deploy", error="boom") is None  # the success reset it
    assert a.call("deploy", error="other") is None
    assert a.call("deploy", error="other") is None  # 2 x other, then a 3rd:
    assert a.call("deploy", result=None) is not None


def test_news_from_another_tool_since_the_last_failure_is_a_new_experiment() -> None:
    a = agent(RetryWithoutProgress(), threshold=2)
    for i in range(5):
        assert a.call("run_tests", error="ImportError: x") is None
        assert a.call("edit_file", {"patch": i}) is None


def test_a_failure_after_news_starts_the_count_again() -> None:
    a = agent(RetryWithoutProgress(), threshold=3)
    assert a.call("run_tests", error="ImportError: x") is None
    assert a.call("edit_file", {"patch": 1}) is None  # news
    assert a.call("run_tests", error="ImportError: x") is None
    assert a.call("run_tests", result=None) is None  # the 2nd failure since the news, not the 3rd


def test_forgetting_drops_the_failure_streaks() -> None:
    a = agent(RetryWithoutProgress(), threshold=3)
    a.calls(2, "deploy", error="boom")
    a.pattern.forget()
    assert a.call("deploy", result=None) is None
