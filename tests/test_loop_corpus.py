"""The loop corpus as the guard's specification (SPEC §5.1), run through the pure session guards.

Under the default config: every honest session untouched (no warning, refusal or ended session
from any guard), every stuck session caught within max(threshold + 1, 2k) calls of its loop's start
(a LOOP_WARNING under `action: warn`, the call refused under `action: block`), over MCP and over
function-calling alike. The seeds' rules, opt-in, are shown doing what their documentation says,
and firing on honest work, which is why they are opt-in.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from corpus_runner import SESSIONS, Outcome, bound, report, run, transports
from loop_corpus import Parallel, Reply

from proxy.guards.decision import Action

THRESHOLD = 5  # the default
HONEST = [(s, t) for s in SESSIONS if not s.stuck for t in transports(s)]
STUCK = [(s, t) for s in SESSIONS if s.stuck for t in transports(s)]
BY_NAME = {s.name: s for s in SESSIONS}


def _id(case: tuple[object, str]) -> str:
    session, transport = case
    return f"{session.name}-{transport}"  # type: ignore[attr-defined]


def fired(outcome: Outcome) -> list[str]:
    return [f"call {n}: {d.kind or d.guard} {d.action.name} ({d.message})" for n, d in outcome.fired]


def test_the_corpus_is_large_enough_and_well_formed() -> None:
    stuck = [s for s in SESSIONS if s.stuck]
    honest = [s for s in SESSIONS if not s.stuck]
    assert len(stuck) >= 20 and len(honest) >= 20
    assert len({s.name for s in SESSIONS}) == len(SESSIONS)
    for s in stuck:
        assert s.loop_start and s.round_len, s.name
        calls = sum(
            len(x.calls) if isinstance(x, Parallel) else int(hasattr(x, "tool") or isinstance(x, Reply))
            for x in s.steps
        )
        assert calls >= s.loop_start - 1 + bound(s, THRESHOLD), f"{s.name}: the loop must run past its bound"


@pytest.mark.parametrize("case", HONEST, ids=[_id(c) for c in HONEST])
def test_honest_sessions_are_never_touched(case: tuple) -> None:
    session, transport = case
    outcome = run(session, transport)
    assert not outcome.touched, fired(outcome)
    assert outcome.calls > 0


@pytest.mark.parametrize("case", STUCK, ids=[_id(c) for c in STUCK])
def test_stuck_sessions_are_warned_within_the_bound(case: tuple) -> None:
    session, transport = case
    outcome = run(session, transport)
    after = outcome.caught_after(Action.WARN)
    assert after is not None and 1 <= after <= bound(session, THRESHOLD), fired(outcome)
    first = next(d for _, d in outcome.fired if d.kind is not None)
    assert first.new_finding  # the decision that catches it writes a LOOP_WARNING


@pytest.mark.parametrize("case", STUCK, ids=[_id(c) for c in STUCK])
def test_stuck_sessions_are_refused_within_the_bound_under_block(case: tuple) -> None:
    session, transport = case
    outcome = run(session, transport, {"action": "block"})
    after = outcome.caught_after(Action.BLOCK)
    assert after is not None and 1 <= after <= bound(session, THRESHOLD), fired(outcome)
    assert outcome.calls == outcome.first(Action.BLOCK)  # the agent got its blocked answer there


# -- the seeds' rules, opt-in ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "transport", "warn_at", "block_at"),
    [
        ("paging_30_pages_of_issues", "mcp", 5, 8),  # idempotent: 5 / 8 / 12
        ("paging_30_pages_of_issues", "fc", 5, 8),
        ("fan_out_weather_20_cities", "mcp", 5, 8),
        ("send_15_emails_distinct_recipients", "mcp", 3, 5),  # mutating: 3 / 5 / 7
        ("mcp_add_seven_argument_sets", "mcp", 3, 5),  # an unknown name counts as mutating
    ],
)
def test_count_mode_is_loop_guards_rule_and_stops_honest_work(
    name: str, transport: str, warn_at: int, block_at: int
) -> None:
    outcome = run(BY_NAME[name], transport, {"per_tool_mode": "count"})
    findings = [
        (n, d.action, d.threshold) for n, d in outcome.fired if d.kind == "per_tool" and d.new_finding
    ]
    assert findings == [(warn_at, Action.WARN, warn_at), (block_at, Action.BLOCK, block_at)]


def test_count_mode_ends_a_twenty_call_fan_out_in_one_step() -> None:
    outcome = run(BY_NAME["fan_out_weather_20_cities"], "fc", {"per_tool_mode": "count"})
    (n, decision), *_ = [(n, d) for n, d in outcome.fired if d.action is Action.TERMINATE]
    assert (n, decision.kind, decision.threshold, decision.actual) == (20, "per_tool", 12, 20)


def test_count_mode_still_catches_every_stuck_session() -> None:
    for session, transport in STUCK:
        outcome = run(session, transport, {"per_tool_mode": "count"})
        assert outcome.first(Action.WARN) is not None, session.name


@pytest.mark.parametrize(
    ("name", "transport", "pattern"),
    [
        ("paging_30_pages_of_issues", "mcp", "TOOL_CALL:list_issues"),
        ("paging_30_pages_of_issues", "fc", "LLM_CALL:gpt-4o -> TOOL_CALL:list_issues"),
        ("send_15_emails_distinct_recipients", "fc", "LLM_CALL:gpt-4o -> TOOL_CALL:send_email"),
    ],
)
def test_agentdbg_cycle_is_name_only_and_warns_on_honest_paging(
    name: str, transport: str, pattern: str
) -> None:
    outcome = run(BY_NAME[name], transport, {"agentdbg_cycle": True})
    cycles = [(n, d) for n, d in outcome.fired if d.kind == "cycle"]
    assert cycles and cycles[0][1].pattern == pattern and cycles[0][1].action is Action.WARN
    assert cycles[0][1].repetitions == 3 and cycles[0][1].window_size <= 12
    assert len({d.pattern for _, d in cycles}) == len(cycles)  # one LOOP_WARNING per distinct pattern
    assert run(BY_NAME[name], transport).fired == []  # the default rule leaves it alone


def _docs_report() -> str:
    text = (Path(__file__).resolve().parent.parent / "docs" / "guards.md").read_text()
    start, end = "<!-- corpus-report:start -->\n", "<!-- corpus-report:end -->"
    return text[text.index(start) + len(start) : text.index(end)].strip()


def test_the_accuracy_tables_in_the_docs_are_current() -> None:
    """docs/guards.md shows what the corpus gives today: `python tests/corpus_runner.py` regenerates it."""
    assert _docs_report() == report().strip()


# -- replay decides as the live guards did ------------------------------------------------------

CASES = [(s, t) for s in SESSIONS for t in transports(s)]


def _decided(outcome: Outcome) -> list[tuple[int, str | None, str, Action]]:
    return [(n, d.kind, d.guard, d.action) for n, d in outcome.fired]


@pytest.mark.parametrize("case", CASES, ids=[_id(c) for c in CASES])
def test_a_replay_from_the_recorded_fingerprints_decides_as_live(case: tuple) -> None:
    """What the trace keeps of each call (`call_fingerprints`: hashed identities carrying the
    values their arguments name; result fingerprints with their tokens; recorded error
    fingerprints) gives every decision the live guards took, session by session (issue 31)."""
    session, transport = case
    for overrides in (None, {"action": "block"}):
        live = run(session, transport, overrides)
        assert _decided(run(session, transport, overrides, recorded=True)) == _decided(live)
