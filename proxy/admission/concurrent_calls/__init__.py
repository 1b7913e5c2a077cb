"""Concurrent calls per agent (SPEC §9 `max_concurrent_calls`, docs/gateway.md): a gate. An agent
over its limit of calls in flight (LLM calls and MCP tool calls, across its sessions, and with
shared state across replicas) is refused with `concurrent_calls`, retryable (429 + Retry-After; MCP:
the BLOCK result saying when), the session going on; the slot is given back when the call ends
(answered, refused by a later check, failed or cancelled). First in the list: a call it refuses
takes no rate-limit slot. The rule: rule.py; its twin: twin.py."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from proxy.admission.check import Check, Refusal
from proxy.admission.concurrent_calls import rule
from proxy.admission.concurrent_calls.twin import RELEASE, TWIN, InFlight
from proxy.constants import GUARD_CONCURRENT_CALLS
from proxy.guards.config import GuardConfig
from proxy.guards.decision import Decision
from proxy.state import keys
from proxy.state.base import Op, Twin

if TYPE_CHECKING:
    from proxy.exchange import Exchange


class ConcurrentCallsGate:
    twin: Twin = TWIN
    release: Op | None = RELEASE

    def ask(self, ex: Exchange, config: GuardConfig, member: str) -> InFlight | None:
        limit = config.max_concurrent_calls
        if limit is None:
            return None
        assert ex.session is not None
        # (no member given, this process's store: the call's object names it, unique while it runs)
        return InFlight(keys.concurrent(ex.session.agent), limit, member or f"local:{id(ex)}")

    def refusal(self, request: InFlight, answer: tuple[bool, int]) -> Decision:
        return rule.refusal(request.limit, answer[1])

    def sweep(self, store: dict[str, Any], now: float) -> None:
        for key, calls in list(store.items()):
            for member, until in list(calls.items()):
                if until <= now:
                    del calls[member]
            if not calls:
                del store[key]


CHECK = Check(
    "concurrent_calls",
    "the agent's calls in flight (`max_concurrent_calls`), across its sessions",
    (Refusal(GUARD_CONCURRENT_CALLS, retryable=True, ends_session=False),),
    gate=ConcurrentCallsGate(),
)
