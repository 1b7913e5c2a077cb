"""The circuit breaker of agent x upstream (SPEC §5.3): the pure rule is proxy/guards/breaker.py,
asked by the breaker stage (proxy/stages/breaker.py) for this process's circuits, or admitted in
the admission's round trip with shared state (twin.py). Refused: `circuit_breaker`, retryable
(429 + Retry-After), the session goes on."""

from __future__ import annotations

from proxy.admission.breaker.twin import TWIN, BreakerAdmission, BreakerRequest
from proxy.admission.check import Check, Refusal
from proxy.constants import GUARD_CIRCUIT_BREAKER

CHECK = Check(
    "breaker",
    "the circuit of the agent x upstream (`circuit_breaker`): open, its calls are refused",
    (Refusal(GUARD_CIRCUIT_BREAKER, retryable=True, ends_session=False),),
    twin=TWIN,
)

__all__ = ["CHECK", "BreakerAdmission", "BreakerRequest"]
