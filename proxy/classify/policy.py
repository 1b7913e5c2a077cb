"""Whether policy applies to an agent: then a call Tripwire cannot classify is refused, not relayed
(issue 30, docs/gateway.md "Fail closed"). `passthrough_unknown: true` relays it as before.

Pure: the agent's guard config and whether agent keys are required in; a yes or no out.
"""

from __future__ import annotations

from proxy.guards.config import GuardConfig


def policy_applies(config: GuardConfig, keys_required: bool) -> bool:
    """Agent keys, tool permissions, rate limits, budget windows, or a guard that refuses (a session
    budget or limit, a loop action other than warn). Shadow mode refuses nothing: only keys count."""
    if keys_required:
        return True
    if config.in_shadow:
        return False
    budget, limits = config.budget, config.limits
    return (
        config.tools.restricts
        or bool(config.rate_limits)
        or bool(config.budget_windows)
        or any(v is not None for v in (budget.max_cost_usd, budget.max_tokens, budget.max_wall_time_seconds))
        or any(
            v is not None
            for v in (limits.max_llm_calls, limits.max_tool_calls, limits.max_events, limits.max_duration_s)
        )
        or (config.loop_detection.enabled and config.loop_detection.action != "warn")
    )


def fail_closed(config: GuardConfig, keys_required: bool, passthrough_unknown: bool) -> bool:
    """Refuse what Tripwire cannot read (the default whenever policy applies)."""
    return not passthrough_unknown and policy_applies(config, keys_required)
