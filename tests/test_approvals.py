"""Ask a person (SPEC §5.5a, issue 23): a held call, decided through the admin API.

The agents are the real SDKs against fakes on 127.0.0.1; the person is `POST /api/approvals/{id}`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import openai

from tests.conftest import AGENT_KEY, Running, StartTripwire
from tests.fakes import FakeUpstream, Reply, webhook_receiver
from tests.pipeline_errors import no_pipeline_errors  # noqa: F401 (autouse fixture)

SESSION = {"X-Tripwire-Session": "ask-1", "X-Tripwire-Agent": "looper"}
CHAT = "/v1/chat/completions"
AUTH = {"Authorization": "Bearer hunter2"}
ASK_LOOP = {"loop_detection": {"action": "ask", "threshold": 5, "max_repeated_tool_steps": 10}}


def loop_then(fake: FakeUpstream, n: int, final: str) -> None:
    """The model asks for the same tool `n` times, then answers `final`."""
    fake.replies = [Reply(tool_calls=[(f"call_{i}", "get_weather", {"city": "Paris"})]) for i in range(n)] + [
        Reply(text=final)
    ]


async def agent_loop(base: str, *, stream: bool = False, max_steps: int = 20) -> Any:
    """The SDK agent: runs the tool itself until the model answers; returns the last answer."""
    client = openai.AsyncOpenAI(
        base_url=base + "/v1", api_key=AGENT_KEY, default_headers=SESSION, max_retries=2, timeout=60
    )
    messages: list[dict[str, Any]] = [{"role": "user", "content": "weather in Paris?"}]
    for _ in range(max_steps):
        if stream:
            async with client.chat.completions.stream(model="gpt-4o-mini", messages=messages) as s:
                async for _event in s:
                    pass
                answer = await s.get_final_completion()
        else:
            answer = await client.chat.completions.create(model="gpt-4o-mini", messages=messages)
        msg = answer.choices[0].message
        if not msg.tool_calls:
            return answer
        messages.append(msg.model_dump(exclude_none=True))
        for tc in msg.tool_calls:
            messages.append({"role": "tool", "tool_call_id": tc.id, "content": "sunny, 21C"})
    raise AssertionError("the agent loop never ended")


async def until(check: Callable[[], Awaitable[Any]], what: str, tries: int = 600) -> Any:
    """Wait for a condition with a generous bound (no wall-clock assertion)."""
    for _ in range(tries):
        found = await check()
        if found:
            return found
        await asyncio.sleep(0.05)
    raise AssertionError(f"never happened: {what}")


async def approvals(tw: Running, *, decided: bool = False) -> list[dict[str, Any]]:
    async with aiohttp.ClientSession() as c:
        url = tw.admin_url + "/api/approvals" + ("?all=1" if decided else "")
        async with c.get(url, headers=AUTH) as r:
            assert r.status == 200
            return list((await r.json())["approvals"])


async def pending_one(tw: Running) -> dict[str, Any]:
    found = await until(lambda: approvals(tw), "an approval pending")
    assert len(found) == 1, found
    return found[0]


async def decide(tw: Running, approval_id: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    async with aiohttp.ClientSession() as c:
        async with c.post(tw.admin_url + f"/api/approvals/{approval_id}", json=body, headers=AUTH) as r:
            return r.status, await r.json()


def state_updates(tw: Running, name: str) -> list[dict[str, Any]]:
    return [e for e in tw.events() if e["event_type"] == "STATE_UPDATE" and e["name"] == name]


async def test_approved_loop_call_gets_the_upstreams_real_answer(
    start_tripwire: StartTripwire, fake_upstream: tuple[FakeUpstream, str]
) -> None:
    fake, url = fake_upstream
    loop_then(fake, 5, "Paris is sunny (the real answer)")
    tw = await start_tripwire(upstream={"url": url}, guards=ASK_LOOP, admin_token="hunter2")
    agent = asyncio.create_task(agent_loop(tw.url))
    approval = await pending_one(tw)
    assert approval["guard"] == "loop_detection" and approval["kind"] == "repetition"
    assert approval["agent"] == "looper" and approval["session_id"] == "ask-1"
    assert approval["call"]["model"] == "gpt-4o-mini"
    assert len(fake.calls(CHAT)) == 5  # held: not forwarded
    assert not agent.done()
    status, body = await decide(tw, approval["id"], {"decision": "approve", "note": "fine, go on"})
    assert status == 200 and body["status"] == "approved"
    answer = await agent
    assert answer.choices[0].message.content == "Paris is sunny (the real answer)"
    assert len(fake.calls(CHAT)) == 6  # forwarded once, no SDK retry
    await tw.flush()
    (requested,) = state_updates(tw, "approval_requested")
    (decided,) = state_updates(tw, "approval_decided")
    assert decided["payload"]["decision"] == "approved" and decided["payload"]["note"] == "fine, go on"
    assert decided["payload"]["by"] == "api" and decided["payload"]["waited_s"] >= 0
    assert requested["payload"]["approval"]["id"] == approval["id"]
    # decided: 409, nothing forwarded twice
    status, body = await decide(tw, approval["id"], {"decision": "approve"})
    assert status == 409 and "already approved" in body["detail"]
    assert len(fake.calls(CHAT)) == 6
    assert await approvals(tw) == []
    assert [a["status"] for a in await approvals(tw, decided=True)] == ["approved"]
    metrics = tw.engine.metrics.render().decode()
    assert 'tripwire_approvals_total{decision="approved",guard="loop_detection"} 1.0' in metrics
    assert "tripwire_pending_approvals 0.0" in metrics


async def test_denied_loop_call_gets_the_synthetic_block_with_the_note(
    start_tripwire: StartTripwire, fake_upstream: tuple[FakeUpstream, str]
) -> None:
    fake, url = fake_upstream
    loop_then(fake, 5, "never sent")
    async with webhook_receiver() as hook:
        tw = await start_tripwire(
            upstream={"url": url}, guards=ASK_LOOP, admin_token="hunter2", alert_webhook=hook.url
        )
        agent = asyncio.create_task(agent_loop(tw.url))
        approval = await pending_one(tw)
        tags = tw.engine.recorder._registry.get(approval["run_id"]).tags
        assert "awaiting_approval" in tags
        await until(lambda: _async(any(h.get("event") == "approval_requested" for h in hook.got)), "webhook")
        (posted,) = [h for h in hook.got if h.get("event") == "approval_requested"]
        assert posted["id"] == approval["id"]
        assert posted["decision_url"].endswith(f"/api/approvals/{approval['id']}")
        status, _ = await decide(tw, approval["id"], {"decision": "deny", "note": "use the cached forecast"})
        assert status == 200
        answer = await agent
    choice = answer.choices[0]
    assert choice.finish_reason == "stop"
    assert choice.message.content.startswith("[tripwire] blocked:")
    assert "use the cached forecast" in choice.message.content
    assert len(fake.calls(CHAT)) == 5
    assert "awaiting_approval" not in tw.engine.recorder._registry.get(approval["run_id"]).tags
    await tw.flush()
    (decided,) = state_updates(tw, "approval_decided")
    assert decided["payload"]["decision"] == "denied"
    assert decided["payload"]["note"] == "use the cached forecast"


async def _async(value: Any) -> Any:
    return value


async def test_bad_decisions(start_tripwire: StartTripwire, fake_upstream: tuple[FakeUpstream, str]) -> None:
    fake, url = fake_upstream
    loop_then(fake, 5, "the real answer")
    tw = await start_tripwire(upstream={"url": url}, guards=ASK_LOOP, admin_token="hunter2")
    status, body = await decide(tw, "0" * 32, {"decision": "approve"})
    assert status == 404 and "no approval" in body["detail"]
    agent = asyncio.create_task(agent_loop(tw.url))
    approval = await pending_one(tw)
    status, body = await decide(tw, approval["id"], {"decision": "maybe"})
    assert status == 400
    status, body = await decide(tw, approval["id"], {"decision": "approve", "raise": {"temperature": 2}})
    assert status == 400 and "not a budget or limit key" in body["detail"]
    async with aiohttp.ClientSession() as c:  # the proxy listener never decides
        async with c.post(tw.url + f"/api/approvals/{approval['id']}", json={"decision": "approve"}) as r:
            assert r.status in (404, 400, 502)
        async with c.get(tw.admin_url + "/api/approvals") as r:  # the admin token, as every API call
            assert r.status == 401
    assert len(fake.calls(CHAT)) == 5
    status, _ = await decide(tw, approval["id"], {"decision": "approve"})
    assert status == 200
    await agent
