"""The circuit breaker's shared-state twin (SPEC §5.3, docs/scaling.md): one circuit per agent x
upstream in a Redis hash, admitted inside the admission's APPEND (after the check is appended, not
for a check a gate refused), reported and released by operations of their own (lua.py). The Lua is
a port of proxy/guards/breaker.py's `CircuitBreaker`; `memory` IS that pure breaker
(tests/test_state_backend.py checks the port against it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from proxy.admission.breaker import lua
from proxy.guards.breaker import CircuitBreaker, State, Ticket, Transition, refusal
from proxy.guards.config import CircuitBreakerConfig
from proxy.guards.decision import Decision
from proxy.state import keys
from proxy.state.base import StateBackend, Store

BREAKER_TTL_MS = 7 * 86_400_000  # a breaker nobody called for a week is closed again


@dataclass(frozen=True)
class BreakerAdmission:
    """A circuit's admission: a ticket (admitted) or a refusal decision with `retry_after`."""

    ticket: Ticket | None
    refusal: Decision | None
    state: State = State.CLOSED  # after admitting (a closed circuit with no failures needs no report
    failures: int = 0  # of a success: there is nothing to reset)


@dataclass(frozen=True)
class BreakerRequest:
    """A circuit to admit a call through, in the same step as the call's check."""

    agent: str
    upstream: str
    config: CircuitBreakerConfig
    now: float | None = None  # None: the backend's clock


@dataclass(frozen=True)
class BreakerReport:
    agent: str
    upstream: str
    ticket: Ticket
    config: CircuitBreakerConfig
    failed: bool
    now: float | None = None


@dataclass(frozen=True)
class BreakerView:
    agent: str
    upstream: str
    state: State
    failures: int


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _admit_args(config: CircuitBreakerConfig) -> list[Any]:
    return [int(config.enabled), repr(float(config.cooldown_seconds)), config.half_open_max_calls]


def _breakers(store: Store) -> dict[tuple[str, str], CircuitBreaker]:
    return store.store("breaker")


def _breaker(store: Store, agent: str, upstream: str, config: CircuitBreakerConfig) -> CircuitBreaker:
    breakers = _breakers(store)
    breaker = breakers.get((agent, upstream))
    if breaker is None:
        breaker = breakers[(agent, upstream)] = CircuitBreaker(config, upstream)
    breaker.configure(config)
    return breaker


def _admission(upstream: str, reply: Sequence[Any], config: CircuitBreakerConfig) -> BreakerAdmission:
    """A breaker script's admit answer as the pure breaker gives it (a ticket, or a refusal)."""
    verdict, gen, trial, moved, failures, left, state = reply
    if _text(verdict) == "allow":
        transition = None
        if _text(moved):
            transition = Transition(
                upstream, State(_text(moved)), State.HALF_OPEN, int(failures), "cooldown elapsed"
            )
        return BreakerAdmission(Ticket(int(gen), trial=bool(int(trial)), transition=transition), None)
    return BreakerAdmission(
        None, refusal(upstream, State(_text(state)), int(failures), float(_text(left)), config)
    )


def _memory_admit(store: Store, r: BreakerRequest, now: float) -> BreakerAdmission:
    breaker = _breaker(store, r.agent, r.upstream, r.config)
    decision, ticket = breaker.before_call(now if r.now is None else r.now)
    return BreakerAdmission(ticket, None if ticket is not None else decision, breaker.state, breaker.failures)


class BreakerTwin:
    """Admitted in the APPEND, after the check is appended."""

    name = "breaker"
    gate = False
    lua = lua.LUA

    def args(self, r: BreakerRequest) -> Any:
        return [
            keys.breaker(r.agent, r.upstream),
            r.agent,
            r.upstream,
            BREAKER_TTL_MS,
            *_admit_args(r.config),
            keys.BREAKER_INDEX,
        ]

    def parse(self, r: BreakerRequest, reply: Sequence[Any]) -> BreakerAdmission:
        return _admission(r.upstream, reply, r.config)

    def memory(self, store: Store, r: BreakerRequest, now: float) -> tuple[bool, BreakerAdmission]:
        return False, _memory_admit(store, r, now)


def _script_keys(agent: str, upstream: str) -> list[str]:
    return [keys.breaker(agent, upstream), keys.BREAKER_INDEX]


def _head(agent: str, upstream: str, now: float | None) -> list[Any]:
    return ["" if now is None else repr(now), agent, upstream, BREAKER_TTL_MS]


class AdmitOp:
    """A circuit admitted on its own (not with a check)."""

    name = "breaker_admit"
    lua = lua.ADMIT_LUA

    def keys(self, r: BreakerRequest) -> list[str]:
        return _script_keys(r.agent, r.upstream)

    def args(self, r: BreakerRequest) -> list[Any]:
        return _head(r.agent, r.upstream, r.now) + _admit_args(r.config)

    def parse(self, r: BreakerRequest, reply: Sequence[Any]) -> BreakerAdmission:
        return _admission(r.upstream, reply, r.config)

    def memory(self, store: Store, r: BreakerRequest, now: float) -> BreakerAdmission:
        return _memory_admit(store, r, now)


class ReportOp:
    """A call's outcome moves the circuit: a Transition, or None."""

    name = "breaker_report"
    lua = lua.REPORT_LUA

    def keys(self, r: BreakerReport) -> list[str]:
        return _script_keys(r.agent, r.upstream)

    def args(self, r: BreakerReport) -> list[Any]:
        c = r.config
        return _head(r.agent, r.upstream, r.now) + [
            int(c.enabled),
            c.open_after_failures,
            r.ticket.generation,
            int(r.ticket.trial),
            int(r.failed),
        ]

    def parse(self, r: BreakerReport, moved: Sequence[Any]) -> Transition | None:
        if not moved:
            return None
        old, new, failures, reason = moved
        return Transition(r.upstream, State(_text(old)), State(_text(new)), int(failures), _text(reason))

    def memory(self, store: Store, r: BreakerReport, now: float) -> Transition | None:
        breaker = _breaker(store, r.agent, r.upstream, r.config)
        at = now if r.now is None else r.now
        return breaker.on_failure(r.ticket, at) if r.failed else breaker.on_success(r.ticket, at)


class ReleaseOp:
    """A trial ticket of a call that never reached the upstream goes back."""

    name = "breaker_release"
    lua = lua.RELEASE_LUA

    def keys(self, r: tuple[str, str, Ticket]) -> list[str]:
        return _script_keys(r[0], r[1])

    def args(self, r: tuple[str, str, Ticket]) -> list[Any]:
        return [*_head(r[0], r[1], None), r[2].generation]

    def parse(self, r: tuple[str, str, Ticket], reply: Any) -> None:
        return None

    def memory(self, store: Store, r: tuple[str, str, Ticket], now: float) -> None:
        breaker = _breakers(store).get((r[0], r[1]))
        if breaker is not None:
            breaker.release(r[2])


class ViewOp:
    name = "breaker_view"
    lua = lua.VIEW_LUA

    def keys(self, r: None) -> list[str]:
        return [keys.BREAKER_INDEX]

    def args(self, r: None) -> list[Any]:
        return []

    def parse(self, r: None, rows: Sequence[Any]) -> list[BreakerView]:
        views = [BreakerView(_text(a), _text(u), State(_text(s)), int(f)) for a, u, s, f in rows]
        return sorted(views, key=lambda v: (v.agent, v.upstream))

    def memory(self, store: Store, r: None, now: float) -> list[BreakerView]:
        return [
            BreakerView(agent, upstream, b.state, b.failures)
            for (agent, upstream), b in sorted(_breakers(store).items())
        ]


TWIN = BreakerTwin()


async def admit(
    backend: StateBackend,
    agent: str,
    upstream: str,
    config: CircuitBreakerConfig,
    *,
    now: float | None = None,
) -> BreakerAdmission:
    result: BreakerAdmission = await backend.run(AdmitOp(), BreakerRequest(agent, upstream, config, now))
    return result


async def report(
    backend: StateBackend,
    agent: str,
    upstream: str,
    ticket: Ticket,
    config: CircuitBreakerConfig,
    *,
    failed: bool,
    now: float | None = None,
) -> Transition | None:
    moved: Transition | None = await backend.run(
        ReportOp(), BreakerReport(agent, upstream, ticket, config, failed, now)
    )
    return moved


async def release(backend: StateBackend, agent: str, upstream: str, ticket: Ticket) -> None:
    if ticket.trial:  # only a half-open trial slot has anything to give back
        await backend.run(ReleaseOp(), (agent, upstream, ticket))


async def views(backend: StateBackend) -> list[BreakerView]:
    found: list[BreakerView] = await backend.run(ViewOp(), None)
    return found
