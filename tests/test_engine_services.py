"""The engine's services without a server: sessions (open, terminate, end once the last call in
flight is done), the guard config in force per agent, the breakers per agent x upstream, the
upstream registry, and what `close` does with the runs still open."""

from __future__ import annotations

from pathlib import Path

from proxy.engine import Engine
from proxy.guards.config import GuardConfig, LoopDetectionConfig
from proxy.sessions import Refused
from tests.factories import (
    EngineFactory,
    kinds,
    make_engine,
    make_session,
    read_events,
    read_tripwire_json,
)


async def test_open_session_starts_one_run_per_session_with_the_config_in_force(
    engine_factory: EngineFactory,
) -> None:
    engine = await engine_factory(
        guards={"loop_detection": {"threshold": 4}}, agents={"bot": {"loop_detection": {"threshold": 9}}}
    )
    bot = make_session(engine, "bot", "s1")
    assert make_session(engine, "bot", "s1") is bot  # the same session, one RUN_START
    other = make_session(engine, "other", "s1")
    assert other.run_id != bot.run_id
    bot_start = (await read_events(engine, bot.run_id))[0]
    assert bot_start["event_type"] == "RUN_START" and bot_start["payload"]["agent_name"] == "bot"
    assert len(await read_events(engine, bot.run_id)) == 1
    tw = await read_tripwire_json(engine, bot.run_id)
    assert tw["guard_config_source"] == "agent"
    assert tw["guard_config"]["loop_detection"]["threshold"] == 9
    assert (await read_tripwire_json(engine, other.run_id))["guard_config_source"] == "project"


async def test_guard_config_resolution_per_agent(engine_factory: EngineFactory) -> None:
    engine = await engine_factory(
        guards={"shadow": True, "loop_detection": {"threshold": 4}},
        agents={"bot": {"loop_detection": {"threshold": 9}}},
    )
    assert engine.guard_config("anyone").loop_detection.threshold == 4
    bot = engine.guard_config("bot")
    assert bot.loop_detection.threshold == 9
    assert bot.shadow is True  # an override that omits `shadow` inherits the project's
    # an admin API change applies to the next call
    engine.guard_store.put_agent("anyone", GuardConfig(loop_detection=LoopDetectionConfig(threshold=2)))
    assert engine.guard_config("anyone").loop_detection.threshold == 2
    assert engine.guard_store.delete_agent("anyone")
    assert engine.guard_config("anyone").loop_detection.threshold == 4


async def test_terminate_session_ends_the_run_and_refuses_later_calls(engine: Engine) -> None:
    session = make_session(engine, "bot", "s1")
    engine.policy.terminate(session, reason="guard:test", own_call=False)
    assert session.terminated and session.ended
    events = await read_events(engine, session.run_id)
    assert kinds(events) == ["RUN_START", "RUN_END"]
    assert events[-1]["payload"]["status"] == "error"
    assert "terminated" in (await read_tripwire_json(engine, session.run_id))["health_tags"]
    refused = engine.policy.open("bot", "s1")
    assert isinstance(refused, Refused)


async def test_a_terminated_run_ends_after_the_calls_still_in_flight(engine: Engine) -> None:
    session = make_session(engine, "bot", "s1")
    session.inflight = 3  # the terminating call and two others
    engine.policy.terminate(session, reason="guard:test", tag=None, own_call=True)
    assert session.terminated and not session.ended
    engine.policy.end_if_pending(session)  # one of the others finishes (its own call still counted)
    assert not session.ended
    session.inflight = 1
    engine.policy.end_if_pending(session)  # the last one
    assert session.ended
    end = (await read_events(engine, session.run_id))[-1]
    assert end["event_type"] == "RUN_END" and end["payload"]["status"] == "error"
    assert "terminated" not in (await read_tripwire_json(engine, session.run_id))["health_tags"]
    engine.policy.end_if_pending(session)  # once only
    assert kinds(await read_events(engine, session.run_id)).count("RUN_END") == 1


async def test_end_if_pending_leaves_a_live_session_alone(engine: Engine) -> None:
    session = make_session(engine, "bot", "s1")
    engine.policy.end_if_pending(session)
    assert not session.ended and not session.terminated


async def test_the_kill_switch_terminates_a_run_once(engine: Engine) -> None:
    session = make_session(engine, "bot", "s1")
    assert await engine.terminate_run(session.run_id)
    assert not await engine.terminate_run(session.run_id)
    assert not await engine.terminate_run("no-such-run")
    events = await read_events(engine, session.run_id)
    assert kinds(events) == ["RUN_START", "ERROR", "RUN_END"]
    assert events[1]["name"] == "kill_switch"


async def test_breakers_are_one_per_agent_and_upstream(engine: Engine) -> None:
    config = engine.guard_config("bot").circuit_breaker
    a = engine.breakers.get("bot", "llm:default", config)
    assert engine.breakers.get("bot", "llm:default", config) is a
    assert engine.breakers.get("other", "llm:default", config) is not a
    assert engine.breakers.get("bot", "mcp:demo", config) is not a
    assert engine.breakers.open_count_by_upstream() == {"llm:default": 0, "mcp:demo": 0}


async def test_upstreams_by_kind_and_name(engine_factory: EngineFactory) -> None:
    engine = await engine_factory(
        upstream={"url": "http://127.0.0.1:1/v1"},
        llm={"azure": {"url": "http://127.0.0.1:2"}},
        mcp={"demo": {"url": "http://127.0.0.1:3/mcp"}},
    )
    assert engine.upstreams.get("llm", "default").url == "http://127.0.0.1:1/v1"
    assert engine.upstreams.get("llm", "azure").url == "http://127.0.0.1:2"
    assert engine.upstreams.get("mcp", "demo").url == "http://127.0.0.1:3/mcp"
    assert engine.upstreams.names("llm") == ("azure",)  # /v1 is the default; /llm/NAME the others
    assert engine.upstreams.names("mcp") == ("demo",)


async def test_inflight_counts_calls_for_drain(engine: Engine) -> None:
    engine.call_started()
    engine.call_started()
    engine.call_finished()
    assert engine.inflight == 1
    engine.call_finished()
    assert engine.inflight == 0 and engine._idle_drained.is_set()
    await engine.drain(0)  # nothing in flight: returns at once
    assert engine.draining


async def test_close_ends_the_runs_still_open(tmp_path: Path) -> None:
    async with make_engine(tmp_path) as engine:
        session = make_session(engine, "bot", None)
        assert not session.explicit
    assert session.ended
    lines = (engine.data_dir / "runs" / session.run_id / "events.jsonl").read_text().splitlines()
    assert '"RUN_END"' in lines[-1] and '"shutdown"' in lines[-1]


async def test_sweep_ends_idle_automatic_sessions(engine_factory: EngineFactory) -> None:
    engine = await engine_factory(session_idle_timeout_s=10)
    session = make_session(engine, "bot", None)
    engine.sweep(session.last_seen + 5)
    assert not session.ended
    engine.sweep(session.last_seen + 11)
    assert session.ended
    end = (await read_events(engine, session.run_id))[-1]
    assert end["payload"]["status"] == "ok"
