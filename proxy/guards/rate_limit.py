"""Rate limits (SPEC §9): at most `max_calls` calls of one agent, across all its sessions, in any
`per_s` seconds, per rule. Pure: the caller passes the clock; no I/O.

What a call is, per rule's `match`:
- `llm`: every LLM request of the agent (chat, Responses over HTTP or WebSocket, Anthropic, ...);
- `tools`: every MCP `tools/call` of the agent, on any server;
- a tool pattern (fnmatch glob, case-sensitive, as tool permissions match): an MCP `tools/call`
  whose `SERVER__TOOL` name matches.
A function-calling tool runs in the agent, not through Tripwire: it is done before Tripwire can
see it (its result comes back in the next LLM request), so a rate limit could not hold it back. Its
use is limited through the `llm` rule instead (each of its rounds is an LLM request); a tool
pattern never counts it.

Exact: a window is the list of the times its admitted calls were admitted, and a call goes through
only when every rule it matches holds fewer than `max_calls` times within the last `per_s` seconds;
then it takes a slot in each of them (all or nothing, so a refused call takes none). The next call
is admitted once enough of the oldest times are `per_s` old: `retry_after`. The Redis script
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


def refusal_decision(refusal: RateRefusal, tool: str | None) -> Decision:
    """The refusal as a guard decision: BLOCK (the session goes on), retryable (`retry_after`)."""
    rule = refusal.rule
    what = "LLM calls" if tool is None else f"calls of {tool}"
    return Decision(
        Action.BLOCK,
        GUARD_RATE_LIMITED,
        f"this agent's {what} are over the rate limit {rule.match!r} ({rule.max_calls} per {rule.per_s:g}s)",
        threshold=f"{rule.max_calls} per {rule.per_s:g}s",
        actual=refusal.count,
        retry_after=round(max(refusal.retry_after, 0.0), 3),
    )


def wait_for_room(times: deque[float] | list[float], rule: RateRule, now: float) -> float:
    """Seconds until a window holding `times` (oldest first, none older than `per_s`) has room."""
    excess = len(times) - rule.max_calls  # >= 0: that many must leave, and one more
    return times[excess] + rule.per_s - now


class SlidingWindows:
    """The windows of every agent x rule of this process (or of the in-memory shared backend)."""

    def __init__(self) -> None:
        # (agent, rule key) -> (the rule's period, the times of its admitted calls, oldest first)
        self._times: dict[tuple[str, str], tuple[float, deque[float]]] = {}

    def admit(self, agent: str, rules: tuple[RateRule, ...], now: float) -> RateRefusal | None:
        """None: admitted, a slot taken in each rule's window; else the refusal (nothing taken)."""
        if not rules:
            return None
        refusal: RateRefusal | None = None
        windows = []
        for rule in rules:
            key = (agent, rule.key)
            window = self._times.get(key)
            if window is None or window[0] != rule.per_s:
                window = self._times[key] = (rule.per_s, window[1] if window else deque())
            times = window[1]
            _expire(times, now - rule.per_s)
            windows.append(times)
            if len(times) >= rule.max_calls:
                wait = wait_for_room(times, rule, now)
                if refusal is None or wait > refusal.retry_after:
                    refusal = RateRefusal(rule, len(times), wait)
        if refusal is not None:
            self._drop_empty(agent, rules)
            return refusal
        for times in windows:
            times.append(now)
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
