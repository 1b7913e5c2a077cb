"""The turn's record alone (proxy/guards/loop/turn.py): staleness, news and streaks."""

from __future__ import annotations

import itertools

from proxy.guards.loop.turn import Turn
from proxy.guards.signatures import call_keys


def attempt_and_answer(
    t: Turn, tool: str, args: dict[str, object], result: str, error: str | None = None
) -> bool | None:
    sig, ident = call_keys(tool, args)
    a = t.attempt(tool, sig, ident, None)
    known = t.same_as(a.tool, result)
    t.resolve(a, known)
    t.apply(a, known, error)
    return a.stale


def test_a_call_is_stale_when_it_and_its_result_had_come_back_before_it_was_made() -> None:
    t = Turn(1, 0.0, itertools.count(1))
    assert t.pristine
    assert attempt_and_answer(t, "get", {"a": 1}, "r") is False  # new
    assert attempt_and_answer(t, "get", {"a": 1}, "r") is True  # the same call, the same result
    assert attempt_and_answer(t, "get", {"a": 1}, "s") is False  # something new came back
    assert not t.pristine and t.calls["get"] == 3 and t.no_progress["get"] == 1
    assert t.same[call_keys("get", {"a": 1})[1]].count == 1  # the streak restarted with "s"


def test_a_counter_that_goes_up_by_one_does_not_make_a_result_new() -> None:
    t = Turn(1, 0.0, itertools.count(1))
    assert t.same_as("poll", "h|1") == "h|1"
    assert t.same_as("poll", "h|2") == "h|1"  # attempt 2 after attempt 1
    assert t.same_as("poll", "h|9") == "h|9"  # a jump is news
    assert t.same_as("poll", "plain") == "plain"


def test_failures_of_a_tool_streak_whatever_the_arguments_until_news() -> None:
    t = Turn(1, 0.0, itertools.count(1))
    attempt_and_answer(t, "deploy", {"v": 1}, "e", error="HTTP 503")
    attempt_and_answer(t, "deploy", {"v": 2}, "e", error="HTTP 503")
    assert t.fails["deploy"].count == 2 and t.fails["deploy"].text == "HTTP 503"
    attempt_and_answer(t, "deploy", {"v": 3}, "ok")
    assert "deploy" not in t.fails


def test_a_refused_call_is_stale_and_no_longer_pending() -> None:
    t = Turn(1, 0.0, itertools.count(1))
    sig, ident = call_keys("t", {})
    a = t.attempt("t", sig, ident, None)
    t.pending[sig] = [a]
    t.refused(a)
    assert a.stale and sig not in t.pending and t.no_progress["t"] == 1


def test_periodic_counts_follow_the_tail() -> None:
    t = Turn(1, 0.0, itertools.count(1))
    for tool in ["a", "b", "a", "b", "a"]:
        t.attempt(tool, tool, tool, None)
    assert t.periodic[1] == 1 and t.periodic[2] == 5
