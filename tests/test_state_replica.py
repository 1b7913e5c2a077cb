"""A replica fed from a run's guard log decides exactly as the session guards fed directly.

This is what lets replicas share one run's guards: the same inputs in the same order give the same
decisions, so every replica agrees on every call (proxy/guard_log/replica.py).
"""

from __future__ import annotations

from typing import Any

from proxy.guard_log import entries
from proxy.guard_log.replica import SessionReplica
from proxy.guards.config import GuardConfig
from proxy.guards.decision import Action
from proxy.guards.session import SessionGuards
from proxy.state.base import LogEntry


class Log:
    """A guard log in a list, with a clock the test moves."""

    def __init__(self, config: GuardConfig, by_rev: dict[int, GuardConfig] | None = None) -> None:
        self.items: list[LogEntry] = []
        self.t = 5000.0
        self.rev = 0
        self.configs = {0: config, **(by_rev or {})}

    def add(self, body: bytes) -> LogEntry:
        entry = LogEntry(len(self.items) + 1, self.t, self.rev, body)
        self.items.append(entry)
        return entry

    def replica(self) -> SessionReplica:
        return SessionReplica(lambda rev: self.configs[rev])


def cid_of(entry: LogEntry) -> str:
    return str(entries.decode(entry.body).check)


def listed(decisions: list[Any]) -> list[tuple[str, str | None, str]]:
    return [(d.guard, d.kind, d.action.name) for d in decisions if d.action > Action.ALLOW]


def test_a_repeated_mcp_call_is_caught_at_the_same_call() -> None:
    config = GuardConfig.model_validate({"loop_detection": {"threshold": 4, "action": "block"}})
    direct = SessionGuards(config, started_at=0.0)
    direct.budget.count_event()
    log = Log(config)
    replica = log.replica()
    seen_direct, seen_replica = [], []
    for i in range(8):
        now = i * 1.5
        log.t = 5000.0 + now
        verdict = direct.before_tool_call("search", {"q": "same"}, now=now, server="docs")
        check = log.add(entries.tool_check(entries.check_id(), "search", {"q": "same"}, "docs", 0.0))
        applied = replica.apply(check)
        assert applied is not None and applied.verdict is not None
        seen_direct.append(listed(verdict.decisions))
        seen_replica.append(listed(applied.verdict.decisions))
        assert applied.verdict.call_seq == verdict.call_seq == i + 1
        if verdict.refused:
            direct.release(verdict.reservation)
            continue
        direct.after_tool_call(
            verdict.reservation, "search", {"q": "same"}, result_fingerprint="r", error=None, now=now
        )
        replica.apply(log.add(entries.settle_tool(cid_of(check), "r", None)))
    assert seen_replica == seen_direct
    assert any(seen_direct), "the loop must fire within 8 calls"


def test_function_calling_history_loops_match() -> None:
    config = GuardConfig()
    direct = SessionGuards(config, started_at=0.0)
    direct.budget.count_event()
    log = Log(config)
    replica = log.replica()
    steps: list[list[tuple[str, str, Any]]] = []
    results: dict[str, tuple[str, str | None]] = {}
    got_direct, got_replica = [], []
    for i in range(10):
        verdict = direct.before_llm_call(steps, 0, results, estimate_usd=0.01, now=float(i))
        log.t = 5000.0 + i
        check = log.add(entries.llm_check(entries.check_id(), steps, 0, results, 0.01, 100))
        applied = replica.apply(check)
        assert applied is not None and applied.verdict is not None
        got_direct.append(listed(verdict.decisions))
        got_replica.append(listed(applied.verdict.decisions))
        if direct.terminated_by is not None:
            break  # the session ends here (later calls are refused before the guards)
        if not verdict.refused:
            direct.after_llm_call(verdict.reservation, cost_usd=0.001, tokens=10, now=float(i))
            replica.apply(log.add(entries.settle_llm(cid_of(check), 0.001, 10)))
        # the model asks for the same tool again, with the same result
        call_id = f"call_{i}"
        steps = [*steps, [(call_id, "read_file", {"path": "a.txt"})]]
        results = {**results, call_id: ("same-result", None)}
    assert got_replica == got_direct
    assert any(got_direct)


def test_budget_trips_at_the_same_call() -> None:
    config = GuardConfig.model_validate({"budget": {"max_cost_usd": 0.05}})
    direct = SessionGuards(config, started_at=0.0)
    direct.budget.count_event()
    log = Log(config)
    replica = log.replica()
    first_direct = first_replica = None
    for i in range(1, 30):
        verdict = direct.before_llm_call([], 0, {}, estimate_usd=0.002, now=0.0)
        applied = replica.apply(check := log.add(entries.llm_check(entries.check_id(), [], 0, {}, 0.002, 0)))
        assert applied is not None and applied.verdict is not None
        if verdict.refused and first_direct is None:
            first_direct = i
        if applied.verdict.refused and first_replica is None:
            first_replica = i
        if verdict.refused:
            break
        direct.after_llm_call(verdict.reservation, cost_usd=0.007, tokens=100, now=0.0)
        replica.apply(log.add(entries.settle_llm(cid_of(check), 0.007, 100)))
    assert first_direct is not None and first_replica == first_direct == 9


def test_concurrent_checks_never_exceed_a_call_limit() -> None:
    config = GuardConfig.model_validate({"limits": {"max_llm_calls": 20}})
    log = Log(config)
    checks = [log.add(entries.llm_check(entries.check_id(), [], 0, {}, 0.0, 0)) for _ in range(50)]
    # three replicas apply the same log (each at its own pace): the same 20 are admitted by all
    admitted = []
    for _ in range(3):
        replica = log.replica()
        outcomes = [replica.apply(c) for c in checks]
        admitted.append([o.seq for o in outcomes if o is not None and o.verdict and not o.verdict.refused])
    assert admitted[0] == admitted[1] == admitted[2] == list(range(1, 21))


def test_an_ended_session_refuses_later_checks_unjudged() -> None:
    config = GuardConfig.model_validate({"limits": {"max_llm_calls": 1}})
    log = Log(config)
    replica = log.replica()
    one = replica.apply(log.add(entries.llm_check(entries.check_id(), [], 0, {}, 0.0, 0)))
    two = replica.apply(log.add(entries.llm_check(entries.check_id(), [], 0, {}, 0.0, 0)))
    assert one is not None and one.verdict is not None and not one.verdict.refused
    assert two is not None and two.verdict is not None and two.verdict.decision.action is Action.TERMINATE
    three = replica.apply(log.add(entries.llm_check(entries.check_id(), [], 0, {}, 0.0, 0)))
    assert three is not None and three.verdict is None and three.ended_by is not None
    assert three.ended_by.guard == "max_llm_calls"
    assert replica.guards is not None and replica.guards.calls_seen == 2


def test_the_kill_switch_ends_the_session() -> None:
    log = Log(GuardConfig())
    replica = log.replica()
    replica.apply(log.add(entries.llm_check(entries.check_id(), [], 0, {}, 0.0, 0)))
    replica.apply(log.add(entries.kill("terminated")))
    after = replica.apply(log.add(entries.llm_check(entries.check_id(), [], 0, {}, 0.0, 0)))
    assert after is not None and after.ended_by is not None and after.ended_by.guard == "kill_switch"


def test_each_entry_is_judged_under_its_config_revision() -> None:
    strict = GuardConfig.model_validate({"limits": {"max_llm_calls": 2}})
    log = Log(GuardConfig(), {1: strict})
    replica = log.replica()
    for _ in range(3):
        applied = replica.apply(c := log.add(entries.llm_check(entries.check_id(), [], 0, {}, 0.0, 0)))
        replica.apply(log.add(entries.settle_llm(cid_of(c), 0.0, 0)))
        assert applied is not None and applied.verdict is not None and not applied.verdict.refused
    log.rev = 1  # a PUT on some replica: the next entries carry the new revision
    applied = replica.apply(log.add(entries.llm_check(entries.check_id(), [], 0, {}, 0.0, 0)))
    assert applied is not None and applied.verdict is not None and applied.verdict.refused


def test_entries_apply_once_and_in_order() -> None:
    log = Log(GuardConfig())
    replica = log.replica()
    first = log.add(entries.llm_check(entries.check_id(), [], 0, {}, 0.0, 0))
    second = log.add(entries.llm_check(entries.check_id(), [], 0, {}, 0.0, 0))
    assert replica.apply(first) is not None
    assert replica.apply(first) is None  # seen already: skipped
    third = log.add(entries.llm_check(entries.check_id(), [], 0, {}, 0.0, 0))
    try:
        replica.apply(third)
    except ValueError as e:
        assert "gap" in str(e)
    else:
        raise AssertionError("a gap in the log must not be applied")
    assert replica.apply(second) is not None and replica.apply(third) is not None
