"""Rate limits (SPEC §9): at most `max_calls` calls of one agent, across all its sessions, in any
`per_s` seconds, per rule. Pure: the caller passes the clock; no I/O.

What a call is, per rule's `match`:
- `llm`: every LLM request of the agent (chat, Responses over HTTP or WebSocket, Anthropic, ...);
- `tools`: every tool call of the agent: an MCP `tools/call` on any server, and a function-calling
  tool call (below);
- a tool pattern (fnmatch glob, case-sensitive, as tool permissions match): the tool calls whose
  name matches, `SERVER__TOOL` for an MCP tool, the function's name for a function-calling tool.
A function-calling tool runs in the agent, not through Tripwire, which sees it only once it ran:
its result in the next LLM request. So its call is counted there: an LLM request that brings the
results of the model's latest tool calls (the last assistant step of the turn) takes one slot per
result in the rules their names match, besides its own `llm` slot, and is refused (429 +
Retry-After) while they have no room: the agent's next round waits (proxy/guard_backend/rates.py).

Exact: a window is the list of the times its admitted calls were admitted, and a call goes through
only when every rule it matches holds room for the slots it needs (one, or its results) within the
last `per_s` seconds; then it takes them in each rule (all or nothing, so a refused call takes
none). The next call is admitted once enough of the oldest times are `per_s` old: `retry_after`.
A call needing more slots than a rule's `max_calls` needs a whole empty window (`max_calls` slots). The Redis script
(proxy/state/lua.py `_RATE`) keeps the same window in a sorted set, so several replicas decide
as this object does in one process.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from fnmatch import fnmatchcase
from functools import lru_cache

from proxy.constants import GUARD_RATE_LIMITED
from proxy.guards.config import RateLimitConfig
from proxy.guards.decision import Action, Decision


@dataclass(frozen=True, slots=True)
class RateRule:
    """One rule as a call asks it. `key` names its window within the agent: its match and period,
    so a changed `max_calls` keeps the calls already counted, a changed period starts afresh."""

    key: str
    match: str
    max_calls: int
    per_s: float


def rule_of(config: RateLimitConfig) -> RateRule:
    return RateRule(f"{config.match}/{config.per_s:g}s", config.match, config.max_calls, config.per_s)


@lru_cache(maxsize=1024)
def rules_for(rate_limits: tuple[RateLimitConfig, ...], tool: str | None) -> tuple[RateRule, ...]:
    """The rules a call counts against: an LLM request (`tool` None), or an MCP tool `SERVER__TOOL`.
    Two rules with one key are one window (the stricter `max_calls` holds)."""
    out: dict[str, RateRule] = {}
    for config in rate_limits:
        if tool is None:
            hit = config.match == "llm"
        else:
            hit = config.match == "tools" or (config.match != "llm" and fnmatchcase(tool, config.match))
        if hit:
            rule = rule_of(config)
            known = out.get(rule.key)
            if known is None or rule.max_calls < known.max_calls:
                out[rule.key] = rule
    return tuple(out.values())


@dataclass(frozen=True, slots=True)
class RateRefusal:
    """A call a full window refused: the rule, how many calls it holds, and when the next goes."""

    rule: RateRule
    count: int
    retry_after: float  # seconds until the window has room again


def slots_for(rate_limits: tuple[RateLimitConfig, ...], tools: tuple[str, ...]) -> dict[RateRule, int]:
    """The slots an LLM request takes: one in each `llm` rule, one per tool result it brings (`tools`:
    the function-calling tools' names) in each rule that tool matches."""
    out: dict[RateRule, int] = dict.fromkeys(rules_for(rate_limits, None), 1)
    for tool in tools:
        for rule in rules_for(rate_limits, tool):
            out[rule] = out.get(rule, 0) + 1
    return out


def refusal_decision(refusal: RateRefusal) -> Decision:
    """The refusal as a guard decision: BLOCK (the session goes on), retryable (`retry_after`)."""
    rule = refusal.rule
    if rule.match == "llm":
        what = "LLM calls"
    elif rule.match == "tools":
        what = "tool calls"
    else:
        what = f"calls of tools matching {rule.match!r}"
    return Decision(
        Action.BLOCK,
        GUARD_RATE_LIMITED,
        f"this agent's {what} are over the rate limit {rule.match!r} ({rule.max_calls} per {rule.per_s:g}s)",
        threshold=f"{rule.max_calls} per {rule.per_s:g}s",
        actual=refusal.count,
        retry_after=round(max(refusal.retry_after, 0.0), 3),
    )


def wait_for_room(times: deque[float] | list[float], rule: RateRule, now: float, need: int = 1) -> float:
    """Seconds until a window holding `times` (oldest first, none older than `per_s`) has room for
    `need` slots (at most `max_calls`)."""
    excess = len(times) + need - rule.max_calls  # > 0: that many of the oldest must leave
    return times[excess - 1] + rule.per_s - now


class SlidingWindows:
    """The windows of every agent x rule of this process (or of the in-memory shared backend)."""

    def __init__(self) -> None:
        # (agent, rule key) -> (the rule's period, the times of its admitted calls, oldest first)
        self._times: dict[tuple[str, str], tuple[float, deque[float]]] = {}

    def admit(
        self, agent: str, rules: tuple[RateRule, ...], now: float, slots: tuple[int, ...] = ()
    ) -> RateRefusal | None:
        """None: admitted, `slots` (one each by default) taken in each rule's window; else the
        refusal (nothing taken)."""
        if not rules:
            return None
        refusal: RateRefusal | None = None
        windows = []
        needs = [
            min(need, rule.max_calls) for need, rule in zip(slots or (1,) * len(rules), rules, strict=True)
        ]
        for rule, need in zip(rules, needs, strict=True):
            key = (agent, rule.key)
            window = self._times.get(key)
            if window is None or window[0] != rule.per_s:
                window = self._times[key] = (rule.per_s, window[1] if window else deque())
            times = window[1]
            _expire(times, now - rule.per_s)
            windows.append(times)
            if len(times) + need > rule.max_calls:
                wait = wait_for_room(times, rule, now, need)
                if refusal is None or wait > refusal.retry_after:
                    refusal = RateRefusal(rule, len(times), wait)
        if refusal is not None:
            self._drop_empty(agent, rules)
            return refusal
        for times, need in zip(windows, needs, strict=True):
            times.extend([now] * need)
        return None

    def count(self, agent: str, rule: RateRule, now: float) -> int:
        """Calls in the window now (for views and tests)."""
        window = self._times.get((agent, rule.key))
        if window is None:
            return 0
        times = window[1]
        _expire(times, now - rule.per_s)
        return len(times)

    def sweep(self, now: float) -> None:
        """Forget windows whose every call is older than their period (idle agents hold no memory)."""
        for key, (per_s, times) in list(self._times.items()):
            if not times or times[-1] <= now - per_s:
                del self._times[key]

    def _drop_empty(self, agent: str, rules: tuple[RateRule, ...]) -> None:
        for rule in rules:
            key = (agent, rule.key)
            window = self._times.get(key)
            if window is not None and not window[1]:
                del self._times[key]

    def __len__(self) -> int:
        return len(self._times)


def _expire(times: deque[float], horizon: float) -> None:
    """Drop the times at or before `horizon`: a call made exactly `per_s` ago no longer counts."""
    while times and times[0] <= horizon:
        times.popleft()
