"""Progress-aware loop detection end to end (SPEC §5.1, §5.5): honest work passes untouched under
the default config, a stuck loop is still caught, through the running proxy with the real mcp 2.x
client and the real `openai` SDK.

Honest shapes: a 30-page pagination, a 20-way fan-out, a poll of a status that changes. Stuck
shape: a 3-tool cycle whose only change is a fresh `request_id` (a value that means nothing), with
the same results every round; it must be caught within max(threshold + 1, 2k) = 6 calls.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import openai
import pytest

pytest.importorskip("mcp.server.mcpserver")  # mcp 2.x

from mcp import Client, MCPError  # noqa: E402
from mcp.server.mcpserver import MCPServer  # noqa: E402

from tests.conftest import AGENT_KEY, Running, StartTripwire  # noqa: E402
from tests.fakes import FakeUpstream, Reply  # noqa: E402
from tests.mcp_servers import ServerThread  # noqa: E402
from tests.pipeline_errors import no_pipeline_errors  # noqa: E402, F401 (autouse fixture)
from tests.test_guards_e2e_llm import CHAT, SESSION  # noqa: E402
from tests.test_guards_e2e_mcp import only, text_of, trace  # noqa: E402

SESSION_URL = "/agents/bot/sessions/s1/mcp/work"
CITIES = [
    "Paris", "London", "Berlin", "Madrid", "Rome", "Vienna", "Prague", "Warsaw", "Lisbon", "Dublin",
    "Oslo", "Stockholm", "Helsinki", "Copenhagen", "Athens", "Budapest", "Brussels", "Amsterdam",
    "Zurich", "Tallinn",
]  # fmt: skip
LOOP_ROUNDS = 5
CAUGHT_BY = 6  # max(threshold + 1, 2k) with threshold 5 and k = 3 calls per round
DONE = "all done"


class Tools:
    """The tools' behaviour, shared by the MCP server and the function-calling agent, with hit counts."""

    def __init__(self) -> None:
        self.hits: Counter[str] = Counter()

    def run(self, name: str, args: dict[str, Any]) -> str:
        self.hits[name] += 1
        n = self.hits[name]
        if name == "list_items":
            page = args["page"]
            return f"page {page}: " + ", ".join(f"item-{page * 10 + j}" for j in range(10))
        if name == "get_weather":
            return f"{args['city']}: {10 + len(args['city'])}C, wind {len(args['city']) * 3} km/h"
        if name == "job_status":  # progress moves on every poll; so does the timestamp
            return (
                f"job {args['job']}: running {5 * n}% (checked at 2026-03-01T12:{n // 60:02d}:{n % 60:02d}Z)"
            )
        # the stuck cycle: whatever the request_id, the same answer every round
        if name == "search":
            return f"hits for {args['query']}: u (Example Domain), v (Example Domain mirror)"
        if name == "open":
            return f"<html><title>Example Domain</title>{args['url']}: for use in examples</html>"
        if name == "summarize":
            return "summary: an example page, nothing else"
        raise AssertionError(f"unknown tool {name}")

    @property
    def total(self) -> int:
        return sum(self.hits.values())


def build_server(tools: Tools) -> MCPServer:
    server = MCPServer("tripwire-progress")

    @server.tool()
    def list_items(page: int) -> str:
        """List one page of items."""
        return tools.run("list_items", {"page": page})

    @server.tool()
    def get_weather(city: str) -> str:
        """The weather in a city."""
        return tools.run("get_weather", {"city": city})

    @server.tool()
    def job_status(job: str) -> str:
        """A job's progress."""
        return tools.run("job_status", {"job": job})

    @server.tool()
    def search(query: str, request_id: str) -> str:
        """Search the web."""
        return tools.run("search", {"query": query, "request_id": request_id})

    @server.tool(name="open")
    def open_page(url: str, request_id: str) -> str:
        """Open a page."""
        return tools.run("open", {"url": url, "request_id": request_id})

    @server.tool()
    def summarize(text: str, request_id: str) -> str:
        """Summarize a text."""
        return tools.run("summarize", {"text": text, "request_id": request_id})

    return server


@contextmanager
def serve_tools(tools: Tools) -> Iterator[str]:
    thread = ServerThread(build_server(tools).streamable_http_app())
    base = thread.start()
    try:
        yield base + "/mcp"
    finally:
        thread.stop()


def stuck_cycle(rounds: int = LOOP_ROUNDS) -> list[tuple[str, dict[str, Any]]]:
    """search -> open -> summarize, the same each round but for a fresh request_id on every call."""
    calls = []
    for _ in range(rounds):
        calls += [
            ("search", {"query": "x", "request_id": str(uuid.uuid4())}),
            ("open", {"url": "u", "request_id": str(uuid.uuid4())}),
            ("summarize", {"text": "Example Domain page", "request_id": str(uuid.uuid4())}),
        ]
    return calls


def outcome(result: Any) -> str:
    """What the model sees of one MCP result, as one string (guard texts included)."""
    return " | ".join(text_of(result))


def refusal(error: MCPError) -> str:
    data = error.error.data if isinstance(error.error.data, dict) else {}
    return f"[tripwire refused: {data.get('guardrail')}] {error.error.message}"


async def call_mcp(client: Client, name: str, args: dict[str, Any]) -> tuple[str, Any]:
    """(what the model sees, the result or None when refused with a JSON-RPC error)."""
    try:
        result = await client.call_tool(name, args)
    except MCPError as e:
        return refusal(e), None
    return outcome(result), result


async def assert_untouched(tw: Running) -> list[dict[str, Any]]:
    """No loop finding of any kind, no refusal, no loop tag: the run is as if Tripwire were not there."""
    run_id, events = await trace(tw)
    warnings = [
        (w["payload"]["kind"], w["payload"].get("action"), w["name"]) for w in only(events, "LOOP_WARNING")
    ]
    assert warnings == [], f"honest work was flagged: {warnings}"
    errors = [(e["payload"].get("guardrail"), e["payload"].get("message")) for e in only(events, "ERROR")]
    assert errors == []
    assert "loop_detected" not in tw.tripwire_json(run_id).get("health_tags", [])
    return events


# ---- honest work over MCP, default config ------------------------------------------------------


async def test_mcp_pagination_of_30_pages_passes_untouched(start_tripwire: StartTripwire) -> None:
    tools = Tools()
    with serve_tools(tools) as upstream:
        tw = await start_tripwire(mcp={"work": {"url": upstream}})
        async with Client(tw.url + SESSION_URL, cache=None) as client:
            seen = [(await call_mcp(client, "list_items", {"page": p}))[0] for p in range(1, 31)]
        events = await assert_untouched(tw)
    expected = [Tools().run("list_items", {"page": p}) for p in range(1, 31)]
    assert seen == expected  # every page answered by the real tool, nothing appended
    assert not any("[tripwire" in s for s in seen)
    assert tools.hits == {"list_items": 30}
    assert len(only(events, "TOOL_CALL")) == 30


async def test_mcp_parallel_fan_out_of_20_passes_untouched(start_tripwire: StartTripwire) -> None:
    tools = Tools()
    with serve_tools(tools) as upstream:
        tw = await start_tripwire(mcp={"work": {"url": upstream}})
        async with Client(tw.url + SESSION_URL, cache=None) as client:
            answers = await asyncio.gather(*(call_mcp(client, "get_weather", {"city": c}) for c in CITIES))
        events = await assert_untouched(tw)
    seen = [s for s, _ in answers]
    assert seen == [Tools().run("get_weather", {"city": c}) for c in CITIES]
    assert not any("[tripwire" in s for s in seen)
    assert tools.hits == {"get_weather": 20}
    assert len(only(events, "TOOL_CALL")) == 20


async def test_mcp_poll_of_a_changing_status_passes_untouched(start_tripwire: StartTripwire) -> None:
    tools = Tools()
    with serve_tools(tools) as upstream:
        tw = await start_tripwire(mcp={"work": {"url": upstream}})
        async with Client(tw.url + SESSION_URL, cache=None) as client:
            seen = [(await call_mcp(client, "job_status", {"job": "j1"}))[0] for _ in range(15)]
        events = await assert_untouched(tw)
    reference = Tools()
    assert seen == [reference.run("job_status", {"job": "j1"}) for _ in range(15)]
    assert seen[0].startswith("job j1: running 5% ") and seen[-1].startswith("job j1: running 75% ")
    assert not any("[tripwire" in s for s in seen)
    assert tools.hits == {"job_status": 15}
    assert len(only(events, "TOOL_CALL")) == 15


# ---- honest work over OpenAI function calling, default config ----------------------------------


async def fc_agent(tw: Running, tools: Tools, max_steps: int = 40) -> list[tuple[Any, Any]]:
    """The agent: ask the model, run the tools it asks for locally, send the results back, until
    it stops asking. Returns (response headers, completion or the API error) of every request."""
    client = openai.AsyncOpenAI(
        base_url=tw.url + "/v1", api_key=AGENT_KEY, default_headers=SESSION, max_retries=0
    )
    messages: list[dict[str, Any]] = [{"role": "user", "content": "do the job"}]
    answers: list[tuple[Any, Any]] = []
    for _ in range(max_steps):
        try:
            raw = await client.chat.completions.with_raw_response.create(
                model="gpt-4o-mini", messages=messages
            )
        except openai.APIStatusError as e:  # a refusal (429): kept as the answer, the loop ends
            answers.append((e.response.headers, e))
            return answers
        answer = raw.parse()
        answers.append((raw.headers, answer))
        msg = answer.choices[0].message
        if not msg.tool_calls:
            return answers
        messages.append(msg.model_dump(exclude_none=True))
        for tc in msg.tool_calls:
            result = tools.run(tc.function.name, json.loads(tc.function.arguments))
            messages.append({"role": "tool", "tool_call_id": tc.id, "content": result})
    raise AssertionError("the agent loop never ended")


def fc_script(shape: str) -> list[Reply]:
    """What the fake model asks for, step by step."""
    if shape == "pagination":  # one page per step
        return [Reply(tool_calls=[(f"call_{p}", "list_items", {"page": p})]) for p in range(1, 31)]
    if shape == "fan_out":  # one step, 20 parallel calls
        return [Reply(tool_calls=[(f"call_{i}", "get_weather", {"city": c}) for i, c in enumerate(CITIES)])]
    assert shape == "poll"
    return [Reply(tool_calls=[(f"call_{i}", "job_status", {"job": "j1"})]) for i in range(15)]


@pytest.mark.parametrize(
    ("shape", "requests", "tool_calls"),
    [("pagination", 31, 30), ("fan_out", 2, 20), ("poll", 16, 15)],
)
async def test_function_calling_honest_work_passes_untouched(
    start_tripwire: StartTripwire,
    fake_upstream: tuple[FakeUpstream, str],
    shape: str,
    requests: int,
    tool_calls: int,
) -> None:
    fake, url = fake_upstream
    fake.replies = fc_script(shape)
    fake.default = Reply(text=DONE)
    tw = await start_tripwire(upstream={"url": url})
    tools = Tools()
    answers = await fc_agent(tw, tools)

    guarded = [
        (i, h.get("X-Tripwire-Guard"), str(a)[:300])
        for i, (h, a) in enumerate(answers)
        if "X-Tripwire-Guard" in h
    ]
    assert guarded == [], f"requests answered by a guard: {guarded}"
    assert answers[-1][1].choices[0].message.content == DONE
    assert len(answers) == requests
    assert len(fake.calls(CHAT)) == requests  # every request went to the upstream
    assert tools.total == tool_calls
    await assert_untouched(tw)


# ---- a stuck cycle whose arguments carry a fresh request_id -------------------------------------


async def test_stuck_cycle_with_fresh_request_ids_is_blocked_over_mcp(start_tripwire: StartTripwire) -> None:
    tools = Tools()
    with serve_tools(tools) as upstream:
        tw = await start_tripwire(
            mcp={"work": {"url": upstream}}, guards={"loop_detection": {"action": "block"}}
        )
        seen: list[tuple[str, Any]] = []
        hits_after: list[int] = []
        async with Client(tw.url + SESSION_URL, cache=None) as client:
            for name, args in stuck_cycle():  # a stuck agent does not stop by itself
                seen.append(await call_mcp(client, name, args))
                hits_after.append(tools.total)
        _, events = await trace(tw)

    refused = [i for i, (s, _) in enumerate(seen) if s.startswith("[tripwire")]
    assert refused, f"the loop was never refused: {[s for s, _ in seen]}"
    first = refused[0]
    assert first + 1 <= CAUGHT_BY, f"first refused at call {first + 1}: {[s for s, _ in seen]}"
    text, blocked = seen[first]
    # SPEC §5.5: a JSON-RPC result the model can read, not an error
    assert blocked is not None, f"refused with a JSON-RPC error, not a blocked result: {text}"
    assert blocked.is_error is True
    assert text_of(blocked)[0].startswith("[tripwire] blocked")
    assert blocked.model_dump(by_alias=True)["_meta"]["tripwire"]["loop_blocked"] is True
    # refused calls never reached the server; every other call did
    assert hits_after[first] == first
    assert tools.total == len(seen) - len(refused)
    assert len(only(events, "TOOL_CALL")) == tools.total
    warnings = [w for w in only(events, "LOOP_WARNING") if w["payload"]["kind"] != "cycle"]
    assert warnings
    errors = only(events, "ERROR")
    assert errors and errors[0]["payload"]["guardrail"] == "loop_detection"


async def test_stuck_cycle_with_fresh_request_ids_is_warned_over_mcp(start_tripwire: StartTripwire) -> None:
    """Default `action: warn`. The agent stops at the first warning it reads: run on, a stuck loop
    of mutating tools would later meet per-tool escalation's own block level, which is not `action`."""
    tools = Tools()
    with serve_tools(tools) as upstream:
        tw = await start_tripwire(mcp={"work": {"url": upstream}})
        seen: list[tuple[str, Any]] = []
        hits_after: list[int] = []
        async with Client(tw.url + SESSION_URL, cache=None) as client:
            for name, args in stuck_cycle():
                seen.append(await call_mcp(client, name, args))
                hits_after.append(tools.total)
                if "[tripwire" in seen[-1][0]:
                    break
        run_id, events = await trace(tw)

    texts = [s for s, _ in seen]
    at = len(seen) - 1
    assert "[tripwire] warning" in texts[at], f"never warned: {texts}"
    assert at + 1 <= CAUGHT_BY, f"first warned at call {at + 1}: {texts}"
    result = seen[at][1]
    assert result is not None and not result.is_error
    name, args = stuck_cycle(1)[at % 3]
    # the server's own answer, then the warning block appended
    assert text_of(result)[0] == Tools().run(name, args)
    assert len(text_of(result)) == 2 and text_of(result)[1].startswith("[tripwire]")
    assert hits_after == list(range(1, len(seen) + 1))  # every call reached the server, the warned one too
    assert [w for w in only(events, "LOOP_WARNING") if w["payload"]["kind"] != "cycle"]
    assert only(events, "ERROR") == []
    assert "loop_detected" in tw.tripwire_json(run_id)["health_tags"]


async def test_stuck_cycle_with_fresh_request_ids_is_blocked_over_function_calling(
    start_tripwire: StartTripwire, fake_upstream: tuple[FakeUpstream, str]
) -> None:
    fake, url = fake_upstream
    fake.replies = [Reply(tool_calls=[(f"call_{i}", n, a)]) for i, (n, a) in enumerate(stuck_cycle())]
    fake.default = Reply(text=DONE)
    tw = await start_tripwire(upstream={"url": url}, guards={"loop_detection": {"action": "block"}})
    answers = await fc_agent(tw, Tools())

    headers, last = answers[-1]
    assert "X-Tripwire-Guard" in headers, f"no request was blocked: {len(answers)} all forwarded"
    # request n holds the loop's first n - 1 calls (one per step)
    blocked_at = len(answers)
    assert blocked_at - 1 <= CAUGHT_BY, (
        f"blocked only at request {blocked_at}, holding {blocked_at - 1} calls"
    )
    assert headers["X-Tripwire-Guard"] == "loop_detection"
    assert not isinstance(last, Exception), f"refused with an error, not a blocked completion: {last}"
    choice = last.choices[0]
    assert choice.finish_reason == "stop"
    assert choice.message.content.startswith("[tripwire] blocked")
    assert len(fake.calls(CHAT)) == blocked_at - 1  # the blocked request never went upstream
    _, events = await trace(tw)
    assert [w for w in only(events, "LOOP_WARNING") if w["payload"]["kind"] != "cycle"]
    assert [e["payload"]["guardrail"] for e in only(events, "ERROR")] == ["loop_detection"]
