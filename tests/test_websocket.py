"""WebSockets through Tripwire (issue 14): the Responses API over WebSocket, judged and recorded
per `response.create`, and any other socket relayed frame by frame (SPEC §4.2, §5.5)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
from aiohttp import WSMsgType

from proxy.replay import replay_dir
from tests.conftest import AGENT_KEY, Running, StartTripwire
from tests.fakes import FakeUpstream, Reply
from tests.redis_server import RedisServer
from tests.schema import assert_run_valid

SESSION = {"X-Tripwire-Session": "ws-1", "X-Tripwire-Agent": "codex"}
BETA = {"openai-beta": "responses_websockets=2026-02-06"}
WEATHER = ("call_1", "get_weather", {"city": "Paris"})
# a guard refusal waits at most this long for an event that must come: a hang fails, it does not time
EVENT_WAIT_S = 30


def auth(**extra: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {AGENT_KEY}", **BETA, **SESSION, **extra}


async def next_json(ws: aiohttp.ClientWebSocketResponse) -> dict[str, Any]:
    msg = await asyncio.wait_for(ws.receive(), EVENT_WAIT_S)
    assert msg.type == WSMsgType.TEXT, msg
    return json.loads(msg.data)


async def until_done(ws: aiohttp.ClientWebSocketResponse) -> list[dict[str, Any]]:
    """Events of one response, up to its final event (or an error event)."""
    events = []
    while True:
        event = await next_json(ws)
        events.append(event)
        if event["type"] in ("response.completed", "response.failed", "response.incomplete", "error"):
            return events


def create(**body: Any) -> str:
    return json.dumps({"type": "response.create", "model": "gpt-4o", **body})


async def one_run(tw: Running) -> tuple[str, list[dict[str, Any]]]:
    await tw.flush()
    (run_id,) = tw.run_ids()
    _, events = assert_run_valid(tw.data_dir, run_id)
    return run_id, events


def of_type(events: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [e for e in events if e["event_type"] == kind]


async def test_raw_upgrade_handshake_gets_101(start_tripwire: StartTripwire, fake_upstream) -> None:
    """The curl of issue 14, on a raw socket: 101 through Tripwire, with the handshake relayed."""
    fake, url = fake_upstream
    fake.ws_response_headers = {"x-request-id": "req_ws_1", "openai-model": "gpt-4o"}
    tw = await start_tripwire(upstream={"url": url})
    host, port = tw.proxy.host, tw.proxy.port
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(
        (
            "GET /v1/responses HTTP/1.1\r\n"
            f"Host: {host}:{port}\r\n"
            "Connection: Upgrade\r\n"
            "Upgrade: websocket\r\n"
            "Sec-WebSocket-Version: 13\r\n"
            "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
            f"Authorization: Bearer {AGENT_KEY}\r\n"
            "openai-beta: responses_websockets=2026-02-06\r\n"
            "X-Tripwire-Agent: codex\r\n"
            "\r\n"
        ).encode()
    )
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), EVENT_WAIT_S)
    writer.close()
    lines = head.decode().split("\r\n")
    assert lines[0].startswith("HTTP/1.1 101"), lines[0]
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)}
    assert headers["upgrade"].lower() == "websocket"
    assert headers["sec-websocket-accept"] == "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="  # RFC 6455's example
    assert headers["x-request-id"] == "req_ws_1" and headers["openai-model"] == "gpt-4o"
    (seen,) = fake.ws_handshakes
    assert seen.path == "/v1/responses"
    assert seen.headers["Authorization"] == f"Bearer {AGENT_KEY}"
    assert seen.headers["openai-beta"] == "responses_websockets=2026-02-06"
    assert "X-Tripwire-Agent" not in seen.headers
    assert tw.run_ids() == []  # a handshake is no call


async def test_two_calls_over_one_socket_are_recorded(start_tripwire: StartTripwire, fake_upstream) -> None:
    """A function call, then the final answer: two LLM_CALLs with exact usage and one TOOL_CALL,
    with the guard fields replay needs; the trace is valid and replays as it ran."""
    fake, url = fake_upstream
    fake.replies = [
        Reply(tool_calls=[WEATHER], prompt_tokens=31, completion_tokens=7),
        Reply(text="Paris is sunny", prompt_tokens=45, completion_tokens=5),
    ]
    tw = await start_tripwire(upstream={"url": url})
    async with (
        aiohttp.ClientSession() as http,
        http.ws_connect(tw.url + "/v1/responses", headers=auth()) as ws,
    ):
        await ws.send_str(create(input="weather in Paris?"))
        first = await until_done(ws)
        assert [e["type"] for e in first][0] == "response.created"
        final = first[-1]["response"]
        (fc,) = [item for item in final["output"] if item["type"] == "function_call"]
        output = {"type": "function_call_output", "call_id": fc["call_id"], "output": "sunny, 24C"}
        await ws.send_str(create(previous_response_id=final["id"], input=[output]))
        second = await until_done(ws)
        assert second[-1]["type"] == "response.completed"
        assert second[-1]["response"]["output"][0]["content"][0]["text"] == "Paris is sunny"
    sent = [m for m in fake.ws_messages if m.get("type") == "response.create"]
    assert len(sent) == 2 and sent[1]["previous_response_id"] == final["id"]
    run_id, events = await one_run(tw)
    assert [e["event_type"] for e in events] == ["RUN_START", "LLM_CALL", "TOOL_CALL", "LLM_CALL"]
    llm1, tool, llm2 = events[1:]
    assert llm1["payload"]["usage"] == {"prompt_tokens": 31, "completion_tokens": 7, "total_tokens": 38}
    assert llm2["payload"]["usage"] == {"prompt_tokens": 45, "completion_tokens": 5, "total_tokens": 50}
    assert llm1["payload"]["response"]["tool_calls"] == [
        {"id": "call_1", "name": "get_weather", "arguments": {"city": "Paris"}}
    ]
    assert llm2["payload"]["response"]["text"] == "Paris is sunny"
    assert llm1["payload"]["status"] == llm2["payload"]["status"] == "ok"
    assert llm1["payload"]["stream"] is True and llm1["payload"]["endpoint"] == "openai_responses"
    assert llm1["payload"]["cost_usd"] > 0
    assert tool["name"] == "get_weather" and tool["parent_id"] == llm1["event_id"]
    assert tool["payload"]["args"] == {"city": "Paris"} and tool["payload"]["result"] == "sunny, 24C"
    assert [e["payload"]["call_seq"] for e in (llm1, llm2)] == [1, 2]
    assert all("guard_input" in e["payload"] for e in (llm1, llm2))
    assert tw.run_json(run_id)["counts"]["llm_calls"] == 2
    replay = replay_dir(tw.data_dir / "runs" / run_id)
    assert replay.calls == 2 and replay.live and replay.replayed_checks == replay.live
    async with aiohttp.ClientSession() as http, http.get(tw.admin_url + "/metrics") as resp:
        metrics = await resp.text()
    assert 'tripwire_requests_total{kind="llm",status_class="2xx",upstream="default"} 2.0' in metrics


async def test_an_automatic_session_over_a_socket_is_one_run(
    start_tripwire: StartTripwire, fake_upstream
) -> None:
    """No session named: the calls of one chain land in one automatic run, as over HTTP."""
    fake, url = fake_upstream
    fake.replies = [Reply(tool_calls=[WEATHER]), Reply(text="done")]
    tw = await start_tripwire(upstream={"url": url})
    headers = {"Authorization": f"Bearer {AGENT_KEY}", **BETA}
    async with (
        aiohttp.ClientSession() as http,
        http.ws_connect(tw.url + "/v1/responses", headers=headers) as ws,
    ):
        await ws.send_str(create(input="weather in Paris?"))
        first = await until_done(ws)
        output = {"type": "function_call_output", "call_id": "call_1", "output": "sunny"}
        await ws.send_str(create(previous_response_id=first[-1]["response"]["id"], input=[output]))
        await until_done(ws)
    _, events = await one_run(tw)
    assert [e["event_type"] for e in events] == ["RUN_START", "LLM_CALL", "TOOL_CALL", "LLM_CALL"]


async def test_the_openai_sdk_websocket_through_tripwire(
    start_tripwire: StartTripwire, fake_upstream
) -> None:
    """The real `openai` SDK's Responses WebSocket (client.beta.responses.connect) through Tripwire."""
    pytest.importorskip("websockets")
    fake, url = fake_upstream
    fake.replies = [Reply(text="hello over a socket", prompt_tokens=12, completion_tokens=4)]
    tw = await start_tripwire(upstream={"url": url})
    client = openai.AsyncOpenAI(base_url=tw.url + "/v1", api_key=AGENT_KEY, default_headers=SESSION)
    if not hasattr(client, "beta") or not hasattr(client.beta, "responses"):
        pytest.skip("this openai SDK has no Responses WebSocket")
    async with client.beta.responses.connect() as conn:
        await conn.send({"type": "response.create", "model": "gpt-4o", "input": "hi"})
        kinds = []
        async for event in conn:
            kinds.append(event.type)
            if event.type == "response.completed":
                text = event.response.output[0].content[0].text
                break
    assert kinds[0] == "response.created" and text == "hello over a socket"
    _, events = await one_run(tw)
    (call,) = of_type(events, "LLM_CALL")
    assert call["payload"]["usage"]["total_tokens"] == 16


async def test_a_guard_refusal_is_an_error_event_then_1008(
    start_tripwire: StartTripwire, fake_upstream
) -> None:
    """max_llm_calls: 1: the second response.create gets the error event with the guard's code,
    the socket closes with 1008, and the upstream never sees that message."""
    fake, url = fake_upstream
    fake.replies = [Reply(tool_calls=[WEATHER])]
    tw = await start_tripwire(upstream={"url": url}, guards={"limits": {"max_llm_calls": 1}})
    async with (
        aiohttp.ClientSession() as http,
        http.ws_connect(tw.url + "/v1/responses", headers=auth()) as ws,
    ):
        await ws.send_str(create(input="weather in Paris?"))
        first = await until_done(ws)
        output = {"type": "function_call_output", "call_id": "call_1", "output": "sunny"}
        await ws.send_str(create(previous_response_id=first[-1]["response"]["id"], input=[output]))
        error = await next_json(ws)
        closing = await asyncio.wait_for(ws.receive(), EVENT_WAIT_S)
    assert error["type"] == "error" and error["status"] == 429
    assert error["error"]["code"] == "max_llm_calls" and error["error"]["type"] == "tripwire_guard"
    assert error["error"]["message"].startswith("[tripwire]")
    assert error["headers"]["x-should-retry"] == "false"
    assert closing.type == WSMsgType.CLOSE and closing.data == 1008
    assert ws.close_code == 1008
    assert len([m for m in fake.ws_messages if m.get("type") == "response.create"]) == 1
    run_id, events = await one_run(tw)
    (refused,) = of_type(events, "ERROR")
    assert refused["payload"]["guardrail"] == "max_llm_calls" and refused["payload"]["call_seq"] == 2
    assert len(of_type(events, "LLM_CALL")) == 1 and len(of_type(events, "TOOL_CALL")) == 1
    assert events[-1]["event_type"] == "RUN_END" and events[-1]["payload"]["status"] == "error"
    replay = replay_dir(tw.data_dir / "runs" / run_id)
    assert [(d.call_index, d.guard, d.action) for d in replay.decisions] == [
        (2, "max_llm_calls", "terminate")
    ]


async def test_a_loop_block_is_a_synthetic_response_and_the_chain_goes_on(
    start_tripwire: StartTripwire, fake_upstream
) -> None:
    """A BLOCK answers with the synthetic completed response's events; the socket stays open and
    continuing the synthetic id goes upstream to the real parent (SPEC §5.5)."""
    fake, url = fake_upstream
    fake.replies = [Reply(tool_calls=[(f"call_{i}", "get_weather", {"city": "Paris"})]) for i in range(3)] + [
        Reply(text="Paris is sunny")
    ]
    guards = {"loop_detection": {"action": "block", "threshold": 3, "max_repeated_tool_steps": 10}}
    tw = await start_tripwire(upstream={"url": url}, guards=guards)
    async with (
        aiohttp.ClientSession() as http,
        http.ws_connect(tw.url + "/v1/responses", headers=auth()) as ws,
    ):
        await ws.send_str(create(input="weather in Paris?", stream_id="lane-a"))
        events = await until_done(ws)
        ids = [events[-1]["response"]["id"]]
        for _ in range(3):
            (fc,) = [i for i in events[-1]["response"]["output"] if i["type"] == "function_call"]
            output = {"type": "function_call_output", "call_id": fc["call_id"], "output": "sunny"}
            await ws.send_str(create(previous_response_id=ids[-1], input=[output], stream_id="lane-a"))
            events = await until_done(ws)
            ids.append(events[-1]["response"]["id"])
            if ids[-1].startswith("resp_tripwire_"):
                break
        blocked = events
        await ws.send_str(
            create(previous_response_id=ids[-1], input="fine, just summarise", stream_id="lane-a")
        )
        final = await until_done(ws)
    assert [e["type"] for e in blocked][0] == "response.created"
    assert blocked[-1]["type"] == "response.completed" and blocked[-1]["stream_id"] == "lane-a"
    text = blocked[-1]["response"]["output"][0]["content"][0]["text"]
    assert text.startswith("[tripwire] blocked:")
    assert final[-1]["response"]["output"][0]["content"][0]["text"] == "Paris is sunny"
    creates = [m for m in fake.ws_messages if m.get("type") == "response.create"]
    assert len(creates) == 4  # the blocked one never went upstream
    assert creates[-1]["previous_response_id"] == ids[2]  # the real parent
    assert creates[-1]["input"][0]["type"] == "function_call_output"
    assert creates[-1]["input"][1]["content"].startswith("[tripwire] blocked:")
    assert all(e.get("stream_id") == "lane-a" for e in final)
    _, trace = await one_run(tw)
    assert len(of_type(trace, "LOOP_WARNING")) == 1 and len(of_type(trace, "ERROR")) == 1
    assert len(of_type(trace, "LLM_CALL")) == 4


async def test_frames_are_relayed_as_they_arrive(start_tripwire: StartTripwire, fake_upstream) -> None:
    """The upstream sends one event and waits for the client to have it before sending the rest:
    nothing is held back to be read."""
    fake, url = fake_upstream
    resume = asyncio.Event()
    fake.replies = [Reply(text="a long answer in pieces", pause_after_events=1, resume=resume)]
    tw = await start_tripwire(upstream={"url": url})
    async with (
        aiohttp.ClientSession() as http,
        http.ws_connect(tw.url + "/v1/responses", headers=auth()) as ws,
    ):
        await ws.send_str(create(input="go"))
        first = await next_json(ws)  # the upstream is paused: this came through on its own
        assert first["type"] == "response.created"
        resume.set()
        rest = await until_done(ws)
    assert rest[-1]["type"] == "response.completed"
    assert "".join(e["delta"] for e in rest if e["type"] == "response.output_text.delta") == (
        "a long answer in pieces"
    )
    _, events = await one_run(tw)
    (call,) = of_type(events, "LLM_CALL")
    assert call["payload"]["response"]["text"] == "a long answer in pieces"


async def test_an_upstream_error_event_is_relayed_and_recorded(
    start_tripwire: StartTripwire, fake_upstream
) -> None:
    fake, url = fake_upstream
    fake.replies = [Reply(status=400), Reply(text="fine")]
    tw = await start_tripwire(upstream={"url": url})
    async with (
        aiohttp.ClientSession() as http,
        http.ws_connect(tw.url + "/v1/responses", headers=auth()) as ws,
    ):
        await ws.send_str(create(input="one"))
        (error,) = await until_done(ws)
        await ws.send_str(create(input="two"))
        ok = await until_done(ws)
    assert error["type"] == "error" and error["status"] == 400
    assert ok[-1]["type"] == "response.completed"
    _, events = await one_run(tw)
    failed, answered = of_type(events, "LLM_CALL")
    assert failed["payload"]["status"] == "error" and failed["payload"]["http_status"] == 400
    assert answered["payload"]["status"] == "ok"
    assert of_type(events, "ERROR") == []  # a 4xx is the caller's: no upstream_error, no breaker


async def test_a_warmup_is_relayed_not_recorded(start_tripwire: StartTripwire, fake_upstream) -> None:
    """`generate: false` generates nothing: not a call (max_llm_calls 2 lets both real calls
    through), but the tool output it brings is a TOOL_CALL and its id continues the chain."""
    fake, url = fake_upstream
    fake.replies = [Reply(tool_calls=[WEATHER]), Reply(text="warm answer")]
    tw = await start_tripwire(upstream={"url": url}, guards={"limits": {"max_llm_calls": 2}})
    async with (
        aiohttp.ClientSession() as http,
        http.ws_connect(tw.url + "/v1/responses", headers=auth()) as ws,
    ):
        await ws.send_str(create(input="weather in Paris?"))
        first = await until_done(ws)
        output = {"type": "function_call_output", "call_id": "call_1", "output": "sunny"}
        await ws.send_str(
            create(previous_response_id=first[-1]["response"]["id"], input=[output], generate=False)
        )
        warm = await until_done(ws)
        assert warm[-1]["type"] == "response.completed"
        await ws.send_str(create(previous_response_id=warm[-1]["response"]["id"], input=[]))
        answer = await until_done(ws)
    assert answer[-1]["type"] == "response.completed"
    _, events = await one_run(tw)
    assert [e["event_type"] for e in events] == ["RUN_START", "LLM_CALL", "TOOL_CALL", "LLM_CALL"]
    assert events[2]["payload"]["result"] == "sunny"
    assert events[3]["payload"]["response"]["text"] == "warm answer"
    assert [e["payload"]["call_seq"] for e in of_type(events, "LLM_CALL")] == [1, 2]


async def test_an_unreadable_message_is_a_400_error_event(
    start_tripwire: StartTripwire, fake_upstream
) -> None:
    """A message json.loads would refuse is judged as an HTTP body is: a 400, never forwarded."""
    fake, url = fake_upstream
    tw = await start_tripwire(upstream={"url": url})
    async with (
        aiohttp.ClientSession() as http,
        http.ws_connect(tw.url + "/v1/responses", headers=auth()) as ws,
    ):
        await ws.send_str('{"type": "response.create", "input": ')
        error = await next_json(ws)
        await ws.send_str(create(input="still here"))
        ok = await until_done(ws)
    assert error["type"] == "error" and error["status"] == 400
    assert error["error"]["type"] == "invalid_request_error"
    assert ok[-1]["type"] == "response.completed"
    assert [m["input"] for m in fake.ws_messages] == ["still here"]


async def test_a_draining_proxy_refuses_new_calls_and_closes(
    start_tripwire: StartTripwire, fake_upstream
) -> None:
    fake, url = fake_upstream
    tw = await start_tripwire(upstream={"url": url})
    async with (
        aiohttp.ClientSession() as http,
        http.ws_connect(tw.url + "/v1/responses", headers=auth()) as ws,
    ):
        tw.engine.draining = True
        await ws.send_str(create(input="too late"))
        error = await next_json(ws)
        closing = await asyncio.wait_for(ws.receive(), EVENT_WAIT_S)
        tw.engine.draining = False
    assert error["status"] == 503 and error["error"]["code"] == "draining"
    assert closing.type == WSMsgType.CLOSE and closing.data == 1001
    assert fake.ws_messages == []


async def test_an_open_circuit_refuses_but_keeps_the_socket(
    start_tripwire: StartTripwire, fake_upstream
) -> None:
    """A 5xx `error` event is an upstream failure: the circuit opens; the next call gets the
    circuit's error event (with retry-after) and the session, and the socket, go on."""
    fake, url = fake_upstream
    fake.replies = [Reply(status=500)]
    guards = {"circuit_breaker": {"open_after_failures": 1, "cooldown_seconds": 60}}
    tw = await start_tripwire(upstream={"url": url}, guards=guards)
    async with (
        aiohttp.ClientSession() as http,
        http.ws_connect(tw.url + "/v1/responses", headers=auth(), autoping=False) as ws,
    ):
        await ws.send_str(create(input="one"))
        (failed,) = await until_done(ws)
        await ws.send_str(create(input="two"))
        refused = await next_json(ws)
        await ws.ping(b"still open?")
        pong = await asyncio.wait_for(ws.receive(), EVENT_WAIT_S)
    assert failed["status"] == 500
    assert refused["type"] == "error" and refused["status"] == 429
    assert refused["error"]["code"] == "circuit_breaker" and int(refused["headers"]["retry-after"]) > 0
    assert pong.type == WSMsgType.PONG
    assert len(fake.ws_messages) == 1
    _, events = await one_run(tw)
    assert [e["name"] for e in of_type(events, "ERROR")] == ["upstream_error", "circuit_breaker"]


@pytest.mark.parametrize("path", ["/v1/realtime", "/llm/other/v1/anything", "/mcp/tools/ws"])
async def test_other_sockets_are_relayed_not_recorded(
    start_tripwire: StartTripwire, fake_upstream, path: str
) -> None:
    """Text, binary, ping/pong and close codes both ways, on a path Tripwire does not parse."""
    fake, url = fake_upstream
    fake.ws_protocols = ("chat.v2",)
    tw = await start_tripwire(upstream={"url": url}, llm={"other": {"url": url}}, mcp={"tools": {"url": url}})
    async with aiohttp.ClientSession() as http:
        async with http.ws_connect(
            tw.url + path, headers=auth(), protocols=("chat.v1", "chat.v2"), autoping=False
        ) as ws:
            assert ws.protocol == "chat.v2"
            await ws.send_str("hi")
            assert (await ws.receive()).data == "echo:hi"
            await ws.send_bytes(b"abc")
            assert (await ws.receive()).data == b"cba"
            await ws.ping(b"are you there")
            pong = await ws.receive()
            assert pong.type == WSMsgType.PONG and pong.data == b"are you there"
            await ws.send_str("close:4001")
            closing = await ws.receive()
            assert closing.type == WSMsgType.CLOSE and closing.data == 4001
        async with http.ws_connect(tw.url + path, headers=auth()) as ws:
            await ws.send_str(create(input="not a Responses socket"))
            assert (await ws.receive()).data.startswith("echo:")
            await ws.close(code=4000)
    await tw.flush()
    for _ in range(100):  # the fake records the close code once its handler returns
        if len(fake.ws_closes) == 2:
            break
        await asyncio.sleep(0.01)
    assert [code for code, _ in fake.ws_closes] == [4001, 4000]
    assert fake.ws_handshakes[0].path == path.removeprefix("/llm/other").removeprefix("/mcp/tools")
    assert tw.run_ids() == []


async def test_a_refused_upgrade_gets_the_upstream_status(
    start_tripwire: StartTripwire, fake_upstream
) -> None:
    fake, url = fake_upstream
    fake.ws_refuse_status = 403
    tw = await start_tripwire(upstream={"url": url})
    async with aiohttp.ClientSession() as http:
        with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
            await http.ws_connect(tw.url + "/v1/responses", headers=auth())
        assert refused.value.status == 403
        assert refused.value.headers is not None and refused.value.headers["X-Upstream-Refusal"] == "1"
        # a plain GET is still a plain GET
        async with http.get(tw.url + "/v1/responses") as resp:
            assert resp.status == 200 and (await resp.json())["method"] == "GET"


async def test_the_upstream_key_source_replaces_the_agents(
    start_tripwire: StartTripwire, fake_upstream, tmp_path: Path
) -> None:
    fake, url = fake_upstream
    key = tmp_path / "key"
    key.write_text("sk-upstream-own-key\n")
    tw = await start_tripwire(upstream={"url": url, "api_key_file": key})
    async with (
        aiohttp.ClientSession() as http,
        http.ws_connect(tw.url + "/v1/responses", headers=auth()) as ws,
    ):
        await ws.send_str(create(input="hi"))
        await until_done(ws)
    (seen,) = fake.ws_handshakes
    assert seen.headers["Authorization"] == "Bearer sk-upstream-own-key"


async def test_the_upstream_closing_mid_response_is_recorded_as_broken(
    start_tripwire: StartTripwire, fake_upstream: tuple[FakeUpstream, str]
) -> None:
    """The upstream drops the connection mid-answer: the client's socket ends abnormally too, and
    the call is recorded with status error (an upstream failure)."""
    fake, url = fake_upstream
    resume = asyncio.Event()
    fake.replies = [Reply(text="never finished", pause_after_events=1, resume=resume)]
    tw = await start_tripwire(upstream={"url": url})
    async with (
        aiohttp.ClientSession() as http,
        http.ws_connect(tw.url + "/v1/responses", headers=auth()) as ws,
    ):
        await ws.send_str(create(input="go"))
        assert (await next_json(ws))["type"] == "response.created"
        for conn in list(fake_connections(tw)):
            conn.close()
        end = await asyncio.wait_for(ws.receive(), EVENT_WAIT_S)
    assert end.type in (WSMsgType.CLOSED, WSMsgType.ERROR, WSMsgType.CLOSE)
    assert end.type != WSMsgType.CLOSE or end.data != 1000
    resume.set()
    _, events = await one_run(tw)
    (call,) = of_type(events, "LLM_CALL")
    assert call["payload"]["status"] == "error"
    assert [e["name"] for e in of_type(events, "ERROR")] == ["upstream_error"]


def fake_connections(tw: Running) -> list[Any]:
    """The transports of Tripwire's upstream sockets (closing one is a dropped connection)."""
    session = tw.engine.forwarder.session
    assert session is not None
    connector = session.connector
    assert connector is not None
    return [proto.transport for proto in connector._acquired if proto.transport is not None]  # type: ignore[attr-defined]


async def test_real_codex_websocket_episodes_become_one_run_each(
    start_tripwire: StartTripwire, fake_upstream
) -> None:
    """Codex CLI 0.169's own handshake and messages (tests/fixtures/codex_0169_websocket.json, recorded
    from the real CLI): three `codex exec` invocations are three runs, each holding its turn."""
    import uuid

    fake, url = fake_upstream
    fake.default = Reply(text="4")
    codex = json.loads((Path(__file__).parent / "fixtures" / "codex_0169_websocket.json").read_text())
    tw = await start_tripwire(upstream={"url": url})
    sessions = []
    async with aiohttp.ClientSession() as http:
        for _ in range(3):
            session = str(uuid.uuid4())
            sessions.append(session)
            fill = json.loads(json.dumps(codex).replace("SESSION", session))
            headers = {"Authorization": f"Bearer {AGENT_KEY}", **fill["handshake_headers"]}
            warmup, turn = fill["messages"]
            async with http.ws_connect(tw.url + "/v1/responses", headers=headers) as ws:
                await ws.send_str(json.dumps(warmup))
                warm = await until_done(ws)
                assert warm[-1]["type"] == "response.completed"
                turn["previous_response_id"] = warm[-1]["response"]["id"]
                await ws.send_str(json.dumps(turn))
                done = await until_done(ws)
                assert done[-1]["type"] == "response.completed"
    await tw.flush()
    runs = tw.run_ids()
    assert len(runs) == 3
    seen = set()
    for run_id in runs:
        _, events = assert_run_valid(tw.data_dir, run_id)
        assert [e["event_type"] for e in events] == ["RUN_START", "LLM_CALL"]  # the warm-up is no call
        seen.add(tw.tripwire_json(run_id)["episode"]["id"])
    assert seen == set(sessions)


async def test_a_shared_state_outage_under_fail_closed_is_an_error_event_and_the_socket_goes_on(
    own_redis: RedisServer, start_tripwire: StartTripwire, fake_upstream
) -> None:
    """`state_unavailable` over the WebSocket (issue 13, SPEC §8): the call gets a 503 error event
    with retry-after, nothing reaches the upstream, the socket stays open, and once Redis is back
    the next call goes through."""
    fake, url = fake_upstream
    fake.replies = [Reply(text="back again")]
    tw = await start_tripwire(
        upstream={"url": url}, state={"url": own_redis.url, "on_unavailable": "fail_closed"}
    )
    own_redis.stop()
    async with (
        aiohttp.ClientSession() as http,
        http.ws_connect(tw.url + "/v1/responses", headers=auth(), autoping=False) as ws,
    ):
        await ws.send_str(create(input="one"))
        refused = await next_json(ws)
        await ws.ping(b"still open?")
        pong = await asyncio.wait_for(ws.receive(), EVENT_WAIT_S)
        assert refused["type"] == "error" and refused["status"] == 503
        assert refused["error"]["code"] == "state_unavailable"
        assert int(refused["headers"]["retry-after"]) > 0
        assert pong.type == WSMsgType.PONG
        assert fake.ws_messages == []
        own_redis.start()
        shared = tw.engine.shared
        assert shared is not None
        deadline = asyncio.get_running_loop().time() + EVENT_WAIT_S
        while not shared.link.up:  # the probe notices (every second)
            assert asyncio.get_running_loop().time() < deadline, "Redis never seen back"
            await asyncio.sleep(0.05)
        await ws.send_str(create(input="two"))
        events = await until_done(ws)
    assert events[-1]["type"] == "response.completed"
    assert len(fake.ws_messages) == 1


async def test_drain_grace_over_cuts_an_answer_still_arriving(
    start_tripwire: StartTripwire, fake_upstream
) -> None:
    """SIGTERM's drain waits its grace for a socket's answer in flight, then cuts it as it cuts an
    HTTP stream: the client's socket closes (1001, going away) before the terminal event, and the
    call is recorded as incomplete (status error), so the drain ends and the run can close."""
    fake, url = fake_upstream
    resume = asyncio.Event()
    fake.replies = [Reply(text="never finished", pause_after_events=1, resume=resume)]
    tw = await start_tripwire(upstream={"url": url})
    try:
        async with (
            aiohttp.ClientSession() as http,
            http.ws_connect(tw.url + "/v1/responses", headers=auth()) as ws,
        ):
            await ws.send_str(create(input="go"))
            assert (await next_json(ws))["type"] == "response.created"
            await asyncio.wait_for(tw.engine.drain(0.05), EVENT_WAIT_S)
            assert tw.engine.inflight == 0
            end = await asyncio.wait_for(ws.receive(), EVENT_WAIT_S)
    finally:
        tw.engine.draining = False
        resume.set()
    assert end.type == WSMsgType.CLOSE and end.data == 1001
    _, events = await one_run(tw)
    (call,) = of_type(events, "LLM_CALL")
    assert call["payload"]["status"] == "error"
    assert call["payload"]["error"]["error_type"] == "Incomplete"
    assert "drain grace over" in call["payload"]["error"]["message"]
