"""`LocalGuardBackend`: the session's `SessionGuards` in this process; a call is judged and settled
in place, its circuit is this process's."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from proxy.admission import GATES, Hold, Stores
from proxy.admission.breaker import BreakerAdmission
from proxy.episodes import Episode
from proxy.exchange import Exchange
from proxy.guard_backend.contract import ENDED_BY_GUARD, Admitted, CallInputs, OnCycle, OnSettled
from proxy.guard_backend.windows import LocalWindows, WindowBook
from proxy.guard_events import is_tool_call
from proxy.guard_store import GuardConfigStore
from proxy.guard_trace import mark_settled
from proxy.guards.breaker import Ticket, Transition
from proxy.guards.budget import Reservation
from proxy.guards.config import GuardConfig
from proxy.guards.raises import validate_raise
from proxy.guards.session import SessionGuards
from proxy.responses_chain import ResponsesChains
from proxy.sessions import Session, SessionManager


def session_guards(config: GuardConfig, session: Session) -> SessionGuards:
    """The session's guards under the config in force now (an admin API change applies to the next call)."""
    guards: SessionGuards | None = session.guards
    if guards is None:
        guards = session.guards = SessionGuards(config, started_at=session.started_mono)
        # RUN_START was written before the session had guards: it counts toward max_events
        guards.budget.count_event()
    elif config is not guards.config:  # (the same object on almost every call)
        guards.configure(config)
    return guards


class LocalGuardBackend:
    """The guard state of this process (one replica, or none configured)."""

    results_at_admit = False

    def __init__(self, guard_store: GuardConfigStore, windows: WindowBook | None = None) -> None:
        self.guard_store = guard_store
        self.windows: WindowBook = windows if windows is not None else LocalWindows(None)
        # the admission's gates (proxy/admission/: concurrent calls, rate limits; SPEC §9): their
        # twins' rules on this process's store
        self.stores = Stores()

    async def start(self) -> None:
        await self.windows.start()

    async def close(self) -> None:
        await self.windows.close()

    async def keep_alive(self, sessions: SessionManager, now: float) -> None:
        for _, gate in GATES:  # idle agents' windows hold no memory
            gate.sweep(self.stores.store(gate.twin.name), now)

    def health(self) -> dict[str, Any] | None:
        return None  # nothing outside the process to report

    def retry_after_s(self) -> float:
        return 0.0

    def config(self, agent: str) -> GuardConfig:
        return self.guard_store.effective(agent)[0]

    async def resolve_run(
        self,
        sessions: SessionManager,
        agent: str,
        explicit_id: str | None,
        episode: Episode | None,
        now: float,
    ) -> str | None:
        return None  # the session manager decides alone

    def observe(self, session: Session, event_type: str, name: str, event_id: str, on_cycle: OnCycle) -> None:
        assert session.guards is not None
        decision = session.guards.observe_event(event_type, name, event_id)
        if decision is not None:
            on_cycle(session, decision)

    def ended(self, session: Session) -> None:
        return None

    def terminated(self, session: Session, reason: str, *, kill: bool = False) -> None:
        return None  # the session manager refuses its calls

    async def fetch_chain(
        self, chains: ResponsesChains, agent: str, previous_response_id: str | None
    ) -> None:
        return None  # every link is this process's

    async def share_chain(self, chains: ResponsesChains, agent: str, response_id: str) -> None:
        return None

    async def admit(self, ex: Exchange, inputs: Callable[[], CallInputs], now: float) -> Admitted:
        session = ex.session
        assert session is not None
        config = self.config(session.agent)
        guards = session_guards(config, session)
        # the admission's gates first, in the list's order: a call one refuses is no call of the
        # session (retried, it is judged then); what one admits (a rate slot) stays taken whatever
        # the later checks decide, what it holds for the call (a concurrent slot) goes at its end
        for _, gate in GATES:
            request = gate.ask(ex, config, "")  # (no member: the call's own object names it here)
            if request is None:
                continue
            refused, answer = gate.twin.memory(self.stores, request, now)
            if refused:
                return Admitted(guards, refused=gate.refusal(request, answer))
            if gate.release is not None:
                ex.admission_holds = (*ex.admission_holds, Hold(gate.release, request, shared=False))
                # the answer ends once the slot is given back (finish hooks): an agent that calls
                # again the moment it has its answer finds its slot free
                ex.hold_end = True
        call = ex.call
        if is_tool_call(ex):
            # an MCP result ends its answer once the call is recorded and settled (finish hooks): a
            # client that calls again the moment it reads the result is judged with it, and its
            # events follow this call's TOOL_CALL in the trace, as with shared state (SPEC §8)
            ex.hold_end = True
            judged = inputs()
            seen = (guards.events_seen, guards.calls_settled)
            verdict = guards.before_tool_call(
                call.tool_name,
                call.arguments,
                now=now,
                server=call.naming_server,  # (the one naming rule: proxy/guards/tool_names.py)
                estimate_usd=judged.estimate,
            )
            return Admitted(guards, verdict, judged, seen)
        if session.terminated:  # a result it brings ended the session (stop_on_loop): refused
            return Admitted(guards, ended=guards.terminated_by or ENDED_BY_GUARD)
        judged = inputs()
        conversation = session.conversation
        seen = (guards.events_seen, guards.calls_settled)
        verdict = guards.before_llm_call(
            judged.steps,
            judged.turn_start,
            judged.results,
            estimate_usd=judged.estimate,
            estimate_tokens=judged.tokens,
            now=now,
            event_ids=conversation.tool_event_ids_so_far,
            reading=conversation.guard_state,
            read_from=getattr(call, "continues", None),
            echo=judged.echo,
        )
        return Admitted(guards, verdict, judged, seen)

    def give_back(self, guards: SessionGuards, reservation: Reservation | None) -> None:
        """A refused call's budget reservation goes back."""
        guards.release(reservation)

    async def settle(self, ex: Exchange, on_settled: OnSettled) -> None:
        """Settle the call with this process's guards: its reservation, what its answer brought."""
        session = ex.session
        if ex.protocol is None or session is None or session.guards is None or ex.guards_skipped:
            return
        guards = session.guards
        now = time.monotonic()
        trace = ex.guard_trace
        if trace is not None:
            now = mark_settled(ex, trace, now)
        if not ex.forwarded:  # refused, or never sent
            guards.release(ex.reservation)
            return
        if trace.tool if trace is not None else is_tool_call(ex):
            result = ex.result
            decisions = guards.after_tool_call(
                ex.reservation,
                ex.call.tool_name,
                ex.call.arguments,
                result_fingerprint=(result.fingerprint or "") if result is not None else "",
                error=result.error_text if result is not None and result.status == "error" else None,
                now=now,
                event_id=ex.tool_event_id,
            )
        else:
            decisions = guards.after_llm_call(
                ex.reservation,
                cost_usd=float(ex.cost_usd),
                tokens=int(ex.tokens),
                now=now,
            )
        if decisions:  # (most calls conclude nothing)
            on_settled(session, guards, decisions)

    async def release(self, ex: Exchange) -> None:
        now = time.monotonic()
        holds, ex.admission_holds = ex.admission_holds, ()
        for hold in holds:
            hold.op.memory(self.stores, hold.request, now)

    async def circuit_release(self, ex: Exchange, ticket: Ticket) -> None:
        return None  # circuits here are admitted by the breaker stage itself (no admission)

    async def circuit_report(
        self, ex: Exchange, admission: BreakerAdmission, ticket: Ticket, *, failed: bool
    ) -> Transition | None:
        return None

    async def raise_limits(self, session: Session, raised: Any, now: float) -> dict[str, float]:
        guards = session_guards(self.config(session.agent), session)
        values = validate_raise(raised, guards.config, guards.budget, now)
        guards.raise_limits(values)
        return values

    async def approve_loop(self, session: Session, until: int) -> None:
        if session.guards is not None:
            session.guards.approve_loop(until)

    async def resumed(self, old: Session, run_id: str) -> None:
        return None  # the session manager moves the session and its guards to the new run
