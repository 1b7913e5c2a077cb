"""Edges of forwarding and recording: hang-ups, encodings, raw queries, chains, failures."""

from __future__ import annotations

import asyncio
import gzip
import json
from typing import Any

import aiohttp
import openai
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from proxy.app import make_proxy_app, proxy_runner, url_host
from proxy.recorder import TraceRecorder
from tests.conftest import AGENT_KEY, StartTripwire
from tests.fakes import Reply
from tests.schema import assert_run_valid


def client(base: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=base, api_key=AGENT_KEY, max_retries=0)


async def test_client_hang_up_is_recorded_and_never_trips_the_breaker(
    start_tripwire: StartTripwire, fake_upstream
) -> None:
    fake, url = fake_upstream
    fake.default = Reply(text="a long streamed answer " * 20, chunk_delay=0.02)
    tw = await start_tripwire(upstream={"url": url}, guards={"circuit_breaker": {"open_after_failures": 2}})
    body = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "x"}], "stream": True}
    for _ in range(4):
        async with aiohttp.ClientSession() as http:
            async with http.post(tw.url + "/agents/default/sessions/s/v1/chat/completions", json=body) as r:
                await r.content.readany()  # take the first chunk, then hang up
        await asyncio.sleep(0.1)
    # four hang-ups: the circuit (2 failures) must still be closed. The same session (each first
    # request of a conversation alone would start a run of its own: SPEC §3)
    resp = await client(tw.url + "/agents/default/sessions/s/v1").chat.completions.create(
        model="gpt-4o-mini", messages=[{"role": "user", "content": "x"}]
    )
    assert resp.choices[0].message.content
    await tw.flush()
    events = tw.events()
    llm = [e["payload"] for e in events if e["event_type"] == "LLM_CALL"]
    assert len(llm) == 5
    assert all(p["status"] == "error" and "client disconnected" in p["error"]["message"] for p in llm[:4])
    assert llm[4]["status"] == "ok"
    assert not [e for e in events if e["event_type"] == "ERROR"], "a hang-up is not an upstream failure"
    assert_run_valid(tw.data_dir, tw.run_ids()[0])


async def _wait_for(condition: Any, what: str) -> None:
    for _ in range(1000):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


async def test_hang_up_before_the_answer_head_never_trips_the_breaker(start_tripwire: StartTripwire) -> None:
    """A client gone before the answer's head is written (a load generator stopping, a killed agent):
    aiohttp raises ClientConnectionResetError, a ClientError, which must not count as the upstream's failure."""
    arrived, release = asyncio.Event(), asyncio.Event()

    async def slow(request: web.Request) -> web.Response:
        await request.read()
        arrived.set()
        await release.wait()
        return web.json_response(
            {
                "id": "x",
                "object": "chat.completion",
                "model": "gpt-4o-mini",
                "choices": [
                    {"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}
                ],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
            }
        )

    app = web.Application()
    app.router.add_post("/v1/chat/completions", slow)
    upstream = TestServer(app, host="127.0.0.1")
    await upstream.start_server()
    try:
        url = str(upstream.make_url("")).rstrip("/")
        tw = await start_tripwire(
            upstream={"url": url}, guards={"circuit_breaker": {"open_after_failures": 2}}
        )
        # served as `tripwire serve` serves (the test server cancels a handler on hang-up; serve does not)
        runner = proxy_runner(make_proxy_app(tw.engine), access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        server = runner.server
        assert server is not None
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        base = f"http://127.0.0.1:{port}"
        body = json.dumps({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "x"}]}).encode()
        head = (
            f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
            "X-Tripwire-Session: s\r\n"  # one run for the test's calls (each a first request: SPEC §3)
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode()
        for _ in range(3):
            arrived.clear()
            release.clear()
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(head + body)
            # bounded: with the bug, the circuit opens and the third call never reaches the upstream
            await asyncio.wait_for(arrived.wait(), 30)
            writer.close()  # gone while the upstream is still working on the answer
            await _wait_for(
                lambda: all(h.transport is None for h in server.connections), "Tripwire to see the hang-up"
            )
            release.set()  # the answer comes: its head has nowhere to go
            await _wait_for(lambda: tw.engine.inflight == 0, "the call to finish")
        release.set()
        resp = await client(base + "/agents/default/sessions/s/v1").chat.completions.create(
            model="gpt-4o-mini", messages=[{"role": "user", "content": "x"}]
        )
        assert resp.choices[0].message.content == "hi", "three hang-ups must not open a 2-failure circuit"
        await runner.cleanup()
        await tw.flush()
        events = tw.events()
        llm = [e["payload"] for e in events if e["event_type"] == "LLM_CALL"]
        assert [p["status"] for p in llm] == ["error", "error", "error", "ok"]
        assert all("client disconnected" in p["error"]["message"] for p in llm[:3]), llm[0]["error"]
        assert not [e for e in events if e["event_type"] == "ERROR"], "a hang-up is not an upstream failure"
    finally:
        await upstream.close()


async def test_gzip_request_body_is_forwarded_decoded_and_labelled_so(
    start_tripwire: StartTripwire, fake_upstream
) -> None:
    fake, url = fake_upstream
    tw = await start_tripwire(upstream={"url": url})
    raw = json.dumps({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "zip"}]}).encode()
    async with aiohttp.ClientSession() as http:
        async with http.post(
            tw.url + "/v1/chat/completions",
            data=gzip.compress(raw),
            headers={"Content-Encoding": "gzip", "Content-Type": "application/json"},
        ) as r:
            assert r.status == 200
    seen = fake.calls("/v1/chat/completions")[0]
    assert seen.body["messages"][0]["content"] == "zip"
    assert "Content-Encoding" not in seen.headers


async def test_raw_query_string_reaches_the_upstream_unchanged(start_tripwire: StartTripwire) -> None:
    lines: list[str] = []

    async def raw(request: web.Request) -> web.Response:
        lines.append(request.raw_path)
        return web.json_response({})

    app = web.Application()
    app.router.add_get("/{tail:.*}", raw)
    upstream = TestServer(app, host="127.0.0.1")
    await upstream.start_server()
    try:
        tw = await start_tripwire(upstream={"url": str(upstream.make_url("")).rstrip("/")})
        async with aiohttp.ClientSession() as http:
            async with http.get(
                aiohttp.client.URL(tw.url + "/v1/files?k=%23frag&q=a%20b", encoded=True)
            ) as r:
                assert r.status == 200
        assert lines == ["/v1/files?k=%23frag&q=a%20b"]
    finally:
        await upstream.close()


async def test_filtered_stream_never_claims_the_upstream_content_length(
    start_tripwire: StartTripwire,
) -> None:
    """An upstream that sends its whole SSE answer with a Content-Length: Tripwire drops the usage chunk."""
    usage = {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
    chunk: dict[str, Any] = {
        "id": "c",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "gpt-4o-mini",
    }
    frames = [
        {
            **chunk,
            "choices": [{"index": 0, "delta": {"role": "assistant", "content": "hi"}, "finish_reason": None}],
        },
        {**chunk, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
        {**chunk, "choices": [], "usage": usage},
    ]
    body = "".join(f"data: {json.dumps(f)}\n\n" for f in frames) + "data: [DONE]\n\n"

    async def sse(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(body=body.encode(), content_type="text/event-stream")

    app = web.Application()
    app.router.add_post("/v1/chat/completions", sse)
    upstream = TestServer(app, host="127.0.0.1")
    await upstream.start_server()
    try:
        tw = await start_tripwire(upstream={"url": str(upstream.make_url("")).rstrip("/")})
        async with aiohttp.ClientSession() as http:
            req = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "x"}], "stream": True}
            async with http.post(tw.url + "/v1/chat/completions", json=req) as r:
                got = await asyncio.wait_for(r.read(), 5)
        assert r.headers.get("Content-Length") in (None, str(len(got)))
        assert b'"usage"' not in got and got.endswith(b"data: [DONE]\n\n")
        await tw.flush()
        llm = [e for e in tw.events() if e["event_type"] == "LLM_CALL"][0]["payload"]
        assert llm["usage"] == usage
    finally:
        await upstream.close()


async def test_responses_chain_records_the_new_input_items(
    start_tripwire: StartTripwire, fake_upstream
) -> None:
    fake, url = fake_upstream
    fake.replies = [Reply(tool_calls=[("call_9", "lookup", {"q": "x"})]), Reply(text="done")]
    tw = await start_tripwire(upstream={"url": url})
    c = client(tw.url + "/v1")
    first = await c.responses.create(model="gpt-4o", input="find x")
    await c.responses.create(
        model="gpt-4o",
        previous_response_id=first.id,
        input=[{"type": "function_call_output", "call_id": "call_9", "output": "x is 42"}],
    )
    await tw.flush()
    events = tw.events()
    llm = [e["payload"] for e in events if e["event_type"] == "LLM_CALL"]
    assert llm[1]["prompt"], "the chained call's new input is recorded"
    tool = [e["payload"] for e in events if e["event_type"] == "TOOL_CALL"]
    assert [(t["tool_name"], t["args"], t["result"]) for t in tool] == [("lookup", {"q": "x"}, "x is 42")]


async def test_upstream_failure_writes_an_error_event(start_tripwire: StartTripwire, fake_upstream) -> None:
    fake, url = fake_upstream
    fake.replies = [Reply(status=500)]
    tw = await start_tripwire(upstream={"url": url})
    with pytest.raises(openai.InternalServerError):
        await client(tw.url + "/v1").chat.completions.create(
            model="gpt-4o-mini", messages=[{"role": "user", "content": "x"}]
        )
    await tw.flush()
    (run_id,) = tw.run_ids()
    events = tw.events(run_id)
    llm = next(e for e in events if e["event_type"] == "LLM_CALL")
    err = next(e for e in events if e["event_type"] == "ERROR")
    assert llm["payload"]["status"] == "error" and "stack" in llm["payload"]["error"]
    assert err["parent_id"] == llm["event_id"] and err["payload"]["http_status"] == 500
    assert tw.run_json(run_id)["counts"]["errors"] == 1
    assert_run_valid(tw.data_dir, run_id)


async def test_metadata_only_traces_keep_tool_names_not_arguments(tmp_path) -> None:
    rec = TraceRecorder(tmp_path, record_content=False)
    await rec.start()
    run_id = rec.start_run(run_name="r", agent_name="a", session_id="s", argv=[])
    rec.record(
        run_id,
        "LOOP_WARNING",
        'search_docs({"query":"ACME merger plan"})',
        {
            "pattern": 'search_docs({"query":"ACME merger plan"})',
            "repetitions": 5,
            "window_size": 5,
            "evidence_event_ids": [],
            "kind": "repetition",
            "message": "search_docs called 5 times: ACME merger plan",
        },
    )
    rec.record(
        run_id,
        "ERROR",
        "loop_detection",
        {
            "error_type": "loop_detection",
            "message": "x",
            "stack": None,
            "call": {"kind": "tool", "tool_name": "search_docs", "args": {"query": "ACME"}},
        },
    )
    await rec.close()
    text = (tmp_path / "runs" / run_id / "events.jsonl").read_text()
    assert "ACME" not in text
    assert "search_docs" in text


def test_ipv6_hosts_are_bracketed_in_urls() -> None:
    assert url_host("::1") == "[::1]"
    assert url_host("0.0.0.0") == "127.0.0.1"
    assert url_host("127.0.0.1") == "127.0.0.1"


def test_headers_named_by_connection_are_hop_by_hop() -> None:
    from multidict import CIMultiDict

    from proxy.forward import request_headers, response_headers
    from proxy.settings import UpstreamConfig

    incoming = CIMultiDict(
        [
            ("Connection", "keep-alive, X-Per-Hop"),
            ("X-Per-Hop", "1"),
            ("Expect", "100-continue"),
            ("X-Kept", "2"),
        ]
    )
    sent = request_headers(incoming, UpstreamConfig(url="http://127.0.0.1:1"), identity_encoding=False)
    assert list(sent.keys()) == ["X-Kept"]
    answer = CIMultiDict(
        [("Connection", "close, X-Upstream-Hop"), ("X-Upstream-Hop", "1"), ("Content-Type", "a/b")]
    )
    assert list(response_headers(answer, drop_length=False).keys()) == ["Content-Type"]


async def test_an_answer_broken_before_its_body_still_shows_its_head(start_tripwire: StartTripwire) -> None:
    """A non-streamed answer's head waits for its first body bytes (one write for both); an upstream
    that breaks before any body byte still has its head relayed, so the client sees a broken body,
    as it would direct, not a connection closed without an answer."""

    async def head_only(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(head_only, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        tw = await start_tripwire(upstream={"url": f"http://127.0.0.1:{port}"})
        async with aiohttp.ClientSession() as http:
            async with http.get(tw.url + "/v1/models") as r:
                assert r.status == 200 and r.headers["Content-Length"] == "100"
                with pytest.raises(aiohttp.ClientPayloadError):
                    await r.read()
    finally:
        server.close()
        await server.wait_closed()
