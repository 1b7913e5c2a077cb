"""A person decides a held call late (issue 32 items 1 and 2): 2 s after the hold, past the watch's
one-second tick, on every route: `/mcp/NAME` and the aggregate `/mcp` (mcp client, every transport),
chat, Responses (HTTP and WebSocket) and Anthropic (their SDKs).

Item 1: an aggregated call is held on an in-process request, which has no connection; its watch must
look at the aggregate client's own connection, or the call is `withdrawn` a second after the hold
and the person's approve gets 409 while the client hangs.
Item 2: approving a held loop covers the loop, whichever pattern sees it next, for `threshold`
calls (the approved one the first): the next call of the same loop is not asked about again by
another pattern (an approved identical_step, then repetition one call later).
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import anthropic
import openai
import pytest

from proxy.replay import replay_dir
from tests.conftest import AGENT_KEY, Running, StartTripwire
from tests.fakes import FakeUpstream, Reply
from tests.pipeline_errors import no_pipeline_errors  # noqa: F401 (autouse fixture)
from tests.test_approvals import approvals, decide, until
from tests.test_websocket import auth, create, until_done

LATE_S = 2.0  # the decision comes this long after the hold: past the watch's tick (1 s)
HEADERS = {"X-Tripwire-Session": "late-1", "X-Tripwire-Agent": "looper"}
# only the patterns that ask speak (the graduated no-progress and per-tool ones would end the loop)
QUIET = {"no_progress_warn": 50, "no_progress_halt": 50, "idempotent": [50, 50, 50], "mutating": [50, 50, 50]}
ASK_LOOP = {"loop_detection": {"action": "ask", **QUIET}}  # threshold 5, max_repeated_tool_steps 3


async def decided_late(
    tw: Running, decision: dict[str, Any], *, skip: set[str] | None = None
) -> dict[str, Any]:
    """The next held call, decided LATE_S after it was listed (the watch ticked meanwhile)."""

    async def new() -> list[dict[str, Any]]:
        return [a for a in await approvals(tw) if a["id"] not in (skip or set())]

    (approval,) = await until(new, "a call held")
    await asyncio.sleep(LATE_S)
    status, body = await decide(tw, approval["id"], decision)
    assert status == 200, body  # not 409: the held call was not withdrawn meanwhile
    return approval


# --- MCP: a server's own route and the aggregate ---------------------------------------------------


def _has_mcp2() -> bool:
    try:  # (find_spec of a submodule raises where mcp itself is absent: the mitmproxy environment)
        return __import__("importlib").util.find_spec("mcp.server.mcpserver") is not None
    except ModuleNotFoundError:
        return False


mcp_only = pytest.mark.skipif(not _has_mcp2(), reason="mcp 2.x")


@mcp_only
@pytest.mark.parametrize(
    "transport", ["auto", "legacy", "sse"], ids=["2026-07-28", "handshake", "legacy-sse"]
)
@pytest.mark.parametrize("route", ["direct", "aggregate"])
async def test_an_mcp_call_approved_late_is_forwarded_and_the_loop_goes_on(
    start_tripwire: StartTripwire, route: str, transport: str
) -> None:
    from tests.mcp_servers import connect, serve

    guards = {"loop_detection": {"threshold": 3, "action": "ask", **QUIET}, "ask_timeout_s": 15}
    path, prefix = ("/mcp/demo", "") if route == "direct" else ("/mcp", "demo__")
    server_transport = "sse" if transport == "sse" and route == "direct" else "streamable-http"
    with serve(server_transport) as upstream:
        tw = await start_tripwire(mcp={"demo": {"url": upstream}}, guards=guards, admin_token="hunter2")
        async with connect(transport, f"{tw.url}/agents/bot/sessions/s1{path}") as client:

            async def explode(reason: str) -> Any:
                return await client.call_tool(prefix + "explode", {"reason": reason})

            for _ in range(2):
                assert (await explode("x")).is_error
            held = asyncio.create_task(explode("x"))  # the 3rd identical call: repetition asks
            first = await decided_late(tw, {"decision": "approve"})
            result = await held
            # the next call of the loop: retry_no_progress sees it (the same failure again), and
            # the approval covers it; the one after too; the 6th call asks again
            fourth, fifth = await explode("y"), await explode("y")
            sixth = asyncio.create_task(explode("y"))
            second = await decided_late(tw, {"decision": "deny", "note": "stop"}, skip={first["id"]})
            denied = await sixth
        await tw.flush()
    assert first["kind"] == "repetition" and first["call"]["tool"] == prefix + "explode"
    # the server's own failure, forwarded (not Tripwire's block, not a timeout's)
    for answer in (result, fourth, fifth):
        assert answer.is_error and not answer.content[0].text.startswith("[tripwire]"), answer
    assert second["kind"] == "repetition" and second["actual"] == 3
    assert denied.is_error and "A person denied this call: stop" in denied.content[0].text
    calls = [e for e in tw.events() if e["event_type"] == "TOOL_CALL"]
    assert len(calls) == 5  # 1-5 forwarded, the 6th denied
    decided = [e["payload"] for e in tw.events() if e["name"] == "approval_decided"]
    assert [d["decision"] for d in decided] == ["approved", "denied"]
    assert decided[0]["covers_until"] == 5
    (run_id,) = {e["run_id"] for e in tw.events() if e["event_type"] == "TOOL_CALL"}
    replay = replay_dir(tw.data_dir / "runs" / run_id)
    assert replay.replayed_checks == replay.live  # the covered calls replay as the WARNs they were


# --- LLM dialects: the SDK agents ------------------------------------------------------------------


def looping(fake: FakeUpstream, n: int = 30) -> None:
    """The model asks for the same tool call `n` times, then answers."""
    fake.replies = [Reply(tool_calls=[(f"call_{i}", "get_weather", {"city": "Paris"})]) for i in range(n)] + [
        Reply(text="Paris is sunny")
    ]


async def agent(tw: Running, dialect: str, *, stream: bool) -> str:
    """The SDK's agent loop in `dialect`: runs get_weather itself until the model answers; its text."""
    if dialect == "anthropic":
        a = anthropic.AsyncAnthropic(
            base_url=tw.url + "/llm/anthropic", api_key=AGENT_KEY, default_headers=HEADERS, max_retries=0
        )
        messages: list[dict[str, Any]] = [{"role": "user", "content": "weather in Paris?"}]
        for _ in range(40):
            kw: Any = {"model": "claude-sonnet-4-5", "max_tokens": 100, "messages": messages}
            if stream:
                async with a.messages.stream(**kw) as s:
                    msg = await s.get_final_message()
            else:
                msg = await a.messages.create(**kw)
            uses = [b for b in msg.content if b.type == "tool_use"]
            if not uses:
                return "".join(b.text for b in msg.content if b.type == "text")
            messages.append({"role": "assistant", "content": [b.model_dump() for b in msg.content]})
            results = [{"type": "tool_result", "tool_use_id": u.id, "content": "sunny"} for u in uses]
            messages.append({"role": "user", "content": results})
        raise AssertionError("the agent loop never ended")
    o = openai.AsyncOpenAI(base_url=tw.url + "/v1", api_key=AGENT_KEY, default_headers=HEADERS, max_retries=0)
    if dialect == "responses":
        items: list[Any] = [{"role": "user", "content": "weather in Paris?"}]
        for _ in range(40):
            if stream:
                async with o.responses.stream(model="gpt-4o-mini", input=items) as r:
                    response = await r.get_final_response()
            else:
                response = await o.responses.create(model="gpt-4o-mini", input=items)
            calls = [i for i in response.output if i.type == "function_call"]
            if not calls:
                return response.output_text
            items += [i.model_dump(exclude_none=True) for i in response.output]
            items += [
                {"type": "function_call_output", "call_id": c.call_id, "output": "sunny"} for c in calls
            ]
        raise AssertionError("the agent loop never ended")
    chat: list[Any] = [{"role": "user", "content": "weather in Paris?"}]
    for _ in range(40):
        if stream:
            async with o.chat.completions.stream(model="gpt-4o-mini", messages=chat) as c:
                answer = await c.get_final_completion()
        else:
            answer = await o.chat.completions.create(model="gpt-4o-mini", messages=chat)
        message = answer.choices[0].message
        if not message.tool_calls:
            return str(message.content)
        chat.append(message.model_dump(exclude_none=True))
        chat += [{"role": "tool", "tool_call_id": tc.id, "content": "sunny"} for tc in message.tool_calls]
    raise AssertionError("the agent loop never ended")


async def ws_agent(tw: Running) -> str:
    """The Responses WebSocket agent: each step's output goes back with previous_response_id."""
    async with (
        aiohttp.ClientSession() as http,
        http.ws_connect(tw.url + "/v1/responses", headers=auth(**HEADERS)) as ws,
    ):
        await ws.send_str(create(input="weather in Paris?"))
        for _ in range(40):
            events = await until_done(ws)
            response = events[-1]["response"]
            calls = [i for i in response["output"] if i["type"] == "function_call"]
            if not calls:
                return str(response["output"][0]["content"][0]["text"])
            outputs = [
                {"type": "function_call_output", "call_id": c["call_id"], "output": "sunny"} for c in calls
            ]
            await ws.send_str(create(previous_response_id=response["id"], input=outputs))
    raise AssertionError("the agent loop never ended")


def forwarded(fake: FakeUpstream) -> int:
    """Model calls the upstream got (HTTP requests, or response.create messages on its socket)."""
    return len(fake.seen) + len([m for m in fake.ws_messages if m.get("type") == "response.create"])


@pytest.mark.parametrize(
    "dialect,stream",
    [
        ("chat", False),
        ("chat", True),
        ("responses", False),
        ("responses", True),
        ("responses-ws", False),
        ("anthropic", False),
        ("anthropic", True),
    ],
)
async def test_an_approved_loop_is_not_asked_again_by_another_pattern(
    start_tripwire: StartTripwire, fake_upstream: tuple[FakeUpstream, str], dialect: str, stream: bool
) -> None:
    fake, url = fake_upstream
    looping(fake)
    where = {"llm": {"anthropic": {"url": url}}} if dialect == "anthropic" else {"upstream": {"url": url}}
    tw = await start_tripwire(**where, guards={**ASK_LOOP, "ask_timeout_s": 15}, admin_token="hunter2")
    run = asyncio.create_task(
        ws_agent(tw) if dialect == "responses-ws" else agent(tw, dialect, stream=stream)
    )
    # the 5th step repeats the 4th's call set a 3rd time: identical_step asks (4 calls forwarded)
    first = await decided_late(tw, {"decision": "approve"})
    assert first["kind"] == "identical_step" and first["threshold"] == 3
    # what the person is shown (item 3): the tool calls the held step repeats, and the evidence
    assert first["call"]["tool_calls"] == [{"name": "get_weather", "arguments": {"city": "Paris"}}]
    assert first["evidence"]["repetitions"] == 4 and first["evidence"]["event_ids"]
    # approved: the 5th call goes on, and the loop goes on for 3 calls (5, 6, 7): repetition sees
    # call 6 (5 in a row) but does not ask; call 8 asks again
    second = await decided_late(tw, {"decision": "deny", "note": "enough"}, skip={first["id"]})
    assert forwarded(fake) == 7
    text = await run
    assert text.startswith("[tripwire] blocked:") and "A person denied this call: enough" in text
    assert forwarded(fake) == 7
    assert second["call"] and second["kind"] in ("identical_step", "repetition")
    await tw.flush()
    decided = [e["payload"] for e in tw.events() if e["name"] == "approval_decided"]
    assert [(d["decision"], d["call_seq"], d.get("covers_until")) for d in decided] == [
        ("approved", 5, 7),
        ("denied", 8, None),
    ]
    # replay decides as live: the covered calls' asks are warnings, the 8th asks again
    replay = replay_dir(tw.data_dir / "runs" / first["run_id"])
    asks = sorted({d.call_index for d in replay.decisions if d.action == "ask" and d.replayed})
    assert asks == [5, 8]
    assert replay.replayed_checks == replay.live  # every call's decisions, as live


@mcp_only
async def test_a_client_hanging_up_on_the_aggregate_withdraws_its_held_call(
    start_tripwire: StartTripwire,
) -> None:
    """The watch looks at the aggregate client's own connection: closed, the held call is withdrawn
    (and nothing forwarded), as on a server's own route."""
    from tests.mcp_servers import serve

    with serve("streamable-http") as upstream:
        tw = await start_tripwire(
            mcp={"demo": {"url": upstream}}, guards={"tools": {"ask": ["demo__add"]}}, admin_token="hunter2"
        )
        body = {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "tools/call",
            "params": {"name": "demo__add", "arguments": {"a": 1, "b": 2}},
        }
        headers = {"MCP-Protocol-Version": "2026-07-28", "Accept": "application/json, text/event-stream"}
        http = aiohttp.ClientSession()
        call = asyncio.create_task(
            http.post(f"{tw.url}/agents/bot/sessions/s1/mcp", json=body, headers=headers)
        )
        (approval,) = await until(lambda: approvals(tw), "the aggregated call held")
        call.cancel()
        await asyncio.gather(call, return_exceptions=True)
        await http.close()  # the client's connection closes

        async def withdrawn() -> list[dict[str, Any]]:
            return [a for a in await approvals(tw, decided=True) if a["status"] == "withdrawn"]

        await until(withdrawn, "the held call withdrawn")
        status, _ = await decide(tw, approval["id"], {"decision": "approve"})
        await tw.flush()
    assert status == 409
    assert [e for e in tw.events() if e["event_type"] == "TOOL_CALL" and e["name"] == "add"] == []


async def test_an_approved_loop_covers_the_loop_on_every_replica(
    start_tripwire: StartTripwire, fake_upstream: tuple[FakeUpstream, str], redis_url: str
) -> None:
    """Shared state: the call is held and approved on replica a (decided through b's API); the
    loop's next calls reach replica b, whose copy of the run's guards has the cover (a log entry),
    so they are not asked about; the call after the cover asks again, on b."""
    fake, url = fake_upstream
    looping(fake)
    settings: dict[str, Any] = {
        "upstream": {"url": url},
        "state": {"url": redis_url},
        "admin_token": "hunter2",
    }
    a = await start_tripwire(**settings, guards={**ASK_LOOP, "ask_timeout_s": 15})
    b = await start_tripwire(**settings, guards={**ASK_LOOP, "ask_timeout_s": 15})
    clients = [
        openai.AsyncOpenAI(base_url=tw.url + "/v1", api_key=AGENT_KEY, default_headers=HEADERS, max_retries=0)
        for tw in (a, b)
    ]

    async def loop() -> str:
        chat: list[Any] = [{"role": "user", "content": "weather in Paris?"}]
        for step in range(1, 40):
            client = clients[0] if step <= 5 else clients[1]  # calls 1-5 on replica a, then b
            message = (
                (await client.chat.completions.create(model="gpt-4o-mini", messages=chat)).choices[0].message
            )
            if not message.tool_calls:
                return str(message.content)
            chat.append(message.model_dump(exclude_none=True))
            chat += [{"role": "tool", "tool_call_id": tc.id, "content": "sunny"} for tc in message.tool_calls]
        raise AssertionError("the agent loop never ended")

    run = asyncio.create_task(loop())
    first = await decided_late(b, {"decision": "approve"})  # held on a, decided on b
    assert first["replica"] == a.engine.approvals.book.replica  # type: ignore[attr-defined]
    second = await decided_late(a, {"decision": "deny", "note": "enough"}, skip={first["id"]})
    assert second["replica"] == b.engine.approvals.book.replica  # type: ignore[attr-defined]
    assert len(fake.seen) == 7  # calls 6 and 7 went on through b; call 8 asked again
    text = await run
    assert "A person denied this call: enough" in text
