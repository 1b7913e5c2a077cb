"""Which rate limits a call counts against (SPEC §9), read from the exchange for either backend;
the windows themselves are proxy/guards/rate_limit.py's (local, and `MemoryBackend`) or the
admission script's Lua fragment (shared, twin.py).

An MCP `tools/call` is one call of its `SERVER__TOOL`. An LLM request is one `llm` call, and it
brings the results of the function-calling tools the model asked for in its previous answer: each
is one call of that tool, counted here, the first moment Tripwire sees it ran (docs/gateway.md, "Rate limits").
Which results are new needs no state (the same on every replica): the results of the last
assistant step of the current turn, the ones the request ends with. A retry of a refused request
brings them again and asks for them again (a refusal took no slot).
"""

from __future__ import annotations

from dataclasses import dataclass

from proxy.dialects.base import ToolCall, ToolResult
from proxy.exchange import Exchange
from proxy.guard_events import is_tool_call
from proxy.guards.config import GuardConfig
from proxy.guards.rate_limit import RateRule, rules_for, slots_for


@dataclass(frozen=True, slots=True)
class RateAsk:
    """The rules a call counts against, and how many slots it takes in each."""

    rules: tuple[RateRule, ...]
    slots: tuple[int, ...]


def rate_ask(ex: Exchange, config: GuardConfig) -> RateAsk | None:
    """None (nearly always): no rate limit applies to the call."""
    limits = config.rate_limits
    if not limits:
        return None
    if is_tool_call(ex):
        rules = rules_for(limits, ex.call.qualified_name)
        return RateAsk(rules, (1,) * len(rules)) if rules else None
    tools = results_brought(ex) if any(r.match != "llm" for r in limits) else ()
    slots = slots_for(limits, tools)
    return RateAsk(tuple(slots), tuple(slots.values())) if slots else None


def results_brought(ex: Exchange) -> tuple[str, ...]:
    """The names of the function-calling tools whose results this LLM request brings back: the
    model's latest step in this turn, answered at the end of the request."""
    call = ex.call
    history = ex.history  # a Responses chain's whole history (previous_response_id)
    steps: list[list[ToolCall]] = history.steps if history is not None else call.steps
    turn_start = history.turn_start if history is not None else call.turn_start
    results: list[ToolResult] = call.tool_results
    if not steps or len(steps) <= turn_start or not results:
        return ()
    asked = {tc.id: tc.name for tc in steps[-1] if not tc.hosted}
    names: list[str] = []
    for result in reversed(results):  # (a long history's results: only its tail is read)
        name = asked.pop(result.tool_call_id, None)
        if name is None:
            break
        names.append(name)
    return tuple(reversed(names))
