"""Budgets over time per agent (SPEC §9 `budget_windows`, docs/gateway.md): the pure rule is
proxy/guards/budget_window.py, the windows are kept by proxy/guard_backend/windows.py (this process)
or shared_windows.py (shared, reserved in the admission's round trip through twin.py). Asked once
the session's guards admitted the call. Refused: `budget_window_exceeded` with `resets_at`, not
retryable before then, the session goes on."""

from __future__ import annotations

from proxy.admission.budget_window.twin import TWIN
from proxy.admission.check import Check, Refusal
from proxy.constants import GUARD_BUDGET_WINDOW_EXCEEDED

CHECK = Check(
    "budget_window",
    "the agent's spend per day / week / month (`budget_windows`), across its sessions",
    (Refusal(GUARD_BUDGET_WINDOW_EXCEEDED, retryable=False, ends_session=False),),
    twin=TWIN,
)
