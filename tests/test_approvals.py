"""Ask a person (SPEC §5.5a, issue 23): a held call, decided through the admin API.

The agents are the real SDKs against fakes on 127.0.0.1; the person is `POST /api/approvals/{id}`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import openai

from proxy.replay import replay_dir
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
    # replay: the ask recomputed, and the person's decision listed as recorded
    replay = replay_dir(tw.data_dir / "runs" / approval["run_id"])
    listed = [d.as_json() for d in replay.decisions if d.action == "ask"]
    assert {"guard": "loop_detection", "kind": "repetition", "call_index": 6} == {
        k: listed[0][k] for k in ("guard", "kind", "call_index")
    }
    assert "replayed" not in listed[0]  # the guards' ask, recomputed
    recorded = [d for d in listed if d.get("replayed") is False]
    assert [(d["call_index"], d["decision"]) for d in recorded] == [(6, "approved")]
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


async def test_streamed_call_held_with_keepalives_then_the_real_stream(  # the SDK reads through them
    start_tripwire: StartTripwire, fake_upstream: tuple[FakeUpstream, str]
) -> None:
    fake, url = fake_upstream
    loop_then(fake, 5, "streamed real answer")
    tw = await start_tripwire(upstream={"url": url}, guards=ASK_LOOP, admin_token="hunter2")
    tw.engine.approvals.watch.tick_s = tw.engine.approvals.watch.keepalive_s = 0.05
    agent = asyncio.create_task(agent_loop(tw.url, stream=True))
    approval = await pending_one(tw)
    status, _ = await decide(tw, approval["id"], {"decision": "approve"})
    assert status == 200
    answer = await agent
    assert answer.choices[0].message.content == "streamed real answer"
    assert len(fake.calls(CHAT)) == 6


async def test_streamed_raw_client_sees_keepalive_comments_then_the_block(
    start_tripwire: StartTripwire, fake_upstream: tuple[FakeUpstream, str]
) -> None:
    fake, url = fake_upstream
    loop_then(fake, 0, "unused")
    guards = {"loop_detection": {"action": "ask", "threshold": 2, "max_repeated_tool_steps": 10}}
    tw = await start_tripwire(upstream={"url": url}, guards=guards, admin_token="hunter2")
    tw.engine.approvals.watch.tick_s = tw.engine.approvals.watch.keepalive_s = 0.05
    call = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}
    messages: list[dict[str, Any]] = [{"role": "user", "content": "go"}]
    for i in range(2):
        messages.append({"role": "assistant", "tool_calls": [{**call, "id": f"c{i}"}]})
        messages.append({"role": "tool", "tool_call_id": f"c{i}", "content": "same"})
    body = {"model": "gpt-4o-mini", "stream": True, "messages": messages}
    async with aiohttp.ClientSession() as c:
        async with c.post(tw.url + "/v1/chat/completions", json=body, headers=SESSION) as r:
            assert r.status == 200 and r.headers["Content-Type"].startswith("text/event-stream")
            seen = b""
            while seen.count(b": keep-alive") < 3:
                seen += await r.content.readany()
            assert b"data:" not in seen  # nothing a client reads as an answer yet
            (approval,) = await approvals(tw)
            status, _ = await decide(tw, approval["id"], {"decision": "deny", "note": "stop polling"})
            assert status == 200
            seen += await r.content.read()
    assert b"stop polling" in seen and b"data: [DONE]" in seen
    assert fake.calls(CHAT) == []


async def test_timeout_applies_the_fallback(
    start_tripwire: StartTripwire, fake_upstream: tuple[FakeUpstream, str]
) -> None:
    fake, url = fake_upstream
    loop_then(fake, 5, "never sent")
    tw = await start_tripwire(
        upstream={"url": url}, guards={**ASK_LOOP, "ask_timeout_s": 0.3}, admin_token="hunter2"
    )
    answer = await agent_loop(tw.url)
    assert answer.choices[0].message.content.startswith("[tripwire] blocked:")
    assert "Nobody approved this call within 0.3s" in answer.choices[0].message.content
    assert len(fake.calls(CHAT)) == 5
    await tw.flush()
    (decided,) = state_updates(tw, "approval_decided")
    assert decided["payload"]["decision"] == "timeout"
    (expired,) = await approvals(tw, decided=True)
    status, body = await decide(tw, expired["id"], {"decision": "approve"})
    assert status == 409 and "timeout" in body["detail"]
    assert len(fake.calls(CHAT)) == 5


async def test_timeout_with_terminate_fallback_ends_the_session(
    start_tripwire: StartTripwire, fake_upstream: tuple[FakeUpstream, str]
) -> None:
    fake, url = fake_upstream
    loop_then(fake, 5, "never sent")
    guards = {**ASK_LOOP, "ask_timeout_s": 0.2, "ask_fallback": "terminate"}
    tw = await start_tripwire(upstream={"url": url}, guards=guards, admin_token="hunter2")
    try:
        await agent_loop(tw.url)
        raise AssertionError("a terminated session's call is refused")
    except openai.RateLimitError as e:
        assert e.response.headers["x-should-retry"] == "false"
    assert len(fake.calls(CHAT)) == 5
    await tw.flush()
    assert tw.events()[-1]["event_type"] == "RUN_END"


async def test_client_hang_up_withdraws_and_forwards_nothing(
    start_tripwire: StartTripwire, fake_upstream: tuple[FakeUpstream, str]
) -> None:
    fake, url = fake_upstream
    loop_then(fake, 5, "never sent")
    tw = await start_tripwire(upstream={"url": url}, guards=ASK_LOOP, admin_token="hunter2")
    tw.engine.approvals.watch.tick_s = 0.05
    agent = asyncio.create_task(agent_loop(tw.url))
    approval = await pending_one(tw)
    agent.cancel()  # the SDK's request is dropped: its connection closes
    await asyncio.gather(agent, return_exceptions=True)
    await until(lambda: _async(not tw.engine.approvals.book.pending), "withdrawn")  # type: ignore[attr-defined]
    status, body = await decide(tw, approval["id"], {"decision": "approve"})
    assert status == 409 and "withdrawn" in body["detail"]
    await tw.flush()
    (decided,) = state_updates(tw, "approval_decided")
    assert decided["payload"]["decision"] == "withdrawn"
    assert len(fake.calls(CHAT)) == 5


async def test_shadow_holds_nothing(
    start_tripwire: StartTripwire, fake_upstream: tuple[FakeUpstream, str]
) -> None:
    fake, url = fake_upstream
    loop_then(fake, 5, "the real answer")
    tw = await start_tripwire(
        upstream={"url": url}, guards={**ASK_LOOP, "shadow": True}, admin_token="hunter2"
    )
    answer = await agent_loop(tw.url)
    assert answer.choices[0].message.content == "the real answer"
    assert await approvals(tw, decided=True) == []


async def test_budget_on_limit_ask_raised_through_the_api(
    start_tripwire: StartTripwire, fake_upstream: tuple[FakeUpstream, str]
) -> None:
    fake, url = fake_upstream
    fake.replies = [Reply(text=f"answer {i}") for i in range(10)]
    guards = {"limits": {"max_llm_calls": 2, "on_limit": "ask"}}
    tw = await start_tripwire(upstream={"url": url}, guards=guards, admin_token="hunter2")
    client = openai.AsyncOpenAI(
        base_url=tw.url + "/v1", api_key=AGENT_KEY, default_headers=SESSION, max_retries=0
    )

    async def ask(i: int) -> str:
        answer = await client.chat.completions.create(
            model="gpt-4o-mini", messages=[{"role": "user", "content": f"question {i}"}]
        )
        return str(answer.choices[0].message.content)

    assert [await ask(0), await ask(1)] == ["answer 0", "answer 1"]
    third = asyncio.create_task(ask(2))
    approval = await pending_one(tw)
    assert approval["guard"] == "max_llm_calls" and approval["threshold"] == 2
    status, body = await decide(tw, approval["id"], {"decision": "approve", "raise": {"max_llm_calls": 1}})
    assert status == 400 and "not above" in body["detail"]
    status, body = await decide(tw, approval["id"], {"decision": "approve", "raise": {"max_llm_calls": 4}})
    assert status == 200, body
    assert await third == "answer 2"
    assert await ask(3) == "answer 3"  # the 4th call: within the raised limit, not asked
    assert await approvals(tw) == []
    fourth = asyncio.create_task(ask(4))  # the 5th crosses the raised limit: asked again
    approval = await pending_one(tw)
    assert approval["threshold"] == 4
    await decide(tw, approval["id"], {"decision": "deny", "note": "enough"})
    assert "enough" in await fourth  # ask_fallback block: a synthetic answer, the session goes on
    assert len(fake.calls(CHAT)) == 4


def test_the_yaml_top_level_takes_the_ask_keys(tmp_path: Any) -> None:
    """`ask_timeout_s` / `ask_fallback` (and every other guard config key) at the YAML's top level,
    as docs/configuration.md shows them, like LangSight's sections."""
    from proxy.settings import load_settings

    config = tmp_path / "config.yaml"
    config.write_text(
        "ask_timeout_s: 30\nask_fallback: terminate\nloop_detection: {action: ask}\nlimits: {on_limit: ask}\n"
    )
    settings = load_settings({}, config_file=config, environ={}, cwd=tmp_path, home=tmp_path)
    assert settings.guards.ask_timeout_s == 30 and settings.guards.ask_fallback == "terminate"
    assert settings.guards.loop_detection.action == "ask" and settings.guards.limits.on_limit == "ask"


async def test_the_tag_stays_while_any_call_of_the_run_is_held(
    start_tripwire: StartTripwire, fake_upstream: tuple[FakeUpstream, str]
) -> None:
    fake, url = fake_upstream
    fake.replies = [Reply(text=f"answer {i}") for i in range(5)]
    guards = {"limits": {"max_llm_calls": 1, "on_limit": "ask"}}
    tw = await start_tripwire(upstream={"url": url}, guards=guards, admin_token="hunter2")
    client = openai.AsyncOpenAI(
        base_url=tw.url + "/v1", api_key=AGENT_KEY, default_headers=SESSION, max_retries=0
    )

    async def ask(i: int) -> Any:
        return await client.chat.completions.create(
            model="gpt-4o-mini", messages=[{"role": "user", "content": f"question {i}"}]
        )

    await ask(0)
    held = [asyncio.create_task(ask(i)) for i in (1, 2)]

    async def both() -> list[dict[str, Any]]:
        found = await approvals(tw)
        return found if len(found) == 2 else []

    first, second = await until(both, "two calls held")
    tags = tw.engine.recorder._registry.get(first["run_id"]).tags
    assert "awaiting_approval" in tags
    await decide(tw, first["id"], {"decision": "deny"})
    await until(lambda: _async(any(t.done() for t in held)), "the denied call answered")
    assert "awaiting_approval" in tags  # the other is still held
    await decide(tw, second["id"], {"decision": "deny"})
    await asyncio.gather(*held)
    assert "awaiting_approval" not in tags


async def test_an_approved_streak_asks_again_after_threshold_more_calls(
    start_tripwire: StartTripwire, fake_upstream: tuple[FakeUpstream, str]
) -> None:
    fake, url = fake_upstream
    loop_then(fake, 30, "unused")
    # only the repetition pattern speaks (the graduated no-progress and per-tool ones would end it)
    quiet = {"no_progress_warn": 50, "no_progress_halt": 50, "idempotent": [50, 50, 50]}
    guards = {"loop_detection": {**ASK_LOOP["loop_detection"], **quiet}}
    tw = await start_tripwire(upstream={"url": url}, guards=guards, admin_token="hunter2")
    agent = asyncio.create_task(agent_loop(tw.url, max_steps=40))
    first = await pending_one(tw)
    assert len(fake.calls(CHAT)) == 5
    await decide(tw, first["id"], {"decision": "approve"})

    async def next_one() -> list[dict[str, Any]]:
        return [a for a in await approvals(tw) if a["id"] != first["id"]]

    (second,) = await until(next_one, "the streak asks again")
    # the approved 6th call, then 4 more let through; the 5th call after the approval asks
    assert len(fake.calls(CHAT)) == 10
    await decide(tw, second["id"], {"decision": "deny", "note": "stop"})
    answer = await agent
    assert "stop" in answer.choices[0].message.content


async def test_a_call_approved_after_the_kill_switch_is_refused(
    start_tripwire: StartTripwire, fake_upstream: tuple[FakeUpstream, str]
) -> None:
    fake, url = fake_upstream
    loop_then(fake, 5, "never sent")
    tw = await start_tripwire(upstream={"url": url}, guards=ASK_LOOP, admin_token="hunter2")
    agent = asyncio.create_task(agent_loop(tw.url))
    approval = await pending_one(tw)
    async with aiohttp.ClientSession() as c:
        url_kill = tw.admin_url + f"/api/runs/{approval['run_id']}/terminate"
        async with c.post(url_kill, headers=AUTH) as r:
            assert r.status == 200
    status, _ = await decide(tw, approval["id"], {"decision": "approve"})
    assert status == 200
    try:
        await agent
        raise AssertionError("refused: the session was ended")
    except openai.RateLimitError as e:
        assert e.response.headers["X-Tripwire-Guard"] == "kill_switch"
    assert len(fake.calls(CHAT)) == 5
