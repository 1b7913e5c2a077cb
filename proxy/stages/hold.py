"""Holding a call for a person (SPEC §5.5a, docs/approvals.md): the stage after the guards.

When the guards (a tool permission's `ask`, a loop pattern's `ask`) asked for a person
(`ex.asked`), the call waits here until a person decides, `ask_timeout_s` passes or the client
hangs up: approved, it goes on to the circuit and the upstream; otherwise `ask_fallback`'s answer,
with the note. A streamed call's answer starts while it is held (the approvals' `HeldStream`), and
the forwarded stream goes on in it (`finish`). The approval book, the watch over held calls and the
streaks a person let go on are `services.approvals`' (proxy/approvals/, which stages do not import).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import TYPE_CHECKING, Any

from proxy.constants import GUARD_KILL_SWITCH, GUARD_TOOL_ASK, TAG_AWAITING_APPROVAL, EventType
from proxy.exchange import Answer, Exchange
from proxy.guards.decision import Action, Decision
from proxy.guards.raises import RaiseError
from proxy.guards.session import SessionGuards
from proxy.pipeline import BaseStage
from proxy.refusals import refuse, refuse_ended
from proxy.sessions import Session

if TYPE_CHECKING:
    from proxy.services import Services

log = logging.getLogger("tripwire.guards")


def approving(decision: Decision) -> str:
    """What approving a held call does, in words (listed with the approval)."""
    if decision.kind is not None:
        return "forwards this call; the same loop asks again only if it goes on `threshold` more calls"
    if decision.guard == GUARD_TOOL_ASK:
        return "forwards this tool call"
    return "forwards this call; with `raise`, the session's limit is raised for the rest of the session"


class HoldStage(BaseStage):
    name = "hold"
    fail_open = True

    def __init__(self, services: Services) -> None:
        self.services = services
        self.guards = services.guards
        self.policy = services.policy
        self.expose = services.settings.expose_guard_details

    async def request(self, ex: Exchange) -> None:
        if ex.asked is None:
            return
        guards, decision, call_seq = ex.asked
        await self.hold(ex, guards, decision, call_seq)

    # --- asking a person (SPEC §5.5a) --------------------------------------------------------

    async def hold(self, ex: Exchange, guards: SessionGuards, decision: Decision, call_seq: int) -> None:
        """Hold the call until a person decides (or `ask_timeout_s` passes, or the client hangs up):
        approved, it goes on to the upstream; otherwise `ask_fallback`'s answer, with the note."""
        session = ex.session
        assert session is not None
        approvals = self.services.approvals
        config = guards.config
        approval = approvals.approval_class(
            id=approvals.approval_class.new_id(),
            agent=session.agent,
            session_id=session.session_id,
            run_id=session.run_id,
            guard=decision.guard,
            kind=decision.kind,
            message=decision.message,
            threshold=decision.threshold,
            actual=decision.actual,
            call=approvals.held_call(ex, self.services.settings.max_field_bytes),
            evidence=approvals.held_evidence(decision, self.services.settings.max_field_bytes),
            approving=approving(decision),
            requested_at=time.time(),
            timeout_s=float(config.ask_timeout_s),
        )
        recorder = self.services.recorder
        decided, stream = await approvals.hold(
            ex,
            approval,
            lambda: self.write_state(session, "approval_requested", {"approval": approval.to_json()}),
            lambda on: (recorder.add_tags if on else recorder.remove_tags)(
                session.run_id, TAG_AWAITING_APPROVAL
            ),
        )
        try:
            await self.carry_out(ex, guards, decision, approval, decided, stream, call_seq)
        except Exception:
            if stream is not None and stream.response is not None and ex.answer is None:
                # failing open (a bug): the call goes on in the answer already started, not in a second
                stream.relay_into()
                ex.held_stream = stream
            raise

    async def carry_out(
        self,
        ex: Exchange,
        guards: SessionGuards,
        decision: Decision,
        approval: Any,  # proxy.approvals.Approval
        decided: Any,  # proxy.approvals.book.Decided
        stream: Any,  # proxy.approvals.hold.HeldStream | None
        call_seq: int,
    ) -> None:
        """What the decision (or its absence) does: the trace, then the call goes on or is answered."""
        session = ex.session
        assert session is not None
        approvals = self.services.approvals
        config = guards.config
        self.services.metrics.observe_approval(decision.guard, decided.status)
        covers = approvals.covers_until(decision, decided, call_seq)
        self.write_state(
            session,
            "approval_decided",
            {
                "approval_id": approval.id,
                "call_seq": call_seq,
                "guardrail": decision.guard,
                "kind": decision.kind,
                "decision": decided.status,
                "note": decided.note,
                "by": decided.by,
                "waited_s": round(decided.waited_s, 3),
                **({"raise": decided.raised} if decided.raised else {}),
                **({"covers_until": covers} if covers is not None else {}),
            },
        )
        if covers is not None:  # right after its STATE_UPDATE, where replay applies it too
            await self.guards.approve_loop(session, covers)
        if decided.status == approvals.APPROVED and session.terminated:
            # the session was ended while its call was held (the kill switch): refused like its
            # every later call, whatever the approval said
            ended = Decision(
                Action.TERMINATE, GUARD_KILL_SWITCH, "the session was ended while this call was held"
            )
            self.guards.give_back(guards, ex.reservation)
            ex.reservation = None
            self.refuse_ended(ex, ended, elsewhere=False)
            if stream is not None and ex.answer is not None:
                await stream.end_with(ex.answer.body, refusal=True)
            return
        if decided.status == approvals.APPROVED:
            if decided.raised:
                try:
                    await self.policy.raise_limits(session, decided.raised, by=decided.by)
                except RaiseError as e:  # validated by the API; the session moved on since
                    log.warning("approval %s: raise not applied: %s", approval.id, e)
            if stream is not None:
                stream.relay_into()
                ex.held_stream = stream
            return
        self.guards.give_back(guards, ex.reservation)
        ex.reservation = None
        if decided.status == approvals.WITHDRAWN:  # nobody to answer: nothing forwarded, nothing more written
            ex.client_disconnected = True
            ex.answer = Answer(400, b"withdrawn: the client hung up while its call was held", "text/plain")
            return
        fallback = Action.TERMINATE if config.ask_fallback == "terminate" else Action.BLOCK
        final = dataclasses.replace(decision, action=fallback)
        if decided.status == approvals.DENIED:
            note = f" A person denied this call{': ' + decided.note if decided.note else '.'}"
        else:
            note = f" Nobody approved this call within {approval.timeout_s:g}s."
        self.refuse(ex, final, loop_events=decision.kind is not None, note=note)
        if fallback == Action.TERMINATE:
            self.guards.terminated(session, f"guard:{decision.guard}")
        if stream is not None and ex.answer is not None:
            await stream.end_with(ex.answer.body, refusal=ex.answer.status != 200)

    def write_state(self, session: Session, name: str, payload: dict[str, Any]) -> None:
        event_id = self.policy.write_event(session, EventType.STATE_UPDATE, name, payload)
        self.policy.observe_event(session, EventType.STATE_UPDATE, name, event_id)

    def refuse(self, ex: Exchange, decision: Decision, *, loop_events: bool, note: str = "") -> None:
        refuse(self.policy, ex, decision, expose=self.expose, loop_events=loop_events, note=note)

    def refuse_ended(self, ex: Exchange, decision: Decision, *, elsewhere: bool) -> None:
        refuse_ended(self.policy, ex, decision, expose=self.expose, elsewhere=elsewhere)

    async def finish(self, ex: Exchange) -> None:
        stream = ex.held_stream
        if stream is not None:
            if ex.response is None and ex.answer is not None:
                # approved, then the upstream failed before answering: its error into the started stream
                await stream.end_with(ex.answer.body, refusal=True)
            ex.response = stream.response  # the lane's own answer object, which the handler returns
