"""The per-session facade the pipeline calls: before/after an LLM call and an MCP tool call."""

from __future__ import annotations

from proxy.guards.config import BudgetConfig, GuardConfig, LimitsConfig, LoopDetectionConfig
from proxy.guards.decision import Action
from proxy.guards.describe import describe
from proxy.guards.session import SessionGuards


def guards(**sections: object) -> SessionGuards:
    return SessionGuards(GuardConfig(**sections), started_at=0.0)


def test_a_quiet_call_is_allowed_with_a_reservation() -> None:
    g = guards()
    v = g.before_llm_call([], 0, {}, estimate_usd=0.01, now=1.0)
    assert v.decision.action is Action.ALLOW and not v.refused and v.decisions == []
    assert v.reservation is not None
    assert g.after_llm_call(v.reservation, cost_usd=0.002, tokens=30, now=2.0) == []
    assert g.stats()["budget"]["cost_usd"] == 0.002


def test_mcp_loop_block_refuses_without_reserving_and_lists_each_firing() -> None:
    g = guards(loop_detection=LoopDetectionConfig(threshold=3, action="block", no_progress_warn=2))
    for i in range(2):
        v = g.before_tool_call("write_file", {"p": "x"}, now=float(i))
        assert not v.refused
        g.after_tool_call(
            v.reservation, "write_file", {"p": "x"}, result_fingerprint="r", error=None, now=float(i)
        )
    v = g.before_tool_call("write_file", {"p": "x"}, now=3.0)
    assert v.refused and v.reservation is None
    assert {d.kind for d in v.decisions} == {"repetition", "no_progress"}
    assert v.decision.kind == "repetition" and v.decision.action is Action.BLOCK
    assert [d.kind for d in v.loop_findings] == ["repetition", "no_progress"]
    assert v.tags == ("loop_detected",)
    assert g.stats()["budget"]["tool_calls"] == 2  # the refused call was never forwarded


def test_budget_refusal_is_terminate_with_the_budget_tag() -> None:
    g = guards(budget=BudgetConfig(max_cost_usd=0.01))
    v = g.before_llm_call([], 0, {}, estimate_usd=0.001, now=1.0)
    g.after_llm_call(v.reservation, cost_usd=0.02, tokens=10, now=2.0)
    v = g.before_tool_call("read_file", {}, now=3.0)
    assert v.decision.action is Action.TERMINATE and v.decision.guard == "max_cost_usd"
    assert v.tags == ("budget_exceeded",)
    assert g.stats()["terminated_by"]["guard"] == "max_cost_usd"


def test_a_loop_block_still_reports_an_exhausted_budget() -> None:
    g = guards(
        loop_detection=LoopDetectionConfig(threshold=2, action="block"),
        limits=LimitsConfig(max_tool_calls=1),
    )
    v = g.before_tool_call("t", {}, now=0.0)
    g.after_tool_call(v.reservation, "t", {}, result_fingerprint="a", error=None, now=0.0)
    v = g.before_tool_call("t", {}, now=1.0)
    assert [d.guard for d in v.decisions if d.action >= Action.BLOCK] == ["loop_detection", "max_tool_calls"]
    assert v.decision.action is Action.TERMINATE


def test_function_calling_tools_in_history_count_toward_tool_limits_once() -> None:
    g = guards(limits=LimitsConfig(max_tool_calls=2))
    steps = [[("c1", "search", '{"q": 1}')], [("c2", "search", '{"q": 2}')]]
    results = {"c1": ("r1", None), "c2": ("r2", None)}
    assert not g.before_llm_call(steps[:1], 0, results, estimate_usd=0, now=1).refused
    assert not g.before_llm_call(steps, 0, results, estimate_usd=0, now=2).refused
    assert not g.before_llm_call(steps, 0, results, estimate_usd=0, now=3).refused  # same history again
    steps.append([("c3", "search", '{"q": 3}')])
    v = g.before_llm_call(steps, 0, {**results, "c3": ("r3", None)}, estimate_usd=0, now=4)
    assert (v.decision.guard, v.decision.actual) == ("max_tool_calls", 3)


def test_history_before_the_turn_counts_for_limits_only_once_the_proxy_has_joined() -> None:
    """A first request's old turns are not counted; a call that appears before the turn later
    (its result sent with the next user message) came after Tripwire joined: it counts."""
    for enabled in (True, False):
        g = guards(limits=LimitsConfig(max_tool_calls=1), loop_detection=LoopDetectionConfig(enabled=enabled))
        old = [[("c0", "write_file", {"p": 0})], [("c00", "write_file", {"p": 0})]]
        assert not g.before_llm_call(old, 2, {}, estimate_usd=0, now=1).refused
        assert g.budget.tool_calls == 0
        steps = [*old, [("c1", "write_file", {"p": 1})]]
        assert not g.before_llm_call(steps, 3, {"c1": ("x", None)}, estimate_usd=0, now=2).refused
        steps.append([("c2", "write_file", {"p": 2})])
        v = g.before_llm_call(steps, 3, {"c2": ("x", None)}, estimate_usd=0, now=3)
        assert (v.decision.guard, v.decision.actual) == ("max_tool_calls", 2)


def test_mcp_calls_seen_again_in_history_are_not_counted_twice_by_limits() -> None:
    g = guards(limits=LimitsConfig(max_tool_calls=1))
    v = g.before_tool_call("docs__search", {"q": 1}, now=0.0)
    g.after_tool_call(v.reservation, "docs__search", {"q": 1}, result_fingerprint="r", error=None, now=0.5)
    v = g.before_llm_call([[("c1", "search", '{"q": 1}')]], 0, {"c1": ("r", None)}, estimate_usd=0, now=1.0)
    assert not v.refused


def test_soft_alert_comes_after_the_call_once() -> None:
    g = guards(budget=BudgetConfig(max_cost_usd=1.0, soft_alert_threshold_usd=0.5))
    v = g.before_llm_call([], 0, {}, estimate_usd=0.1, now=1.0)
    (alert,) = g.after_llm_call(v.reservation, cost_usd=0.6, tokens=1, now=2.0)
    assert alert.action is Action.WARN and alert.tags == ("budget_warning",)
    v = g.before_llm_call([], 0, {}, estimate_usd=0.1, now=3.0)
    assert not v.refused and g.after_llm_call(v.reservation, cost_usd=0.1, tokens=1, now=4.0) == []


def test_observe_event_counts_events_and_feeds_the_cycle() -> None:
    g = guards(limits=LimitsConfig(max_events=7), loop_detection=LoopDetectionConfig(agentdbg_cycle=True))
    fired = [
        g.observe_event(t, n, f"e{i}") for i, (t, n) in enumerate([("LLM_CALL", "m"), ("TOOL_CALL", "t")] * 3)
    ]
    assert fired[-1] is not None and fired[-1].kind == "cycle"
    assert g.observe_event("STATE_UPDATE", "state", "e7") is None  # counted, not a cycle signature
    v = g.before_llm_call([], 0, {}, estimate_usd=0, now=1.0)
    assert (v.decision.guard, v.decision.actual) == ("max_events", 8)


def test_release_gives_the_reservation_back() -> None:
    g = guards(limits=LimitsConfig(max_llm_calls=1))
    v = g.before_llm_call([], 0, {}, estimate_usd=0, now=1.0)
    g.release(v.reservation)
    v = g.before_llm_call([], 0, {}, estimate_usd=0, now=2.0)
    assert not v.refused


def test_configure_applies_on_the_next_call_and_keeps_counts() -> None:
    g = guards()
    for i in range(3):
        v = g.before_tool_call("t", {"i": i}, now=float(i))
        g.after_tool_call(v.reservation, "t", {"i": i}, result_fingerprint="r", error=None, now=float(i))
    g.configure(GuardConfig(limits=LimitsConfig(max_tool_calls=3)))
    assert g.before_tool_call("t", {"i": 9}, now=5.0).decision.guard == "max_tool_calls"


def test_stats_carry_loop_guard_fields() -> None:
    g = guards()
    g.before_tool_call("read_file", {"p": 1}, now=0.0)
    s = g.stats(now=1.0)
    assert (
        s["turn"] == 1 and s["turn_tool_counts"] == {"read_file": 1} and s["tool_counts"] == {"read_file": 1}
    )
    assert s["config"]["loop_detection"]["threshold"] == 5 and s["decisions"] == {}


# -- describe ---------------------------------------------------------------------------------------


def _loop_block():
    g = guards(loop_detection=LoopDetectionConfig(threshold=2, action="block"))
    g.before_tool_call("t", {"a": 1}, now=0.0)
    return g.before_tool_call("t", {"a": 1}, now=0.0).decision


def test_describe_with_details_names_guard_threshold_and_actual() -> None:
    text = describe(_loop_block(), expose_details=True)
    assert text.startswith("[tripwire] blocked: ")
    assert "guard loop_detection" in text and "threshold 2" in text and "actual 2" in text


def test_describe_without_details_hides_numbers() -> None:
    text = describe(_loop_block(), expose_details=False)
    assert text.startswith("[tripwire] blocked: loop detected")
    assert "threshold" not in text and "actual" not in text and "2" not in text


def test_describe_terminate_and_warn() -> None:
    g = guards(budget=BudgetConfig(max_cost_usd=0.5))
    v = g.before_llm_call([], 0, {}, estimate_usd=0, now=0)
    g.after_llm_call(v.reservation, cost_usd=0.6, tokens=0, now=0)
    d = g.before_llm_call([], 0, {}, estimate_usd=0, now=1).decision
    assert describe(d, False) == (
        "[tripwire] blocked: the session's cost budget is spent. The session has been ended; do not retry it."
    )
    g2 = guards(loop_detection=LoopDetectionConfig(threshold=2))
    g2.before_tool_call("t", {}, now=0)
    warn = g2.before_tool_call("t", {}, now=0).decision
    assert describe(warn, False).startswith("[tripwire] warning: loop detected")


def test_describe_an_open_circuit_says_when_to_retry() -> None:
    from proxy.guards.breaker import CircuitBreaker
    from proxy.guards.config import CircuitBreakerConfig

    b = CircuitBreaker(CircuitBreakerConfig(open_after_failures=1), "files")
    _, t = b.before_call(0.0)
    b.on_failure(t, 0.0)
    d, _ = b.before_call(10.0)
    assert (
        describe(d, False)
        == "[tripwire] blocked: the upstream is failing and its circuit is open. Try again in 20s."
    )


def test_the_dialects_own_request_types_are_accepted() -> None:
    from proxy.dialects.base import ToolCall, ToolResult

    g = guards(loop_detection=LoopDetectionConfig(threshold=3, action="block"))
    steps: list[list[ToolCall]] = []
    results: list[ToolResult] = []
    verdict = None
    for i in range(3):
        steps.append([ToolCall(f"c{i}", "deploy", {"env": f"prod-{i}"})])
        results.append(ToolResult(f"c{i}", [{"type": "text", "text": "HTTP 503"}], is_error=True))
        verdict = g.before_llm_call(steps, 0, results, estimate_usd=0, now=float(i))
    # the third attempt after two identical failures is the one answered
    assert verdict is not None and verdict.decision.kind == "retry_no_progress"
    assert verdict.decision.pattern == "deploy: HTTP 503" and verdict.refused
