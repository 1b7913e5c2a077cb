"""The idle sweep's queues (proxy/sessions.py `idle_sessions`): new sessions in a deque in the order
they started, sessions used since they were queued (and resumed ones) in a heap; a sweep ends
exactly the sessions idle for the timeout, oldest queue time first (issue 33)."""

import random

from proxy.sessions import Session, SessionManager


def mgr() -> SessionManager:
    return SessionManager(idle_timeout_s=300, terminated_ttl_s=3600)


def opened(m: SessionManager, explicit: str | None, now: float) -> Session:
    found = m.lookup("a", explicit, now=now, wall=0)
    assert isinstance(found, tuple) and found[1]
    return found[0]


def test_a_session_whose_clock_reads_earlier_than_the_newest_queued_ends_on_time() -> None:
    m = mgr()
    later = opened(m, "later", 10.0)
    earlier = opened(m, "earlier", 5.0)  # (a caller's clock read before the previous one's)
    assert m.idle_sessions(306.0) == [earlier]
    assert m.idle_sessions(309.0) == []
    assert m.idle_sessions(310.0) == [later]


def test_a_sweep_ends_used_and_new_sessions_in_the_order_they_went_idle() -> None:
    m = mgr()
    used = opened(m, "used", 0.0)
    new1 = opened(m, "new1", 50.0)
    assert m.lookup("a", "used", now=100.0, wall=0) == (used, False)  # used again: idle from 100
    new2 = opened(m, "new2", 150.0)
    new3 = opened(m, "new3", 450.0)
    assert m.idle_sessions(300.0) == []  # `used` is queued again, at 100
    assert m.idle_sessions(349.0) == []
    assert m.idle_sessions(460.0) == [new1, used, new2]
    assert m.idle_sessions(749.0) == []
    assert m.idle_sessions(750.0) == [new3]
    assert m.live_count() == 0


def test_a_forgotten_session_left_in_the_queue_is_not_ended() -> None:
    m = mgr()
    s = opened(m, None, 0.0)
    assert m.expire("a", None, 400.0) is s  # expired on a call: forgotten, still queued
    assert m.idle_sessions(400.0) == []


def test_a_resumed_session_is_queued_at_its_resume() -> None:
    m = mgr()
    s = opened(m, "x", 0.0)
    m.terminate(s, now=10.0)
    new = m.resume(s, "run-2", now=200.0, wall=0)
    assert m.idle_sessions(499.0) == []
    assert m.idle_sessions(500.0) == [new]


def test_a_sweep_ends_exactly_the_sessions_idle_for_the_timeout_whatever_the_order_of_calls() -> None:
    """Against the definition, read off every session tracked: random calls (a new session's clock
    read earlier than the newest's, calls in flight, sessions expired on a call, terminated and
    resumed), then sweeps."""
    rng = random.Random(33)
    for _ in range(20):
        m = mgr()
        now = 0.0
        explicit = [f"s{i}" for i in range(12)]
        resumed = 0
        for _ in range(300):
            now += rng.choice((0.0, 0.5, 7.0, 40.0))
            at = max(0.0, now - rng.choice((0.0, 0.0, 2.0, 90.0)))  # a clock read earlier (a slow caller)
            op = rng.random()
            sid = rng.choice(explicit + [None])
            if op < 0.55:
                current = m.match("a", sid)
                if current is not None and current.last_seen > at:
                    at = now  # (a session's own clock never goes back: only a new one's reads early)
                m.expire("a", sid, at)
                found = m.lookup("a", sid, now=at, wall=0)
                if isinstance(found, tuple) and rng.random() < 0.1:
                    found[0].inflight = 1  # a long call
            elif op < 0.65:
                live = [s for s in m.known() if s.inflight]
                if live:
                    rng.choice(live).inflight = 0
            elif op < 0.7:
                live = [s for s in m.known() if s.explicit and not s.terminated and not s.ended]
                if live:
                    s = rng.choice(live)
                    m.terminate(s, at)
                    if rng.random() < 0.5:
                        resumed += 1
                        m.resume(s, f"resumed-{resumed}", now=at, wall=0)
            else:
                idle = {
                    id(s)
                    for s in m.known()
                    if not s.ended and not s.inflight and now - s.last_seen >= m.idle_timeout_s
                }
                ended = m.idle_sessions(now)
                assert {id(s) for s in ended} == idle
                for s in ended:
                    s.ended = True
