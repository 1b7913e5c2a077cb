from proxy.sessions import Refused, SessionManager


def mgr() -> SessionManager:
    return SessionManager(idle_timeout_s=300, terminated_ttl_s=3600)


def test_automatic_session_is_reused_until_idle_timeout() -> None:
    m = mgr()
    s1, created = m.lookup("a", None, now=0, wall=0)
    assert created
    s2, created = m.lookup("a", None, now=299, wall=0)
    assert s2 is s1 and not created
    s3, created = m.lookup("a", None, now=299 + 300, wall=0)
    assert created and s3.run_id != s1.run_id


def test_agents_and_explicit_sessions_are_separate_runs() -> None:
    m = mgr()
    a, _ = m.lookup("a", None, now=0, wall=0)
    b, _ = m.lookup("b", None, now=0, wall=0)
    x, _ = m.lookup("a", "x", now=0, wall=0)
    assert len({a.run_id, b.run_id, x.run_id}) == 3
    assert x.session_id == "x" and x.explicit


def test_idle_sessions_are_reported_once_and_not_while_in_flight() -> None:
    m = mgr()
    s, _ = m.lookup("a", None, now=0, wall=0)
    s.inflight = 1
    assert m.idle_sessions(1000) == []
    s.inflight = 0
    assert m.idle_sessions(1000) == [s]
    assert m.idle_sessions(2000) == []


def test_terminated_explicit_session_refuses_until_ttl() -> None:
    m = mgr()
    s, _ = m.lookup("a", "x", now=0, wall=0)
    m.terminate(s, now=10)
    assert isinstance(m.lookup("a", "x", now=11, wall=0), Refused)
    assert isinstance(m.lookup("a", "x", now=10 + 3599, wall=0), Refused)
    fresh, created = m.lookup("a", "x", now=10 + 3600, wall=0)
    assert created and fresh.run_id != s.run_id


def test_terminated_automatic_session_refuses_until_a_full_quiet_idle_timeout() -> None:
    m = mgr()
    s, _ = m.lookup("a", None, now=0, wall=0)
    m.terminate(s, now=0)
    assert isinstance(m.lookup("a", None, now=200, wall=0), Refused)
    # retrying at 400 is within 300 s of the refused retry at 200: still refused
    assert isinstance(m.lookup("a", None, now=400, wall=0), Refused)
    fresh, created = m.lookup("a", None, now=701, wall=0)
    assert created and fresh.run_id != s.run_id


def test_by_run_id() -> None:
    m = mgr()
    s, _ = m.lookup("a", None, now=0, wall=0)
    assert m.by_run_id(s.run_id) is s
    assert m.by_run_id("nope") is None


def test_a_call_in_flight_keeps_the_session_alive_past_the_idle_timeout() -> None:
    m = mgr()
    s, _ = m.lookup("a", None, now=0, wall=0)
    s.inflight = 1  # a long stream
    same, created = m.lookup("a", None, now=1000, wall=0)
    assert same is s and not created


def test_expire_hands_over_an_idle_session_once() -> None:
    m = mgr()
    s, _ = m.lookup("a", None, now=0, wall=0)
    assert m.expire("a", None, now=100) is None
    assert m.expire("a", None, now=301) is s
    assert m.expire("a", None, now=302) is None
    fresh, created = m.lookup("a", None, now=302, wall=0)
    assert created and fresh is not s
