"""Issue 21 item 5: replicas decide exactly as one process however fast the calls come (SPEC §8).

Three replicas (in-process apps on loopback) share one real Redis; an agent sends its calls
round-robin over them back to back, each the moment the previous answer ended: no pause, no flush
between calls. Each decision must fall at the same call as when the same sequence goes through one
process. What makes it hold: a call's settle reaches the shared log before its answer's end reaches
the client, so the next call is judged with it whichever replica serves it.
"""

from __future__ import annotations

import contextlib
from typing import Any

import openai
import pytest

from tests.conftest import AGENT_KEY, Running, StartTripwire, serve_fake
from tests.fakes import FakeUpstream, Reply
from tests.pipeline_errors import no_pipeline_errors  # noqa: F401 (autouse fixture)

CHAT = "/v1/chat/completions"


def client(tw: Running, session: str) -> openai.AsyncOpenAI:
    headers = {"X-Tripwire-Agent": "researcher", "X-Tripwire-Session": session}
    return openai.AsyncOpenAI(
        base_url=tw.url + "/v1", api_key=AGENT_KEY, default_headers=headers, max_retries=0
    )


async def start_all(
    start: StartTripwire, url: str, redis_url: str | None, n: int, **kw: Any
) -> list[Running]:
    state = {"state": {"url": redis_url}} if redis_url else {}
    return [await start(upstream={"url": url}, **state, **kw) for _ in range(n)]


async def loop_caught_at(replicas: list[Running], fake: FakeUpstream, stream: bool) -> int:
    """A function-calling agent reading the same file again and again; the call the guard blocks."""
    fake.replies = [Reply(tool_calls=[(f"call_{i}", "read_file", {"path": "notes.txt"})]) for i in range(30)]
    clients = [client(r, f"loop-{len(replicas)}-{stream}") for r in replicas]
    messages: list[dict[str, Any]] = [{"role": "user", "content": "summarise notes.txt"}]
    for i in range(30):
        llm = clients[i % len(clients)]
        if stream:
            calls: dict[int, dict[str, Any]] = {}
            async with await llm.chat.completions.create(model="gpt-4o", messages=messages, stream=True) as s:
                async for chunk in s:
                    for choice in chunk.choices:
                        if choice.delta.content and "[tripwire]" in choice.delta.content:
                            return i + 1
                        for tc in choice.delta.tool_calls or []:
                            c = calls.setdefault(tc.index, {"id": "", "name": "", "args": ""})
                            c["id"] += tc.id or ""
                            c["name"] += (tc.function.name or "") if tc.function else ""
                            c["args"] += (tc.function.arguments or "") if tc.function else ""
            tool_calls = [
                {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["args"]}}
                for c in calls.values()
            ]
            messages.append({"role": "assistant", "tool_calls": tool_calls})
            ids = [c["id"] for c in calls.values()]
        else:
            raw = await llm.chat.completions.with_raw_response.create(model="gpt-4o", messages=messages)
            answer = raw.parse().choices[0].message
            if raw.headers.get("X-Tripwire-Guard"):
                return i + 1
            messages.append(answer.model_dump(exclude_none=True))
            ids = [tc.id for tc in answer.tool_calls or []]
        messages.extend({"role": "tool", "tool_call_id": i, "content": "the same notes"} for i in ids)
    raise AssertionError("the loop was never caught")


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_a_function_calling_loop_back_to_back_is_caught_at_the_same_call(
    start_tripwire: StartTripwire, redis_url: str, stream: bool
) -> None:
    guards = {"loop_detection": {"action": "block"}}
    async with serve_fake(Reply(text="done")) as (fake, url):
        (alone,) = await start_all(start_tripwire, url, None, 1, guards=guards)
        one = await loop_caught_at([alone], fake, stream)
        replicas = await start_all(start_tripwire, url, redis_url, 3, guards=guards)
        shared = await loop_caught_at(replicas, fake, stream)
    assert one == shared


async def refused_at(replicas: list[Running], guard: str, n: int = 20) -> list[int]:
    """Back-to-back calls of one session: the status of each (200, or 429 from `guard`)."""
    clients = [client(r, f"limits-{len(replicas)}") for r in replicas]
    out = []
    for i in range(n):
        try:
            await clients[i % len(clients)].chat.completions.create(
                model="gpt-4o", messages=[{"role": "user", "content": "hello"}]
            )
            out.append(200)
        except openai.RateLimitError as e:
            assert e.response.headers["X-Tripwire-Guard"] in (guard, "session_terminated")
            out.append(429)
    return out


@pytest.mark.parametrize(
    "guards",
    [
        {"budget": {"max_cost_usd": 0.9}},
        {"limits": {"max_llm_calls": 4}},
        {"budget": {"max_tokens": 250_000}},
    ],
    ids=["max_cost_usd", "max_llm_calls", "max_tokens"],
)
async def test_budgets_and_limits_back_to_back_refuse_at_the_same_call(
    start_tripwire: StartTripwire, redis_url: str, guards: dict[str, Any]
) -> None:
    # gpt-4o: $2.50 / 1M input tokens: each answer costs $0.25 (and 100,000 tokens)
    reply = Reply(text="expensive", prompt_tokens=100_000, completion_tokens=0)
    guard = next(iter(next(iter(guards.values()))))
    async with serve_fake(reply) as (fake, url):
        (alone,) = await start_all(start_tripwire, url, None, 1, guards=guards)
        one = await refused_at([alone], guard, 8)
        replicas = await start_all(start_tripwire, url, redis_url, 3, guards=guards)
        shared = await refused_at(replicas, guard, 8)
    assert 200 in one and 429 in one  # the guard did fire within the sequence
    assert one == shared


# --- MCP --------------------------------------------------------------------------------------


async def mcp_blocked_at(replicas: list[Running], legacy: bool = False) -> list[str]:
    """set_price with the same arguments twelve times, round-robin, back to back: what each call
    got (its result, a BLOCK result, or the JSON-RPC error of an ended session). Its rules read the
    results too (no progress, per-tool escalation): each call must be judged with the one before."""
    from mcp import Client, MCPError
    from mcp.client.sse import sse_client

    async with contextlib.AsyncExitStack() as stack:
        url = f"/agents/bot/sessions/pace-{len(replicas)}/mcp/shop"
        clients = [
            await stack.enter_async_context(
                Client(sse_client(r.url + url), mode="legacy", cache=None)
                if legacy
                else Client(r.url + url, cache=None)
            )
            for r in replicas
        ]
        out = []
        for i in range(12):
            try:
                result = await clients[i % len(clients)].call_tool("set_price", {"sku": "A1", "price": 1.0})
            except MCPError:
                # the session ended: the ending call's refusal, or an ended session's (the replica
                # that did not end it refuses in the ending guard's words: the same decision)
                out.append("refused")
                continue
            texts = [getattr(c, "text", "") for c in result.content]
            if result.is_error:
                out.append("blocked: " + texts[0].split(" (")[0])
            else:
                out.append("warned" if any("[tripwire]" in t for t in texts) else "ok")
        return out


@pytest.mark.parametrize("answers", ["sse", "json", "legacy-sse"])
@pytest.mark.parametrize(
    "loop",
    [{"action": "warn"}, {"action": "block"}, {"action": "block", "threshold": 3}],
    ids=["default", "block", "block-threshold-3"],
)
async def test_an_mcp_loop_back_to_back_is_caught_at_the_same_call(
    start_tripwire: StartTripwire, redis_url: str, answers: str, loop: dict[str, Any]
) -> None:
    """Streamable HTTP answering with an SSE stream or with JSON."""
    pytest.importorskip("mcp.server.mcpserver")  # mcp 2.x
    from tests.mcp_servers import ServerThread
    from tests.test_guards_e2e_mcp import build_shop

    guards = {"loop_detection": loop}
    legacy = answers == "legacy-sse"
    shop = build_shop()
    thread = ServerThread(
        shop.sse_app() if legacy else shop.streamable_http_app(json_response=answers == "json")
    )
    upstream = thread.start() + ("/sse" if legacy else "/mcp")
    try:
        alone = await start_tripwire(mcp={"shop": {"url": upstream}}, guards=guards)
        one = await mcp_blocked_at([alone], legacy)
        replicas = [
            await start_tripwire(mcp={"shop": {"url": upstream}}, guards=guards, state={"url": redis_url})
            for _ in range(3)
        ]
        shared = await mcp_blocked_at(replicas, legacy)
    finally:
        thread.stop()
    assert "ok" in one and one[-1] != "ok"
    assert one == shared


async def test_an_mcp_stream_closed_before_its_result_ends_at_once_with_shared_state(
    start_tripwire: StartTripwire, redis_url: str
) -> None:
    """2025-11-25 polling with shared state: the POST's stream carries no result (the server closes
    it early, the client resumes on a GET): its end is not held for the call's settle, or the client,
    waiting for that end before it resumes, would wait for a result that can only come after it."""
    pytest.importorskip("mcp.server.mcpserver")  # mcp 2.x
    import asyncio

    from mcp import Client

    from tests.mcp_servers import serve, served_as_in_production

    with serve(resumable=True) as upstream:
        tw = await start_tripwire(mcp={"demo": {"url": upstream}}, state={"url": redis_url})
        async with (
            served_as_in_production(tw) as base,
            Client(f"{base}/agents/bot/sessions/s1/mcp/demo", mode="legacy", cache=None) as client,
        ):
            result = await asyncio.wait_for(client.call_tool("poll_later", {}), 20)
        for _ in range(200):  # the POST's pipeline records once the resumed GET delivered the result
            await tw.flush()
            if tw.run_ids() and any(e["event_type"] == "TOOL_CALL" for e in tw.events()):
                break
            await asyncio.sleep(0.05)

    assert result.content[0].text == "ready after polling"
    (call,) = [e for e in tw.events() if e["event_type"] == "TOOL_CALL"]
    assert call["payload"]["status"] == "ok"


async def test_a_legacy_call_that_needs_a_sampling_answer_completes_with_shared_state(
    start_tripwire: StartTripwire, redis_url: str
) -> None:
    """Legacy HTTP+SSE with shared state: the call's POST is answered 202 and its result comes on the
    GET stream after the client answered the server's sampling request, which the client POSTs only
    once the 202 has ended. That end carries no result: it is not held for the call's settle."""
    pytest.importorskip("mcp.server.mcpserver")  # mcp 2.x
    import asyncio

    from mcp import Client
    from mcp.client.sse import sse_client
    from mcp.types import CreateMessageResult, TextContent

    from tests.mcp_servers import serve, served_as_in_production

    async def sampler(context: Any, params: Any) -> CreateMessageResult:
        return CreateMessageResult(
            role="assistant", content=TextContent(type="text", text="fine"), model="fake"
        )

    with serve("sse", sampling=True) as upstream:
        tw = await start_tripwire(mcp={"demo": {"url": upstream}}, state={"url": redis_url})
        async with (
            served_as_in_production(tw) as base,
            Client(
                sse_client(f"{base}/mcp/demo"), mode="legacy", cache=None, sampling_callback=sampler
            ) as client,
        ):
            result = await asyncio.wait_for(client.call_tool("summarize", {"topic": "t"}), 20)
            again = await client.call_tool("add", {"a": 1, "b": 2})  # the session goes on
        await tw.flush()

    assert result.content[0].text == "summary of t: fine"
    assert again.structured_content == {"result": 3}
    calls = [e for e in tw.events() if e["event_type"] == "TOOL_CALL"]
    assert [(e["name"], e["payload"]["status"]) for e in calls] == [("summarize", "ok"), ("add", "ok")]
