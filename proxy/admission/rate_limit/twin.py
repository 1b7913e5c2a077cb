"""The rate limits' shared-state twin (SPEC §9): asked inside the admission's APPEND, before the
check is appended (a gate). A window is a sorted set of the checks it admitted, scored by the time
(Redis TIME, seconds) they were admitted; entries at or before now - per_s no longer count. A check
is admitted through all its rules or none, taking its slots in each (members `member`, `member#2`,
...); checks of one append are asked in order, so they see each other. `memory` is the same rule:
proxy/guards/rate_limit.py's pure `SlidingWindows`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from proxy.guards.rate_limit import RateRefusal, RateRule, SlidingWindows
from proxy.state import keys
from proxy.state.base import Store


@dataclass(frozen=True, slots=True)
class RateRequest:
    """The rate limits a check goes through, taking `slots` in each (one each when empty); `member`
    names its slots in each window (the check's id: unique)."""

    agent: str
    member: str
    rules: tuple[RateRule, ...]
    slots: tuple[int, ...] = ()


# args: {member, {{key, max_calls, per_s, slots (<= max_calls)}, ...}}; reply {0, '0', 0} admitted,
# else {rule index (from 1), seconds until room, calls held}
LUA = r"""
CHECKS.rate_limit = function(ask, now)
  local hit, wait, held = 0, 0, 0
  for j, rule in ipairs(ask[2]) do
    local k, max, per, need = rule[1], tonumber(rule[2]), tonumber(rule[3]), tonumber(rule[4])
    redis.call('ZREMRANGEBYSCORE', k, '-inf', string.format('%.6f', now - per))
    local n = redis.call('ZCARD', k)
    if n + need > max then
      -- n + need - max of the oldest must leave: room comes when the last of them is per old
      local at = redis.call('ZRANGE', k, n + need - max - 1, n + need - max - 1, 'WITHSCORES')
      local w = tonumber(at[2]) + per - now
      if hit == 0 or w > wait then hit, wait, held = j, w, n end
    end
  end
  if hit ~= 0 then return true, {hit, string.format('%.6f', wait), held} end
  local stamp = string.format('%.6f', now)
  for _, rule in ipairs(ask[2]) do
    redis.call('ZADD', rule[1], stamp, ask[1])
    for i = 2, tonumber(rule[4]) do redis.call('ZADD', rule[1], stamp, ask[1] .. '#' .. i) end
    redis.call('PEXPIRE', rule[1], math.ceil(tonumber(rule[3]) * 1000))
  end
  return false, {0, '0', 0}
end
"""


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class RateTwin:
    name = "rate_limit"
    gate = True
    lua = LUA

    def args(self, request: RateRequest) -> Any:
        r = request
        return [
            r.member,
            [
                [
                    keys.rate(r.agent, rule.key),
                    rule.max_calls,
                    repr(float(rule.per_s)),
                    min(need, rule.max_calls),
                ]
                for rule, need in zip(r.rules, r.slots or (1,) * len(r.rules), strict=True)
            ],
        ]

    def parse(self, request: RateRequest, reply: Sequence[Any]) -> RateRefusal | None:
        """None admitted, else the refusal of its fullest rule."""
        hit, wait, held = reply
        if int(hit) == 0:
            return None
        return RateRefusal(request.rules[int(hit) - 1], int(held), float(_text(wait)))

    def memory(self, store: Store, request: RateRequest, now: float) -> tuple[bool, RateRefusal | None]:
        windows = windows_of(store.store(self.name))
        refusal = windows.admit(request.agent, request.rules, now, request.slots)
        return refusal is not None, refusal


def windows_of(store: dict[str, Any]) -> SlidingWindows:
    found: SlidingWindows | None = store.get("windows")
    if found is None:
        found = store["windows"] = SlidingWindows()
    return found


TWIN = RateTwin()
