"""Circuit breaker transitions per agent x upstream (SPEC §5.3)."""

from __future__ import annotations

from proxy.guards.breaker import BreakerRegistry, CircuitBreaker, State, Ticket
from proxy.guards.config import CircuitBreakerConfig
from proxy.guards.decision import Action

CFG = CircuitBreakerConfig()  # 5 / 30 / 3


def _fail(b: CircuitBreaker, n: int, now: float = 0.0) -> list:
    out = []
    for _ in range(n):
        d, t = b.before_call(now)
        assert d.action is Action.ALLOW
        out.append(b.on_failure(t, now))
    return out


def test_opens_after_exactly_open_after_failures() -> None:
    b = CircuitBreaker(CFG, "llm")
    transitions = _fail(b, 4)
    assert transitions == [None] * 4 and b.state is State.CLOSED
    (t,) = _fail(b, 1, now=10.0)
    assert t is not None and (t.old, t.new) == (State.CLOSED, State.OPEN)
    d, ticket = b.before_call(11.0)
    assert d.action is Action.BLOCK and ticket is None
    assert d.guard == "circuit_breaker" and "circuit_breaker_open" in d.tags
    assert d.retry_after == 29.0
    assert (d.threshold, d.actual) == (5, 5)


def test_success_resets_the_consecutive_count() -> None:
    b = CircuitBreaker(CFG, "llm")
    _fail(b, 4)
    d, t = b.before_call(0)
    assert b.on_success(t, 0) is None
    _fail(b, 4)
    assert b.state is State.CLOSED


def test_cooldown_then_half_open_admits_exactly_max_calls_of_simultaneous_calls() -> None:
    b = CircuitBreaker(CFG, "mcp:files")
    _fail(b, 5, now=100.0)
    assert b.before_call(129.9)[0].action is Action.BLOCK
    # five calls arrive together after the cooldown: three trials go, two are refused
    results = [b.before_call(130.0) for _ in range(5)]
    admitted = [t for d, t in results if d.action is Action.ALLOW]
    refused = [d for d, t in results if d.action is Action.BLOCK]
    assert len(admitted) == 3 and len(refused) == 2
    assert admitted[0].transition is not None
    assert (admitted[0].transition.old, admitted[0].transition.new) == (State.OPEN, State.HALF_OPEN)
    assert all(t.transition is None for t in admitted[1:])
    assert b.state is State.HALF_OPEN


def test_half_open_success_closes() -> None:
    b = CircuitBreaker(CFG, "u")
    _fail(b, 5)
    _, t = b.before_call(30.0)
    tr = b.on_success(t, 31.0)
    assert tr is not None and (tr.old, tr.new) == (State.HALF_OPEN, State.CLOSED)
    assert b.before_call(31.0)[0].action is Action.ALLOW


def test_half_open_failure_reopens_and_restarts_cooldown() -> None:
    b = CircuitBreaker(CFG, "u")
    _fail(b, 5)
    _, t1 = b.before_call(30.0)
    _, t2 = b.before_call(30.0)
    tr = b.on_failure(t1, 40.0)
    assert tr is not None and (tr.old, tr.new) == (State.HALF_OPEN, State.OPEN)
    d, _ = b.before_call(69.0)
    assert d.action is Action.BLOCK and d.retry_after == 1.0
    # the other trial's late answer belongs to an older state and changes nothing
    assert b.on_success(t2, 41.0) is None and b.state is State.OPEN
    assert b.before_call(70.0)[0].action is Action.ALLOW


def test_released_trial_gives_its_slot_back() -> None:
    b = CircuitBreaker(CircuitBreakerConfig(half_open_max_calls=1), "u")
    _fail(b, 5)
    d, t = b.before_call(30.0)
    assert b.before_call(30.0)[0].action is Action.BLOCK
    b.release(t)
    assert b.before_call(30.0)[0].action is Action.ALLOW


def test_disabled_breaker_never_refuses() -> None:
    b = CircuitBreaker(CircuitBreakerConfig(enabled=False), "u")
    _fail(b, 50)
    assert b.state is State.CLOSED


def test_registry_keeps_upstreams_and_agents_apart() -> None:
    reg = BreakerRegistry()
    bad = reg.get("agent-a", "files")
    _fail(bad, 5)
    assert reg.get("agent-a", "files") is bad
    assert reg.get("agent-a", "search").before_call(1.0)[0].action is Action.ALLOW
    assert reg.get("agent-b", "files").before_call(1.0)[0].action is Action.ALLOW
    _fail(reg.get("agent-b", "files"), 5)
    assert reg.open_count_by_upstream() == {"files": 2, "search": 0}


def test_registry_applies_a_new_config_on_the_next_call() -> None:
    reg = BreakerRegistry()
    b = reg.get("a", "u", CircuitBreakerConfig(open_after_failures=2))
    _fail(b, 2)
    assert b.state is State.OPEN
    assert (
        reg.get("a", "u", CircuitBreakerConfig(open_after_failures=2, cooldown_seconds=1))
        .before_call(1.0)[0]
        .action
        is Action.ALLOW
    )


def test_a_ticket_names_its_circuit_outside_its_value() -> None:
    """The circuit that issued a ticket rides on it (the stage settles the answer there); the
    ticket's value (generation, trial, transition: what the shared backends compare) is unchanged."""
    b = CircuitBreaker(CircuitBreakerConfig(open_after_failures=1, cooldown_seconds=1.0))
    _, closed = b.before_call(0.0)
    assert closed is not None and closed.breaker is b and closed == Ticket(0, trial=False)
    b.on_failure(closed, 1.0)
    _, trial = b.before_call(5.0)
    assert trial is not None and trial.trial and trial.breaker is b
    assert trial == Ticket(trial.generation, trial=True, transition=trial.transition)
