"""Budgets and limits: N allowed, N+1 refused, reservations under concurrency (SPEC §5.2)."""

from __future__ import annotations

import pytest

from proxy.guards.budget import SessionBudget
from proxy.guards.config import BudgetConfig, LimitsConfig
from proxy.guards.decision import Action


def _budget(
    budget: BudgetConfig | None = None, limits: LimitsConfig | None = None, max_steps: int | None = None
):
    return SessionBudget(budget or BudgetConfig(), limits or LimitsConfig(), max_steps, started_at=1000.0)


def _call(b: SessionBudget, kind: str = "llm", cost: float = 0.0, tokens: int = 0, now: float = 1000.0):
    d, res = b.check(kind, cost, now, estimate_tokens=tokens)
    if res is not None:
        b.settle(res, cost, tokens, now)
    return d


@pytest.mark.parametrize(("field", "kind"), [("max_llm_calls", "llm"), ("max_tool_calls", "tool")])
def test_count_limits_allow_n_and_refuse_n_plus_1(field: str, kind: str) -> None:
    b = _budget(limits=LimitsConfig(**{field: 3}))
    assert [_call(b, kind).action for _ in range(3)] == [Action.ALLOW] * 3
    d = _call(b, kind)
    assert d.action is Action.TERMINATE and d.guard == field
    assert (d.threshold, d.actual) == (3, 4)
    assert "budget_exceeded" not in d.tags  # a limit, not a budget
    other = "tool" if kind == "llm" else "llm"
    assert _call(b, other).action is Action.ALLOW  # the other kind has its own count


def test_limits_count_forwarded_calls_only() -> None:
    b = _budget(limits=LimitsConfig(max_llm_calls=1))
    d, res = b.check("llm", 0.0, 1000.0)
    b.release(res)  # refused downstream / never reached the upstream
    assert _call(b).action is Action.ALLOW
    assert _call(b).action is Action.TERMINATE


def test_max_steps_is_a_hard_cap_on_tool_calls() -> None:
    b = _budget(max_steps=2)
    assert _call(b, "tool").action is Action.ALLOW
    assert _call(b, "tool").action is Action.ALLOW
    assert _call(b, "llm").action is Action.ALLOW
    d = _call(b, "tool")
    assert (d.action, d.guard, d.threshold, d.actual) == (Action.TERMINATE, "max_steps", 2, 3)


def test_history_tool_calls_refuse_the_llm_request_that_holds_the_n_plus_1th() -> None:
    b = _budget(limits=LimitsConfig(max_tool_calls=2))
    b.count_history_tool_calls(2)
    assert _call(b, "llm").action is Action.ALLOW
    b.count_history_tool_calls(1)
    d = _call(b, "llm")
    assert (d.guard, d.actual) == ("max_tool_calls", 3)


def test_max_events_refuses_the_call_whose_event_would_be_n_plus_1() -> None:
    b = _budget(limits=LimitsConfig(max_events=3))
    b.count_event()  # RUN_START
    for _ in range(2):
        d, res = b.check("llm", 0.0, 1000.0)
        assert d.action is Action.ALLOW
        b.settle(res, 0.0, 0, 1000.0)
        b.count_event()  # its LLM_CALL
    d, _ = b.check("tool", 0.0, 1000.0)
    assert (d.action, d.guard, d.actual) == (Action.TERMINATE, "max_events", 4)


def test_max_duration_fires_when_elapsed_reaches_the_limit() -> None:
    b = _budget(limits=LimitsConfig(max_duration_s=10))
    assert _call(b, now=1009.999).action is Action.ALLOW
    d = _call(b, now=1010.0)
    assert (d.action, d.guard, d.threshold, d.actual) == (Action.TERMINATE, "max_duration_s", 10, 10.0)


def test_wall_time_budget_fires_when_exceeded() -> None:
    b = _budget(BudgetConfig(max_wall_time_seconds=10))
    assert _call(b, now=1010.0).action is Action.ALLOW
    d = _call(b, "tool", now=1010.5)
    assert (d.guard, d.tags) == ("max_wall_time_seconds", ("budget_exceeded",))


def test_cost_stops_at_the_first_call_after_spend_reaches_the_limit() -> None:
    b = _budget(BudgetConfig(max_cost_usd=1.0))
    assert _call(b, cost=0.6).action is Action.ALLOW
    assert _call(b, cost=0.39).action is Action.ALLOW  # 0.99 spent: still below
    assert _call(b, cost=0.05).action is Action.ALLOW  # 1.04 now: one call past, as LangSight
    d = _call(b, cost=0.01)
    assert (d.action, d.guard) == (Action.TERMINATE, "max_cost_usd")
    assert d.threshold == 1.0 and d.actual == pytest.approx(1.04)
    assert d.tags == ("budget_exceeded",)


def test_spend_exactly_at_the_limit_refuses() -> None:
    b = _budget(BudgetConfig(max_cost_usd=0.5))
    assert _call(b, cost=0.5).action is Action.ALLOW
    assert _call(b, "tool").action is Action.TERMINATE


def test_max_tokens_counts_total_tokens() -> None:
    b = _budget(BudgetConfig(max_tokens=100))
    assert _call(b, tokens=99).action is Action.ALLOW
    assert _call(b, tokens=1).action is Action.ALLOW
    d = _call(b)
    assert (d.guard, d.threshold, d.actual) == ("max_tokens", 100, 100)


def test_concurrent_calls_cannot_all_slip_past_the_cost_limit() -> None:
    b = _budget(BudgetConfig(max_cost_usd=1.0))
    # ten calls arrive together, each reserving $0.40: only while the others' reservations stay below
    # the limit is one admitted
    results = [b.check("llm", 0.40, 1000.0) for _ in range(10)]
    admitted = [r for d, r in results if d.action is Action.ALLOW]
    assert len(admitted) == 3
    assert all(d.guard == "max_cost_usd" for d, r in results if r is None)
    # answers settle the real (smaller) cost, which frees room for new calls
    for r in admitted:
        b.settle(r, 0.10, 0, 1001.0)
    assert b.check("llm", 0.40, 1001.0)[0].action is Action.ALLOW


def test_concurrent_calls_cannot_all_slip_past_a_count_limit() -> None:
    b = _budget(limits=LimitsConfig(max_tool_calls=2))
    results = [b.check("tool", 0.0, 1000.0) for _ in range(5)]
    assert [d.action for d, _ in results] == [Action.ALLOW] * 2 + [Action.TERMINATE] * 3


def test_soft_alert_fires_once() -> None:
    b = _budget(BudgetConfig(max_cost_usd=1.0, soft_alert_threshold_usd=0.5))
    d, r = b.check("llm", 0.1, 1000.0)
    assert b.settle(r, 0.49, 0, 1000.0) == []
    d, r = b.check("llm", 0.1, 1000.0)
    (alert,) = b.settle(r, 0.01, 0, 1000.0)
    assert (alert.action, alert.guard, alert.tags) == (
        Action.WARN,
        "soft_alert_threshold_usd",
        ("budget_warning",),
    )
    assert alert.threshold == 0.5 and alert.actual == pytest.approx(0.5)
    d, r = b.check("llm", 0.1, 1000.0)
    assert b.settle(r, 0.2, 0, 1000.0) == []


def test_no_config_means_no_limit() -> None:
    b = _budget()
    for _ in range(100):
        assert _call(b, cost=10.0, tokens=10**6).action is Action.ALLOW


def test_stats_report_settled_and_in_flight() -> None:
    b = _budget()
    _call(b, cost=0.25, tokens=40)
    b.check("tool", 0.0, 1000.0)
    s = b.stats(now=1002.0)
    assert s["cost_usd"] == 0.25 and s["tokens"] == 40 and s["llm_calls"] == 1
    assert s["in_flight"]["tool"] == 1 and s["elapsed_s"] == 2.0


def test_budget_messages_show_enough_digits_to_tell_small_amounts_apart() -> None:
    b = _budget(BudgetConfig(max_cost_usd=0.00002, soft_alert_threshold_usd=0.00001))
    d, res = b.check("llm", 0.0, 1000.0)
    (soft,) = b.settle(res, 0.0000123, 10, 1000.0)
    assert soft.message == "session cost $0.0000123 reached the $0.0000100 soft alert"
    b.settle(b.check("llm", 0.0, 1000.0)[1], 0.0000123, 10, 1000.0)
    refused = _call(b)
    assert refused.message == "session cost $0.0000250 reached the $0.0000200 budget"
    big = _budget(BudgetConfig(max_cost_usd=2.5))
    big.settle(big.check("llm", 0.0, 1000.0)[1], 3.0, 10, 1000.0)
    assert _call(big).message == "session cost $3.0000 reached the $2.5000 budget"


def test_a_budget_without_limits_refuses_nothing_until_one_is_configured() -> None:
    from proxy.guards.budget import SessionBudget
    from proxy.guards.config import BudgetConfig, LimitsConfig

    budget = SessionBudget(BudgetConfig(), LimitsConfig(), None, started_at=0.0)
    assert budget.refusal("llm", now=10_000.0) is None
    budget.count_event(100)
    budget.configure(BudgetConfig(), LimitsConfig(max_events=50), None)
    refusal = budget.refusal("llm", now=10_000.0)
    assert refusal is not None and refusal.guard == "max_events"
    budget.configure(BudgetConfig(), LimitsConfig(), None)
    assert budget.refusal("llm", now=10_000.0) is None
    budget.configure(BudgetConfig(), LimitsConfig(), 1)  # max_steps alone
    budget.count_history_tool_calls(2)
    refusal = budget.refusal("llm", now=10_000.0)
    assert refusal is not None and refusal.guard == "max_steps"
