"""One session's guards behind four calls the pipeline makes (SPEC §5).

    before_llm_call  -> Verdict    (tool permissions and loop patterns in the request's history,
                                    budgets, limits)
    after_llm_call   -> [Decision] (settle the reservation; the soft budget alert)
    before_tool_call -> Verdict    (MCP tools/call: tool permissions, loop patterns, budgets, limits)
    after_tool_call  -> [Decision] (settle; feed the result-dependent loop patterns)
    observe_event    -> Decision | None  (every event written: max_events, AgentDbg's cycle)

The circuit breaker is not here: it belongs to agent x upstream, not to a session
(`proxy.guards.breaker.BreakerRegistry`). Pure: no I/O, the monotonic clock passed in as `now`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

from proxy.constants import GUARD_TOOL_ASK, GUARD_TOOL_DENIED, EventType
from proxy.guards.budget import CallKind, Reservation, SessionBudget
from proxy.guards.config import GuardConfig, ToolsConfig
from proxy.guards.decision import ALLOW, Action, Decision, strictest
from proxy.guards.loop.detector import LoopDetector
from proxy.guards.loop.history import HistoryCall, HistoryResults
from proxy.guards.loop.replies import Echo
from proxy.guards.permissions import permission, qualified_tool_name
from proxy.guards.raises import raised_sections

# events AgentDbg's cycle detector looks at (Tripwire's own STATE_UPDATEs are guard state, not
# agent behaviour, and LOOP_WARNING / ERROR are the detector's own output)
CYCLE_EVENTS = frozenset({EventType.LLM_CALL, EventType.TOOL_CALL})
_NOTHING_RAISED: Mapping[str, float] = MappingProxyType({})


@dataclass(slots=True)
class Verdict:
    """Everything the guards concluded about one call before it is forwarded."""

    decisions: list[Decision] = field(default_factory=list)  # every firing, in order
    reservation: Reservation | None = None  # hold it until after_*() or release()
    call_seq: int = 0  # the call's arrival number in the session, from 1
    shadow: bool = False  # evaluated and recorded only: nothing is refused or altered

    @property
    def decision(self) -> Decision:
        """The one that wins (strictest; ALLOW when nothing fired)."""
        return strictest(self.decisions)

    @property
    def refused(self) -> bool:
        """Do not forward: answer with a block (BLOCK) or a refusal (TERMINATE). Never in shadow."""
        return not self.shadow and self.would_refuse

    @property
    def would_refuse(self) -> bool:
        """What enforce mode would do: refuse this call."""
        return self.decision.action >= Action.BLOCK

    @property
    def loop_findings(self) -> list[Decision]:
        """The LOOP_WARNING events to write (one per streak, per level)."""
        return [d for d in self.decisions if d.kind is not None and d.new_finding]

    @property
    def tags(self) -> tuple[str, ...]:
        seen: dict[str, None] = {}
        for d in self.decisions:
            seen.update(dict.fromkeys(d.tags))
        return tuple(seen)


class SessionGuards:
    """The loop detector and budget of one session, under the config in force."""

    # slots, and the containers made at their first use: a stateless service's call is a run (and
    # a SessionGuards) of its own, held for the idle timeout (issue 33)
    __slots__ = (
        "config",
        "loop",
        "budget",
        "_decision_counts",
        "terminated_by",
        "calls_seen",
        "calls_settled",
        "events_seen",
        "config_rev",
        "_shadow_reported",
        "_raised",
        "loop_approved_until",
    )

    def __init__(self, config: GuardConfig, started_at: float) -> None:
        self.config = config
        self.loop = LoopDetector(config.loop_detection)
        self.budget = SessionBudget(config.budget, config.limits, config.loop_detection.max_steps, started_at)
        self._decision_counts: Counter[str] | None = None
        self.terminated_by: Decision | None = None
        # what a replay needs to put the calls back in the order the guards saw them (SPEC §5.7)
        self.calls_seen = 0  # calls judged so far: the next one's call_seq is this + 1
        self.calls_settled = 0  # answers settled so far
        self.events_seen = 0  # events observed so far
        self.config_rev = 0  # changes of the config in force
        self._shadow_reported: set[str] | None = None  # shadow mode: guards whose ERROR was written
        # limits a person raised for the rest of the session (proxy/guards/raises.py), kept over
        # config changes
        self._raised: dict[str, float] | None = None
        # the last call_seq a loop a person approved covers (SPEC §5.5a): up to it a loop pattern's
        # ASK is let through as a WARN, whichever pattern asks (the approved one or another)
        self.loop_approved_until = 0

    @property
    def decision_counts(self) -> Counter[str]:
        """Decisions so far, by `guard:action`."""
        if self._decision_counts is None:
            self._decision_counts = Counter()
        return self._decision_counts

    @property
    def shadow_reported(self) -> set[str]:
        """Shadow mode: the guards whose ERROR was written."""
        if self._shadow_reported is None:
            self._shadow_reported = set()
        return self._shadow_reported

    @property
    def raised(self) -> Mapping[str, float]:
        """Limits a person raised for the rest of the session (read only: `raise_limits`)."""
        return self._raised or _NOTHING_RAISED

    def approve_loop(self, until: int) -> None:
        """A person approved a held loop call: the loop's asks go through up to call `until`."""
        self.loop_approved_until = max(self.loop_approved_until, until)

    def configure(self, config: GuardConfig) -> bool:
        """The config in force changed (admin API): effective on the next call, counts kept.
        True when it did change."""
        if config is self.config or config == self.config:  # identity first: pydantic's == walks fields
            return False
        self.config = config
        self.config_rev += 1
        self.loop.configure(config.loop_detection)
        self._configure_budget()
        return True

    def raise_limits(self, raised: Mapping[str, float]) -> None:
        """Raise budgets or limits for the rest of the session (validated by the caller:
        `proxy.guards.raises.validate_raise`); effective on the next call."""
        own = self._raised
        if own is None:
            own = self._raised = {}
        for key, value in raised.items():
            own[key] = max(value, own.get(key, value))
        self._configure_budget()

    def resumed(self) -> None:
        """The session goes on in a new run (SPEC §5.5a resume): no longer ended by a guard. Spend,
        counts, raises and loop state carry over; the ordinals a run's trace numbers its calls
        and events by (call_seq, settle ranks, events seen, config revisions) start again."""
        self.terminated_by = None
        self.calls_seen = self.calls_settled = self.events_seen = 0
        self.loop_approved_until = 0  # numbered by call_seq, which starts again
        self.config_rev = 0

    def carry_over(self, carried: Mapping[str, Any]) -> None:
        """Replay of a resumed run: start from the counts its RUN_START says the session carried
        over (`carried_over`: cost_usd, tokens, llm_calls, tool_calls, events, raised). The loop
        detector's state is not recorded: it starts empty."""
        budget = self.budget
        budget.cost_usd = float(carried.get("cost_usd") or 0.0)
        budget.tokens = int(carried.get("tokens") or 0)
        budget.llm_calls = int(carried.get("llm_calls") or 0)
        budget.tool_calls = int(carried.get("tool_calls") or 0)
        budget.events = int(carried.get("events") or 0)
        raised = carried.get("raised")
        if isinstance(raised, Mapping) and raised:
            self.raise_limits({str(k): float(v) for k, v in raised.items()})

    def _configure_budget(self) -> None:
        config = self.config
        if self._raised:
            self.budget.configure(*raised_sections(config, self._raised))
        else:
            self.budget.configure(config.budget, config.limits, config.loop_detection.max_steps)

    @property
    def shadow(self) -> bool:
        return self.config.in_shadow

    def next_settle(self) -> int:
        """The rank of the answer being settled now (1, 2, ...), recorded for replay."""
        self.calls_settled += 1
        return self.calls_settled

    # -- LLM calls -------------------------------------------------------------------------------

    def before_llm_call(
        self,
        steps: Sequence[Sequence[HistoryCall]],
        turn_start: int,
        tool_results: HistoryResults,
        *,
        estimate_usd: float,
        now: float,
        estimate_tokens: int = 0,
        event_ids: Mapping[str, str] | None = None,
        reading: object = None,
        read_from: object = None,
        echo: Echo | None = None,
    ) -> Verdict:
        """Before forwarding an LLM request: its history's tool calls, then budgets and limits.

        Pass `LLMRequest.steps`, `.turn_start` and `.tool_results` as they are (ToolCall /
        ToolResult objects), or tuples (tool_call_id, name, arguments) and a mapping
        tool_call_id -> (result fingerprint, error text or None). `event_ids` (tool_call_id ->
        TOOL_CALL event id) makes a LOOP_WARNING's evidence event ids. `reading` / `read_from`:
        this history's name and that of the one it goes on from (`LoopDetector.check_llm_history`).
        `echo`: the same reply to the same nudge at the conversation's end (`replies.repeated_reply`).
        """
        decisions = self.loop.check_llm_history(
            steps, turn_start, tool_results, now, event_ids, reading=reading, read_from=read_from, echo=echo
        )
        if self.loop.new_history_calls:
            self.budget.count_history_tool_calls(self.loop.new_history_calls)
        tools = self.config.tools
        if tools.restricts and self.loop.new_call_names:
            # the agent ran a tool it may not (it was not offered, SPEC §9): the first such call decides
            found = history_permission(tools, self.loop.new_call_names)
            if found is not None:
                decisions = [*decisions, found]
        return self._admit("llm", decisions, estimate_usd, estimate_tokens, now)

    def after_llm_call(
        self, reservation: Reservation | None, *, cost_usd: float, tokens: int, now: float
    ) -> list[Decision]:
        """The answer came (or broke after reaching the upstream): settle to its real cost."""
        decisions = self.budget.settle(reservation, cost_usd, tokens, now)
        return self._count(decisions) if decisions else decisions  # (most settles conclude nothing)

    # -- MCP tool calls --------------------------------------------------------------------------

    def before_tool_call(
        self,
        tool: str,
        args: Any,
        *,
        now: float,
        server: str | None = None,
        estimate_usd: float = 0.0,
    ) -> Verdict:
        """Before forwarding an MCP `tools/call`: its permission, loop patterns (the attempt counts),
        then limits. `server`: the MCP server, whose `SERVER__TOOL` the permissions name (SPEC §9)."""
        tools = self.config.tools
        if tools.restricts:
            found = tool_permission(tools, qualified_tool_name(server, tool))
            if found is not None and found.action is Action.BLOCK:
                return self._admit("tool", [found], estimate_usd, 0, now)  # never an attempt
            if found is not None:
                decisions = self.loop.check_tool_call(
                    tool, args, now, server=server, enforced=not self.shadow
                )
                return self._admit("tool", [*decisions, found], estimate_usd, 0, now)
        decisions = self.loop.check_tool_call(tool, args, now, server=server, enforced=not self.shadow)
        return self._admit("tool", decisions, estimate_usd, 0, now)

    def after_tool_call(
        self,
        reservation: Reservation | None,
        tool: str,
        args: Any,
        *,
        result_fingerprint: str,
        error: str | None,
        now: float,
        event_id: str | None = None,
        cost_usd: float = 0.0,
    ) -> list[Decision]:
        """The tool answered: settle, and remember the result for retry / no-progress patterns.

        `error` is the failure as text (JSON-RPC error message, or the text of an `isError`
        result) so identical failures compare equal; `result_fingerprint` a hash of the result.
        """
        self.loop.record_tool_result(tool, args, result_fingerprint, error, now, event_id=event_id)
        return self._count(self.budget.settle(reservation, cost_usd, 0, now))

    def release(self, reservation: Reservation | None) -> None:
        """The admitted call never reached the upstream (another guard refused it, connect failed)."""
        self.budget.release(reservation)

    # -- events ----------------------------------------------------------------------------------

    def observe_event(self, event_type: str, name: str, event_id: str) -> Decision | None:
        """Call for every event written to the session's trace, after writing it."""
        self.events_seen += 1
        self.budget.count_event()
        if event_type not in CYCLE_EVENTS:
            return None
        d = self.loop.observe_event(event_type, name, event_id)
        if d is not None:
            self._count([d])
        return d

    # -- helpers ---------------------------------------------------------------------------------

    def _admit(
        self, kind: CallKind, decisions: list[Decision], estimate_usd: float, estimate_tokens: int, now: float
    ) -> Verdict:
        self.calls_seen += 1
        if self.calls_seen <= self.loop_approved_until:
            decisions = [approved(d) for d in decisions]
        shadow = self.config.in_shadow
        verdict = Verdict(list(decisions), None, self.calls_seen, shadow)
        if verdict.refused and not shadow:
            # refused by a loop guard: the budget still says whether it would have stopped it too,
            # without reserving anything
            refusal = self.budget.refusal(kind, now)
            if refusal is not None:
                verdict.decisions.append(refusal)
        else:
            decision, reservation = self.budget.check(
                kind, estimate_usd, now, estimate_tokens=estimate_tokens, reserve_anyway=shadow
            )
            if decision is not ALLOW and decision.action is not Action.ALLOW:
                verdict.decisions.append(decision)
            verdict.reservation = reservation
        if verdict.decisions:
            self._count(verdict.decisions)
        return verdict

    def _count(self, decisions: list[Decision]) -> list[Decision]:
        for d in decisions:
            self.decision_counts[f"{d.guard}:{d.action.name.lower()}"] += 1
            if d.action is Action.TERMINATE and self.terminated_by is None and not self.shadow:
                self.terminated_by = d
        return decisions

    def stats(self, now: float | None = None) -> dict[str, Any]:
        """Loop Guard's get_stats() and the budget's counters, for the admin API."""
        loop = self.loop.stats(now)
        t = self.terminated_by
        return {
            "turn": loop["turn"],
            "turn_tool_counts": loop["turn_tool_counts"],
            "tool_counts": loop["tool_counts"],
            "decisions": dict(self._decision_counts or {}),
            "loop": loop,
            "budget": self.budget.stats(now),
            "terminated_by": None if t is None else {"guard": t.guard, "kind": t.kind, "message": t.message},
            "config": self.config.model_dump(mode="json"),
            "raised": dict(self.raised),
        }


def approved(decision: Decision) -> Decision:
    """A loop pattern's ASK within an approved loop: let through, recorded as a warning."""
    if decision.kind is not None and decision.action is Action.ASK:
        return replace(decision, action=Action.WARN)
    return decision


def tool_permission(tools: ToolsConfig, name: str) -> Decision | None:
    """A call of tool `name` (`SERVER__TOOL` for MCP): BLOCK when denied, ASK when it must be asked
    for (SPEC §9, §5.5a), None when allowed."""
    verdict = permission(tools, name)
    if verdict == "allow":
        return None
    if verdict == "deny":
        return Decision(
            Action.BLOCK,
            GUARD_TOOL_DENIED,
            f"tool {name!r} is not permitted for this agent",
            actual=name,
        )
    return Decision(Action.ASK, GUARD_TOOL_ASK, f"tool {name!r} needs a person's approval", actual=name)


def history_permission(tools: ToolsConfig, names: Sequence[str]) -> Decision | None:
    """An LLM request whose history brings calls of tools the permissions deny (or ask for): the
    strictest, the first of its kind."""
    asked: Decision | None = None
    for name in names:
        found = tool_permission(tools, name)
        if found is None:
            continue
        if found.action is Action.BLOCK:
            return Decision(
                Action.BLOCK,
                GUARD_TOOL_DENIED,
                f"the conversation shows a call of tool {name!r}, which is not permitted for this agent",
                actual=name,
            )
        asked = asked or found
    return asked


__all__ = ["ALLOW", "SessionGuards", "Verdict", "history_permission", "tool_permission"]
