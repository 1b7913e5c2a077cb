"""Loop guards on MCP tool calls through the running proxy, with the real mcp 2.x client (issue 4,
acceptance 2 and 6): what the model sees (results, blocked results, JSON-RPC errors) and what the
trace says."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

pytest.importorskip("mcp.server.mcpserver")  # mcp 2.x

from mcp import Client, MCPError  # noqa: E402
from mcp.server.mcpserver import MCPServer  # noqa: E402

from proxy.mcp.jsonrpc import TRIPWIRE_GUARD_ERROR  # noqa: E402
from tests.conftest import Running, StartTripwire  # noqa: E402
from tests.fakes import webhook_receiver  # noqa: E402
from tests.mcp_servers import ServerThread  # noqa: E402
from tests.pipeline_errors import no_pipeline_errors  # noqa: E402, F401 (autouse fixture)
from tests.schema import assert_run_valid  # noqa: E402

SESSION_URL = "/agents/bot/sessions/s1/mcp/shop"


def build_shop() -> MCPServer:
    """Tools whose names put them on each side of Loop Guard's idempotent / mutating split."""
    server = MCPServer("tripwire-shop")
    calls: dict[str, int] = {}

    @server.tool()
    def set_price(sku: str, price: float) -> str:
        """Set a price (mutating: no idempotent word in its name)."""
        return f"{sku} now costs {price}"

    @server.tool()
    def fetch_user(user_id: int) -> str:
        """Read a user."""
        return f"user {user_id}"

    @server.tool()
    def fetch_orders(user_id: int) -> str:
        """Read a user's orders."""
        return f"orders of {user_id}: none"

    @server.tool()
    def fetch_invoice(user_id: int) -> str:
        """Read a user's invoice."""
        return f"invoice of {user_id}: empty"

    @server.tool()
    def search(query: str, page: int) -> str:
        """Search, one page at a time."""
        return f"{query} page {page}: result {page * 10}..{page * 10 + 9}"

    @server.tool()
    def get_record(record_id: int) -> str:
        """Read one record (idempotent)."""
        return f"record {record_id}"

    @server.tool()
    def write_note(text: str) -> str:
        """Write a note (mutating)."""
        calls["write_note"] = calls.get("write_note", 0) + 1
        return f"note {calls['write_note']} written"

    @server.tool()
    def deploy(version: str) -> str:
        """Fails the same way whatever the version (retry without progress)."""
        raise ValueError("cluster is locked")

    @server.tool()
    def job_status(job_id: str) -> str:
        """A status that never changes."""
        return f"job {job_id}: pending"

    return server


@contextmanager
def shop() -> Iterator[str]:
    thread = ServerThread(build_shop().streamable_http_app())
    base = thread.start()
    try:
        yield base + "/mcp"
    finally:
        thread.stop()


async def start(start_tripwire: StartTripwire, upstream: str, **loop: Any) -> Running:
    return await start_tripwire(mcp={"shop": {"url": upstream}}, guards={"loop_detection": loop})


def text_of(result: Any) -> list[str]:
    return [c.text for c in result.content]


def only(events: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [e for e in events if e["event_type"] == kind]


def guard_warnings(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """LOOP_WARNINGs other than AgentDbg's cycle (which warns on any repeated tool name)."""
    return [e for e in only(events, "LOOP_WARNING") if e["payload"]["kind"] != "cycle"]


async def trace(tw: Running) -> tuple[str, list[dict[str, Any]]]:
    await tw.flush()
    (run_id,) = tw.run_ids()
    _, events = assert_run_valid(tw.data_dir, run_id)
    return run_id, events


async def test_near_equal_floats_are_one_repeated_call(start_tripwire: StartTripwire) -> None:
    prices = [1.0, 0.9999999, 1.0000001, 1.0, 0.99999999]
    with shop() as upstream:
        tw = await start(start_tripwire, upstream, action="block", threshold=3)
        async with Client(tw.url + SESSION_URL, cache=None) as client:
            results = [await client.call_tool("set_price", {"sku": "A1", "price": p}) for p in prices]
        run_id, events = await trace(tw)

    assert [r.is_error for r in results] == [False, False, True, True, True]
    blocked = results[2]
    assert text_of(blocked)[0].startswith("[tripwire] blocked: set_price was called 3 times in a row")
    meta = blocked.model_dump(by_alias=True)["_meta"]["tripwire"]
    assert meta == {"loop_blocked": True, "guard": "loop_detection", "threshold": 3, "actual": 3}
    assert len(only(events, "TOOL_CALL")) == 2  # refused calls never reached the server
    (warning,) = [w for w in guard_warnings(events) if w["payload"]["kind"] == "repetition"]
    assert warning["payload"]["action"] == "block"
    assert warning["payload"]["pattern"] == 'set_price({"price":1.0,"sku":"A1"})'
    # one streak, one LOOP_WARNING; every refused call in it is an ERROR
    errors = only(events, "ERROR")
    assert len(errors) == 3 and {e["payload"]["kind"] for e in errors} == {"repetition"}
    assert errors[0]["parent_id"] == warning["event_id"]
    assert "loop_detected" in tw.tripwire_json(run_id)["health_tags"]
    assert tw.run_json(run_id)["status"] == "running"


async def test_exact_three_step_cycle_is_caught(start_tripwire: StartTripwire) -> None:
    steps = ["fetch_user", "fetch_orders", "fetch_invoice"] * 2
    with shop() as upstream:
        tw = await start(start_tripwire, upstream, action="block")
        async with Client(tw.url + SESSION_URL, cache=None) as client:
            results = [await client.call_tool(name, {"user_id": 7}) for name in steps]
        _, events = await trace(tw)
    # A,B,C,A,B,C: the 6th call completes two rounds spanning >= threshold (5) calls
    assert [r.is_error for r in results] == [False] * 5 + [True]
    assert "cycle" in text_of(results[5])[0] or "alternating" in text_of(results[5])[0]
    (warning,) = [w for w in guard_warnings(events) if w["payload"]["kind"] == "ping_pong"]
    assert warning["payload"]["action"] == "block"
    assert len(only(events, "ERROR")) == 1


async def test_paging_is_never_stopped(start_tripwire: StartTripwire) -> None:
    with shop() as upstream:
        tw = await start(start_tripwire, upstream, action="block")
        async with Client(tw.url + SESSION_URL, cache=None) as client:
            results = [await client.call_tool("search", {"query": "shoes", "page": p}) for p in range(7)]
        _, events = await trace(tw)
    assert [r.is_error for r in results] == [False] * 7
    assert [text_of(r)[0] for r in results][6] == "shoes page 6: result 60..69"
    assert len(only(events, "TOOL_CALL")) == 7
    assert only(events, "ERROR") == []
    # per-tool escalation may warn (7 calls of one idempotent tool), never block
    assert all(w["payload"]["action"] == "warn" for w in only(events, "LOOP_WARNING"))


async def test_count_mode_escalates_an_idempotent_tool_warn_block_halt(start_tripwire: StartTripwire) -> None:
    """`per_tool_mode: count` is Loop Guard's rule: every call of a tool in the turn counts, whatever
    its arguments (the default counts calls without progress, and leaves this paging alone)."""
    with shop() as upstream:
        tw = await start(start_tripwire, upstream, action="warn", per_tool_mode="count")
        outcomes: list[str] = []
        async with Client(tw.url + SESSION_URL, cache=None) as client:
            for i in range(1, 14):
                try:
                    r = await client.call_tool("get_record", {"record_id": i})
                except MCPError as e:
                    outcomes.append(f"error:{e.error.code}:{e.error.data['guardrail']}")
                    continue
                if r.is_error:
                    outcomes.append("blocked")
                elif any(t.startswith("[tripwire] warning:") for t in text_of(r)):
                    assert text_of(r)[0] == f"record {i}"  # the server's answer, then the warning
                    outcomes.append("warn")
                else:
                    outcomes.append("ok")
        run_id, events = await trace(tw)
    refused = f"error:{TRIPWIRE_GUARD_ERROR}:loop_detection"
    ended = f"error:{TRIPWIRE_GUARD_ERROR}:session_terminated"
    assert outcomes == ["ok"] * 4 + ["warn"] * 3 + ["blocked"] * 4 + [refused, ended]
    per_tool = [w["payload"] for w in guard_warnings(events) if w["payload"]["kind"] == "per_tool"]
    assert [(w["action"], w["threshold"]) for w in per_tool] == [("warn", 5), ("block", 8), ("terminate", 12)]
    assert len(only(events, "TOOL_CALL")) == 7
    assert events[-1]["event_type"] == "RUN_END" and events[-1]["payload"]["status"] == "error"
    assert {"loop_detected", "terminated"} <= set(tw.tripwire_json(run_id)["health_tags"])


async def test_a_pause_longer_than_turn_gap_starts_a_new_turn(start_tripwire: StartTripwire) -> None:
    with shop() as upstream:
        tw = await start(start_tripwire, upstream, action="warn", turn_gap_s=0.3)
        async with Client(tw.url + SESSION_URL, cache=None) as client:
            first = [await client.call_tool("get_record", {"record_id": i}) for i in range(4)]
            await asyncio.sleep(0.5)
            second = [await client.call_tool("get_record", {"record_id": i}) for i in range(10, 14)]
        _, events = await trace(tw)
    # 8 calls of one idempotent tool, but never 5 in one turn: no warning block anywhere
    assert all(len(r.content) == 1 and not r.is_error for r in first + second)
    assert [w for w in guard_warnings(events) if w["payload"]["kind"] == "per_tool"] == []


async def test_count_mode_escalates_a_mutating_tool_three_five_seven(start_tripwire: StartTripwire) -> None:
    with shop() as upstream:
        tw = await start(start_tripwire, upstream, action="warn", per_tool_mode="count")
        outcomes: list[str] = []
        async with Client(tw.url + SESSION_URL, cache=None) as client:
            for i in range(1, 8):
                try:
                    r = await client.call_tool("write_note", {"text": f"note {i}"})
                except MCPError as e:
                    outcomes.append(f"error:{e.error.data['guardrail']}")
                    continue
                outcomes.append("blocked" if r.is_error else ("warn" if len(r.content) == 2 else "ok"))
        _, events = await trace(tw)
    assert outcomes == ["ok", "ok", "warn", "warn", "blocked", "blocked", "error:loop_detection"]
    per_tool = [w["payload"] for w in guard_warnings(events) if w["payload"]["kind"] == "per_tool"]
    assert [(w["action"], w["threshold"]) for w in per_tool] == [("warn", 3), ("block", 5), ("terminate", 7)]
    assert len(only(events, "TOOL_CALL")) == 4


async def test_polling_an_unchanging_status_warns_then_terminates(start_tripwire: StartTripwire) -> None:
    with shop() as upstream:
        tw = await start(start_tripwire, upstream, action="warn", idempotent_tools=["job_status"])
        outcomes: list[str] = []
        async with Client(tw.url + SESSION_URL, cache=None) as client:
            for _ in range(9):
                try:
                    r = await client.call_tool("job_status", {"job_id": "j1"})
                except MCPError as e:
                    outcomes.append(f"error:{e.error.data['guardrail']}")
                    continue
                outcomes.append("blocked" if r.is_error else ("warn" if len(r.content) == 2 else "ok"))
        run_id, events = await trace(tw)
    # the poll after 4 identical results warns, the one after 8 ends the session (issue 31: judged
    # before its own result, so a status moving every 1-3 polls is never warned)
    assert outcomes[:4] == ["ok"] * 4
    assert outcomes[4] == "warn"
    assert outcomes[8] == "error:loop_detection"
    no_progress = [w["payload"] for w in guard_warnings(events) if w["payload"]["kind"] == "no_progress"]
    assert [(w["action"], w["threshold"]) for w in no_progress] == [("warn", 4), ("terminate", 8)]
    assert events[-1]["event_type"] == "RUN_END"
    assert "terminated" in tw.tripwire_json(run_id)["health_tags"]


async def test_kill_switch_refuses_the_next_mcp_call(start_tripwire: StartTripwire) -> None:
    import aiohttp

    with shop() as upstream:
        tw = await start(start_tripwire, upstream)
        async with Client(tw.url + SESSION_URL, cache=None) as client:
            await client.call_tool("get_record", {"record_id": 1})
            await tw.flush()
            (run_id,) = tw.run_ids()
            async with aiohttp.ClientSession() as http:
                async with http.post(f"{tw.admin_url}/api/runs/{run_id}/terminate") as resp:
                    assert resp.status == 200, await resp.text()
            with pytest.raises(MCPError) as refused:
                await client.call_tool("get_record", {"record_id": 2})
        _, events = await trace(tw)
    assert refused.value.error.code == TRIPWIRE_GUARD_ERROR
    assert len(only(events, "TOOL_CALL")) == 1
    assert [e["event_type"] for e in events][-2:] == ["ERROR", "RUN_END"]


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def raw_tool_call(tw: Running, server: str, call_id: int) -> tuple[int, dict[str, Any]]:
    """A bare JSON-RPC tools/call POST (a server that is down cannot take the SDK's handshake)."""
    import aiohttp

    body = {"jsonrpc": "2.0", "id": call_id, "method": "tools/call", "params": {"name": "get_record"}}
    body["params"]["arguments"] = {"record_id": call_id}
    headers = {"Accept": "application/json, text/event-stream"}
    async with aiohttp.ClientSession() as http:
        async with http.post(
            f"{tw.url}/agents/bot/sessions/s1/mcp/{server}", json=body, headers=headers
        ) as resp:
            return resp.status, await resp.json(content_type=None)


async def test_mcp_circuit_opens_as_json_rpc_errors_and_spares_other_servers(
    start_tripwire: StartTripwire,
) -> None:
    with shop() as upstream:
        tw = await start_tripwire(
            mcp={"shop": {"url": upstream}, "down": {"url": f"http://127.0.0.1:{free_port()}/mcp"}},
            guards={"circuit_breaker": {"open_after_failures": 3, "cooldown_seconds": 30}},
        )
        failures = [await raw_tool_call(tw, "down", i) for i in range(1, 4)]
        status, refused = await raw_tool_call(tw, "down", 4)
        async with Client(tw.url + SESSION_URL, cache=None) as client:
            fine = await client.call_tool("fetch_user", {"user_id": 1})
        run_id, events = await trace(tw)
    assert all(s == 200 and "error" in b for s, b in failures)  # the server is down: JSON-RPC errors
    assert all(b["error"]["code"] != TRIPWIRE_GUARD_ERROR for _, b in failures)
    # open: never an HTTP 429 on /mcp/*, a JSON-RPC error with the same id and retry_after
    assert status == 200 and refused["id"] == 4
    assert refused["error"]["code"] == TRIPWIRE_GUARD_ERROR
    data = refused["error"]["data"]
    assert data["guardrail"] == "circuit_breaker" and 1 <= data["retry_after"] <= 30
    assert text_of(fine) == ["user 1"]
    states = [e["payload"]["diff"]["circuit_breaker"] for e in only(events, "STATE_UPDATE")]
    assert states == [{"from": "closed", "to": "open"}]
    assert "circuit_breaker_open" in tw.tripwire_json(run_id)["health_tags"]


async def test_mcp_tool_call_limit_is_a_json_rpc_error_and_ends_the_session(
    start_tripwire: StartTripwire,
) -> None:
    with shop() as upstream:
        tw = await start_tripwire(mcp={"shop": {"url": upstream}}, guards={"limits": {"max_tool_calls": 2}})
        async with Client(tw.url + SESSION_URL, cache=None) as client:
            for i in range(2):
                await client.call_tool("get_record", {"record_id": i})
            with pytest.raises(MCPError) as refused:
                await client.call_tool("get_record", {"record_id": 9})
        run_id, events = await trace(tw)
    assert refused.value.error.code == TRIPWIRE_GUARD_ERROR
    assert refused.value.error.data == {"guardrail": "max_tool_calls", "threshold": 2, "actual": 3}
    assert [e["event_type"] for e in events][-2:] == ["ERROR", "RUN_END"]
    assert len(only(events, "TOOL_CALL")) == 2
    assert tw.run_json(run_id)["status"] == "error"


async def test_hidden_guard_details_in_a_blocked_mcp_result(start_tripwire: StartTripwire) -> None:
    with shop() as upstream:
        tw = await start_tripwire(
            mcp={"shop": {"url": upstream}},
            guards={"loop_detection": {"action": "block", "threshold": 3}},
            expose_guard_details=False,
        )
        async with Client(tw.url + SESSION_URL, cache=None) as client:
            results = [await client.call_tool("fetch_user", {"user_id": 1}) for _ in range(3)]
        _, events = await trace(tw)
    blocked = results[2]
    assert blocked.is_error
    assert blocked.model_dump(by_alias=True)["_meta"]["tripwire"] == {
        "loop_blocked": True,
        "guard": "loop_detection",
    }
    assert "3" not in text_of(blocked)[0]
    (error,) = only(events, "ERROR")
    assert error["payload"]["threshold"] == 3 and error["payload"]["actual"] == 3


async def test_repetition_block_over_legacy_sse(start_tripwire: StartTripwire) -> None:
    """The legacy HTTP+SSE transport: the POST gets its 202, the blocked result comes on the stream."""
    from mcp.client.sse import sse_client

    thread = ServerThread(build_shop().sse_app())
    base = thread.start()
    try:
        tw = await start_tripwire(
            mcp={"shop": {"url": base + "/sse"}},
            guards={"loop_detection": {"action": "block", "threshold": 3}},
        )
        async with Client(
            sse_client(f"{tw.url}/agents/bot/sessions/s1/mcp/shop"), mode="legacy", cache=None
        ) as c:
            results = [await c.call_tool("fetch_user", {"user_id": 5}) for _ in range(4)]
            after = await c.call_tool("fetch_orders", {"user_id": 5})
        _, events = await trace(tw)
    finally:
        thread.stop()
    assert [r.is_error for r in results] == [False, False, True, True]
    assert text_of(results[2])[0].startswith("[tripwire] blocked:")
    assert text_of(after) == ["orders of 5: none"]  # something else goes through again
    assert len(only(events, "TOOL_CALL")) == 3
    assert len(only(events, "ERROR")) == 2


async def test_a_call_seen_as_mcp_and_in_llm_history_counts_once(
    start_tripwire: StartTripwire, fake_upstream: Any
) -> None:
    """The model asks for fetch_user, the agent runs it through /mcp/shop and sends the result
    back: each call is one occurrence, so the 3rd MCP call is the one blocked, not an LLM request."""
    import json

    import httpx2
    import openai
    from mcp.client.streamable_http import streamable_http_client

    from tests.fakes import Reply

    fake, llm_url = fake_upstream
    fake.replies = [Reply(tool_calls=[(f"call_{i}", "shop__fetch_user", {"user_id": 1})]) for i in range(3)]
    fake.default = Reply(text="user 1 it is")
    headers = {"X-Tripwire-Session": "both-1", "X-Tripwire-Agent": "mixed"}
    guards = {"loop_detection": {"action": "block", "threshold": 3, "max_repeated_tool_steps": 10}}
    with shop() as upstream:
        tw = await start_tripwire(upstream={"url": llm_url}, mcp={"shop": {"url": upstream}}, guards=guards)
        llm = openai.AsyncOpenAI(base_url=f"{tw.url}/v1", api_key="sk-test", default_headers=headers)
        tool_texts: list[str] = []
        async with (
            httpx2.AsyncClient(headers=headers) as http,
            Client(streamable_http_client(f"{tw.url}/mcp/shop", http_client=http), cache=None) as tools,
        ):
            messages: list[Any] = [{"role": "user", "content": "who is user 1?"}]
            for _ in range(6):
                msg = (
                    (await llm.chat.completions.create(model="gpt-4o-mini", messages=messages))
                    .choices[0]
                    .message
                )
                if not msg.tool_calls:
                    break
                messages.append(msg.model_dump(exclude_none=True))
                for tc in msg.tool_calls:
                    name = tc.function.name.split("__")[-1]
                    result = await tools.call_tool(name, json.loads(tc.function.arguments))
                    tool_texts.append(result.content[0].text)
                    messages.append(
                        {"role": "tool", "tool_call_id": tc.id, "content": result.content[0].text}
                    )
        run_id, events = await trace(tw)
    assert tool_texts[:2] == ["user 1", "user 1"]
    assert tool_texts[2].startswith("[tripwire] blocked:")
    assert msg.content == "user 1 it is"  # every LLM request went upstream: none held a 4th call
    assert len(fake.calls("/v1/chat/completions")) == 4
    # each forwarded call recorded once, as the MCP TOOL_CALL
    calls = only(events, "TOOL_CALL")
    assert [(c["payload"]["source"], c["payload"]["tool_name"]) for c in calls] == [("mcp", "fetch_user")] * 2
    (warning,) = [w for w in guard_warnings(events) if w["payload"]["kind"] == "repetition"]
    assert warning["payload"]["actual"] == 3


async def test_retrying_the_same_failure_is_blocked_at_the_threshold(start_tripwire: StartTripwire) -> None:
    """Retry without progress: the 3rd attempt after 2 identical failures is refused, not forwarded,
    though every attempt carries other arguments (no repetition, no ping-pong)."""
    with shop() as upstream:
        tw = await start(start_tripwire, upstream, action="block", threshold=3, mutating=[10, 11, 12])
        async with Client(tw.url + SESSION_URL, cache=None) as client:
            results = [await client.call_tool("deploy", {"version": f"1.{i}"}) for i in range(4)]
            after = await client.call_tool("fetch_user", {"user_id": 1})
        run_id, events = await trace(tw)
    assert [r.is_error for r in results] == [True] * 4
    blocked = [text_of(r)[0].startswith("[tripwire] blocked:") for r in results]
    assert blocked == [False, False, True, True]
    assert text_of(after) == ["user 1"]  # a success elsewhere: the session goes on
    assert len(only(events, "TOOL_CALL")) == 3  # two failures and the fetch reached the server
    (warning,) = [w["payload"] for w in guard_warnings(events) if w["payload"]["kind"] == "retry_no_progress"]
    assert (warning["action"], warning["threshold"], warning["actual"]) == ("block", 3, 3)
    errors = only(events, "ERROR")
    assert [e["payload"]["kind"] for e in errors] == ["retry_no_progress"] * 2
    assert tw.run_json(run_id)["status"] == "running"


async def test_mcp_calls_of_an_llm_session_count_in_its_turns_not_by_pauses(
    start_tripwire: StartTripwire, fake_upstream: Any
) -> None:
    """Where the LLM traffic passes through Tripwire, turns come from its history: a pause longer
    than turn_gap_s between MCP calls does not start a new turn, a new user message does; each
    call counts once (as MCP), so under `per_tool_mode: count` the 5th get_record of the turn is
    the one warned."""
    import json

    import httpx2
    import openai
    from mcp.client.streamable_http import streamable_http_client

    from tests.fakes import Reply

    fake, llm_url = fake_upstream
    fake.replies = [Reply(tool_calls=[(f"call_{i}", "shop__get_record", {"record_id": i})]) for i in range(5)]
    fake.replies.append(Reply(text="done"))
    fake.replies += [
        Reply(tool_calls=[(f"call_b{i}", "shop__get_record", {"record_id": i})]) for i in range(2)
    ]
    fake.default = Reply(text="done again")
    headers = {"X-Tripwire-Session": "turns-1", "X-Tripwire-Agent": "mixed"}
    loop = {"turn_gap_s": 0.1, "max_repeated_tool_steps": 50, "per_tool_mode": "count"}
    with shop() as upstream:
        tw = await start_tripwire(
            upstream={"url": llm_url}, mcp={"shop": {"url": upstream}}, guards={"loop_detection": loop}
        )
        llm = openai.AsyncOpenAI(base_url=f"{tw.url}/v1", api_key="sk-test", default_headers=headers)
        warned: list[bool] = []
        async with (
            httpx2.AsyncClient(headers=headers) as http,
            Client(streamable_http_client(f"{tw.url}/mcp/shop", http_client=http), cache=None) as tools,
        ):
            messages: list[Any] = []
            for question in ("records please", "two more"):
                messages.append({"role": "user", "content": question})
                for _ in range(8):
                    answer = await llm.chat.completions.create(model="gpt-4o-mini", messages=messages)
                    msg = answer.choices[0].message
                    messages.append(msg.model_dump(exclude_none=True))
                    if not msg.tool_calls:
                        break
                    for tc in msg.tool_calls:
                        await asyncio.sleep(0.15)  # longer than turn_gap_s
                        result = await tools.call_tool("get_record", json.loads(tc.function.arguments))
                        warned.append(len(result.content) == 2)
                        messages.append(
                            {"role": "tool", "tool_call_id": tc.id, "content": result.content[0].text}
                        )
        _, events = await trace(tw)
    assert warned == [False] * 4 + [True] + [False] * 2
    per_tool = [w["payload"] for w in guard_warnings(events) if w["payload"]["kind"] == "per_tool"]
    assert [(w["action"], w["actual"]) for w in per_tool] == [("warn", 5)]


async def test_a_loop_warning_reaches_the_alert_webhook_once_per_streak(
    start_tripwire: StartTripwire,
) -> None:
    """`alert_webhook` gets a POST when a guard fires: a loop WARN (the default action) too, once
    for its LOOP_WARNING, not again for every further call of the streak."""
    async with webhook_receiver() as webhook:
        got = webhook.got
        with shop() as upstream:
            tw = await start_tripwire(
                mcp={"shop": {"url": upstream}},
                guards={"loop_detection": {"threshold": 3, "no_progress_warn": 8}},
                alert_webhook=webhook.url,
            )
            async with Client(tw.url + SESSION_URL, cache=None) as client:
                results = [await client.call_tool("fetch_user", {"user_id": 1}) for _ in range(4)]
            _, events = await trace(tw)
            for _ in range(50):
                if got:
                    break
                await asyncio.sleep(0.02)
            await asyncio.sleep(0.1)
    assert [len(r.content) for r in results] == [1, 1, 2, 2]  # warned from the 3rd call on
    assert [w["payload"]["kind"] for w in guard_warnings(events)] == ["repetition"]
    # AgentDbg's cycle pattern (TOOL_CALL:fetch_user x3) alerts once on its own; the repetition once
    assert [
        (a["guardrail"], a["action"], a["threshold"], a["actual"]) for a in got if a["kind"] != "cycle"
    ] == [("loop_detection", "warn", 3, 3)]
    assert len([a for a in got if a["kind"] == "cycle"]) <= 1
