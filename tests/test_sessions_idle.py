"""The idle sweep's queues (proxy/sessions.py `idle_sessions`): new sessions in a deque in the order
they started, sessions used since they were queued (and resumed ones) in a heap; a sweep ends
exactly the sessions idle for the timeout, oldest queue time first (issue 33)."""

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
