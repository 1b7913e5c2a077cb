"""Rate limits per agent (SPEC §9, docs/gateway.md "Rate limits"): a gate. The pure rule is
proxy/guards/rate_limit.py (sliding windows), which calls count against which rules `ask.py`, the
shared twin `twin.py`. Refused: `rate_limited`, retryable (429 + Retry-After; MCP: the BLOCK result
saying when), the session goes on; a refused call takes no slot, an admitted one keeps its slots
whatever the later checks decide."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from proxy.admission.check import Check, Refusal
from proxy.admission.rate_limit.ask import rate_ask
from proxy.admission.rate_limit.twin import TWIN, RateRequest, windows_of
from proxy.constants import GUARD_RATE_LIMITED
from proxy.guards.config import GuardConfig
from proxy.guards.decision import Decision
from proxy.guards.rate_limit import RateRefusal, refusal_decision
from proxy.state.base import Op, Twin

if TYPE_CHECKING:
    from proxy.exchange import Exchange


class RateLimitGate:
    twin: Twin = TWIN
    release: Op | None = None

    def ask(self, ex: Exchange, config: GuardConfig, member: str) -> RateRequest | None:
        ask = rate_ask(ex, config)
        if ask is None:
            return None
        assert ex.session is not None
        return RateRequest(ex.session.agent, member, ask.rules, ask.slots)

    def refusal(self, request: RateRequest, answer: RateRefusal) -> Decision:
        return refusal_decision(answer)

    def sweep(self, store: dict[str, Any], now: float) -> None:
        windows_of(store).sweep(now)


CHECK = Check(
    "rate_limit",
    "the agent's calls per period (`rate_limits`), across its sessions",
    (Refusal(GUARD_RATE_LIMITED, retryable=True, ends_session=False),),
    gate=RateLimitGate(),
)
