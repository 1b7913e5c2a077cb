"""An approved loop covers the loop for `threshold` calls, whichever pattern sees it (issue 32 item
2), in the pure guard state: `SessionGuards.approve_loop`, the shared log's `appr` entry a replica
applies, so a session's guards, every replica's copy and replay agree."""

from __future__ import annotations

from proxy.approvals.book import APPROVED, DENIED, Decided
from proxy.approvals.service import covers_until
from proxy.constants import GUARD_TOOL_ASK
from proxy.guard_log import entries
from proxy.guard_log.replica import SessionReplica
from proxy.guards.config import GuardConfig
from proxy.guards.decision import Action, Decision
from proxy.guards.session import SessionGuards
from proxy.state.base import LogEntry

CONFIG = GuardConfig.model_validate(
    {
        "loop_detection": {
            "threshold": 3,
            "action": "ask",
            "mutating": [50, 50, 50],
            "no_progress_warn": 50,
            "no_progress_halt": 50,
        },
        "tools": {"ask": ["demo__add"]},
    }
)


def asks(guards: SessionGuards, tool: str, args: dict[str, str], now: float) -> list[tuple[str | None, str]]:
    verdict = guards.before_tool_call(tool, args, now=now, server="demo")
    guards.after_tool_call(verdict.reservation, tool, args, result_fingerprint="", error="boom", now=now)
    return [(d.kind or d.guard, d.action.name) for d in verdict.decisions]


def test_another_pattern_within_the_cover_warns_instead_of_asking() -> None:
    guards = SessionGuards(CONFIG, started_at=0.0)
    assert asks(guards, "explode", {"r": "x"}, 1) == []
    assert asks(guards, "explode", {"r": "x"}, 2) == []
    assert asks(guards, "explode", {"r": "x"}, 3) == [("repetition", "ASK"), ("retry_no_progress", "ASK")]
    guards.approve_loop(5)  # a person approved call 3, threshold 3: calls 3-5
    # call 4 (other arguments): retry_no_progress sees the same failure again; covered
    assert asks(guards, "explode", {"r": "y"}, 4) == [("retry_no_progress", "WARN")]
    assert ("repetition", "ASK") not in asks(guards, "explode", {"r": "y"}, 5)
    assert asks(guards, "explode", {"r": "y"}, 6)[0] == ("repetition", "ASK")  # past the cover


def test_the_cover_lets_no_tool_ask_through() -> None:
    guards = SessionGuards(CONFIG, started_at=0.0)
    guards.approve_loop(10)
    assert asks(guards, "add", {"a": "1"}, 1) == [(GUARD_TOOL_ASK, "ASK")]


def test_a_resumed_session_starts_without_a_cover() -> None:
    guards = SessionGuards(CONFIG, started_at=0.0)
    guards.approve_loop(10)
    guards.resumed()  # call_seq starts again
    assert guards.loop_approved_until == 0


def test_covers_until() -> None:
    loop = Decision(Action.ASK, "loop_detection", kind="identical_step", threshold=3)
    assert covers_until(loop, Decided(APPROVED), 5) == 7
    assert covers_until(loop, Decided(DENIED), 5) is None
    assert covers_until(Decision(Action.ASK, GUARD_TOOL_ASK), Decided(APPROVED), 5) is None


def test_a_replica_applies_the_approval_entry_in_log_order() -> None:
    replica = SessionReplica(lambda rev: CONFIG)
    direct = SessionGuards(CONFIG, started_at=0.0)
    log: list[LogEntry] = []

    def add(body: bytes) -> LogEntry:
        log.append(LogEntry(len(log) + 1, 1000.0 + len(log), 0, body))
        return log[-1]

    seen_replica, seen_direct = [], []
    for i, reason in enumerate(["x", "x", "x", "y", "y", "y"], start=1):
        if i == 4:
            assert entries.decode(entries.approve_loop(5)) == entries.ApproveLoop(until=5)
            replica.apply(add(entries.approve_loop(5)))
            direct.approve_loop(5)
        cid = entries.check_id()
        applied = replica.apply(add(entries.tool_check(cid, "explode", {"r": reason}, "demo", 0.0)))
        assert applied is not None and applied.verdict is not None
        replica.apply(add(entries.settle_tool(cid, "", "boom")))
        seen_replica.append([(d.kind, d.action.name) for d in applied.verdict.decisions])
        seen_direct.append(asks(direct, "explode", {"r": reason}, float(i)))
    assert seen_replica == seen_direct
    assert ("retry_no_progress", "WARN") in seen_replica[3]
    assert ("repetition", "ASK") in seen_replica[5]
