"""Attacks on the relayed WebSockets (issue 26 item 6): idle sockets are closed after
`websocket_idle_timeout_s`, and an agent holds at most `websocket_max_per_agent` of them.

The client is the `websockets` library (what the openai SDK's Responses WebSocket uses), the
upstream the fake of tests/fakes.py, on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from tests.conftest import AGENT_KEY, Running, StartTripwire
from tests.fakes import FakeUpstream, Reply

websockets = pytest.importorskip("websockets")

WAIT_S = 30.0  # generous bound on anything that must happen


def headers(agent: str = "codex", session: str = "ws-idle") -> dict[str, str]:
    return {
        "Authorization": f"Bearer {AGENT_KEY}",
        "openai-beta": "responses_websockets=2026-02-06",
        "X-Tripwire-Agent": agent,
        "X-Tripwire-Session": session,
    }


def connect(tw: Running, **kw: Any) -> Any:
    url = tw.url.replace("http://", "ws://", 1) + "/v1/responses"
    return websockets.connect(url, additional_headers=headers(**kw), open_timeout=WAIT_S)


async def call(ws: Any, text: str = "hi") -> dict[str, Any]:
    """One response.create; its final event."""
    await ws.send(json.dumps({"type": "response.create", "model": "gpt-4o", "input": text}))
    while True:
        event = json.loads(await asyncio.wait_for(ws.recv(), WAIT_S))
        if event["type"] in ("response.completed", "response.failed", "response.incomplete", "error"):
            return event


async def test_an_idle_socket_is_closed_with_1001_and_nothing_is_recorded_wrong(
    start_tripwire: StartTripwire, fake_upstream: tuple[FakeUpstream, str]
) -> None:
    fake, url = fake_upstream
    tw = await start_tripwire(upstream={"url": url}, websocket_idle_timeout_s=0.3)
    async with connect(tw) as ws:
        assert (await call(ws))["type"] == "response.completed"
        await asyncio.wait_for(ws.wait_closed(), WAIT_S)  # nothing more sent either way
        assert (ws.close_code, ws.close_reason) == (1001, "idle timeout")
    await tw.flush()
    (run_id,) = tw.run_ids()
    events = tw.events(run_id)
    assert [e["event_type"] for e in events] == ["RUN_START", "LLM_CALL"]
    assert events[1]["payload"]["status"] == "ok"
    assert not tw.engine.sessions.by_run_id(run_id).terminated  # the session goes on
    for _ in range(int(WAIT_S / 0.01)):  # the handler ends after the client saw the close
        if not tw.engine.socket_slots.open:
            break
        await asyncio.sleep(0.01)
    assert tw.engine.socket_slots.open == {}  # its slot given back


async def test_a_socket_with_a_call_in_flight_is_not_idle(
    start_tripwire: StartTripwire, fake_upstream: tuple[FakeUpstream, str]
) -> None:
    """The upstream thinks silently for several idle timeouts: the call's socket stays open, and
    serves the next call; only then, with nothing in flight, is it closed."""
    fake, url = fake_upstream
    thinking = Reply(text="after a long think", pause_after_events=0, resume=asyncio.Event())
    fake.replies = [thinking, Reply(text="next")]
    tw = await start_tripwire(upstream={"url": url}, websocket_idle_timeout_s=0.2)
    async with connect(tw) as ws:
        answer = asyncio.create_task(call(ws))
        await asyncio.sleep(1.5)  # several idle timeouts with the call in flight and no frame
        assert thinking.resume is not None
        thinking.resume.set()
        final = await answer
        assert final["type"] == "response.completed"
        assert final["response"]["output"][0]["content"][0]["text"] == "after a long think"
        assert (await call(ws, "again"))["response"]["output"][0]["content"][0]["text"] == "next"
        await asyncio.wait_for(ws.wait_closed(), WAIT_S)
        assert ws.close_code == 1001


async def test_an_agents_socket_past_its_cap_is_refused_before_the_upgrade(
    start_tripwire: StartTripwire, fake_upstream: tuple[FakeUpstream, str]
) -> None:
    fake, url = fake_upstream
    tw = await start_tripwire(upstream={"url": url}, websocket_max_per_agent=2)
    async with connect(tw, session="a") as first, connect(tw, session="b") as second:
        with pytest.raises(websockets.exceptions.InvalidStatus) as refused:
            async with connect(tw, session="c"):
                pass
        response = refused.value.response
        assert response.status_code == 426
        error = json.loads(response.body)["error"]
        assert error["code"] == "websocket_limit_reached" and "websocket_max_per_agent" in error["message"]
        # another agent is served meanwhile, and so are the agent's open sockets
        async with connect(tw, agent="other", session="o") as other:
            assert (await call(other))["type"] == "response.completed"
        assert (await call(first))["type"] == "response.completed"
        assert (await call(second))["type"] == "response.completed"
    assert len(fake.ws_handshakes) == 3  # the refused one never reached the upstream

    async def slots_free() -> bool:
        return tw.engine.socket_slots.open == {}

    deadline = asyncio.get_running_loop().time() + WAIT_S
    while not await slots_free():  # the relays finish after the clients' close handshakes
        assert asyncio.get_running_loop().time() < deadline, tw.engine.socket_slots.open
        await asyncio.sleep(0.02)
    async with connect(tw, session="d") as again:  # closed sockets give their slots back
        assert (await call(again))["type"] == "response.completed"
