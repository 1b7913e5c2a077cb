"""The pure sliding windows of rate limits (proxy/guards/rate_limit.py), on an injected clock."""

from __future__ import annotations

import pytest

from proxy.constants import GUARD_RATE_LIMITED
from proxy.guards.config import GuardConfig, RateLimitConfig
from proxy.guards.decision import Action, retry_after_seconds
from proxy.guards.rate_limit import SlidingWindows, refusal_decision, rules_for, slots_for


def limits(*rules: dict[str, object]) -> tuple[RateLimitConfig, ...]:
    return GuardConfig.model_validate({"rate_limits": list(rules)}).rate_limits


def test_exactly_max_calls_in_any_window_and_the_refusal_says_when() -> None:
    rules = rules_for(limits({"match": "llm", "max_calls": 3, "per_s": 10}), None)
    w = SlidingWindows()
    for t in (0.0, 1.0, 2.0):
        assert w.admit("a", rules, t) is None
    refusal = w.admit("a", rules, 5.0)
    assert refusal is not None and refusal.count == 3
    assert refusal.retry_after == pytest.approx(5.0)  # the call at 0 leaves at 10
    assert w.admit("a", rules, 9.999) is not None
    assert w.admit("a", rules, 10.0) is None  # exactly per_s later: the oldest no longer counts
    assert w.admit("a", rules, 10.5) is not None  # 1, 2, 10 are in (0.5, 10.5]
    assert w.admit("a", rules, 11.0) is None


def test_a_refused_call_takes_no_slot() -> None:
    rules = rules_for(limits({"match": "llm", "max_calls": 1, "per_s": 1}), None)
    w = SlidingWindows()
    assert w.admit("a", rules, 0.0) is None
    for t in (0.2, 0.4, 0.6, 0.8):
        assert w.admit("a", rules, t) is not None
    assert w.admit("a", rules, 1.0) is None  # refusals never moved the window


def test_all_or_nothing_over_several_rules_and_the_longest_wait_wins() -> None:
    config = limits(
        {"match": "tools", "max_calls": 5, "per_s": 100},
        {"match": "files__*", "max_calls": 1, "per_s": 10},
    )
    w = SlidingWindows()
    files = rules_for(config, "files__read")
    other = rules_for(config, "shop__buy")
    assert [r.match for r in files] == ["tools", "files__*"] and [r.match for r in other] == ["tools"]
    assert w.admit("a", files, 0.0) is None
    refusal = w.admit("a", files, 1.0)
    assert (
        refusal is not None and refusal.rule.match == "files__*" and refusal.retry_after == pytest.approx(9)
    )
    tools_rule = other[0]
    assert w.count("a", tools_rule, 1.0) == 1  # the refused call took no `tools` slot either
    for t in (2.0, 3.0, 4.0, 5.0):
        assert w.admit("a", other, t) is None
    refusal = w.admit("a", files, 11.0)  # files__* has room again, tools has not until 100
    assert refusal is not None and refusal.rule.match == "tools" and refusal.retry_after == pytest.approx(89)


def test_windows_are_per_agent_and_llm_never_counts_a_tool() -> None:
    config = limits(
        {"match": "llm", "max_calls": 1, "per_s": 60}, {"match": "*", "max_calls": 1, "per_s": 60}
    )
    w = SlidingWindows()
    llm = rules_for(config, None)
    assert [r.match for r in llm] == ["llm"]
    assert [r.match for r in rules_for(config, "s__t")] == ["*"]
    assert w.admit("a", llm, 0.0) is None
    assert w.admit("b", llm, 0.0) is None
    assert w.admit("a", llm, 1.0) is not None
    assert w.admit("a", rules_for(config, "s__t"), 1.0) is None


def test_a_lower_max_calls_keeps_the_calls_counted() -> None:
    w = SlidingWindows()
    assert all(
        w.admit("a", rules_for(limits({"match": "llm", "max_calls": 5, "per_s": 10}), None), t) is None
        for t in (0.0, 1.0, 2.0)
    )
    lower = rules_for(limits({"match": "llm", "max_calls": 2, "per_s": 10}), None)
    refusal = w.admit("a", lower, 3.0)
    assert refusal is not None and refusal.count == 3
    assert refusal.retry_after == pytest.approx(8.0)  # two must leave: the one at 1 leaves at 11


def test_sweep_forgets_idle_windows() -> None:
    w = SlidingWindows()
    rules = rules_for(limits({"match": "llm", "max_calls": 2, "per_s": 5}), None)
    w.admit("a", rules, 0.0)
    w.sweep(4.0)
    assert len(w) == 1
    w.sweep(5.0)
    assert len(w) == 0


def test_the_decision_is_a_retryable_block() -> None:
    rules = rules_for(limits({"match": "llm", "max_calls": 1, "per_s": 60}), None)
    w = SlidingWindows()
    w.admit("a", rules, 0.0)
    refusal = w.admit("a", rules, 0.5)
    assert refusal is not None
    d = refusal_decision(refusal)
    assert d.action is Action.BLOCK and d.guard == GUARD_RATE_LIMITED
    assert d.retry_after is not None and retry_after_seconds(d.retry_after) == 60  # 59.5 rounded up
    assert d.threshold == "1 per 60s" and d.actual == 1


def test_a_call_needing_several_slots_takes_all_or_none() -> None:
    config = limits(
        {"match": "search", "max_calls": 3, "per_s": 10}, {"match": "llm", "max_calls": 100, "per_s": 10}
    )
    slots = slots_for(config, ("search", "search", "other"))
    by_match = {rule.match: n for rule, n in slots.items()}
    assert by_match == {"llm": 1, "search": 2}
    rules, needs = tuple(slots), tuple(slots.values())
    w = SlidingWindows()
    assert w.admit("a", rules, 0.0, needs) is None
    refusal = w.admit("a", rules, 1.0, needs)  # 2 held + 2 needed > 3: the first must leave
    assert refusal is not None and refusal.rule.match == "search" and refusal.retry_after == pytest.approx(9)
    llm = next(r for r in rules if r.match == "llm")
    assert w.count("a", llm, 1.0) == 1  # the refusal took nothing, not even its llm slot
    assert w.admit("a", rules, 10.0, needs) is None


def test_more_slots_than_a_rule_allows_wait_for_an_empty_window() -> None:
    rules = rules_for(limits({"match": "tools", "max_calls": 2, "per_s": 10}), "s__t")
    w = SlidingWindows()
    assert w.admit("a", rules, 0.0, (1,)) is None
    refusal = w.admit("a", rules, 1.0, (5,))  # capped at 2: the one call held must leave
    assert refusal is not None and refusal.retry_after == pytest.approx(9)
    assert w.admit("a", rules, 10.0, (5,)) is None
    assert w.count("a", rules[0], 10.0) == 2
