"""Loop patterns at their edges (SPEC §5.1): progress, not counts; T-1 allowed, T fires, the streak keeps it.

The corpus (`test_loop_corpus.py`) says which sessions are stuck and which are honest; these tests
pin each pattern's exact edge, one at a time, with the others out of the way.
"""

from __future__ import annotations

from typing import Any

import pytest

from proxy.guards.config import LoopDetectionConfig
from proxy.guards.decision import Action, Decision, strictest
from proxy.guards.loop.detector import LoopDetector
from proxy.guards.loop.per_tool import classify_tool

# per-tool escalation and the no-progress poll out of the way, for the tests of the other patterns
QUIET: dict[str, Any] = {
    "idempotent": (100, 100, 100),
    "mutating": (100, 100, 100),
    "no_progress_warn": 100,
    "no_progress_halt": 100,
}
A = Action


def det(**kw: Any) -> LoopDetector:
    return LoopDetector(LoopDetectionConfig(**kw))


def kinds(decisions: list[Decision]) -> dict[str, Decision]:
    return {d.kind or d.guard: d for d in decisions}


def mcp(
    d: LoopDetector,
    tool: str,
    args: Any,
    now: float = 0.0,
    result: str | None = "ok",
    error: str | None = None,
) -> dict[str, Decision]:
    """One MCP call: checked before forwarding, then its result recorded unless it was refused."""
    out = d.check_tool_call(tool, args, now)
    if strictest(out).action < Action.BLOCK and result is not None:
        d.record_tool_result(tool, args, result, error, now)
    return kinds(out)


# -- repetition ---------------------------------------------------------------------------------


def test_repetition_fires_on_the_threshold_th_call_without_progress_and_the_streak_keeps_it() -> None:
    d = det(**QUIET)
    for _ in range(4):
        assert mcp(d, "read_file", {"path": "a"}, result="same") == {}
    fired = mcp(d, "read_file", {"path": "a"}, result="same")["repetition"]
    assert (fired.action, fired.new_finding, fired.threshold, fired.actual) == (Action.WARN, True, 5, 5)
    assert fired.guard == "loop_detection" and fired.tags == ("loop_detected",)
    assert fired.pattern.startswith('read_file({"path":"a"}') and len(fired.pattern) <= 80
    again = mcp(d, "read_file", {"path": "a"}, result="same")["repetition"]
    assert (again.action, again.new_finding, again.repetitions) == (Action.WARN, False, 6)
    # something new comes back: the streak is over, and the same call starts counting again
    assert mcp(d, "read_file", {"path": "a"}, result="changed")["repetition"].new_finding is False
    assert mcp(d, "read_file", {"path": "a"}, result="changed") == {}


def test_the_same_call_whose_result_changes_is_progress_however_often() -> None:
    d = det(**QUIET)
    for i in range(40):  # a poll of a status that does change
        assert mcp(d, "get_job_status", {"job": "j1"}, result=f"running {i}%") == {}


@pytest.mark.parametrize(("action", "expected"), [("block", Action.BLOCK), ("terminate", Action.TERMINATE)])
def test_repetition_applies_the_configured_action(action: str, expected: Action) -> None:
    d = det(threshold=3, action=action, **QUIET)
    assert mcp(d, "t", {}) == {} and mcp(d, "t", {}) == {}
    first = mcp(d, "t", {})["repetition"]
    assert first.action is expected and first.new_finding
    if expected is Action.TERMINATE:
        assert "terminated" in first.tags
    # a refused call learned nothing: the streak goes on and the next attempt gets the same answer
    second = mcp(d, "t", {})["repetition"]
    assert second.action is expected and not second.new_finding


@pytest.mark.parametrize(
    "noise",
    [
        lambda i: {"request_id": f"{i:08x}-1111-4222-8333-444455556666"},
        lambda i: {"nonce": f"{i:032x}" if i % 2 else f"a{i:031x}"},
        lambda i: {"timestamp": f"2026-11-26T06:{i:02d}:00Z"},
        lambda i: {"ts": 1764137432 + i},
        lambda i: {"attempt": i},
        lambda i: {"note": f"sent at 2026-11-26 06:{i:02d}:11.{i}"},
    ],
)
def test_per_call_noise_in_arguments_does_not_make_a_call_new(noise: Any) -> None:
    d = det(**QUIET)
    got = [mcp(d, "search", {"query": "tripwire", **noise(i)}, result="3 hits") for i in range(5)]
    assert got[:4] == [{}] * 4 and got[4]["repetition"].actual == 5


def test_per_call_noise_in_results_does_not_make_a_result_new() -> None:
    from proxy.guards.signatures import result_fingerprint

    results = [
        {"status": "pending", "checked_at": f"2026-11-26T06:00:{i:02d}Z", "request_id": f"req-{i}"}
        for i in range(5)
    ]
    fps = {result_fingerprint(r) for r in results}
    fps |= {result_fingerprint(f"FAILED test_x - AssertionError\n1 failed in 0.{i}1s") for i in range(3)}
    assert len(fps) == 2
    # what is kept is kept: a date alone, a page number, an id naming a thing
    assert result_fingerprint({"date": "2026-11-26"}) != result_fingerprint({"date": "2026-11-27"})
    assert result_fingerprint({"id": 41}) != result_fingerprint({"id": 42})


def test_float_micro_variations_and_case_are_the_same_call() -> None:
    d = det(threshold=4, **QUIET)
    for value in (1.0, 0.9999999, 1.0000001):
        assert mcp(d, "set_price", {"price": value, "sku": 7}) == {}
    assert "repetition" in mcp(d, "set_price", '{"sku": 7, "price": 1.0000004}')
    d = det(threshold=3, **QUIET)
    for q in ("Weather in Paris?", "weather in  paris"):
        assert mcp(d, "search", {"q": q}, result="18C") == {}
    assert "repetition" in mcp(d, "search", {"q": "WEATHER IN PARIS"}, result="18C")


def test_paging_and_crawling_are_never_loops_under_defaults() -> None:
    d = det()
    for page in range(1, 41):
        assert mcp(d, "list_items", {"page": page}, result=f"items {page * 10}..{page * 10 + 9}") == {}
    for i in range(40):
        assert mcp(d, "fetch_url", {"url": f"https://example.org/docs/{i}"}, result=f"page {i}") == {}
    for i in range(30):  # a link checker: distinct calls, the same answer, all honest
        assert mcp(d, "check_url", {"url": f"https://example.org/{i}"}, result="200 OK") == {}


# -- ping-pong and longer cycles ----------------------------------------------------------------


@pytest.mark.parametrize(("period", "fires_at"), [(2, 5), (3, 6), (4, 8), (5, 10)])
def test_cycles_fire_within_max_threshold_and_two_rounds(period: int, fires_at: int) -> None:
    d = det(threshold=5, action="block", **QUIET)
    block = [(f"tool{i}", {"i": i}) for i in range(period)]
    got = [mcp(d, t, a, result=f"r{t}") for t, a in (block * 4)[: fires_at + 1]]
    assert all(g == {} for g in got[: fires_at - 1])
    fired = got[fires_at - 1]["ping_pong"]
    assert (fired.action, fired.actual, fired.threshold) == (Action.BLOCK, fires_at, max(5, 2 * period))
    assert fired.pattern.startswith('tool0({"i":0}) -> tool1(')
    assert got[fires_at]["ping_pong"].action is Action.BLOCK and not got[fires_at]["ping_pong"].new_finding


def test_a_cycle_with_a_repeated_member_is_caught_after_two_rounds() -> None:
    # the agent alternates two edits and runs the same failing test after each
    d = det(action="block", **QUIET)
    rounds = [
        ("edit_file", {"patch": "A"}),
        ("run_tests", {}),
        ("edit_file", {"patch": "B"}),
        ("run_tests", {}),
    ]
    got = [mcp(d, t, a, result="1 failed" if t == "run_tests" else "ok") for t, a in rounds * 3]
    assert all(g == {} for g in got[:7]) and got[7]["ping_pong"].action is Action.BLOCK


def test_a_cycle_whose_rounds_learn_something_new_is_not_a_loop() -> None:
    d = det(**QUIET)
    for i in range(10):  # search, open, summarize: the same calls, but new results every round
        for tool in ("search", "open_page", "summarize"):
            assert mcp(d, tool, {"q": "x"}, result=f"{tool} {i}") == {}


def test_a_three_tool_cycle_with_a_fresh_request_id_is_caught_at_call_6() -> None:
    d = det(action="block", **QUIET)
    calls = [("search", {"q": "x"}), ("open_page", {"url": "u"}), ("summarize", {"n": 1})] * 3
    got = []
    for i, (tool, args) in enumerate(calls):
        got.append(mcp(d, tool, {**args, "request_id": f"{i:08x}-0000-4000-8000-000000000000"}, result=tool))
        if got[-1]:
            break
    assert len(got) == 6 and got[5]["ping_pong"].action is Action.BLOCK


# -- retry without progress ---------------------------------------------------------------------


def test_retry_without_progress_fires_on_the_threshold_th_attempt_after_identical_failures() -> None:
    d = det(threshold=3, action="block", **QUIET)
    for _ in range(2):
        assert mcp(d, "deploy", {"env": "prod"}, error="HTTP 503 at 06:00:01") == {}
    third = kinds(d.check_tool_call("deploy", {"env": "prod"}, 0.0))
    assert (third["retry_no_progress"].action, third["retry_no_progress"].new_finding) == (Action.BLOCK, True)
    assert third["retry_no_progress"].actual == 3
    # the blocked call never ran: the next attempt stays blocked, same streak
    fourth = mcp(d, "deploy", {"env": "prod"})
    assert fourth["retry_no_progress"].action is Action.BLOCK and not fourth["retry_no_progress"].new_finding
    assert mcp(d, "status", {}) == {}  # another call is not held back


def test_retry_streak_resets_on_success_or_a_different_error() -> None:
    d = det(threshold=3, **QUIET)
    mcp(d, "deploy", {"n": 1}, error="boom")
    mcp(d, "deploy", {"n": 1}, error="other")
    assert "retry_no_progress" not in mcp(d, "deploy", {"n": 1}, error="other")
    assert "retry_no_progress" in mcp(d, "deploy", {"n": 1}, result="fine")  # 3rd after 2 x other
    assert "retry_no_progress" not in mcp(d, "deploy", {"n": 1})  # the success reset it


def test_the_same_failure_with_other_arguments_is_a_retry_without_progress() -> None:
    d = det(threshold=3, action="block", **QUIET)
    for i in range(2):
        assert mcp(d, "deploy", {"version": f"1.{i}"}, error="HTTP 503") == {}
    assert mcp(d, "deploy", {"version": "1.2"})["retry_no_progress"].action is Action.BLOCK
    # a change that came back since (a new edit) makes the next attempt a new experiment
    d = det(threshold=3, **QUIET)
    for i in range(6):
        assert mcp(d, "run_tests", {}, error="ImportError: no module named x") == {}
        assert mcp(d, "edit_file", {"path": "a.py", "patch": f"fix {i}"}) == {}


def test_a_flaky_tool_failing_once_per_input_is_not_a_retry_loop() -> None:
    d = det(threshold=3)
    for i in range(10):
        assert mcp(d, "fetch_url", {"url": f"u{i}"}, error="timeout") == {}
        assert mcp(d, "fetch_url", {"url": f"u{i}"}, result=f"page {i}") == {}


# -- no-progress poll ---------------------------------------------------------------------------


def test_no_progress_poll_warns_after_4_same_results_and_terminates_after_8() -> None:
    """The attempt after `no_progress_warn` (4) results the same warns; after `no_progress_halt` (8)
    it ends the session (issue 31: judged before its own result, a poll moving every 1-3 polls is
    never warned)."""
    d = det(threshold=100, idempotent=(100, 100, 100))
    got = [mcp(d, "get_status", {"job": 1}, result="pending").get("no_progress") for _ in range(10)]
    assert got[:4] == [None, None, None, None]
    assert (got[4].action, got[4].new_finding, got[4].threshold, got[4].actual) == (Action.WARN, True, 4, 5)
    assert got[4].message == "get_status returned the same result 4 times in a row; this is call 5"
    assert [g.action for g in got[5:8]] == [Action.WARN] * 3 and not any(g.new_finding for g in got[5:8])
    assert (got[8].action, got[8].new_finding, got[8].threshold) == (Action.TERMINATE, True, 8)
    assert "terminated" in got[8].tags


def test_checking_again_after_a_change_is_progress() -> None:
    d = det()
    for i in range(12):  # write a new version, check the (unchanged) status, again and again
        assert mcp(d, "write_file", {"path": "a.py", "content": f"v{i}"}) == {}
        assert mcp(d, "get_status", {"job": 1}, result="build failed") == {}


# -- per-tool escalation ------------------------------------------------------------------------


def _escalation(d: LoopDetector, tool: str, n: int, start: float = 0.0, repeat: bool = True) -> list[Action]:
    """n calls of `tool`, each a call already made with its answer already seen (no progress), in a
    row: the count is a streak since the tool's last news (issue 31), so news in between would
    start it again."""
    out = []
    if repeat:  # the first call is new: not counted
        mcp(d, tool, {"arg": 0}, now=start)
    for i in range(n):
        args = {"arg": 0 if repeat else i}
        got = mcp(d, tool, args, now=start + i).get("per_tool")
        out.append(got.action if got else Action.ALLOW)
    return out


def test_idempotent_tools_escalate_at_5_8_12_calls_without_progress() -> None:
    d = det(threshold=100, no_progress_warn=100, no_progress_halt=100)
    assert _escalation(d, "read_file", 13) == [A.ALLOW] * 4 + [A.WARN] * 3 + [A.BLOCK] * 4 + [A.TERMINATE] * 2


def test_mutating_tools_escalate_at_3_5_7_calls_without_progress() -> None:
    d = det(threshold=100, no_progress_warn=100, no_progress_halt=100)
    assert _escalation(d, "write_file", 8) == [A.ALLOW] * 2 + [A.WARN] * 2 + [A.BLOCK] * 2 + [A.TERMINATE] * 2


def test_calls_with_new_arguments_never_escalate_by_default() -> None:
    d = det()
    assert set(_escalation(d, "shell", 50, repeat=False)) == {A.ALLOW}
    assert d.stats()["turn_tool_counts"] == {"shell": 50}


def test_count_mode_is_loop_guards_exact_rule() -> None:
    d = det(threshold=100, per_tool_mode="count")
    assert _escalation(d, "read_file", 13, repeat=False) == (
        [A.ALLOW] * 4 + [A.WARN] * 3 + [A.BLOCK] * 4 + [A.TERMINATE] * 2
    )
    d = det(threshold=100, per_tool_mode="count")
    assert _escalation(d, "write_file", 8, repeat=False) == (
        [A.ALLOW] * 2 + [A.WARN] * 2 + [A.BLOCK] * 2 + [A.TERMINATE] * 2
    )


def test_each_escalation_level_writes_one_loop_warning() -> None:
    d = det(threshold=100, per_tool_mode="count")
    news = [mcp(d, "shell", {"cmd": i}).get("per_tool") for i in range(7)]
    assert [(x.action, x.new_finding) for x in news if x is not None] == [
        (Action.WARN, True),
        (Action.WARN, False),
        (Action.BLOCK, True),
        (Action.BLOCK, False),
        (Action.TERMINATE, True),
    ]


def test_refused_attempts_still_count() -> None:
    d = det(threshold=100, mutating=(3, 4, 6), per_tool_mode="count")
    for i in range(4):
        d.check_tool_call("delete_file", {"p": i}, float(i))  # 4th is blocked: no result recorded
    assert kinds(d.check_tool_call("delete_file", {"p": 9}, 5.0))["per_tool"].actual == 5
    assert kinds(d.check_tool_call("delete_file", {"p": 10}, 6.0))["per_tool"].action is Action.TERMINATE
    # progress mode: a refused attempt learned nothing, so it counts as a call without progress
    d = det(threshold=100, mutating=(2, 3, 4), no_progress_warn=100, no_progress_halt=100)
    assert mcp(d, "delete_file", {"p": 1}) == {} and mcp(d, "delete_file", {"p": 1}) == {}
    assert mcp(d, "delete_file", {"p": 1})["per_tool"].action is Action.WARN  # 1 stale + this one
    assert mcp(d, "delete_file", {"p": 1})["per_tool"].action is Action.BLOCK  # refused: stale
    assert kinds(d.check_tool_call("delete_file", {"p": 1}, 0.0))["per_tool"].action is Action.TERMINATE


def test_mcp_only_turn_ends_after_a_pause_longer_than_turn_gap() -> None:
    d = det(threshold=100, per_tool_mode="count")  # turn_gap_s 30
    assert _escalation(d, "write_file", 2, start=0.0, repeat=False) == [Action.ALLOW] * 2
    # a pause of exactly 30 s is the same turn
    assert _escalation(d, "write_file", 1, start=31.0, repeat=False) == [Action.WARN]
    # a longer pause starts a new turn: counts from one again
    assert _escalation(d, "write_file", 3, start=61.5, repeat=False) == [A.ALLOW, A.ALLOW, A.WARN]
    assert d.stats()["turn"] == 2


def test_classification_lists_then_heuristics_unknown_is_mutating() -> None:
    cfg = LoopDetectionConfig(idempotent_tools=("calculator",), mutating_tools=("get_and_reset",))
    assert classify_tool("calculator", cfg) == "idempotent"
    assert classify_tool("get_and_reset", cfg) == "mutating"
    for name in ("read_file", "git_status", "webSearch", "db_query", "fetchUrl", "docs__list_pages"):
        assert classify_tool(name, cfg) == "idempotent", name
    for name in ("check_url", "run_tests", "sleep", "verify_checksum"):
        assert classify_tool(name, cfg) == "idempotent", name
    for name in (
        "write_file",
        "execute_code",
        "sql_insert",
        "git_push",
        "install_package",
        "read_then_write",
    ):
        assert classify_tool(name, cfg) == "mutating", name
    assert classify_tool("frobnicate", cfg) == "mutating"
    # words start with a key: yes; a key buried inside another word: no
    assert classify_tool("readfile", cfg) == "idempotent" and classify_tool("searching", cfg) == "idempotent"
    assert classify_tool("budget_report", cfg) == "mutating"  # "budget" is not "get"
    assert classify_tool("credit_card", cfg) == "mutating"  # unknown, and "credit" is not "edit"
    # well-known names the words would misplace
    assert classify_tool("grep", cfg) == "idempotent" and classify_tool("git_log", cfg) == "idempotent"
    assert classify_tool("bash", cfg) == "mutating"
    # the config's lists win over everything
    assert classify_tool("grep", LoopDetectionConfig(mutating_tools=("grep",))) == "mutating"


# -- parallel calls: a fan-out is not a repetition ----------------------------------------------


def test_an_mcp_fan_out_in_flight_together_is_not_a_repetition() -> None:
    d = det(threshold=3)
    args = [{"city": f"c{i}", "ts": 1764137432 + i} for i in range(20)]
    for a in args:  # twenty calls sent before any answer
        assert d.check_tool_call("get_weather", a, 0.0) == []
    for a in args:
        d.record_tool_result("get_weather", a, "sunny 20C", None, 1.0)
    # the same fan-out again, each city answered the same way: now it is a repetition
    assert d.check_tool_call("get_weather", args[0], 2.0) == []
    d.record_tool_result("get_weather", args[0], "sunny 20C", None, 2.0)


# -- function-calling tools seen in LLM history ---------------------------------------------------


class Conversation:
    """Builds the growing history an agent sends: one assistant step per model answer."""

    def __init__(self) -> None:
        self.steps: list[list[tuple[str, str, Any]]] = []
        self.results: dict[str, tuple[str, str | None]] = {}
        self.turn_start = 0
        self.n = 0

    def step(self, *calls: tuple[str, Any], result: str = "ok", error: str | None = None) -> None:
        ids = []
        for name, args in calls:
            self.n += 1
            ids.append((f"call_{self.n}", name, args))
            self.results[f"call_{self.n}"] = (result, error)
        self.steps.append(ids)

    def user(self) -> None:
        self.turn_start = len(self.steps)

    def send(self, d: LoopDetector, now: float = 0.0) -> dict[str, Decision]:
        return kinds(d.check_llm_history(self.steps, self.turn_start, self.results, now))


def test_the_request_whose_history_holds_the_threshold_th_occurrence_is_answered() -> None:
    d, c = det(threshold=4, action="block", **QUIET), Conversation()
    c.send(d)
    for _ in range(3):
        c.step(("search", '{"q": "x"}'))
        assert "repetition" not in c.send(d)
    c.step(("search", '{"q": "x"}'))
    fired = c.send(d)["repetition"]
    assert fired.action is Action.BLOCK and fired.new_finding and fired.actual == 4
    assert fired.evidence[-1] == "call_4"
    # the same history again (a retry) gets the same answer, without a second LOOP_WARNING
    again = c.send(d)["repetition"]
    assert again.action is Action.BLOCK and not again.new_finding


def test_one_step_fanning_out_twenty_calls_is_not_a_loop() -> None:
    d, c = det(threshold=3), Conversation()
    c.send(d)
    c.step(*[("get_weather", {"city": f"c{i}", "request_id": f"r{i}"}) for i in range(20)], result="sunny")
    assert c.send(d) == {}
    c.step(("summarize", {}))
    assert c.send(d) == {}


def test_history_repeats_are_counted_once() -> None:
    d, c = det(threshold=100), Conversation()
    c.send(d)
    c.step(("read_file", {"p": 1}), ("read_file", {"p": 2}))
    for _ in range(5):
        c.send(d)
    assert d.stats()["turn_tool_counts"] == {"read_file": 2}


def test_a_call_seen_as_mcp_and_in_history_counts_once() -> None:
    d, c = det(threshold=5), Conversation()
    c.send(d)
    for _ in range(4):
        mcp(d, "search", {"q": "same"}, result="r")
        c.step(("docs__search", '{"q": "same"}'))  # the framework's server__ prefix
        assert "repetition" not in c.send(d)
    assert d.stats()["turn_tool_counts"] == {"search": 4}
    assert "repetition" in mcp(d, "search", {"q": "same"})  # the 5th, caught before forwarding


def test_a_real_user_message_starts_a_new_turn() -> None:
    d, c = det(**QUIET), Conversation()
    c.send(d)
    for _ in range(5):  # the same status check, asked for in five separate user turns
        c.step(("get_status", {"service": "api"}), result="healthy")
        assert c.send(d) == {}
        c.user()
        assert c.send(d) == {}
    assert d.stats()["turn_tool_counts"] == {}


def test_identical_step_fires_on_the_4th_identical_step_without_progress() -> None:
    d, c = det(threshold=100, action="block", **QUIET), Conversation()
    c.send(d)
    for i in range(3):
        # the same set of calls, in a different order each time
        calls = [("read_file", {"p": "a"}), ("grep", {"q": "x"})]
        c.step(*(calls if i % 2 else calls[::-1]))
        assert "identical_step" not in c.send(d)
    c.step(("grep", {"q": "x"}), ("read_file", {"p": "a"}))
    fired = c.send(d)["identical_step"]
    assert (fired.action, fired.new_finding, fired.threshold, fired.actual, fired.repetitions) == (
        Action.BLOCK,
        True,
        3,
        3,
        4,
    )
    c.step(("grep", {"q": "x"}), ("read_file", {"p": "a"}))
    assert not c.send(d)["identical_step"].new_finding
    c.step(("grep", {"q": "y"}))
    assert "identical_step" not in c.send(d)


def test_identical_steps_that_learn_something_new_are_progress() -> None:
    d, c = det(threshold=100), Conversation()
    c.send(d)
    for i in range(8):
        c.step(("get_job_status", {"job": 1}), ("get_logs", {"job": 1}), result=f"step {i}")
        assert c.send(d) == {}


def test_max_time_per_turn_refuses_further_calls_of_a_long_turn() -> None:
    d, c = det(threshold=100, max_time_per_turn=120), Conversation()
    c.send(d, now=0.0)
    c.step(("read_file", {"p": 1}))
    assert "max_time_per_turn" not in c.send(d, now=120.0)
    blocked = kinds(d.check_tool_call("read_file", {"p": 2}, 120.5))["max_time_per_turn"]
    assert (blocked.action, blocked.threshold) == (Action.BLOCK, 120)
    c.step(("read_file", {"p": 2}))
    assert c.send(d, now=121.0)["max_time_per_turn"].action is Action.BLOCK
    c.user()
    assert c.send(d, now=130.0) == {}


def test_mcp_only_sessions_have_no_turn_time_limit() -> None:
    d = det(threshold=100, max_time_per_turn=1)
    assert all(mcp(d, "read_file", {"p": i}, now=i * 0.5) == {} for i in range(4))


# -- several patterns on one call -----------------------------------------------------------------


def test_several_patterns_fire_together_and_the_strictest_wins() -> None:
    d = det(threshold=5)
    out = {}
    for _ in range(9):  # no_progress ends it after 8 results the same
        out = mcp(d, "get_status", {"job": 1}, result="pending")
    assert set(out) == {"repetition", "per_tool", "no_progress"}
    assert (out["repetition"].action, out["per_tool"].action, out["no_progress"].action) == (
        Action.WARN,
        Action.BLOCK,  # its 8th call without progress
        Action.TERMINATE,
    )
    assert strictest(list(out.values())).kind == "no_progress"


def test_disabled_detection_never_fires() -> None:
    d = det(enabled=False, threshold=2, agentdbg_cycle=True)
    assert all(d.check_tool_call("write_file", {}, 0.0) == [] for _ in range(20))
    assert d.observe_event("TOOL_CALL", "x", "e") is None


# -- AgentDbg cycle (opt-in) --------------------------------------------------------------------


def _events(d: LoopDetector, pairs: list[tuple[str, str]], start: int = 0) -> list[Decision | None]:
    return [d.observe_event(t, n, f"ev{start + i}") for i, (t, n) in enumerate(pairs)]


def test_agentdbg_cycle_is_off_by_default() -> None:
    assert all(g is None for g in _events(det(), [("LLM_CALL", "gpt-4"), ("TOOL_CALL", "search")] * 6))


def test_cycle_warns_once_per_distinct_pattern() -> None:
    d = det(agentdbg_cycle=True)  # window 12, repetitions 3
    got = _events(d, [("LLM_CALL", "gpt-4"), ("TOOL_CALL", "search")] * 5)
    assert got[:5] == [None] * 5
    first, rotated = got[5], got[6]
    assert (first.action, first.kind, first.pattern, first.repetitions) == (
        Action.WARN,
        "cycle",
        "LLM_CALL:gpt-4 -> TOOL_CALL:search",
        3,
    )
    assert first.evidence == tuple(f"ev{i}" for i in range(6)) and first.window_size == 6
    # AgentDbg's patterns are strings: the rotation is a distinct pattern (its own LOOP_WARNING) ...
    assert rotated is not None and rotated.pattern == "TOOL_CALL:search -> LLM_CALL:gpt-4"
    assert got[7:] == [None] * 3  # ... and a pattern seen before writes nothing more
    other = _events(d, [("TOOL_CALL", "fetch")] * 3, start=10)
    assert other[2] is not None and other[2].pattern == "TOOL_CALL:fetch"


def test_cycle_ignores_arguments_so_paging_warns_and_three_llm_calls_do_too() -> None:
    d = det(agentdbg_cycle=True)
    fired = [g for g in _events(d, [("TOOL_CALL", "list_items")] * 20) if g is not None]
    assert len(fired) == 1 and fired[0].action is Action.WARN
    d = det(agentdbg_cycle=True)
    assert _events(d, [("LLM_CALL", "gpt-4o")] * 3)[2] is not None  # why it is opt-in


def test_stop_on_loop_implies_the_cycle_and_terminates_at_min_repetitions() -> None:
    d = det(stop_on_loop=True, stop_on_loop_min_repetitions=4)
    assert d.config.agentdbg_cycle
    got = _events(d, [("LLM_CALL", "m"), ("TOOL_CALL", "t")] * 4)
    assert got[5].action is Action.WARN  # 3 repetitions: below the stop threshold
    assert got[6].pattern == "TOOL_CALL:t -> LLM_CALL:m"
    stop = got[7]
    assert (stop.action, stop.guard, stop.threshold, stop.actual, stop.new_finding) == (
        Action.TERMINATE,
        "stop_on_loop",
        4,
        4,
        True,
    )
    assert "terminated" in stop.tags and len(stop.evidence) == 8


def test_window_bounds_the_cycle() -> None:
    d = det(window=4, repetitions=3, agentdbg_cycle=True)
    got = _events(d, [("LLM_CALL", "m"), ("TOOL_CALL", "t")] * 4)
    assert all(g is None for g in got)  # 2 x 3 = 6 events never fit a window of 4


# -- stats and evidence -------------------------------------------------------------------------


def test_stats_report_counts_turn_and_decisions() -> None:
    d = det(threshold=3, **QUIET)
    for _ in range(4):
        mcp(d, "read_file", {"p": 1}, result="same")
    s = d.stats(now=5.0)
    assert s["tool_counts"] == {"read_file": 4} and s["turn"] == 1
    assert s["turn_no_progress_counts"] == {"read_file": 3}
    assert s["decisions"] == {"repetition:warn": 2}


def test_identical_steps_do_not_carry_across_a_user_message() -> None:
    d, c = det(threshold=100, **QUIET), Conversation()
    c.send(d)
    for _ in range(3):
        c.step(("grep", {"q": "x"}))
        c.send(d)
    c.user()
    c.send(d)
    c.step(("grep", {"q": "x"}))
    assert "identical_step" not in c.send(d)  # the 4th identical step, but the first of this turn


def test_mcp_evidence_carries_the_recorded_event_ids() -> None:
    d = det(threshold=3, **QUIET)
    for i in range(2):
        d.check_tool_call("read_file", {"p": 1}, float(i))
        d.record_tool_result("read_file", {"p": 1}, "same", None, float(i), event_id=f"evt-{i}")
    fired = kinds(d.check_tool_call("read_file", {"p": 1}, 3.0))["repetition"]
    assert fired.evidence == ("evt-0", "evt-1")  # the third has no event yet: it was not forwarded


def test_ping_pong_in_function_calling_history() -> None:
    d, c = det(threshold=4, action="block", **QUIET), Conversation()
    c.send(d)
    got = []
    for i in range(4):
        c.step(("open", {"f": "a"}) if i % 2 == 0 else ("close", {"f": "a"}))
        got.append(c.send(d))
    assert all("ping_pong" not in g for g in got[:3])
    assert got[3]["ping_pong"].action is Action.BLOCK
    assert got[3]["ping_pong"].evidence == ("call_1", "call_2", "call_3", "call_4")


def test_a_batch_of_new_calls_gives_one_decision_per_streak() -> None:
    d, c = det(threshold=3, **QUIET), Conversation()
    c.send(d)
    for _ in range(5):  # five identical steps arrive in one request (e.g. the proxy joined late)
        c.step(("search", {"q": "x"}))
    out = d.check_llm_history(c.steps, 0, c.results, 0.0)
    reps = [x for x in out if x.kind == "repetition"]
    assert len(reps) == 1 and reps[0].actual == 5 and reps[0].new_finding


def test_max_time_per_turn_is_opt_in() -> None:
    """Default null (SPEC §5.2): an honest turn of twenty minutes is not refused."""
    assert LoopDetectionConfig().max_time_per_turn is None
    d, c = det(threshold=100), Conversation()
    c.send(d, now=0.0)
    c.step(("read_file", {"p": 1}))
    assert "max_time_per_turn" not in c.send(d, now=1200.0)
    assert "max_time_per_turn" not in kinds(d.check_tool_call("read_file", {"p": 2}, 1201.0))
