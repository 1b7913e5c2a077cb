"""Which rate limits a call counts against (SPEC §9), read from the exchange for either backend;
the windows themselves are proxy/guards/rate_limit.py's (local) or the admission script's (shared)."""

from __future__ import annotations

from proxy.exchange import Exchange
from proxy.guard_events import is_tool_call
from proxy.guards.config import GuardConfig
from proxy.guards.permissions import mcp_tool_name
from proxy.guards.rate_limit import RateRule, rules_for


def rate_rules(ex: Exchange, config: GuardConfig) -> tuple[tuple[RateRule, ...], str | None]:
    """The rules of the call (none, nearly always), and the tool it names (None: an LLM request)."""
    if not config.rate_limits:
        return (), None
    tool = mcp_tool_name(ex.route.upstream, ex.call.tool_name) if is_tool_call(ex) else None
    return rules_for(config.rate_limits, tool), tool
