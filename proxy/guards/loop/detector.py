"""`LoopDetector`: the loop patterns of one session, composed (package docstring: the rule).

Tool calls reach it two ways and count once: MCP `check_tool_call()` then `record_tool_result()`;
function-calling tools in an LLM request's history, `check_llm_history()` (read by
`history.HistoryReader`: each `tool_call_id` once; a call already seen as MCP is not counted again).
Each call is recorded in the `turn.Turn` and judged by the turn's patterns (one of each of
`ATTEMPT_PATTERNS`, in order), which hear its answer too; a request's steps are judged by
`identical_step`, the events by `cycle.AgentDbgCycle`.

Pure: no I/O, no asyncio, the monotonic clock passed in as `now`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from proxy.constants import GUARD_MAX_TIME_PER_TURN
from proxy.guards.config import LoopDetectionConfig
from proxy.guards.decision import Action, Decision
from proxy.guards.loop import identical_step, replies
from proxy.guards.loop.cycle import AgentDbgCycle
from proxy.guards.loop.history import HistoryCall, HistoryReader, HistoryResults, call_tuple, results_map
from proxy.guards.loop.no_progress import NoProgress
from proxy.guards.loop.pattern import Firing, Pattern
from proxy.guards.loop.per_tool import PerTool, classify_tool
from proxy.guards.loop.periodic import Periodic
from proxy.guards.loop.retry import RetryWithoutProgress
from proxy.guards.loop.turn import Attempt, Turn
from proxy.guards.signatures import call_keys, call_sig

# judged on every tool call before it is forwarded, in this order (the order of their decisions);
# one of each per turn
ATTEMPT_PATTERNS: tuple[type[Pattern], ...] = (Periodic, NoProgress, RetryWithoutProgress, PerTool)
# every kind of loop finding -> what the agent reads about it (proxy.guards.describe)
LOOP_KINDS: dict[str, str] = {
    kind: text
    for kinds in (
        *(p.KINDS for p in ATTEMPT_PATTERNS),
        identical_step.KINDS,
        replies.KINDS,
        AgentDbgCycle.KINDS,
    )
    for kind, text in kinds.items()
}


class LoopDetector:
    """All loop patterns of one session."""

    # slots, and every container made when first needed: a stateless service's call is a run of
    # its own, whose guards judge one call without a tool call and then wait out the idle timeout
    # (issue 33: ~4 KB a run of empty turns, patterns, sets and Counters)
    __slots__ = (
        "config",
        "_reported",
        "_turn",
        "_turn_number",
        "_turn_started",
        "_patterns",
        "_last_mcp_at",
        "_llm_seen",
        "_history",
        "_by_id",
        "_answers",
        "_event_ids",
        "new_history_calls",
        "new_call_names",
        "_cycle",
        "_writes",
        "_tool_totals",
        "_decision_counts",
    )

    def __init__(self, config: LoopDetectionConfig) -> None:
        self.config = config
        self._reported: set[Any] | None = None  # finding keys that already wrote their LOOP_WARNING
        # the turn: None while nothing happened in it (no call, no answer), numbered and started by
        # the two fields after it; built with the turn's patterns (one of each) at its first call
        self._turn: Turn | None = None
        self._turn_number = 0
        self._turn_started: float | None = None
        self._patterns: Sequence[Pattern] = ()  # the turn's (none until it is built)
        self._last_mcp_at: float | None = None
        self._llm_seen = False
        # function-calling bookkeeping
        self._history = HistoryReader()
        self._by_id: dict[str, Attempt] | None = None
        self._answers: tuple[tuple[str, ...], list[Decision]] | None = None  # last request's decisions
        self._event_ids: Mapping[str, str] | None = None  # tool_call_id -> TOOL_CALL event id
        self.new_history_calls = 0  # counted by the last check_llm_history (not seen as MCP)
        self.new_call_names: Sequence[str] = ()  # the names of those calls (tool permissions)
        self._cycle: AgentDbgCycle | None = None  # (made at the first event it looks at)
        self._writes: dict[str, bool] | None = None  # tool -> mutating (classify_tool, config in force)
        # stats
        self._tool_totals: Counter[str] | None = None
        self._decision_counts: Counter[str] | None = None

    @property
    def tool_totals(self) -> Counter[str]:
        """Every tool call seen, by tool."""
        if self._tool_totals is None:
            self._tool_totals = Counter()
        return self._tool_totals

    @property
    def decision_counts(self) -> Counter[str]:
        """Decisions so far, by `kind or guard:action`."""
        if self._decision_counts is None:
            self._decision_counts = Counter()
        return self._decision_counts

    def _current(self) -> Turn:
        """The turn, built (with its patterns) when something first happens in it."""
        t = self._turn
        if t is None:
            t = self._turn = Turn(self._turn_number, self._turn_started)
            self._patterns = [make() for make in ATTEMPT_PATTERNS]
        return t

    def configure(self, config: LoopDetectionConfig) -> None:
        """A config change (admin API) applies from the next call; counts are kept."""
        self.config = config
        self._writes = None
        if self._cycle is not None:
            self._cycle.configure(config)

    # -- MCP tool calls --------------------------------------------------------------------------

    def check_tool_call(
        self,
        tool: str,
        args: Any,
        now: float,
        *,
        server: str | None = None,
        evidence: str | None = None,
        enforced: bool = True,
    ) -> list[Decision]:
        """Before forwarding an MCP `tools/call`: the attempt counts (even when refused).

        `args` may be the call's recorded `Fingerprinted` arguments (replay). `enforced` False
        (shadow mode): a refusal is only recorded, the call goes on and its result will come.
        """
        sig, ident = call_keys(tool, args)
        self._history.mcp_call(sig)
        if not self.config.enabled:
            return []
        if not self._llm_seen:
            gap = self.config.turn_gap_s
            if self._last_mcp_at is None or now - self._last_mcp_at > gap:
                self._new_turn(now)
        self._last_mcp_at = now
        attempt = self._attempt(tool, sig, ident, evidence)
        t = self._current()
        t.pending.setdefault(sig, []).append(attempt)
        decisions = self._judge(attempt) + self._turn_time(now)
        decisions = self._finish(decisions)
        if enforced and any(d.action >= Action.BLOCK for d in decisions):
            t.refused(attempt)
        return decisions

    def record_tool_result(
        self,
        tool: str,
        args: Any,
        result_fingerprint: str,
        error: str | None,
        now: float,
        *,
        event_id: str | None = None,
    ) -> None:
        """After an MCP call answered: whether it made progress, for the patterns that follow."""
        self._last_mcp_at = now  # the pause that ends an MCP-only turn runs from the last activity
        t = self._turn
        waiting = None if t is None else t.pending.get(call_sig(tool, args))
        if not waiting or t is None:
            return  # detection off when it was made, or a turn began since: nothing to measure against
        attempt = waiting.pop(0)
        if not waiting:
            del t.pending[attempt.sig]
        if event_id is not None:
            attempt.evidence = event_id
        known = t.same_as(attempt.tool, result_fingerprint)
        t.resolve(attempt, known)
        self._answered(attempt, known, error)

    # -- function-calling tools in an LLM request's history ---------------------------------------

    def check_llm_history(
        self,
        steps: Sequence[Sequence[HistoryCall]],
        turn_start: int,
        tool_results: HistoryResults,
        now: float,
        event_ids: Mapping[str, str] | None = None,
        *,
        reading: object = None,
        read_from: object = None,
        echo: replies.Echo | None = None,
    ) -> list[Decision]:
        """Before forwarding an LLM request: the tool calls its history holds, new ones counted once.

        `steps` are the assistant steps (oldest first), `turn_start` the index of the first step
        after the last real user message, `tool_results` maps tool_call_id -> (fingerprint, error)
        for the results the request carries. Sending the same history again gives the same answer.
        `event_ids` maps tool_call_id -> the id of its TOOL_CALL event, for the evidence of a
        LOOP_WARNING (a call without one is left out); without it the evidence is tool_call_ids.

        `reading` names this history (any object, compared by identity) and `read_from` the one it
        goes on from, when the caller knows: its first steps are that history's, unchanged (the
        dialect read it on from there). If that is the history this detector read last, only the
        steps after it are read; the decisions are the same as reading the whole.

        `echo`: the run of one reply to one nudge the conversation ends with
        (`replies.repeated_reply`), judged whatever the tool calls say.
        """
        self._event_ids = event_ids
        enabled = self.config.enabled
        turn_start = max(0, min(turn_start, len(steps)))
        read = self._history.read(steps, turn_start, judged=enabled, reading=reading, read_from=read_from)
        self.new_history_calls = read.new_history_calls
        self.new_call_names = read.new_names
        if not enabled:
            return []
        self._llm_seen = True
        said = self._echo(echo)
        if not steps:
            # a history without an assistant step (a plain chat call): no call to count or judge, a
            # turn without calls (renumbered), and no turn time spent in it yet
            self._new_turn(now)
            return said
        t = self._current()
        if (
            not read.inside
            or t.started_at is None
            or (not read.continued and t.ids.intersection(read.earlier_ids))
        ):
            self._new_turn(now)
            t = self._current()

        decisions: list[Decision] = []
        tool_results = results_map(tool_results)
        by_id = self._by_id
        if by_id is None:
            by_id = self._by_id = {}
        for step in read.turn_steps:
            made: list[tuple[Attempt, tuple[str, str | None] | None]] = []
            for call in step:
                t.ids.add(call.call_id)
                if call.claimed:  # already counted as the MCP call it was
                    continue
                attempt = self._attempt(call.name, call.sig, call.ident, self._evidence_id(call.call_id))
                by_id[call.call_id] = attempt
                decisions += self._judge(attempt)
                result = tool_results.get(call.call_id)
                if result is not None:
                    result = (t.same_as(attempt.tool, result[0]), result[1])
                    t.resolve(attempt, result[0])  # known now: the step's next calls see it
                made.append((attempt, result))
            # the calls of one step were made together: what they returned counts from the next step
            for attempt, result in made:
                if result is not None:
                    self._answered(attempt, *result)

        # the request's shape: the same history sent again gets the same answer
        last_ids = (str(turn_start), str(len(steps)), *(call_tuple(c)[0] for c in steps[-1]))
        answers = self._answers
        if read.new_calls == 0 and answers is not None and answers[0] == last_ids:
            decisions = [replace(d, new_finding=False) for d in answers[1]]
        else:
            firing = identical_step.judge(steps, turn_start, self.config, by_id, self._evidence_id)
            if firing is not None:
                decisions.append(self._decision(firing))
            decisions = self._finish(decisions)
            self._answers = (last_ids, decisions)
        turn_time = self._turn_time(now)
        self._tally(turn_time)
        return self._dedupe(decisions + turn_time + said)

    def _echo(self, echo: replies.Echo | None) -> list[Decision]:
        firing = replies.judge(echo, self.config)
        if firing is None:
            return []
        decision = self._decision(firing)
        self._tally([decision])
        return [decision]

    def _evidence_id(self, call_id: str) -> str | None:
        return call_id if self._event_ids is None else self._event_ids.get(call_id)

    # -- AgentDbg cycle --------------------------------------------------------------------------

    def observe_event(self, event_type: str, name: str, event_id: str) -> Decision | None:
        """After an event is recorded: AgentDbg's cycle over `window` event signatures (opt-in)."""
        config = self.config
        if not config.enabled or not config.agentdbg_cycle:
            return None  # (the cycle looks at nothing then)
        cycle = self._cycle
        if cycle is None:
            cycle = self._cycle = AgentDbgCycle(config)
        firing = cycle.observe(event_type, name, event_id, config)
        if firing is None:
            return None
        decision = firing.decision()
        self._tally([decision])
        return decision

    # -- the turn and its attempts ---------------------------------------------------------------

    def _new_turn(self, now: float) -> None:
        t = self._turn
        if t is None:  # nothing happened in it (not even built): the next one, renumbered
            self._turn_number += 1
            self._turn_started = now
        elif t.pristine:  # nothing happened in it: the next turn is the same empty one, renumbered
            t.number += 1
            t.started_at = now
        else:  # built at its first call
            self._turn, self._patterns = None, ()
            self._turn_number, self._turn_started = t.number + 1, now

    def _attempt(self, tool: str, sig: str, ident: str, evidence: str | None) -> Attempt:
        t = self._current()
        writes_of = self._writes
        if writes_of is None:
            writes_of = self._writes = {}
        writes = writes_of.get(tool)
        if writes is None:
            writes = writes_of[tool] = classify_tool(tool, self.config) == "mutating"
        attempt = t.attempt(tool, sig, ident, evidence, writes=writes)
        for pattern in self._patterns:
            pattern.attempted(attempt, t)
        self.tool_totals[attempt.tool] += 1
        return attempt

    def _judge(self, attempt: Attempt) -> list[Decision]:
        """The patterns that fire on this attempt, before it is forwarded."""
        t, config = self._current(), self.config
        return [
            self._decision(f)
            for pattern in self._patterns
            if (f := pattern.judge(attempt, t, config)) is not None
        ]

    def _answered(self, attempt: Attempt, fingerprint: str, error: str | None) -> None:
        """An answer came back: the turn records it, then the patterns hear it."""
        t = self._current()
        t.apply(attempt, fingerprint, error)
        for pattern in self._patterns:
            pattern.answered(attempt, fingerprint, error, t)
        if t.too_large:
            t.forget()
            for pattern in self._patterns:
                pattern.forget()

    def _turn_time(self, now: float) -> list[Decision]:
        """Loop Guard's max_time_per_turn, for turns the conversation history shows."""
        limit = self.config.max_time_per_turn
        started = self._turn_started if self._turn is None else self._turn.started_at
        if limit is None or not self._llm_seen or started is None:
            return []
        elapsed = now - started
        if elapsed <= limit:
            return []
        d = Decision(
            Action.BLOCK,
            GUARD_MAX_TIME_PER_TURN,
            f"this turn has run {elapsed:.3g}s, longer than {limit:g}s",
            threshold=limit,
            actual=round(elapsed, 3),
        )
        return [d]

    # -- decisions -------------------------------------------------------------------------------

    def _decision(self, firing: Firing) -> Decision:
        """A firing as a decision, a new finding the first time its key fires."""
        reported = self._reported
        if reported is None:
            reported = self._reported = set()
        new = firing.key not in reported
        reported.add(firing.key)
        return firing.decision(new)

    def _finish(self, decisions: list[Decision]) -> list[Decision]:
        decisions = self._dedupe(decisions)
        self._tally(decisions)
        return decisions

    @staticmethod
    def _dedupe(decisions: Iterable[Decision]) -> list[Decision]:
        """One decision per streak when a request carries several calls of it: the latest, strictest."""
        best: dict[tuple[Any, ...], Decision] = {}
        order: list[tuple[Any, ...]] = []
        for d in decisions:
            key = (d.kind, d.guard, d.pattern)
            old = best.get(key)
            if old is None:
                order.append(key)
                best[key] = d
            elif d.action >= old.action:
                best[key] = replace(d, new_finding=d.new_finding or old.new_finding)
        return [best[k] for k in order]

    def _tally(self, decisions: Iterable[Decision]) -> None:
        for d in decisions:
            self.decision_counts[f"{d.kind or d.guard}:{d.action.name.lower()}"] += 1

    def stats(self, now: float | None = None) -> dict[str, Any]:
        """Loop Guard's get_stats(): per-tool counts, the current turn, decisions so far."""
        t = self._turn
        totals: Mapping[str, int] = self._tool_totals or {}
        out: dict[str, Any] = {
            "turn": self._turn_number if t is None else t.number,
            "turn_tool_counts": {} if t is None else dict(t.calls),
            "turn_no_progress_counts": {} if t is None else dict(t.no_progress),
            "tool_counts": dict(totals),
            "decisions": dict(self._decision_counts or {}),
            "tool_calls_seen": sum(totals.values()),
        }
        started = self._turn_started if t is None else t.started_at
        if now is not None and started is not None:
            out["turn_elapsed_s"] = round(now - started, 3)
        return out
