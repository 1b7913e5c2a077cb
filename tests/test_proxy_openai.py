"""The real `openai` SDK through Tripwire to a fake upstream on 127.0.0.1 (issue 2, acceptance 2, 3, 5, 6)."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import openai
import pytest

from proxy.dialects.base import Usage
from proxy.pricing import Pricing
from tests.conftest import AGENT_KEY, StartTripwire
from tests.fakes import Reply
from tests.schema import assert_run_valid

pytestmark = pytest.mark.both_loops  # asyncio's loop and uvloop, which `tripwire serve` runs on


def client(base: str, **kw: Any) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=base, api_key=AGENT_KEY, max_retries=0, **kw)


def chunks_of(stream_chunks: list[Any]) -> list[dict[str, Any]]:
    return [c.model_dump(exclude={"created"}) for c in stream_chunks]


async def test_non_streamed_chat_is_relayed_and_recorded(
    start_tripwire: StartTripwire, fake_upstream
) -> None:
    fake, url = fake_upstream
    fake.replies = [
        Reply(text="hi there", prompt_tokens=11, completion_tokens=3, model="gpt-4o-mini-2024-07-18")
    ]
    tw = await start_tripwire(upstream={"url": url})
    resp = await client(tw.url + "/v1").chat.completions.create(
        model="gpt-4o-mini", messages=[{"role": "user", "content": "hello"}], temperature=0.2
    )
    assert resp.choices[0].message.content == "hi there"
    assert resp.usage is not None and resp.usage.total_tokens == 14
    seen = fake.calls("/v1/chat/completions")[0]
    assert seen.headers["Authorization"] == f"Bearer {AGENT_KEY}"
    assert "X-Tripwire-Agent" not in seen.headers
    await tw.flush()
    (run_id,) = tw.run_ids()
    events = tw.events(run_id)
    assert [e["event_type"] for e in events] == ["RUN_START", "LLM_CALL"]
    llm = events[1]
    p = llm["payload"]
    assert llm["name"] == "gpt-4o-mini-2024-07-18"
    assert p["usage"] == {"prompt_tokens": 11, "completion_tokens": 3, "total_tokens": 14}
    assert p["prompt"] == [{"role": "user", "content": "hello"}]
    assert p["response"]["text"] == "hi there"
    assert p["status"] == "ok" and p["stream"] is False and p["temperature"] == 0.2
    expected = Pricing().cost(Usage(11, 3, 14), ["gpt-4o-mini-2024-07-18", "gpt-4o-mini"])
    assert expected.known and p["cost_usd"] == pytest.approx(expected.cost_usd)
    assert isinstance(llm["duration_ms"], int)
    assert_run_valid(tw.data_dir, run_id)


@pytest.mark.parametrize("client_asks_usage", [False, True])
async def test_streamed_chat_chunks_match_direct(
    start_tripwire: StartTripwire, fake_upstream, client_asks_usage: bool
) -> None:
    fake, url = fake_upstream
    reply = Reply(
        text="streamed answer text",
        tool_calls=[("call_1", "get_weather", {"city": "Paris", "unit": "c"})],
        prompt_tokens=21,
        completion_tokens=9,
    )
    fake.replies = [reply, reply]
    tw = await start_tripwire(upstream={"url": url})
    kwargs: dict[str, Any] = {
        "model": "gpt-4o-mini",
        "messages": [{"role": "user", "content": "weather?"}],
        "stream": True,
    }
    if client_asks_usage:
        kwargs["stream_options"] = {"include_usage": True}

    async def collect(base: str) -> list[Any]:
        return [c async for c in await client(base).chat.completions.create(**kwargs)]

    direct = await collect(url + "/v1")
    proxied = await collect(tw.url + "/v1")
    assert chunks_of(proxied) == chunks_of(direct)
    usage_chunks = [c for c in proxied if not c.choices and c.usage is not None]
    assert len(usage_chunks) == (1 if client_asks_usage else 0)
    # the proxy asked the upstream for usage either way
    assert fake.calls("/v1/chat/completions")[1].body["stream_options"] == {"include_usage": True}
    await tw.flush()
    llm = [e for e in tw.events() if e["event_type"] == "LLM_CALL"][0]["payload"]
    assert llm["usage"] == {"prompt_tokens": 21, "completion_tokens": 9, "total_tokens": 30}
    assert llm["response"]["tool_calls"] == [
        {"id": "call_1", "name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}
    ]
    assert llm["stream"] is True and llm["stop_reason"] == "tool_calls"


async def test_sync_client_and_responses_api(start_tripwire: StartTripwire, fake_upstream) -> None:
    fake, url = fake_upstream
    fake.replies = [
        Reply(text="sync hi", prompt_tokens=5, completion_tokens=2),
        Reply(text="resp hi", prompt_tokens=40, completion_tokens=10),
    ]
    tw = await start_tripwire(upstream={"url": url})
    sync = openai.OpenAI(base_url=tw.url + "/v1", api_key=AGENT_KEY, max_retries=0)

    def run_sync() -> tuple[str | None, str]:
        chat = sync.chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": "a"}])
        resp = sync.responses.create(model="gpt-4o", input="tell me")
        return chat.choices[0].message.content, resp.output_text

    chat_text, resp_text = await asyncio.to_thread(run_sync)
    assert (chat_text, resp_text) == ("sync hi", "resp hi")
    await tw.flush()
    # two unrelated conversations: two episodes, so two automatic runs (SPEC §3, Session)
    runs = tw.run_ids()
    assert len(runs) == 2
    llm = sorted(
        (e for run in runs for e in tw.events(run) if e["event_type"] == "LLM_CALL"),
        key=lambda e: e["payload"]["endpoint"] == "openai_responses",
    )
    assert len(llm) == 2
    assert llm[1]["payload"]["usage"] == {"prompt_tokens": 40, "completion_tokens": 10, "total_tokens": 50}
    assert llm[1]["payload"]["response"]["text"] == "resp hi"


async def test_streamed_responses_api_is_recorded(start_tripwire: StartTripwire, fake_upstream) -> None:
    fake, url = fake_upstream
    fake.replies = [Reply(text="streamed resp", prompt_tokens=12, completion_tokens=4)]
    tw = await start_tripwire(upstream={"url": url})
    async with client(tw.url + "/v1").responses.stream(model="gpt-4o", input="hi") as stream:
        final = await stream.get_final_response()
    assert final.output_text == "streamed resp"
    await tw.flush()
    llm = [e for e in tw.events() if e["event_type"] == "LLM_CALL"][0]["payload"]
    assert llm["usage"]["total_tokens"] == 16 and llm["stream"] is True


async def run_tool_loop(base: str, model: str, steps: int = 3) -> str:
    """A plain tool-calling agent loop: call the model, run the tools it asks for, repeat."""
    c = client(base)
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Plan a trip"}]
    tools = [
        {
            "type": "function",
            "function": {
                "name": "lookup",
                "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
            },
        }
    ]
    for _ in range(steps + 2):
        resp = await c.chat.completions.create(model=model, messages=messages, tools=tools)
        msg = resp.choices[0].message
        if not msg.tool_calls:
            return msg.content or ""
        messages.append(msg.model_dump(exclude_none=True))
        for tc in msg.tool_calls:
            args = json.loads(tc.function.arguments)
            messages.append({"role": "tool", "tool_call_id": tc.id, "content": f"result for {args['q']}"})
    raise AssertionError("the loop did not end")


@pytest.mark.parametrize("model", ["gpt-4o-mini", "my-custom-model"])
async def test_three_step_tool_loop(start_tripwire: StartTripwire, fake_upstream, model: str) -> None:
    fake, url = fake_upstream
    fake.replies = [
        Reply(
            tool_calls=[(f"call_{i}", "lookup", {"q": f"step {i}"})],
            prompt_tokens=1000 * (i + 1),
            completion_tokens=50,
            model=model,
        )
        for i in range(3)
    ] + [Reply(text="done", prompt_tokens=4000, completion_tokens=500, model=model)]
    tw = await start_tripwire(upstream={"url": url})
    assert await run_tool_loop(tw.url + "/v1", model) == "done"
    await tw.flush()
    (run_id,) = tw.run_ids()
    events = tw.events(run_id)
    kinds = [e["event_type"] for e in events]
    assert events[0]["ts"] == min(e["ts"] for e in events), "no event of the run predates RUN_START"
    calls = [e["ts"] for e in events if e["event_type"] in ("LLM_CALL", "TOOL_CALL")]
    assert calls == sorted(calls)
    assert kinds.count("RUN_START") == 1 and kinds.count("LLM_CALL") == 4 and kinds.count("TOOL_CALL") == 3
    tools = [e for e in events if e["event_type"] == "TOOL_CALL"]
    assert [t["payload"]["args"] for t in tools] == [{"q": "step 0"}, {"q": "step 1"}, {"q": "step 2"}]
    assert [t["payload"]["result"] for t in tools] == [
        "result for step 0",
        "result for step 1",
        "result for step 2",
    ]
    assert all(t["payload"]["source"] == "llm" and t["name"] == "lookup" for t in tools)
    assert all(
        isinstance(e["duration_ms"], int) for e in events if e["event_type"] in ("LLM_CALL", "TOOL_CALL")
    )
    llm = [e["payload"] for e in events if e["event_type"] == "LLM_CALL"]
    # only the new messages are stored: the first call has the user message, later ones the assistant + tool result
    assert len(llm[0]["prompt"]) == 1 and len(llm[1]["prompt"]) == 2 and llm[3]["prompt_messages_total"] == 7
    pricing = Pricing()
    for p in llm:
        u = p["usage"]
        expected = pricing.cost(
            Usage(u["prompt_tokens"], u["completion_tokens"], u["total_tokens"]), [model]
        ).cost_usd
        assert p["cost_usd"] == pytest.approx(expected)
    if model == "my-custom-model":
        assert llm[0]["cost_usd"] == pytest.approx(1000 * 10 / 1e6 + 50 * 30 / 1e6)
        assert llm[3]["cost_usd"] == pytest.approx(4000 * 10 / 1e6 + 500 * 30 / 1e6)
    else:
        assert pricing.cost(Usage(1000, 50, 1050), [model]).known
    total = sum(p["cost_usd"] for p in llm)
    assert tw.tripwire_json(run_id)["cost_usd"] == pytest.approx(total)
    assert_run_valid(tw.data_dir, run_id)


async def test_agent_key_never_reaches_the_data_dir(start_tripwire: StartTripwire, fake_upstream) -> None:
    fake, url = fake_upstream
    fake.replies = [Reply(text=f"echo {AGENT_KEY}")]
    tw = await start_tripwire(upstream={"url": url})
    await client(tw.url + "/v1", default_headers={"X-Api-Key": AGENT_KEY}).chat.completions.create(
        model="gpt-4o-mini", messages=[{"role": "user", "content": f"my key is {AGENT_KEY}"}]
    )
    await tw.engine.close()  # clean shutdown: RUN_END written, files complete
    assert fake.calls("/v1/chat/completions")[0].headers["Authorization"] == f"Bearer {AGENT_KEY}"
    files = [p for p in tw.data_dir.rglob("*") if p.is_file()]
    assert any(p.name == "events.jsonl" for p in files)
    for path in files:
        assert AGENT_KEY not in path.read_text(errors="replace"), path
        assert "hunter2" not in path.read_text(errors="replace"), path
    events = tw.events()
    assert events[-1]["event_type"] == "RUN_END" and events[-1]["payload"]["reason"] == "shutdown"


async def test_upstream_key_source_replaces_the_agent_key(
    start_tripwire: StartTripwire, fake_upstream, monkeypatch
) -> None:
    fake, url = fake_upstream
    monkeypatch.setenv("TEST_UPSTREAM_KEY", "sk-real-upstream-key")
    tw = await start_tripwire(upstream={"url": url, "api_key_env": "TEST_UPSTREAM_KEY"})
    await client(tw.url + "/v1").chat.completions.create(
        model="gpt-4o-mini", messages=[{"role": "user", "content": "x"}]
    )
    assert fake.calls("/v1/chat/completions")[0].headers["Authorization"] == "Bearer sk-real-upstream-key"


async def test_unparsed_routes_forward_unchanged(start_tripwire: StartTripwire, fake_upstream) -> None:
    fake, url = fake_upstream
    tw = await start_tripwire(upstream={"url": url})
    models = await client(tw.url + "/v1").models.list()
    assert [m.id for m in models.data] == ["gpt-4o-mini"]
    import aiohttp

    async with aiohttp.ClientSession() as http:
        async with http.put(
            tw.url + "/agents/bot/v1/files/abc?purpose=x&b=2",
            data=b"raw-bytes",
            headers={"X-Tripwire-Session": "s1", "X-Custom": "kept", "Connection": "keep-alive"},
        ) as r:
            echo = await r.json()
            assert r.status == 200 and r.headers["X-Upstream-Echo"] == "1"
        assert echo == {
            "method": "PUT",
            "path": "/v1/files/abc",
            "query": "purpose=x&b=2",
            "body": "raw-bytes",
        }
        seen = fake.seen[-1]
        assert seen.headers["X-Custom"] == "kept" and "X-Tripwire-Session" not in seen.headers
        assert seen.headers["Host"] == url.removeprefix("http://")
        async with http.get(tw.url + "/llm/nope/v1/models") as r:
            assert r.status == 404 and (await r.json())["error"]["configured"] == []
    await tw.flush()
    assert tw.run_ids() == []  # nothing recorded for models/files: no empty runs


async def test_broken_stream_ends_abnormally_and_is_recorded_as_error(
    start_tripwire: StartTripwire, fake_upstream
) -> None:
    fake, url = fake_upstream
    fake.replies = [Reply(text="this stream will break in the middle", break_after_chunks=3)]
    tw = await start_tripwire(upstream={"url": url})
    # the client's stream breaks as the upstream's did (SPEC §4.2), after the chunks that did arrive
    got = []
    with pytest.raises(openai.APIConnectionError):
        async for c in await client(tw.url + "/v1").chat.completions.create(
            model="gpt-4o-mini", messages=[{"role": "user", "content": "x"}], stream=True
        ):
            got.append(c)
    assert 1 <= len(got) < 5
    await tw.flush()
    llm = [e for e in tw.events() if e["event_type"] == "LLM_CALL"][0]["payload"]
    assert llm["status"] == "error" and llm["error"]["message"]


async def test_request_too_large_gets_413(start_tripwire: StartTripwire, fake_upstream) -> None:
    fake, url = fake_upstream
    tw = await start_tripwire(upstream={"url": url}, max_body_bytes=1024)
    with pytest.raises(openai.APIStatusError) as e:
        await client(tw.url + "/v1").chat.completions.create(
            model="gpt-4o-mini", messages=[{"role": "user", "content": "x" * 5000}]
        )
    assert e.value.status_code == 413
    assert fake.calls("/v1/chat/completions") == []


async def test_upstream_down_gets_502_and_an_error_event(start_tripwire: StartTripwire) -> None:
    tw = await start_tripwire(upstream={"url": "http://127.0.0.1:9"})
    with pytest.raises(openai.APIStatusError) as e:
        await client(tw.url + "/v1").chat.completions.create(
            model="gpt-4o-mini", messages=[{"role": "user", "content": "x"}]
        )
    assert e.value.status_code == 502
    await tw.flush()
    llm = [e for e in tw.events() if e["event_type"] == "LLM_CALL"][0]["payload"]
    assert llm["status"] == "error" and "connection" in llm["error"]["message"]


async def test_embeddings_recorded_with_usage_and_cost(start_tripwire: StartTripwire, fake_upstream) -> None:
    fake, url = fake_upstream
    tw = await start_tripwire(upstream={"url": url})
    await client(tw.url + "/v1").embeddings.create(model="text-embedding-3-small", input=["a", "b"])
    await tw.flush()
    llm = [e for e in tw.events() if e["event_type"] == "LLM_CALL"][0]["payload"]
    assert llm["usage"]["prompt_tokens"] == 16 and llm["cost_usd"] > 0


async def test_sessions_by_header_and_agent_path(start_tripwire: StartTripwire, fake_upstream) -> None:
    fake, url = fake_upstream
    tw = await start_tripwire(upstream={"url": url})
    a = client(tw.url + "/agents/research-agent/v1")
    b = client(tw.url + "/v1", default_headers={"X-Tripwire-Session": "s-1", "X-Tripwire-Agent": "writer"})
    first = [{"role": "user", "content": "x"}]
    answer = await a.chat.completions.create(model="gpt-4o-mini", messages=first)
    # the same conversation goes on: the same automatic run (SPEC §3)
    went_on = [
        *first,
        answer.choices[0].message.model_dump(exclude_none=True),
        {"role": "user", "content": "y"},
    ]
    await a.chat.completions.create(model="gpt-4o-mini", messages=went_on)
    await b.chat.completions.create(model="gpt-4o-mini", messages=first)
    await tw.flush()
    runs = {tw.tripwire_json(r)["agent_name"]: r for r in tw.run_ids()}
    assert set(runs) == {"research-agent", "writer"}
    assert len([e for e in tw.events(runs["research-agent"]) if e["event_type"] == "LLM_CALL"]) == 2
    assert tw.tripwire_json(runs["writer"])["session_id"] == "s-1"


async def test_idle_timeout_ends_the_run(start_tripwire: StartTripwire, fake_upstream) -> None:
    fake, url = fake_upstream
    tw = await start_tripwire(upstream={"url": url}, session_idle_timeout_s=0.2)
    c = client(tw.url + "/v1")
    await c.chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": "x"}])
    await asyncio.sleep(0.5)
    tw.engine.sweep(time.monotonic() + 1000)
    await c.chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": "y"}])
    await tw.flush()
    first, second = sorted(tw.run_ids(), key=lambda r: tw.run_json(r)["started_at"])
    assert (
        tw.run_json(first)["status"] == "ok" and tw.events(first)[-1]["payload"]["reason"] == "idle_timeout"
    )
    assert tw.run_json(second)["status"] == "running"


async def test_draining_refuses_new_calls_in_each_protocol_shape(
    start_tripwire: StartTripwire, fake_upstream
) -> None:
    fake, url = fake_upstream
    tw = await start_tripwire(upstream={"url": url}, mcp={"files": {"url": url + "/mcp"}})
    tw.engine.draining = True
    with pytest.raises(openai.APIStatusError) as e:
        await client(tw.url + "/v1").chat.completions.create(
            model="gpt-4o-mini", messages=[{"role": "user", "content": "x"}]
        )
    assert e.value.status_code == 503
    import aiohttp

    async with aiohttp.ClientSession() as http:
        msg = {"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": "t", "arguments": {}}}
        async with http.post(tw.url + "/mcp/files", json=msg) as r:
            body = await r.json()
    assert r.status == 200 and body["id"] == 7 and "shutting down" in body["error"]["message"]
    assert fake.seen == []
