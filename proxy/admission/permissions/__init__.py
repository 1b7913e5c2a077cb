"""Tool permissions (SPEC §9, docs/gateway.md "Tool permissions"): the pure rule is
proxy/guards/permissions.py. Denied tools leave an LLM request's tool list in the parse stage
(`without_tools`); a call of a denied tool (an MCP `tools/call`, or a denied call in an LLM request's
history) is refused `tool_denied` (BLOCK: the session goes on, not retryable), an `ask` tool is held
for a person (`tool_ask`, the hold stage). Judged first among the session guards' checks
(`SessionGuards.before_*`), so its decisions go through the run's guard log with theirs (its twin
is the log: replicas and a replay decide alike)."""

from __future__ import annotations

from proxy.admission.check import Check, Refusal
from proxy.constants import GUARD_TOOL_ASK, GUARD_TOOL_DENIED

CHECK = Check(
    "permissions",
    "the tool the call runs or brings results of (`tools`: allow, deny, ask), judged with the session's guards",
    (
        Refusal(GUARD_TOOL_DENIED, retryable=False, ends_session=False),
        Refusal(GUARD_TOOL_ASK, retryable=False, ends_session=False),  # held, then the fallback's
    ),
)
