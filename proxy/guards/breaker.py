"""Circuit breaker per agent x upstream (SPEC §5.3, LangSight's three states).

Closed -> Open after `open_after_failures` consecutive failures; Open refuses at once for
`cooldown_seconds`; then Half-open admits at most `half_open_max_calls` trial calls, counted when
they are admitted (not when they finish) so trials that arrive together cannot all slip through.
A trial success closes the circuit, a trial failure re-opens it and restarts the cooldown.

What is a failure is the caller's call (the pipeline): connection error, timeout, HTTP 5xx, a
stream that breaks before its clean end, and for MCP a JSON-RPC internal error (-32603); never a
4xx or a well-formed answer the proxy cannot parse. Calls that never reached the upstream (refused
by another guard) must `release()` their ticket so a half-open slot is not lost.

Pure: no I/O, no asyncio, the monotonic clock passed in as `now`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from proxy.constants import GUARD_CIRCUIT_BREAKER, TAG_CIRCUIT_BREAKER_OPEN
from proxy.guards.config import CircuitBreakerConfig
from proxy.guards.decision import ALLOW, Action, Decision


class State(enum.StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


@dataclass(frozen=True)
class Transition:
    """A state change, for the STATE_UPDATE event (state = new state, diff = old -> new)."""

    upstream: str
    old: State
    new: State
    failures: int  # consecutive failures when it happened
    reason: str


@dataclass(frozen=True)
class Ticket:
    """Proof that a call was admitted; `trial` when it used a half-open slot."""

    generation: int
    trial: bool
    transition: Transition | None = None  # open -> half_open happens when the first trial is admitted
    # the circuit that issued it (not part of its value): the call's answer goes back to it
    breaker: CircuitBreaker | None = field(default=None, compare=False, repr=False)


def refusal(
    upstream: str, state: State, failures: int, left: float, config: CircuitBreakerConfig
) -> Decision:
    """The BLOCK of a call an open (or trial-full half-open) circuit refuses, with `retry_after`.
    Shared with the Redis backend, which keeps the state elsewhere (proxy/state/)."""
    if state is State.OPEN:
        message = f"circuit open for upstream {upstream!r}: {failures} consecutive failures"
    else:
        message = f"circuit half-open for upstream {upstream!r}: trial calls in progress"
        left = max(left, 1.0)
    return Decision(
        Action.BLOCK,
        GUARD_CIRCUIT_BREAKER,
        message,
        threshold=config.open_after_failures,
        actual=failures,
        retry_after=round(left, 3),
        tags=(TAG_CIRCUIT_BREAKER_OPEN,),
    )


class CircuitBreaker:
    """One circuit: one agent calling one upstream."""

    def __init__(self, config: CircuitBreakerConfig, upstream: str = "") -> None:
        self.config = config
        self.upstream = upstream
        self.state = State.CLOSED
        self.failures = 0  # consecutive
        self.opened_at: float | None = None
        self.trials_admitted = 0
        self.trials_in_flight = 0
        # bumped on every state change, so an answer to a call admitted in an older state
        # (e.g. a slow closed-state call that fails after the circuit re-opened) changes nothing
        self.generation = 0
        self._closed: Ticket | None = None  # see _closed_ticket

    def configure(self, config: CircuitBreakerConfig) -> None:
        """Config changes at run time (admin API) apply on the next call; the state is kept."""
        self.config = config

    def _move(self, new: State, reason: str) -> Transition:
        t = Transition(self.upstream, self.state, new, self.failures, reason)
        self.state = new
        self.generation += 1
        self.trials_admitted = 0
        self.trials_in_flight = 0
        return t

    def retry_after(self, now: float) -> float:
        if self.state is not State.OPEN or self.opened_at is None:
            return 0.0
        return max(0.0, self.opened_at + self.config.cooldown_seconds - now)

    def before_call(self, now: float) -> tuple[Decision, Ticket | None]:
        """Can a call go? ALLOW with a ticket, or BLOCK (refused at once) with `retry_after`.

        The open -> half_open transition rides on the ticket of the first trial it admits.
        """
        if not self.config.enabled:
            return ALLOW, Ticket(self.generation, trial=False)
        transition = None
        if self.state is State.OPEN and self.retry_after(now) <= 0:
            transition = self._move(State.HALF_OPEN, "cooldown elapsed")
        if self.state is State.CLOSED:
            return ALLOW, self._closed_ticket()
        if self.state is State.HALF_OPEN and self.trials_admitted < self.config.half_open_max_calls:
            self.trials_admitted += 1
            self.trials_in_flight += 1
            return ALLOW, Ticket(self.generation, trial=True, transition=transition, breaker=self)
        return self._refusal(now), None

    def _closed_ticket(self) -> Ticket:
        """The ticket of a call a closed circuit admits: the same (frozen) one for every such call of
        a generation, rather than one made per call."""
        ticket = self._closed
        if ticket is None or ticket.generation != self.generation:
            ticket = self._closed = Ticket(self.generation, trial=False, breaker=self)
        return ticket

    def _refusal(self, now: float) -> Decision:
        return refusal(self.upstream, self.state, self.failures, self.retry_after(now), self.config)

    def on_success(self, ticket: Ticket | None, now: float) -> Transition | None:
        if ticket is None or ticket.generation != self.generation:
            return None
        if self.state is State.HALF_OPEN and ticket.trial:
            self.failures = 0
            return self._move(State.CLOSED, "trial call succeeded")
        if self.state is State.CLOSED:
            self.failures = 0
        return None

    def on_failure(self, ticket: Ticket | None, now: float) -> Transition | None:
        if ticket is None or ticket.generation != self.generation or not self.config.enabled:
            return None
        self.failures += 1
        if self.state is State.HALF_OPEN and ticket.trial:
            self.opened_at = now
            return self._move(State.OPEN, "trial call failed")
        if self.state is State.CLOSED and self.failures >= self.config.open_after_failures:
            self.opened_at = now
            return self._move(State.OPEN, f"{self.failures} consecutive failures")
        return None

    def release(self, ticket: Ticket | None) -> None:
        """The admitted call never reached the upstream: give its half-open slot back."""
        if ticket is not None and ticket.trial and ticket.generation == self.generation:
            self.trials_admitted = max(0, self.trials_admitted - 1)
            self.trials_in_flight = max(0, self.trials_in_flight - 1)

    def snapshot(self, now: float) -> dict[str, object]:
        return {
            "upstream": self.upstream,
            "state": str(self.state),
            "consecutive_failures": self.failures,
            "retry_after": round(self.retry_after(now), 3),
            "half_open_trials": self.trials_admitted,
        }


class BreakerRegistry:
    """All circuits of the process, keyed by (agent, upstream): one failing server never trips another."""

    def __init__(self, config_for: CircuitBreakerConfig | None = None) -> None:
        self._default = config_for or CircuitBreakerConfig()
        self._breakers: dict[tuple[str, str], CircuitBreaker] = {}

    def get(self, agent: str, upstream: str, config: CircuitBreakerConfig | None = None) -> CircuitBreaker:
        """The circuit for this pair, created closed; `config` (the agent's config in force) is applied."""
        key = (agent, upstream)
        breaker = self._breakers.get(key)
        if breaker is None:
            breaker = self._breakers[key] = CircuitBreaker(config or self._default, upstream)
        elif config is not None and config is not breaker.config:
            breaker.configure(config)
        return breaker

    def open_count_by_upstream(self) -> dict[str, int]:
        """Circuits not closed (open or half-open), per upstream, counted across agents (a metric)."""
        counts: dict[str, int] = {}
        for (_agent, upstream), b in self._breakers.items():
            counts.setdefault(upstream, 0)
            if b.state is not State.CLOSED:
                counts[upstream] += 1
        return counts

    def items(self) -> list[tuple[tuple[str, str], CircuitBreaker]]:
        return list(self._breakers.items())
