"""Trace export over OTLP/HTTP (issue 13, acceptance 4; SPEC §8): the real openai and mcp SDKs through
Tripwire, a fake collector on 127.0.0.1 decoding the protobuf exports, and the trace files Tripwire
wrote: one span per LLM and tool call with the GenAI attributes and the trace's token counts; a
collector that is down or hangs never fails or holds up a proxied call."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from collections.abc import AsyncIterator
from datetime import datetime
from typing import Any

import openai
import pytest

pytest.importorskip("opentelemetry.exporter.otlp.proto.http")
pytest.importorskip("mcp.server.mcpserver")  # mcp 2.x

import aiohttp  # noqa: E402
import httpx2  # noqa: E402
from mcp import Client  # noqa: E402
from mcp.client.streamable_http import streamable_http_client  # noqa: E402

from proxy.settings import OtlpConfig  # noqa: E402
from proxy.trace.otlp import OtlpExporter  # noqa: E402
from proxy.trace.spans import CallSpan  # noqa: E402
from tests.conftest import AGENT_KEY, Running, StartTripwire  # noqa: E402
from tests.fakes import FakeUpstream, Reply  # noqa: E402
from tests.mcp_servers import serve  # noqa: E402
from tests.otlp_receiver import ReceivedSpan, serve_receiver  # noqa: E402
from tests.schema import assert_run_valid  # noqa: E402

HEADERS = {"X-Tripwire-Session": "trip-1", "X-Tripwire-Agent": "calc"}
CALLS = ("LLM_CALL", "TOOL_CALL")


def span_id(uuid_text: str) -> str:
    """The span id Tripwire gives an event or run: the low 64 bits of its UUID, in hex."""
    return uuid_text.replace("-", "")[16:]


def epoch_ns(iso: str) -> int:
    return int(datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp() * 1e9)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def agent_loop(tw: Running) -> None:
    """The model asks for two tools: `add` runs on the MCP server through Tripwire, `get_weather` in
    the agent itself; a failing MCP tool too; then the answer, then one call past max_llm_calls."""
    llm = openai.AsyncOpenAI(
        base_url=f"{tw.url}/v1", api_key=AGENT_KEY, default_headers=HEADERS, max_retries=0
    )
    async with (
        httpx2.AsyncClient(headers=HEADERS) as http,
        Client(streamable_http_client(f"{tw.url}/mcp/demo", http_client=http), cache=None) as tools,
    ):
        messages: list[Any] = [{"role": "user", "content": "2 + 3, and the weather in Paris?"}]
        first = await llm.chat.completions.create(model="gpt-4o-mini", messages=messages, temperature=0.3)
        msg = first.choices[0].message
        assert msg.tool_calls is not None and len(msg.tool_calls) == 2
        messages.append(msg.model_dump(exclude_none=True))
        for tc in msg.tool_calls:
            args = json.loads(tc.function.arguments)
            if tc.function.name == "add":
                text = (await tools.call_tool("add", args)).content[0].text  # type: ignore[union-attr]
            else:
                text = "sunny"  # the agent's own function
            messages.append({"role": "tool", "tool_call_id": tc.id, "content": text})
        failed = await tools.call_tool("explode", {"reason": "boom"})
        assert failed.is_error
        second = await llm.chat.completions.create(model="gpt-4o-mini", messages=messages, stream=True)
        assert "".join([c.choices[0].delta.content or "" async for c in second if c.choices]) == "5, sunny"
        with pytest.raises(openai.RateLimitError):  # max_llm_calls=2: refused, the session ends
            await llm.chat.completions.create(
                model="gpt-4o-mini", messages=[{"role": "user", "content": "more"}]
            )


def by_event(spans: list[ReceivedSpan]) -> dict[str, ReceivedSpan]:
    out: dict[str, ReceivedSpan] = {}
    for s in spans:
        if "tripwire.event_id" in s.attributes:
            assert s.attributes["tripwire.event_id"] not in out, "one span per call"
            out[s.attributes["tripwire.event_id"]] = s
    return out


async def test_calls_are_exported_as_genai_spans_with_the_trace_token_counts(
    start_tripwire: StartTripwire, fake_upstream: tuple[FakeUpstream, str]
) -> None:
    fake, llm_url = fake_upstream
    fake.replies = [
        Reply(
            tool_calls=[("call_add", "add", {"a": 2, "b": 3}), ("call_w", "get_weather", {"city": "Paris"})],
            prompt_tokens=50,
            completion_tokens=7,
            model="gpt-4o-mini-2024-07-18",
        ),
        Reply(text="5, sunny", prompt_tokens=80, completion_tokens=9),
    ]
    async with serve_receiver() as (receiver, otlp_url):
        with serve() as mcp_url:
            tw = await start_tripwire(
                upstream={"url": llm_url},
                mcp={"demo": {"url": mcp_url}},
                otlp={"endpoint": otlp_url, "export_interval_s": 0.05},
                guards={"limits": {"max_llm_calls": 2}},
            )
            await agent_loop(tw)
            await tw.flush()
        (run_id,) = tw.run_ids()
        _, events = assert_run_valid(tw.data_dir, run_id)
        calls = [e for e in events if e["event_type"] in CALLS]
        (refused,) = [e for e in events if e["event_type"] == "ERROR" and "call" in e["payload"]]
        (run_end,) = [e for e in events if e["event_type"] == "RUN_END"]
        assert [e["event_type"] for e in calls] == [
            "LLM_CALL",
            "TOOL_CALL",
            "TOOL_CALL",
            "TOOL_CALL",
            "LLM_CALL",
        ]
        await receiver.wait_for(lambda r: len(r.spans) >= len(calls) + 2)
        # the exporter counts a batch once the collector's answer is back, just after the spans arrived
        await wait_until(
            lambda: tw.engine.recorder.health()["exporters"]["otlp"]["exported"] == len(calls) + 2
        )
        async with aiohttp.ClientSession() as http, http.get(f"{tw.admin_url}/healthz") as resp:
            exported = (await resp.json())["trace_store"]["exporters"]["otlp"]

    spans = by_event(receiver.spans)
    assert set(spans) == {e["event_id"] for e in calls} | {refused["event_id"]}
    (root,) = [s for s in receiver.spans if not s.parent_span_id]
    assert len(receiver.spans) == len(calls) + 2
    # one trace per run, named by the run id; every span carries the agent and the session
    assert {s.trace_id for s in receiver.spans} == {run_id.replace("-", "")}
    for s in receiver.spans:
        assert s.attributes["gen_ai.agent.name"] == "calc"
        assert s.attributes["gen_ai.conversation.id"] == "trip-1" == s.attributes["tripwire.session_id"]
        assert s.attributes["tripwire.run_id"] == run_id
        assert s.resource["service.name"] == "tripwire" and s.resource["service.version"]
        assert s.scope == "tripwire"

    for event in calls:
        span = spans[event["event_id"]]
        p = event["payload"]
        assert span.span_id == span_id(event["event_id"])
        assert span.end_ns - span.start_ns == event["duration_ms"] * 1_000_000
        if event["event_type"] == "LLM_CALL":
            assert span.name == "chat gpt-4o-mini" and span.kind == "CLIENT"
            assert span.parent_span_id == root.span_id
            assert abs(span.start_ns - epoch_ns(event["ts"])) < 1_000_000  # ts is to the millisecond
            a = span.attributes
            assert a["gen_ai.operation.name"] == "chat"
            assert a["gen_ai.provider.name"] == a["gen_ai.system"] == "openai"
            assert a["gen_ai.request.model"] == "gpt-4o-mini"
            assert a["gen_ai.response.model"] == p["model"]
            # the token counts of the local trace
            assert a["gen_ai.usage.input_tokens"] == p["usage"]["prompt_tokens"]
            assert a["gen_ai.usage.output_tokens"] == p["usage"]["completion_tokens"]
            assert a["tripwire.cost_usd"] == pytest.approx(p["cost_usd"])
            assert a["gen_ai.request.stream"] is p["stream"]
            assert a["gen_ai.response.finish_reasons"] == [p["stop_reason"]]
            assert span.status == "UNSET"
        elif p["source"] == "mcp":
            assert span.name == f"execute_tool {p['tool_name']}" and span.kind == "CLIENT"
            a = span.attributes
            assert a["gen_ai.operation.name"] == "execute_tool" and a["gen_ai.tool.name"] == p["tool_name"]
            assert a["mcp.method.name"] == "tools/call" and a["tripwire.mcp.server"] == "demo"
            assert a.get("mcp.session.id") == event["meta"].get("mcp_session_id")
            assert a["jsonrpc.request.id"] == str(event["meta"]["jsonrpc_id"])
            assert span.status == ("ERROR" if p["status"] == "error" else "UNSET")
        else:  # the agent's own function, recorded when its result came back in the next request
            assert span.name == "execute_tool get_weather" and span.kind == "INTERNAL"
            assert span.attributes["gen_ai.tool.call.id"] == "call_w"
            assert span.attributes["gen_ai.tool.type"] == "function"
            assert span.parent_span_id == span_id(event["parent_id"])  # the LLM call that asked for it
            assert abs(span.end_ns - epoch_ns(event["ts"])) < 1_000_000
    assert sum(s.attributes.get("gen_ai.usage.input_tokens", 0) for s in receiver.spans) == 130
    (explode,) = [s for s in spans.values() if s.name == "execute_tool explode"]
    assert explode.status == "ERROR" and explode.attributes["error.type"]

    blocked = spans[refused["event_id"]]
    assert blocked.name == "chat gpt-4o-mini" and blocked.status == "ERROR"
    assert blocked.attributes["error.type"] == "max_llm_calls" == blocked.attributes["tripwire.guard"]
    assert blocked.attributes["gen_ai.request.model"] == "gpt-4o-mini"
    assert "gen_ai.usage.input_tokens" not in blocked.attributes  # the upstream never saw it

    summary = run_end["payload"]["summary"]
    assert root.name == "invoke_agent calc" and root.span_id == span_id(run_id)
    assert root.attributes["gen_ai.operation.name"] == "invoke_agent"
    assert root.status == "ERROR" and root.attributes["tripwire.end_reason"] == run_end["payload"]["reason"]
    assert root.attributes["tripwire.llm_calls"] == summary["llm_calls"] == 2
    assert root.attributes["tripwire.tool_calls"] == summary["tool_calls"] == 3
    assert root.attributes["tripwire.total_tokens"] == summary["total_tokens"] == 146
    assert root.end_ns - root.start_ns == summary["duration_ms"] * 1_000_000
    assert exported["exported"] == len(receiver.spans) and exported["pending"] == exported["dropped"] == 0


async def llm_calls(tw: Running, n: int) -> None:
    llm = openai.AsyncOpenAI(
        base_url=f"{tw.url}/v1", api_key=AGENT_KEY, default_headers=HEADERS, max_retries=0
    )
    for i in range(n):
        resp = await llm.chat.completions.create(
            model="gpt-4o-mini", messages=[{"role": "user", "content": f"q{i}"}]
        )
        assert resp.choices[0].message.content == "Hello from the fake upstream"


async def test_a_collector_that_is_down_never_fails_a_call(
    start_tripwire: StartTripwire, fake_upstream: tuple[FakeUpstream, str]
) -> None:
    _, llm_url = fake_upstream
    down = f"http://127.0.0.1:{free_port()}"  # nothing listens: connections are refused
    tw = await start_tripwire(
        upstream={"url": llm_url}, otlp={"endpoint": down, "export_interval_s": 0.05, "timeout_s": 0.5}
    )
    await llm_calls(tw, 5)
    await tw.flush()
    (run_id,) = tw.run_ids()
    _, events = assert_run_valid(tw.data_dir, run_id)
    assert [e["event_type"] for e in events].count("LLM_CALL") == 5
    exporter = tw.engine.recorder.sinks[0]
    assert isinstance(exporter, OtlpExporter)
    await wait_until(lambda: exporter.health()["failed"] == 5)
    health = tw.engine.health()["trace_store"]
    assert health["ok"] is True, "export trouble is not trace-store trouble"
    assert health["exporters"]["otlp"]["endpoint"] == down + "/v1/traces"
    await llm_calls(tw, 1)  # and calls go on


async def test_a_collector_that_hangs_holds_up_no_call_and_gets_the_spans_when_it_recovers(
    start_tripwire: StartTripwire, fake_upstream: tuple[FakeUpstream, str]
) -> None:
    _, llm_url = fake_upstream
    async with serve_receiver(hold=True) as (receiver, otlp_url):
        tw = await start_tripwire(
            upstream={"url": llm_url}, otlp={"endpoint": otlp_url, "export_interval_s": 0.05, "timeout_s": 60}
        )
        await llm_calls(tw, 1)
        await receiver.wait_for(lambda r: r.held == 1)  # the export is stuck in the collector ...
        await llm_calls(tw, 3)  # ... and calls are answered and recorded meanwhile
        await tw.flush()
        assert receiver.held == 1 and receiver.spans == []
        assert [e["event_type"] for e in tw.events()].count("LLM_CALL") == 4
        receiver.hold = False
        receiver.release.set()  # the held export fails (503); the exporter's retry gets through
        await receiver.wait_for(lambda r: len(r.spans) == 4)
        # the kill switch ends the run: its root span follows (while the collector is still there)
        async with aiohttp.ClientSession() as http:
            async with http.post(f"{tw.admin_url}/api/runs/{tw.run_ids()[0]}/terminate") as resp:
                assert resp.status == 200
        await receiver.wait_for(lambda r: len(r.spans) == 5)
    assert sorted(s.attributes.get("tripwire.event_id", "") for s in receiver.spans) == sorted(
        ["", *(e["event_id"] for e in tw.events() if e["event_type"] == "LLM_CALL")]
    )


async def test_close_flushes_and_is_bounded_by_the_export_timeout() -> None:
    span = CallSpan(
        name="chat m",
        client=True,
        trace_id=1,
        span_id=2,
        parent_span_id=3,
        start_ns=1_000,
        end_ns=2_000,
        attributes={"gen_ai.operation.name": "chat"},
        error=None,
    )
    async with serve_receiver() as (receiver, url):
        exporter = OtlpExporter(OtlpConfig(endpoint=url, export_interval_s=60))
        exporter.emit(span)
        await exporter.close()  # no wait for the 60 s interval: close sends what is queued
        assert [s.span_id for s in receiver.spans] == ["0000000000000002"]
    async with serve_receiver(hold=True) as (receiver, url):
        exporter = OtlpExporter(OtlpConfig(endpoint=url, export_interval_s=0.05, timeout_s=0.5))
        exporter.emit(span)
        await receiver.wait_for(lambda r: r.held == 1)
        await exporter.close()  # returns although the collector never answers
        assert exporter.health()["exported"] == 0
        exporter.accept({}, 0.0, agent="a", session_id="s")  # after close: ignored, never raises
    # the collector is gone: the held export fails and the exporter's threads end (before the next
    # test, whose log capture they would otherwise write into)
    await wait_until(
        lambda: not any(t.name.startswith(("Otel", "tripwire-otlp")) for t in threading.enumerate())
    )


def exporter_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith(("Otel", "tripwire-otlp"))]


@pytest.fixture(autouse=True)
async def exporters_end_with_their_test() -> AsyncIterator[None]:
    """A closed exporter's last export (to a collector now gone) ends before the next test starts:
    its thread would otherwise log into that test's capture (seen in test_pricing)."""
    yield
    await wait_until(lambda: not exporter_threads())


async def wait_until(predicate: Any, limit_s: float = 60) -> None:
    """Poll a condition another thread makes true (the exporter's worker), with a generous bound."""
    for _ in range(int(limit_s / 0.02)):
        if predicate():
            return
        await asyncio.sleep(0.02)
    raise AssertionError("condition not met")
