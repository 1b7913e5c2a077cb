"""The circuit breaker in the pipeline (SPEC §5.3): one breaker per agent x upstream, outside sessions.

Before forwarding (after the session's guards admitted the call): an open circuit, or a half-open
one with its trial calls taken, refuses at once (429 with Retry-After; a JSON-RPC error for MCP) and
gives the guards' reservation back. After the answer: a failure (connection error, timeout, 5xx, a
broken stream, an MCP internal error) or a success moves the breaker; a call that never reached the
upstream gives its trial ticket back. Transitions are STATE_UPDATE events. Its finish runs before the
guard stage's (finish hooks unwind), as the breaker was settled before the guards.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from proxy.admission.breaker import BreakerAdmission
from proxy.constants import GUARD_CIRCUIT_BREAKER, TAG_CIRCUIT_BREAKER_OPEN, EventType
from proxy.exchange import Exchange
from proxy.guard_events import is_tool_call
from proxy.guards.breaker import CircuitBreaker, State, Ticket, Transition
from proxy.guards.config import CircuitBreakerConfig
from proxy.guards.decision import Action, Decision
from proxy.guards.describe import describe
from proxy.pipeline import BaseStage
from proxy.refusals import write_refusal_error

if TYPE_CHECKING:
    from proxy.services import Services

log = logging.getLogger("tripwire.breaker")


def transition_line(agent: str, upstream: str, transition: Transition, config: CircuitBreakerConfig) -> str:
    """The log line of a circuit's state change: whose circuit, what happened, what it means now."""
    state = str(transition.new).replace("_", "-")
    head = f"circuit {state} for agent {agent!r} calling upstream {upstream!r}: {transition.reason}"
    if transition.new is State.OPEN:
        return f"{head}; its calls are refused for {config.cooldown_seconds:g}s, then trial calls go through"
    if transition.new is State.HALF_OPEN:
        trials = config.half_open_max_calls
        return f"{head}; it lets {trials} trial call{'' if trials == 1 else 's'} through"
    return f"{head}; calls go through again"


class BreakerStage(BaseStage):
    name = "breaker"
    fail_open = True

    def __init__(self, services: Services) -> None:
        self.services = services
        self.guards = services.guards  # a shared backend admits the circuit in the guards' round trip
        self.policy = services.policy

    async def request(self, ex: Exchange) -> None:
        admission: BreakerAdmission | None = ex.breaker_admission
        if admission is not None:  # admitted with the guards' check (shared state)
            if self.breaker_for(ex) is None:
                return
            ex.breaker_ticket = admission.ticket
            if admission.ticket is not None and admission.ticket.transition is not None:
                self.write_transition(ex, admission.ticket.transition)
            if admission.refusal is not None:
                self.refuse(ex, admission.refusal)
            return
        # this process's circuits (no shared state, or its round trip did not admit the call)
        breaker = self.breaker_for(ex)
        if breaker is None:
            return
        decision, ticket = breaker.before_call(time.monotonic())
        ex.breaker_ticket = ticket
        if ticket is not None and ticket.transition is not None:
            self.write_transition(ex, ticket.transition)
        if decision.action >= Action.BLOCK:
            self.refuse(ex, decision)

    def refuse(self, ex: Exchange, decision: Decision) -> None:
        session = ex.session
        assert session is not None and session.guards is not None
        if ex.breaker_admission is None:
            session.guards.release(ex.reservation)
        # (admitted with shared state: given back through the shared log when the guard stage settles)
        ex.reservation = None
        if ex.guard_trace is not None:
            ex.guard_trace.fields["breaker"] = True  # admitted by the guards, then refused by the circuit
        ex.decisions.append(decision)
        self.services.metrics.observe_decision(decision.guard, decision.action.name)
        self.services.recorder.add_tags(session.run_id, TAG_CIRCUIT_BREAKER_OPEN)
        write_refusal_error(self.policy, ex, decision)
        assert ex.protocol is not None
        ex.answer = ex.protocol.render_refusal(
            ex, decision, describe(decision, self.services.settings.expose_guard_details)
        )

    def breaker_for(self, ex: Exchange) -> CircuitBreaker | None:
        """The breaker of the call's agent x upstream; None where no guards judged the call."""
        session = ex.session
        if ex.protocol is None or session is None or session.guards is None or ex.guards_skipped:
            return None
        config = session.guards.config.circuit_breaker
        if not config.enabled:
            return None
        return self.services.breakers.get(session.agent, f"{ex.route.kind}:{ex.route.upstream}", config)

    def ticket_breaker(self, ex: Exchange, ticket: Ticket) -> CircuitBreaker | None:
        """breaker_for, the circuit taken from the call's ticket (no key made, no registry lookup)."""
        breaker = ticket.breaker
        session = ex.session
        if breaker is None or session is None or session.guards is None:
            return self.breaker_for(ex)
        config = session.guards.config.circuit_breaker  # (the config in force now, as breaker_for)
        if not config.enabled:
            return None
        if config is not breaker.config:
            breaker.configure(config)
        return breaker

    async def finish(self, ex: Exchange) -> None:
        if ex.breaker_ticket is None:
            return
        admission: BreakerAdmission | None = ex.breaker_admission
        if admission is not None:
            await self.finish_admitted(ex, admission, ex.breaker_ticket)
            return
        breaker = self.ticket_breaker(ex, ex.breaker_ticket)
        if breaker is None:
            return
        if ex.refused or not ex.forwarded:
            breaker.release(ex.breaker_ticket)  # never reached the upstream: the trial goes back
            return
        failed = ex.upstream_failed()
        if is_tool_call(ex) and ex.result is not None and ex.result.upstream_failure:
            failed = True
        now = time.monotonic()
        transition = (
            breaker.on_failure(ex.breaker_ticket, now)
            if failed
            else breaker.on_success(ex.breaker_ticket, now)
        )
        if transition is not None:
            self.write_transition(ex, transition)

    async def finish_admitted(self, ex: Exchange, admission: BreakerAdmission, ticket: Ticket) -> None:
        """A circuit admitted with the guards' check: the backend that admitted it is told."""
        if ex.session is None:
            return
        if ex.refused or not ex.forwarded:
            if ticket.trial:  # never reached the upstream: the trial slot goes back
                await self.guards.circuit_release(ex, ticket)
            return
        failed = ex.upstream_failed() or (
            is_tool_call(ex) and ex.result is not None and bool(ex.result.upstream_failure)
        )
        transition = await self.guards.circuit_report(ex, admission, ticket, failed=failed)
        if transition is not None:
            self.write_transition(ex, transition)

    def write_transition(self, ex: Exchange, transition: Transition) -> None:
        session = ex.session
        assert session is not None
        config = (
            session.guards.config.circuit_breaker if session.guards is not None else CircuitBreakerConfig()
        )
        line = transition_line(session.agent, ex.route.upstream, transition, config)
        log.log(logging.WARNING if transition.new is State.OPEN else logging.INFO, line)
        event_id = self.policy.write_event(
            session,
            EventType.STATE_UPDATE,
            "state",
            {
                "state": {"circuit_breaker": {"upstream": ex.route.upstream, "state": str(transition.new)}},
                "diff": {"circuit_breaker": {"from": str(transition.old), "to": str(transition.new)}},
                "reason": transition.reason,
            },
        )
        self.policy.observe_event(session, EventType.STATE_UPDATE, "state", event_id)
        self.services.metrics.set_open_circuits(self.services.breakers.open_count_by_upstream())
        if str(transition.new) == "open":
            self.services.alerts.send(
                session,
                Decision(Action.BLOCK, GUARD_CIRCUIT_BREAKER, f"circuit to {ex.route.upstream} opened"),
            )
