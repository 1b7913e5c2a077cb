"""`proxy/session_policy.py` alone: what AgentDbg's cycle concludes after the fact (a LOOP_WARNING,
an ERROR, the session terminated), the kill switch (once), and idle runs ended by the sweep."""

from __future__ import annotations

from proxy.constants import TAG_TERMINATED
from proxy.engine import Engine
from proxy.guards.decision import Action, Decision
from tests.factories import kinds, make_session, read_events, read_tripwire_json


async def test_a_cycle_that_terminates_writes_its_warning_and_error_and_ends_the_run(engine: Engine) -> None:
    session = make_session(engine)
    decision = Decision(Action.TERMINATE, "loop_detected", "a cycle", kind="cycle", pattern="A -> B")
    engine.policy.on_cycle(session, decision)
    assert session.terminated and session.ended
    await engine.recorder.flush()
    events = await read_events(engine, session.run_id)
    assert kinds(events) == ["RUN_START", "LOOP_WARNING", "ERROR", "RUN_END"]
    assert events[-1]["payload"]["status"] == "error"
    tags = (await read_tripwire_json(engine, session.run_id))["health_tags"]
    assert TAG_TERMINATED in tags and "loop_detected" in tags


async def test_the_kill_switch_terminates_a_live_run_once(engine: Engine) -> None:
    session = make_session(engine)
    assert engine.policy.kill(session.run_id) is True
    assert session.terminated and session.ended
    assert engine.policy.kill(session.run_id) is False  # already terminated
    assert engine.policy.kill("no-such-run") is False


async def test_idle_runs_end_at_the_sweep(engine: Engine) -> None:
    session = make_session(engine)
    engine.policy.end_idle(session.last_seen + engine.settings.session_idle_timeout_s + 1)
    assert session.ended and not session.terminated
    await engine.recorder.flush()
    end = (await read_events(engine, session.run_id))[-1]
    assert end["event_type"] == "RUN_END" and end["payload"]["reason"] == "idle_timeout"
