"""The turn's record alone (proxy/guards/loop/turn.py): staleness, news, counts, forgetting."""

from __future__ import annotations

from proxy.guards.loop.turn import MAX_TURN_KEYS, Turn
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
    t = Turn(1, 0.0)
    assert t.pristine
    assert attempt_and_answer(t, "get", {"a": 1}, "r") is False  # new
    assert attempt_and_answer(t, "get", {"a": 1}, "r") is True  # the same call, the same result
    assert attempt_and_answer(t, "get", {"a": 1}, "s") is False  # something new came back
    # the stale call counted, then the news started the tool's streak again (issue 31)
    assert not t.pristine and t.calls["get"] == 3 and t.no_progress["get"] == 0


def test_news_is_progress_that_did_not_fail_and_a_call_made_after_it_is_changed() -> None:
    t = Turn(1, 0.0)
    attempt_and_answer(t, "check", {}, "failed")
    attempt_and_answer(t, "edit", {}, "boom", error="boom")  # a failure is no news
    sig, ident = call_keys("check", {})
    assert not t.attempt("check", sig, ident, None).changed
    attempt_and_answer(t, "write", {"v": 1}, "ok")  # news
    again = t.attempt("check", sig, ident, None)
    assert again.seen and again.changed and not again.presumed_stale


def test_a_counter_that_goes_up_by_one_does_not_make_a_result_new() -> None:
    t = Turn(1, 0.0)
    assert t.same_as("poll", "h|1") == "h|1"
    assert t.same_as("poll", "h|2") == "h|1"  # attempt 2 after attempt 1
    assert t.same_as("poll", "h|9") == "h|9"  # a jump is news
    assert t.same_as("poll", "plain") == "plain"


def test_a_refused_call_is_stale_and_no_longer_pending() -> None:
    t = Turn(1, 0.0)
    sig, ident = call_keys("t", {})
    a = t.attempt("t", sig, ident, None)
    t.pending[sig] = [a]
    t.refused(a)
    assert a.stale and sig not in t.pending and t.no_progress["t"] == 1


def test_a_turn_too_large_forgets_what_came_back_and_calls_look_new() -> None:
    t = Turn(1, 0.0)
    for i in range(MAX_TURN_KEYS + 1):
        t.last_answer[f"i{i}"] = 0
    attempt_and_answer(t, "get", {}, "r")
    assert t.too_large
    t.forget()
    assert not t.too_large and attempt_and_answer(t, "get", {}, "r") is False
