"""How many calls of one agent may be in flight at once (SPEC §9 `max_concurrent_calls`): the pure
rule, which `MemoryBackend` and the local guard backend apply and twin.py's Lua ports.

A call in flight holds a slot, named by the call (`member`), until it ends; each slot also has a
lease (`LEASE_S`), after which it stops counting: a replica that dies with calls in flight does not
hold its agent's slots for ever (as a budget window's reservation, proxy/guard_backend/shared_windows.py).
No I/O; the clock is passed in.
"""

from __future__ import annotations

from proxy.constants import GUARD_CONCURRENT_CALLS
from proxy.guards.decision import Action, Decision

LEASE_S = 900.0
RETRY_AFTER_S = 1.0  # what the refusal suggests: a call in flight usually ends within seconds


def admit(calls: dict[str, float], limit: int, member: str, now: float, lease_s: float) -> tuple[bool, int]:
    """(refused, calls held before this one); admitted, `member` holds a slot until `now + lease_s`.
    `calls`: member -> the time its lease ends."""
    for held_by, until in list(calls.items()):
        if until <= now:
            del calls[held_by]
    held = len(calls)
    if held >= limit:
        return True, held
    calls[member] = now + lease_s
    return False, held


def release(calls: dict[str, float], member: str) -> None:
    calls.pop(member, None)


def refusal(limit: int, held: int) -> Decision:
    """BLOCK, retryable: the session goes on, the agent may call again once a call of its ends."""
    return Decision(
        Action.BLOCK,
        GUARD_CONCURRENT_CALLS,
        f"this agent has {held} calls in flight, its limit of concurrent calls (max_concurrent_calls: {limit})",
        threshold=limit,
        actual=held,
        retry_after=RETRY_AFTER_S,
    )
