"""`SharedGuardBackend`: the guard state in the run's shared guard log (several replicas,
docs/scaling.md); see the package's docstring for the round trips."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import orjson

from proxy import episodes
from proxy.admission import GATES, Gate, Hold, breaker, budget_window
from proxy.admission.breaker import BreakerAdmission, BreakerRequest
from proxy.constants import EventType
from proxy.episodes import Episode
from proxy.exchange import Exchange
from proxy.guard_backend.contract import CHAIN_FETCH_LIMITS, Admitted, CallInputs, OnCycle, OnSettled
from proxy.guard_backend.shared_windows import SharedWindows
from proxy.guard_backend.windows import LocalWindows, WindowBook
from proxy.guard_events import is_tool_call
from proxy.guard_log import entries
from proxy.guard_log.replica import Applied
from proxy.guard_log.service import SharedState
from proxy.guard_trace import mark_settled
from proxy.guards.breaker import Ticket, Transition
from proxy.guards.budget import Reservation
from proxy.guards.config import GuardConfig
from proxy.guards.raises import validate_raise
from proxy.guards.session import SessionGuards
from proxy.guards.signatures import signature
from proxy.responses_chain import ResponsesChains, link_blob, link_from_blob, synthetic_id_of
from proxy.sessions import Session, SessionManager
from proxy.state import keys
from proxy.state.base import LogEntry, PendingCall, StateUnavailable, Twin

log = logging.getLogger("tripwire.state")


class SharedGuardBackend:
    """The guard state in the run's shared guard log (several replicas, docs/scaling.md)."""

    results_at_admit = True

    def __init__(self, state: SharedState, windows: WindowBook | None = None) -> None:
        self.state = state
        self.windows: WindowBook = windows if windows is not None else LocalWindows(None)
        # shared budget windows are reserved in the admission's round trip (`admit`)
        self.in_admission = windows if isinstance(windows, SharedWindows) else None

    async def start(self) -> None:
        await self.state.start()
        await self.windows.start()

    async def close(self) -> None:
        await self.windows.close()
        await self.state.close()

    async def keep_alive(self, sessions: SessionManager, now: float) -> None:
        await self.state.keep_alive(sessions, now)  # runs live on another replica stay open here too

    def health(self) -> dict[str, Any] | None:
        return self.state.health()  # never fails readiness (SPEC §6, §8)

    def retry_after_s(self) -> float:
        return self.state.link.retry_after_s()

    def config(self, agent: str) -> GuardConfig:
        return self.state.guard_store.effective(agent)[0]

    async def resolve_run(
        self,
        sessions: SessionManager,
        agent: str,
        explicit_id: str | None,
        episode: Episode | None,
        now: float,
    ) -> str | None:
        """The run all replicas use for the session (`TERMINATED`: refused)."""
        return await self.state.run_for(sessions, agent, explicit_id, episode, now)

    def observe(self, session: Session, event_type: str, name: str, event_id: str, on_cycle: OnCycle) -> None:
        self.state.observe(session, event_type, name, event_id, on_cycle)  # in the log's order

    def ended(self, session: Session) -> None:
        self.state.ended(session)

    def terminated(self, session: Session, reason: str, *, kill: bool = False) -> None:
        self.state.terminate(session, reason, kill=kill)  # every replica refuses the session's calls

    async def fetch_chain(
        self, chains: ResponsesChains, agent: str, previous_response_id: str | None
    ) -> None:
        """Links of the chain this replica lacks, newest first; usually only the last answer (another
        replica's), so a few at a time first, more when the gap is longer."""
        for limit in CHAIN_FETCH_LIMITS:
            missing = chains.missing(agent, previous_response_id)
            if missing is None:
                return
            fetched = await self.state.chain(agent, missing, limit)
            for response_id, blob in reversed(fetched):  # oldest first: each finds its parent
                link = link_from_blob(blob, None)
                link.parent = chains.get(agent, link.parent_id)
                chains.remember(agent, response_id, link)
            if len(fetched) < limit:
                return  # the rest of the chain is not shared (expired, or before shared state)

    async def share_chain(self, chains: ResponsesChains, agent: str, response_id: str) -> None:
        """Each answer's link is shared as soon as the client has it, so the replica that gets the
        next request judges the whole history and rewrites a synthetic parent as this one would."""
        link = chains.links.get((agent, response_id))
        if link is not None:
            await self.state.share_link(agent, response_id, link_blob(link), link.parent_id)

    def breaker_request(self, ex: Exchange, agent: str) -> BreakerRequest | None:
        config = self.state.effective_config(agent).circuit_breaker
        if not config.enabled:
            return None
        return BreakerRequest(agent, f"{ex.route.kind}:{ex.route.upstream}", config)

    async def admit(self, ex: Exchange, inputs: Callable[[], CallInputs], now: float) -> Admitted:
        session = ex.session
        assert session is not None
        shared = self.state
        channel = shared.guards.channel(session.agent, session.run_id)
        conversation = session.conversation
        cid = entries.check_id()
        take: list[str] = []
        call = ex.call
        # what the call's event records is a delta from the conversation's previous request: kept
        # to put back if a rate limit refuses the call (its ERROR records no guard inputs)
        before = (conversation.guard_history, conversation.guard_state)
        judged = inputs()
        if is_tool_call(ex):
            check = entries.tool_check(
                cid, call.tool_name, call.arguments, call.naming_server, judged.estimate
            )
        else:
            check = entries.llm_check(
                cid,
                judged.steps,
                judged.turn_start,
                judged.results,
                judged.estimate,
                judged.tokens,
                judged.echo,
            )
            # results whose TOOL_CALL is not written yet: the call that asked for them may have been
            # answered by any replica, so the shared pending calls decide
            take = [
                r.tool_call_id for r in call.tool_results if r.tool_call_id not in conversation.tool_event_ids
            ]
        alive, links = shared.slots(session)
        config = self.config(session.agent)
        # what the admission's checks ask of their twins, in the list's order (proxy/admission/):
        # the gates, then the budget windows and the circuit, all answered in this one round trip
        checks: list[tuple[Twin, Any]] = []
        gates: dict[str, tuple[Gate, Any]] = {}
        for _, gate in GATES:
            request = gate.ask(ex, config, cid)
            if request is not None:
                checks.append((gate.twin, request))
                gates[gate.twin.name] = (gate, request)
        pending = None
        if self.in_admission is not None and config.budget_windows:
            pending = self.in_admission.prepare(
                session.agent, config, judged.estimate, judged.tokens, shadow=config.in_shadow
            )
            checks.append((budget_window.TWIN, pending.request))
        circuit = self.breaker_request(ex, session.agent)
        if circuit is not None:
            checks.append((breaker.TWIN, circuit))
        admission = await channel.admit(  # StateUnavailable under fail_closed: the stage refuses
            check,
            take=take,
            event_ids=conversation.tool_event_ids,
            keep_alive=alive,
            links=links,
            checks=checks,
        )
        answers = admission.answers
        for name, (gate, request) in gates.items():  # what an admitting gate holds goes at the end
            if gate.release is not None and name in answers and name != admission.refused_by:
                ex.admission_holds = (*ex.admission_holds, Hold(gate.release, request, admission.shared))
        if admission.refused_by is not None:
            # refused by a gate before it was appended: no call of the session, nothing to settle
            # (its results are taken by the retry that goes through)
            conversation.guard_history, conversation.guard_state = before
            guards = channel.replica.guards
            if guards is None:  # the session's first call: no guard state anywhere yet
                guards = SessionGuards(config, started_at=session.started_mono)
            gate, request = gates[admission.refused_by]
            return Admitted(guards, refused=gate.refusal(request, answers[admission.refused_by]))
        assert admission.applied is not None
        guards = channel.replica.guards
        assert guards is not None
        session.guards = guards  # stats, the breaker's config, the trace read this replica's copy
        ex.shared_check = cid
        ex.hold_end = True  # the answer ends once its settle is in the shared log (`settle`)
        ex.breaker_admission = answers.get(breaker.TWIN.name)
        admitted = Admitted(guards, asked=take)
        if pending is not None and self.in_admission is not None:
            # (the hold is given back at the settle when the session's guards refuse the call)
            admitted.windows = self.in_admission.decide(
                pending, answers.get(budget_window.TWIN.name) if admission.shared else None
            )
        if not is_tool_call(ex):
            if admission.shared:
                admitted.taken = admission.taken
            else:
                admitted.record_results = True  # backend down: the calls this replica asked for
        applied = admission.applied
        if applied.ended_by is not None:
            ex.shared_check = None  # never judged: nothing to settle
            admitted.ended, admitted.elsewhere = applied.ended_by, True
            return admitted
        admitted.verdict = applied.verdict
        admitted.inputs = judged
        admitted.seen = (applied.events_before, applied.settled_before)
        return admitted

    def give_back(self, guards: SessionGuards, reservation: Reservation | None) -> None:
        """Nothing to give back: the replica did when it applied the refusal (every replica does)."""

    async def settle(self, ex: Exchange, on_settled: OnSettled) -> None:
        session = ex.session
        cid = ex.shared_check
        if ex.protocol is None or session is None or ex.guards_skipped or cid is None:
            return
        shared = self.state
        channel = shared.guards.channel(session.agent, session.run_id)
        if ex.guard_trace is not None:
            mark_settled(ex, ex.guard_trace, time.monotonic())
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

        def settled(applied: Applied) -> None:
            """What settling concluded (the soft budget alert), once this replica applied it."""
            guards = session.guards
            if guards is None or session.ended:
                return
            decisions = list(applied.decisions)
            if decisions:
                on_settled(session, guards, decisions)

        if not session.explicit and session.lineage.announced is None:
            # the conversation's next request, on any replica, finds this run by the answer (SPEC §3)
            given = episodes.given_answer_key(ex.call, ex.result if ex.forwarded else None, ex.block_text)
            if given is not None:
                links = {**links, keys.slot_history(session.agent, given.hex()): session.run_id}
        # awaited: the handler ends the answer after this, so whichever replica the agent's next
        # call reaches judges it with this one (SPEC §8)
        await channel.settle(body, put=put, signatures=signatures, links=links, on_applied=settled)

    async def release(self, ex: Exchange) -> None:
        """Given back where it was taken: in the backend (a failure is logged; the hold's lease ends
        it), or in this replica's memory (taken while the backend was down, fail_open)."""
        holds, ex.admission_holds = ex.admission_holds, ()
        shared = self.state
        for hold in holds:
            if not hold.shared:
                hold.op.memory(shared.guards.local, hold.request, time.monotonic())
                continue
            op, request = hold.op, hold.request
            try:
                await shared.link.call(lambda: shared.backend.run(op, request))  # noqa: B023 (awaited here)
            except StateUnavailable:
                log.warning("admission.release_unavailable op=%s: its lease ends it", hold.op.name)

    async def circuit_release(self, ex: Exchange, ticket: Ticket) -> None:
        """A trial ticket of a call that never reached the upstream goes back (off the response path)."""
        session = ex.session
        assert session is not None
        shared = self.state
        upstream = f"{ex.route.kind}:{ex.route.upstream}"
        shared.spawn(
            shared.link.call(lambda: breaker.twin.release(shared.backend, session.agent, upstream, ticket)),
            "breaker_release",
        )

    async def circuit_report(
        self, ex: Exchange, admission: BreakerAdmission, ticket: Ticket, *, failed: bool
    ) -> Transition | None:
        session = ex.session
        assert session is not None
        if not failed and not ticket.trial and admission.failures == 0:
            return None  # a success of a closed circuit with no failures changes nothing
        shared = self.state
        upstream = f"{ex.route.kind}:{ex.route.upstream}"
        config = shared.effective_config(session.agent).circuit_breaker
        try:
            return await shared.link.call(
                lambda: breaker.twin.report(
                    shared.backend, session.agent, upstream, ticket, config, failed=failed
                )
            )
        except StateUnavailable:
            return None

    async def raise_limits(self, session: Session, raised: Any, now: float) -> dict[str, float]:
        """Validated against this replica's copy of the run's guards once what it queued is in the
        log, then appended: every replica (and a repair of the log) applies it in log order."""
        channel = self.state.guards.channel(session.agent, session.run_id)
        await channel.flush()
        replica = channel.replica
        # an ended run's channel is forgotten: a fresh one has applied nothing yet, the session's
        # last copy of its guards says what was spent
        guards = replica.guards or session.guards or SessionGuards(self.config(session.agent), started_at=0.0)
        values = validate_raise(raised, guards.config, guards.budget, replica.now)
        channel.queue([entries.raise_limits(values)])
        await channel.flush()
        if replica.guards is not None:
            session.guards = replica.guards  # the run's guards with the raise (and all the log)
        return values

    async def approve_loop(self, session: Session, until: int) -> None:
        """Appended to the run's log: every replica's copy of the guards applies it in order."""
        if session.guards is not None:
            session.guards.approve_loop(until)  # this replica's next call, before the log comes back
        channel = self.state.guards.channel(session.agent, session.run_id)
        channel.queue([entries.approve_loop(until)])
        await channel.flush()

    async def resumed(self, old: Session, run_id: str) -> None:
        shared = self.state
        agent, old_run_id, session = old.agent, old.run_id, old
        channel = shared.guards.channel(agent, old_run_id)
        await channel.flush()
        log = await shared.link.call(lambda: shared.backend.read(agent, old_run_id, since=0))
        if len(channel.history) > len(log):  # the backend lost some (an outage): this replica's copy
            log = list(channel.history)
        shared.guards.forget(old_run_id)
        last = log[-1] if log else None
        resume = LogEntry(
            len(log) + 1, last.t if last else 0.0, last.config_rev if last else 0, entries.resume()
        )
        slots = shared.all_slots(session)
        if not session.explicit:
            # and the answers it gave: a conversation's next request is found by the one it carries
            slots += [keys.slot_history(agent, key.hex()) for key in session.lineage.answers]
            slots.append(keys.slot_latest(agent))
        lineage = not session.explicit and not session.lineage.is_empty()
        await shared.link.call(
            lambda: shared.backend.seed(agent, run_id, [*log, resume], idle_s=shared.idle_s, lineage=lineage)
        )
        await shared.link.call(
            lambda: shared.backend.resume(
                agent,
                old_run_id,
                run_id,
                slots=slots,
                idle_s=shared.idle_s,
                ttl_s=max(shared.terminated_ttl_s, shared.idle_s),
                session_id=session.session_id if session.explicit else None,
            )
        )


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
