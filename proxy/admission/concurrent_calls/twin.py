"""The concurrent-calls limit's shared-state twin: one sorted set per agent (`keys.concurrent`) of
its calls in flight, scored by the time their lease ends, asked inside the admission's APPEND
before the check is appended (a gate), so calls through any number of replicas count together; a
call's slot is given back by `ReleaseOp` when it ends. `memory` is rule.py's pure rule.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from proxy.admission.concurrent_calls import rule
from proxy.state.base import Store

# args: {key, limit, member, lease s}; reply {1 refused / 0 admitted, calls held before it}
LUA = r"""
CHECKS.concurrent_calls = function(a, now)
  redis.call('ZREMRANGEBYSCORE', a[1], '-inf', string.format('%.6f', now))
  local held = redis.call('ZCARD', a[1])
  if held >= tonumber(a[2]) then return true, {1, held} end
  redis.call('ZADD', a[1], string.format('%.6f', now + tonumber(a[4])), a[3])
  redis.call('PEXPIRE', a[1], math.ceil(tonumber(a[4]) * 1000))
  return false, {0, held}
end
"""

# KEYS 1 the agent's set; ARGV 1 the call's member.
RELEASE_LUA = r"""
redis.call('ZREM', KEYS[1], ARGV[1])
return 1
"""


@dataclass(frozen=True, slots=True)
class InFlight:
    """A call asking for a slot among its agent's calls in flight (`key`), as `member`."""

    key: str
    limit: int
    member: str
    lease_s: float = rule.LEASE_S


def _calls(store: Store, key: str) -> dict[str, float]:
    agents: dict[str, dict[str, float]] = store.store("concurrent_calls")
    found = agents.get(key)
    if found is None:
        found = agents[key] = {}
    return found


class ConcurrentTwin:
    name = "concurrent_calls"
    gate = True
    lua = LUA

    def args(self, r: InFlight) -> Any:
        return [r.key, r.limit, r.member, repr(float(r.lease_s))]

    def parse(self, r: InFlight, reply: Sequence[Any]) -> tuple[bool, int]:
        return int(reply[0]) == 1, int(reply[1])

    def memory(self, store: Store, r: InFlight, now: float) -> tuple[bool, tuple[bool, int]]:
        refused, held = rule.admit(_calls(store, r.key), r.limit, r.member, now, r.lease_s)
        return refused, (refused, held)


class ReleaseOp:
    name = "concurrent_calls_release"
    lua = RELEASE_LUA

    def keys(self, r: InFlight) -> list[str]:
        return [r.key]

    def args(self, r: InFlight) -> list[Any]:
        return [r.member]

    def parse(self, r: InFlight, reply: Any) -> None:
        return None

    def memory(self, store: Store, r: InFlight, now: float) -> None:
        rule.release(_calls(store, r.key), r.member)


TWIN = ConcurrentTwin()
RELEASE = ReleaseOp()
