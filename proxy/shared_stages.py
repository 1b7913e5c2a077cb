"""The guard and breaker stages when replicas share guard state (`--state`, docs/scaling.md).

Same decisions, same events, same answers as `GuardStage` / `BreakerStage`; what changes is where
the state lives. Before forwarding, the call's check goes into its run's shared guard log and its
circuit is admitted, in ONE round trip (proxy/state/shared.py); the verdict is read from this
replica's copy of the run's guards once it has applied everything the log holds before the check.
After the answer, the settle (and the function-calling tool calls the answer asked for) is appended
in a second round trip, overlapping the relay: the answer's end (its last bytes, or a stream's clean
end) reaches the client only once the log has it, so replicas decide exactly as one process however
fast the agent's calls come (SPEC §8, docs/scaling.md).

Backend unreachable: `fail_open` decides from this replica's copy (and its own circuits);
`fail_closed` refuses with guard code `state_unavailable` (503 + Retry-After, in the protocol's
error shape; a JSON-RPC error for MCP).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import orjson

from proxy import episodes, guard_trace
from proxy.breaker_stage import BreakerStage
from proxy.constants import EventType
from proxy.exchange import Exchange
from proxy.guard_events import is_tool_call, refuse_unavailable
from proxy.guard_stage import GuardStage, llm_guard_inputs
from proxy.guards.budget import Reservation
from proxy.guards.decision import Action, Decision
from proxy.guards.describe import describe
from proxy.guards.session import SessionGuards
from proxy.guards.signatures import signature
from proxy.llm import ToolResultsStage, record_tool_results, write_tool_result
from proxy.responses_chain import link_blob, link_from_blob, synthetic_id_of
from proxy.responses_stage import ResponsesChainStage, is_responses
from proxy.sessions import Session
from proxy.state import entries, keys
from proxy.state.base import BreakerAdmission, BreakerRequest, PendingCall, StateUnavailable
from proxy.state.replica import Applied

if TYPE_CHECKING:
    from proxy.engine import Engine
    from proxy.state.service import SharedState


CHAIN_FETCH_LIMITS = (8, 256, 2048)  # links fetched per round trip, growing while the gap lasts


class SharedResponsesChainStage(ResponsesChainStage):
    """`ResponsesChainStage` with the chains shared: a request continuing a response another replica
    answered (or blocked) gets that chain's links from the backend first; each answer's link is shared
    as soon as the client has it, so the replica that gets the next request judges the whole history
    and rewrites a synthetic parent as this one would."""

    def __init__(self, engine: Engine) -> None:
        super().__init__()
        self.engine = engine

    @property
    def shared(self) -> SharedState:
        shared = self.engine.shared
        assert shared is not None
        return shared

    async def request(self, ex: Exchange) -> None:
        if ex.protocol is not None and ex.session is not None and is_responses(ex):
            await self.fetch_missing(ex.session.agent, ex.call.previous_response_id)
        await super().request(ex)

    async def fetch_missing(self, agent: str, previous_response_id: str | None) -> None:
        """Links of the chain this replica lacks, newest first; usually only the last answer (another
        replica's), so a few at a time first, more when the gap is longer."""
        for limit in CHAIN_FETCH_LIMITS:
            missing = self.chains.missing(agent, previous_response_id)
            if missing is None:
                return
            fetched = await self.shared.chain(agent, missing, limit)
            for response_id, blob in reversed(fetched):  # oldest first: each finds its parent
                link = link_from_blob(blob, None)
                link.parent = self.chains.get(agent, link.parent_id)
                self.chains.remember(agent, response_id, link)
            if len(fetched) < limit:
                return  # the rest of the chain is not shared (expired, or before shared state)

    async def finish(self, ex: Exchange) -> None:
        response_id = self.continue_chain(ex)
        if response_id is None or ex.session is None:
            return
        agent = ex.session.agent
        link = self.chains.links.get((agent, response_id))
        if link is not None:
            await self.shared.share_link(agent, response_id, link_blob(link), link.parent_id)


class SharedToolResultsStage(ToolResultsStage):
    """With shared state the function-calling results a request brings are matched to the calls
    that asked for them in the guard stage's round trip (their TOOL_CALL entries go into the run's
    guard log right before the request's check, as this stage's events precede it in one process);
    the guard stage then writes them. Nothing to do here."""

    async def request(self, ex: Exchange) -> None:
        return None


class SharedGuardStage(GuardStage):
    """`GuardStage` over the run's shared guard log."""

    @property
    def shared(self) -> SharedState:
        shared = self.engine.shared
        assert shared is not None
        return shared

    def breaker_request(self, ex: Exchange, agent: str) -> BreakerRequest | None:
        config = self.shared.effective_config(agent).circuit_breaker
        if not config.enabled:
            return None
        return BreakerRequest(agent, f"{ex.route.kind}:{ex.route.upstream}", config)

    # --- before forwarding -------------------------------------------------------------------

    async def request(self, ex: Exchange) -> None:
        session = ex.session
        if ex.protocol is None or session is None:
            return
        if is_tool_call(ex) and ex.protocol.continues(ex):
            ex.guards_skipped = True  # an MCP resend after `input_required`: admitted once already
            return
        shared = self.shared
        now = time.monotonic()
        channel = shared.guards.channel(session.agent, session.run_id)
        estimate = ex.protocol.reservation_estimate(ex)
        conversation = session.conversation
        cid = entries.check_id()
        take: list[str] = []
        call = ex.call
        if is_tool_call(ex):
            inputs = guard_trace.mcp_inputs(call.tool_name, call.arguments, ex.route.upstream, estimate)
            check = entries.tool_check(cid, call.tool_name, call.arguments, ex.route.upstream, estimate)
        else:
            steps, turn_start, results, tokens, inputs = llm_guard_inputs(ex, estimate)
            check = entries.llm_check(cid, steps, turn_start, results, estimate, tokens)
            # results whose TOOL_CALL is not written yet: the call that asked for them may have been
            # answered by any replica, so the shared pending calls decide
            take = [
                r.tool_call_id for r in call.tool_results if r.tool_call_id not in conversation.tool_event_ids
            ]
        alive, links = shared.slots(session)
        try:
            admission = await channel.admit(
                check,
                take=take,
                event_ids=conversation.tool_event_ids,
                keep_alive=alive,
                links=links,
                breaker=self.breaker_request(ex, session.agent),
            )
        except StateUnavailable:
            refuse_unavailable(self.engine, ex, shared.link.retry_after_s())
            return
        guards = channel.replica.guards
        assert guards is not None
        session.guards = guards  # stats, the breaker's config, the trace read this replica's copy
        ex.shared_check = cid
        ex.hold_end = True  # the answer ends once its settle is in the shared log (settle below)
        ex.breaker_admission = admission.breaker
        if not is_tool_call(ex):
            if admission.shared:
                self.write_taken_tool_calls(ex, admission.taken, take)
            else:
                record_tool_results(ex, self.engine)  # backend down: the calls this replica asked for
        applied = admission.applied
        if applied.ended_by is not None:
            self.refuse_ended_elsewhere(ex, applied.ended_by)
            return
        verdict = applied.verdict
        assert verdict is not None
        self.apply(ex, guards, verdict, inputs, (applied.events_before, applied.settled_before), now)
        if verdict.refused and verdict.decision.action == Action.TERMINATE:
            shared.terminate(session, f"guard:{verdict.decision.guard}")

    def give_back(self, guards: SessionGuards, reservation: Reservation | None) -> None:
        """Nothing to give back: the replica did when it applied the refusal (every replica does)."""

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
                self.engine,
                tr,
                str(detail.get("name")),
                detail.get("arguments"),
                float(detail.get("asked_at", ex.started_wall)),
                detail.get("llm_event_id"),
            )

    def refuse_ended_elsewhere(self, ex: Exchange, decision: Decision) -> None:
        """The session ended (on this replica or another): refused like every later call; this
        replica's copy of the run ends too."""
        session = ex.session
        assert session is not None and ex.protocol is not None
        ex.shared_check = None  # never judged: nothing to settle
        self.engine.metrics.observe_decision(decision.guard, decision.action.name)
        ex.answer = ex.protocol.render_refusal(
            ex, decision, describe(decision, self.engine.settings.expose_guard_details)
        )
        if not session.terminated:
            self.engine.terminate_session(session, reason=f"guard:{decision.guard}", tag=None)

    # --- after the answer --------------------------------------------------------------------

    async def settle(self, ex: Exchange) -> None:
        session = ex.session
        cid = ex.shared_check
        if ex.protocol is None or session is None or ex.guards_skipped or cid is None:
            return
        shared = self.shared
        channel = shared.guards.channel(session.agent, session.run_id)
        if ex.guard_trace is not None:
            guard_trace.mark_settled(ex, ex.guard_trace, time.monotonic())
        put: dict[str, PendingCall] = {}
        signatures: list[str] = []
        links: dict[str, str] = {}
        if ex.refused or not ex.forwarded:
            body = entries.release(cid)
            if is_tool_call(ex) and ex.refused:
                signatures.append(signature(ex.call.tool_name, ex.call.arguments))  # as write_refusal_error
            synthetic = (
                synthetic_id_of(ex.answer.body) if ex.answer is not None and not is_tool_call(ex) else None
            )
            if synthetic:
                links = shared.response_link(session, synthetic)
        elif is_tool_call(ex):
            result = ex.result
            failed = result is not None and result.status == "error"
            fingerprint = (result.fingerprint or "") if result is not None else ""
            body = entries.settle_tool(cid, fingerprint, result.error_text if failed and result else None)
            if ex.tool_event_id is not None:
                signatures.append(signature(ex.call.tool_name, ex.call.arguments))
        else:
            body = entries.settle_llm(cid, float(ex.cost_usd), int(ex.tokens))
            result = ex.result
            if result is not None:
                put = pending_calls(session, result, ex.llm_event_id)
                if result.response_id:
                    links = shared.response_link(session, result.response_id)
        if not session.explicit and session.lineage.announced is None:
            # the conversation's next request, on any replica, finds this run by the answer (SPEC §3)
            given = episodes.given_answer_key(ex.call, ex.result if ex.forwarded else None, ex.block_text)
            if given is not None:
                links = {**links, keys.slot_history(session.agent, given.hex()): session.run_id}
        # awaited: the handler ends the answer after this, so whichever replica the agent's next
        # call reaches judges it with this one (SPEC §8)
        await channel.settle(
            body, put=put, signatures=signatures, links=links, on_applied=lambda a: self.settled(session, a)
        )

    def settled(self, session: Session, applied: Applied) -> None:
        """What settling concluded (the soft budget alert), once this replica applied it."""
        guards = session.guards
        if guards is None or session.ended:
            return
        self.write_settled(session, guards, list(applied.decisions))


def pending_calls(session: Session, result: Any, llm_event_id: str | None) -> dict[str, PendingCall]:
    """The tool calls an answer asked for, shared so the replica that gets their results records them
    (and drops one already recorded as an MCP call: its signatures)."""
    out: dict[str, PendingCall] = {}
    for tc in getattr(result, "tool_calls", None) or []:
        if tc.hosted:  # recorded with its answer (record_hosted_calls): no result will come for it
            continue
        local = session.conversation.pending_tool_calls.get(tc.id)
        detail = {
            "name": tc.name,
            "arguments": tc.arguments,
            "asked_at": local.asked_at if local is not None else time.time(),
            "llm_event_id": llm_event_id,
        }
        out[tc.id] = PendingCall(
            entries.event(EventType.TOOL_CALL, tc.name, f"tool-call:{tc.id}"),
            (signature(tc.name, tc.arguments), signature(tc.name.split("__", 1)[-1], tc.arguments)),
            orjson.dumps(detail),
        )
    return out


class SharedBreakerStage(BreakerStage):
    """`BreakerStage` with the circuit admitted in the guard stage's round trip (shared by replicas)."""

    async def request(self, ex: Exchange) -> None:
        admission: BreakerAdmission | None = ex.breaker_admission
        if admission is None:
            await super().request(ex)  # not admitted through the shared state: this replica's circuits
            return
        if self.breaker_for(ex) is None:
            return
        ex.breaker_ticket = admission.ticket
        if admission.ticket is not None and admission.ticket.transition is not None:
            self.write_transition(ex, admission.ticket.transition)
        if admission.refusal is not None:
            self.refuse(ex, admission.refusal)

    def refuse(self, ex: Exchange, decision: Decision) -> None:
        if ex.breaker_admission is not None:
            ex.reservation = None  # given back through the shared log when the guard stage settles
        super().refuse(ex, decision)

    async def finish(self, ex: Exchange) -> None:
        admission: BreakerAdmission | None = ex.breaker_admission
        ticket = ex.breaker_ticket
        if admission is None or ticket is None:
            await super().finish(ex)
            return
        session = ex.session
        shared = self.engine.shared
        if session is None or shared is None:
            return
        upstream = f"{ex.route.kind}:{ex.route.upstream}"
        config = shared.effective_config(session.agent).circuit_breaker
        if ex.refused or not ex.forwarded:
            if ticket.trial:  # never reached the upstream: the trial slot goes back
                shared.spawn(
                    shared.link.call(lambda: shared.backend.breaker_release(session.agent, upstream, ticket)),
                    "breaker_release",
                )
            return
        failed = ex.upstream_failed() or (
            is_tool_call(ex) and ex.result is not None and bool(ex.result.upstream_failure)
        )
        if not failed and not ticket.trial and admission.failures == 0:
            return  # a success of a closed circuit with no failures changes nothing
        try:
            transition = await shared.link.call(
                lambda: shared.backend.breaker_report(session.agent, upstream, ticket, config, failed=failed)
            )
        except StateUnavailable:
            return
        if transition is not None:
            self.write_transition(ex, transition)
