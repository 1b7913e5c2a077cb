"""Admission: the ordered list of checks a call goes through before it is forwarded.

    ADMISSION = (concurrent_calls, rate_limit, permissions, session_guards, budget_window, breaker)

Each check is one folder here: its pure rule (proxy/guards/, or `rule.py` beside it), its
shared-state twin (`twin.py`: its Lua fragment, from which the APPEND script is assembled at start,
so a call's admission is still ONE round trip with shared state; and the same rule in Python for the
memory backend) and its refusal (`Check.refusals`: code, retryable, ends the session or not).

The gates come first (per agent, across its sessions): the local backend asks each on this
process's store, the shared backend in the admission's APPEND, before the call's check goes into the
run's log; a call one refuses is no call of the session. Then the session's guards (permissions
first, then loops, limits, budgets: the run's log is their twin), the agent's budget windows, the
circuit. Holding a call for a person (an `ask`) is a stage of its own, after admission
(proxy/stages/hold.py). Adding a check: a folder with its rule, twin and `CHECK`, one line below, its
test in tests/test_admission_contract.py (docs/architecture.md "Admission").
"""

from __future__ import annotations

from proxy.admission import breaker, budget_window, concurrent_calls, permissions, rate_limit, session_guards
from proxy.admission.check import Check, Gate, Hold, Refusal, Stores
from proxy.state.base import Twin

ADMISSION: tuple[Check, ...] = (
    concurrent_calls.CHECK,  # first: a call it refuses takes no rate-limit slot
    rate_limit.CHECK,
    permissions.CHECK,
    session_guards.CHECK,
    budget_window.CHECK,
    breaker.CHECK,
)

GATES: tuple[tuple[str, Gate], ...] = tuple((c.name, c.gate) for c in ADMISSION if c.gate is not None)
# every twin asked inside the APPEND, in the list's order (their fragments make the script)
TWINS: tuple[Twin, ...] = tuple(
    t for c in ADMISSION for t in ((c.gate.twin,) if c.gate is not None else (c.twin,)) if t is not None
)

__all__ = ["ADMISSION", "GATES", "TWINS", "Check", "Gate", "Hold", "Refusal", "Stores"]
