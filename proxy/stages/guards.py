"""The guards in the pipeline: admission's checks (proxy/admission/, asked through `services.guards`:
the per-agent gates, then the session's `SessionGuards`: permissions, loop patterns, budgets,
limits; then the agent's budget windows), what they decided written, refusals answered.

A call the guards ask a person about is held by the next stage (proxy/stages/hold.py); the circuit
breaker runs after it, in its own stage (proxy/stages/breaker.py). A refusal sets `ex.answer` in the
client's own protocol (the protocol adapter renders it, SPEC §5.5). After the answer: settle the budget reservation, feed
results to the loop detector, give back what a gate held (a concurrent call's slot). The events
of SPEC §5.5's table are written here.
Fails open: a bug in a guard is logged and the call goes through (pipeline `fail_open`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any

import orjson

from proxy import guard_trace
from proxy.constants import (
    TAG_LOOP_DETECTED,
    TAG_SHADOW_FIRED,
    EventType,
)
from proxy.dialects.base import ParseState, ToolCall, ToolResult
from proxy.exchange import Exchange
from proxy.guard_backend import CallInputs, StateUnavailable
from proxy.guard_events import call_summary, guard_error, is_tool_call, loop_warning
from proxy.guards.decision import Action, Decision
from proxy.guards.describe import describe
from proxy.guards.loop.history import HistoryResults, results_from_index
from proxy.guards.loop.replies import repeated_reply
from proxy.guards.session import SessionGuards, Verdict
from proxy.llm import DEFAULT_RESERVED_COMPLETION_TOKENS, record_tool_results
from proxy.llm_trace import write_tool_result
from proxy.pipeline import BaseStage
from proxy.refusals import refuse, refuse_ended, refuse_unavailable, write_refusal_error
from proxy.sessions import Session

if TYPE_CHECKING:
    from proxy.services import Services

log = logging.getLogger("tripwire.guards")


def token_estimate(ex: Exchange) -> int:
    """Tokens an LLM call reserves against `max_tokens`: prompt estimate plus its max_tokens, as
    its USD reservation does, so concurrent calls cannot all slip past a token budget (SPEC §5.2)."""
    dialect = getattr(ex.protocol, "dialect", None)
    if dialect is None:
        return 0
    return int(dialect.estimate_prompt_tokens(ex.call)) + (
        ex.call.max_tokens or DEFAULT_RESERVED_COMPLETION_TOKENS
    )


def llm_guard_inputs(
    ex: Exchange, estimate: float
) -> tuple[list[list[ToolCall]], int, list[ToolResult] | HistoryResults, int, dict[str, Any]]:
    """An LLM call's history as the guards judge it (a Responses previous_response_id stands for
    its chain's), its token reservation, and what its event keeps of them for replay.

    A history the dialect read on from the session's previous request (`LLMRequest.continues`) is
    compared, and its results indexed, from there on only: the work grows with what is new."""
    call = ex.call
    session = ex.session
    assert session is not None
    conversation = session.conversation
    steps, turn_start = call.steps, call.turn_start
    results: list[ToolResult] | HistoryResults = call.tool_results
    state: ParseState | None = getattr(call, "parsed", None)
    known = 0
    if ex.history is not None:
        steps, turn_start, results = ex.history.steps, ex.history.turn_start, ex.history.results
        state = None
    elif state is not None:
        prior = call.continues
        if prior is not None and prior is conversation.guard_state:
            known = len(prior.steps)
        if state.tool_results:  # (no result, no index: the next request reading on builds the same one)
            results = results_from_index(state.results_by_id(prior))
    tokens = token_estimate(ex)
    inputs, conversation.guard_history = guard_trace.llm_inputs(
        conversation.guard_history, steps, turn_start, results, estimate, tokens, known=known
    )
    conversation.guard_state = state
    return steps, turn_start, results, tokens, inputs


def call_inputs(ex: Exchange, estimate: float, tool_call: bool) -> CallInputs:
    """What the guards judge of the call (read when the backend judges it)."""
    if tool_call:
        call = ex.call
        return CallInputs(
            estimate, guard_trace.mcp_inputs(call.tool_name, call.arguments, call.naming_server, estimate)
        )
    steps, turn_start, results, tokens, inputs = llm_guard_inputs(ex, estimate)
    echo = repeated_reply(ex.call.dialect, ex.call.messages)  # the model's own text, k times (issue 31)
    if echo is not None:
        inputs["echo"] = echo.record()
    return CallInputs(estimate, inputs, steps, turn_start, results, tokens, echo)


class GuardStage(BaseStage):
    name = "guards"
    fail_open = True

    def __init__(self, services: Services) -> None:
        self.services = services
        self.guards = services.guards  # where the guard state lives (proxy/guard_backend/)
        self.policy = services.policy
        self.expose = services.settings.expose_guard_details

    # --- before forwarding -------------------------------------------------------------------

    async def request(self, ex: Exchange) -> None:
        session = ex.session
        if ex.protocol is None or session is None:
            return
        tool_call = is_tool_call(ex)
        if tool_call and ex.protocol.continues(ex):
            # an MCP resend after `input_required`: the same call going on, admitted and counted once
            ex.guards_skipped = True
            return
        now = time.monotonic()
        estimate = ex.protocol.reservation_estimate(ex)
        try:
            admitted = await self.guards.admit(ex, lambda: call_inputs(ex, estimate, tool_call), now)
        except StateUnavailable:  # shared guard state unreachable under fail_closed
            refuse_unavailable(self.policy, ex, self.guards.retry_after_s())
            return
        if admitted.taken is not None:
            self.write_taken_tool_calls(ex, admitted.taken, admitted.asked)
        elif admitted.record_results:
            record_tool_results(ex, self.services)
        if admitted.refused is not None:  # by a gate of admission (proxy/admission/)
            self.refuse_gated(ex, admitted.refused)
            return
        if admitted.windows is not None:  # reserved in the admission's round trip (shared state)
            ex.window_hold = admitted.windows[1]  # (given back at the finish if the call is refused)
        if admitted.ended is not None:
            self.refuse_ended(ex, admitted.ended, elsewhere=admitted.elsewhere)
            return
        verdict, inputs = admitted.verdict, admitted.inputs
        assert verdict is not None and inputs is not None
        asked = self.apply(ex, admitted.guards, verdict, inputs.trace, admitted.seen, now)
        if asked is not None:  # held for a person by the next stage (proxy/stages/hold.py)
            ex.asked = (admitted.guards, asked, verdict.call_seq)
            return
        if verdict.refused and verdict.decision.action == Action.TERMINATE:
            self.guards.terminated(session, f"guard:{verdict.decision.guard}")
        if ex.answer is None and admitted.windows is not None:
            self.judge_windows(ex, admitted.guards, admitted.windows[0])
        elif ex.answer is None and admitted.guards.config.budget_windows:
            await self.admit_windows(ex, admitted.guards, inputs)

    async def admit_windows(self, ex: Exchange, guards: SessionGuards, inputs: CallInputs) -> None:
        """The agent's budgets over time, across its sessions (SPEC §9), reserved once the session's
        guards admitted the call (this process's windows; shared ones were reserved in the
        admission's round trip)."""
        session = ex.session
        assert session is not None
        try:
            refusal, ex.window_hold = await self.guards.windows.reserve(
                session.agent, guards.config, inputs.estimate, inputs.tokens, shadow=guards.shadow
            )
        except StateUnavailable:
            self.guards.give_back(guards, ex.reservation)
            ex.reservation = None
            refuse_unavailable(self.policy, ex, self.guards.retry_after_s())
            return
        self.judge_windows(ex, guards, refusal)

    def judge_windows(self, ex: Exchange, guards: SessionGuards, refusal: Decision | None) -> None:
        """A window's refusal is the budget refusal with `resets_at`; the session goes on (the agent
        may call again in the next window or after a reset)."""
        session = ex.session
        assert session is not None and ex.protocol is not None
        if refusal is None:
            return
        ex.decisions.append(refusal)
        self.services.metrics.observe_decision(refusal.guard, refusal.action.name, shadow=guards.shadow)
        if guards.shadow:  # recorded, refused nothing (SPEC §5.7)
            self.services.recorder.add_tags(session.run_id, TAG_SHADOW_FIRED)
            return
        self.guards.give_back(guards, ex.reservation)
        ex.reservation = None
        self.write_error(ex, refusal)
        self.services.recorder.add_tags(session.run_id, *refusal.tags)
        ex.answer = ex.protocol.render_refusal(
            ex, refusal, describe(refusal, self.services.settings.expose_guard_details)
        )

    def write_taken_tool_calls(self, ex: Exchange, taken: list[tuple[str, bytes]], asked: list[str]) -> None:
        """The TOOL_CALLs of the function-calling results this request brings (SPEC §4.1), written
        by the replica that sees the result, whichever replica saw the answer that asked for it."""
        session = ex.session
        assert session is not None
        by_id = {r.tool_call_id: r for r in ex.call.tool_results}
        for call_id in asked:
            session.conversation.pending_tool_calls.pop(call_id, None)  # the shared take decided
        for call_id, raw in taken:
            detail = orjson.loads(raw)
            tr = by_id.get(call_id)
            if tr is None:
                continue
            # observed already: its entry went into the log right before this request's check
            write_tool_result(
                ex,
                self.services,
                tr,
                str(detail.get("name")),
                detail.get("arguments"),
                float(detail.get("asked_at", ex.started_wall)),
                detail.get("llm_event_id"),
            )

    def apply(
        self,
        ex: Exchange,
        guards: SessionGuards,
        verdict: Verdict,
        inputs: dict[str, Any],
        seen: tuple[int, int],
        now: float,
    ) -> Decision | None:
        """What the guards decided, carried out: the trace, the events, a refusal or a warning.
        Returns the decision to ask a person about (ASK, not in shadow): the caller holds the call."""
        ex.guard_trace = self.trace(ex, guards, verdict, inputs, seen, now)
        ex.reservation = verdict.reservation
        if not verdict.decisions:
            return None  # nothing fired (most calls): no finding, no tag, nothing refused or warned
        ex.decisions.extend(verdict.decisions)
        self.write_findings(ex, verdict)
        if verdict.shadow:
            self.write_shadow_refusal(ex, verdict)
        if verdict.refused:
            self.guards.give_back(guards, ex.reservation)
            ex.reservation = None
            self.refuse(ex, verdict.decision, loop_events=bool(verdict.loop_findings))
            return None
        decision = verdict.decision
        if decision.action == Action.ASK and not verdict.shadow:
            return decision  # (an approved loop's asks are WARNs already: SessionGuards.approve_loop)
        self.warn_agent(ex, verdict)
        return None

    def write_state(self, session: Session, name: str, payload: dict[str, Any]) -> None:
        event_id = self.policy.write_event(session, EventType.STATE_UPDATE, name, payload)
        self.policy.observe_event(session, EventType.STATE_UPDATE, name, event_id)

    def trace(
        self,
        ex: Exchange,
        guards: SessionGuards,
        verdict: Verdict,
        inputs: dict[str, Any],
        seen: tuple[int, int],
        now: float,
    ) -> guard_trace.GuardTrace:
        """What the call's event keeps so a replay decides as the guards just did (SPEC §5.7)."""
        session = ex.session
        assert session is not None
        fields = guard_trace.begin(
            guards,
            session.started_mono,
            now,
            inputs,
            events_before=seen[0],
            settled_before=seen[1],
            config_rev=guards.config_rev,
            config_recorded=session.conversation.configs_recorded,
            dumps=self.services.recorder.config_dumps,
        )
        decisions = verdict.decisions
        fields["decisions"] = guard_trace.decision_list(decisions) if decisions else []
        tool = inputs["kind"] == "tool"
        # begin's values are numbers: with nothing decided, no config recorded and a plain call's
        # inputs, the fields are already as sanitize makes them (the record path takes them as they are)
        clean = not decisions and not tool and "config" not in fields and guard_trace.own_numbers(inputs)
        return guard_trace.GuardTrace(
            verdict.call_seq,
            fields,
            guards,
            session.started_mono,
            clean,
            tool,
            dumps=self.services.recorder.config_dumps,
        )

    def write_findings(self, ex: Exchange, verdict: Verdict) -> None:
        session = ex.session
        assert session is not None
        for d in verdict.decisions:
            self.services.metrics.observe_decision(d.guard, d.action.name, shadow=verdict.shadow)
        winner = verdict.decision
        for finding in verdict.loop_findings:
            name, payload = loop_warning(finding)
            if verdict.shadow:
                payload["shadow"] = True
            event_id = self.policy.write_event(session, EventType.LOOP_WARNING, name, payload)
            self.policy.observe_event(session, EventType.LOOP_WARNING, name, event_id)
            # the ERROR of a refusal points at the LOOP_WARNING of the decision that won
            if finding is winner:
                ex.guard_event_id = event_id
            if not verdict.shadow and not (verdict.refused and finding is winner):
                self.services.alerts.send(session, finding)  # a refusal alerts with its ERROR
        fired = verdict.loop_findings or any(d.action > Action.ALLOW for d in verdict.decisions)
        if verdict.shadow:
            if fired:
                self.services.recorder.add_tags(session.run_id, TAG_SHADOW_FIRED)
            return
        tags = set(verdict.tags)
        if verdict.loop_findings or any(d.kind for d in verdict.decisions if d.action > Action.ALLOW):
            tags.add(TAG_LOOP_DETECTED)
        if tags:
            self.services.recorder.add_tags(session.run_id, *sorted(tags))

    def write_shadow_refusal(self, ex: Exchange, verdict: Verdict) -> None:
        """Shadow mode: the ERROR enforce mode would write, marked shadow, once per streak; the call
        goes on untouched (SPEC §5.7)."""
        session = ex.session
        assert session is not None and session.guards is not None
        if not verdict.would_refuse:
            return
        decision = verdict.decision
        if decision.kind is not None:
            if not decision.new_finding:
                return
        elif decision.guard in session.guards.shadow_reported:
            return
        session.guards.shadow_reported.add(decision.guard)
        payload = guard_error(decision, call=call_summary(ex), shadow=True)
        event_id = self.policy.write_event(
            session, EventType.ERROR, decision.guard, payload, parent_id=ex.guard_event_id
        )
        self.policy.observe_event(session, EventType.ERROR, decision.guard, event_id)

    def warn_agent(self, ex: Exchange, verdict: Verdict) -> None:
        """A loop WARN lets the call through; an MCP result carries the warning as an extra text block."""
        decision = verdict.decision
        if verdict.shadow:
            return  # shadow alters nothing, not even with a warning
        if decision.action == Action.WARN and is_tool_call(ex):
            ex.call.append_text = describe(decision, self.services.settings.expose_guard_details)

    # --- refusing ----------------------------------------------------------------------------

    def refuse(self, ex: Exchange, decision: Decision, *, loop_events: bool, note: str = "") -> None:
        refuse(self.policy, ex, decision, expose=self.expose, loop_events=loop_events, note=note)

    def refuse_gated(self, ex: Exchange, decision: Decision) -> None:
        """Over a per-agent limit (SPEC §9: concurrent calls, a rate limit): retryable, the session
        goes on. An LLM call gets 429 + Retry-After (its SDK retries by itself), an MCP call the BLOCK
        result saying when."""
        protocol = ex.protocol
        assert protocol is not None
        ex.decisions.append(decision)
        self.services.metrics.observe_decision(decision.guard, decision.action.name)
        write_refusal_error(self.policy, ex, decision)
        text = describe(decision, self.services.settings.expose_guard_details)
        render = protocol.render_block if is_tool_call(ex) else protocol.render_refusal
        ex.answer = render(ex, decision, text)

    def refuse_ended(self, ex: Exchange, decision: Decision, *, elsewhere: bool) -> None:
        refuse_ended(self.policy, ex, decision, expose=self.expose, elsewhere=elsewhere)

    def write_error(self, ex: Exchange, decision: Decision) -> None:
        write_refusal_error(self.policy, ex, decision)

    # --- after the answer --------------------------------------------------------------------

    async def finish(self, ex: Exchange) -> None:
        session = ex.session
        try:
            if ex.window_hold is None:
                await self.guards.settle(ex, self.write_settled)
            else:  # the windows' round trip (shared state) overlaps the session's settle
                outcomes = await asyncio.gather(
                    self.guards.settle(ex, self.write_settled),
                    self.settle_windows(ex),
                    return_exceptions=True,
                )
                for outcome in outcomes:
                    if isinstance(outcome, BaseException):
                        raise outcome
        finally:
            if ex.admission_holds:  # a concurrent call's slot: given back however the call ended
                await self.guards.release(ex)
            if session is not None and session.terminated:
                self.policy.end_if_pending(session)  # its RUN_END follows the calls that were in flight

    async def settle_windows(self, ex: Exchange) -> None:
        """The call's hold on its agent's budgets over time: its real cost, or given back when it was
        never forwarded; a soft alert crossed is a STATE_UPDATE and the webhook, once per window."""
        session, hold = ex.session, ex.window_hold
        assert session is not None and hold is not None
        ex.window_hold = None
        windows = self.guards.windows
        try:
            if ex.refused or not ex.forwarded:
                await windows.release(session.agent, hold)
                return
            config = self.guards.config(session.agent)
            tool = is_tool_call(ex)
            cost = 0.0 if tool else float(ex.cost_usd)
            alerts = await windows.settle(session.agent, config, hold, cost, 0 if tool else int(ex.tokens))
        except StateUnavailable:
            log.warning("budget_windows.settle_unavailable agent=%s", session.agent)
            return
        shadow = config.in_shadow
        for d in alerts:
            self.services.metrics.observe_decision(d.guard, d.action.name, shadow=shadow)
            if session.ended:
                continue
            self.services.recorder.add_tags(session.run_id, *(d.tags if not shadow else (TAG_SHADOW_FIRED,)))
            event_id = self.policy.write_event(
                session,
                EventType.STATE_UPDATE,
                "state",
                {
                    "state": {"budget_window": {"spent": d.actual, "soft_alert": d.threshold}},
                    "diff": {"budget_warning": True},
                    "guardrail": d.guard,
                    "message": d.message,
                    "resets_at": d.resets_at,
                    **({"shadow": True} if shadow else {}),
                },
            )
            self.policy.observe_event(session, EventType.STATE_UPDATE, "state", event_id)
            if not shadow:
                self.services.alerts.send(session, d)

    def write_settled(self, session: Session, guards: SessionGuards, decisions: list[Decision]) -> None:
        """What settling concluded (the soft budget alert): a STATE_UPDATE, tags, the alert."""
        for d in decisions:
            self.services.metrics.observe_decision(d.guard, d.action.name, shadow=guards.shadow)
            if d.tags:
                self.services.recorder.add_tags(
                    session.run_id, *(d.tags if not guards.shadow else (TAG_SHADOW_FIRED,))
                )
            event_id = self.policy.write_event(
                session,
                EventType.STATE_UPDATE,
                "state",
                {
                    "state": {"budget": {"cost_usd": d.actual, "soft_alert_threshold_usd": d.threshold}},
                    "diff": {"budget_warning": True},
                    "guardrail": d.guard,
                    "message": d.message,
                    **({"shadow": True} if guards.shadow else {}),
                },
            )
            self.policy.observe_event(session, EventType.STATE_UPDATE, "state", event_id)
            if not guards.shadow:
                self.services.alerts.send(session, d)
