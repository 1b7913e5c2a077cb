"""1,000 sessions through one Tripwire (issue 11): exact counts everywhere, nothing lost or mixed up.

Each session is an agent that asks the model, gets a tool call, runs it and sends the result back:
two LLM calls and one function-calling tool call. Afterwards every run holds exactly its own events,
run.json's counts equal what is on disk, and /metrics counted every call once. Bounded in count
(1,000 sessions, 50 at a time), loopback only, no wall-clock assertion.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import AGENT_KEY, StartTripwire
from tests.fakes import FakeUpstream, Reply
from tests.schema import assert_run_valid

SESSIONS = 1000
CONCURRENCY = 50
CHAT = "/v1/chat/completions"


async def agent(http: aiohttp.ClientSession, url: str, n: int) -> None:
    headers = {
        "Authorization": f"Bearer {AGENT_KEY}",
        "X-Tripwire-Session": f"load-{n}",
        "X-Tripwire-Agent": "load",
    }
    messages: list[dict[str, Any]] = [{"role": "user", "content": f"task {n}"}]
    async with http.post(url, json={"model": "gpt-4o-mini", "messages": messages}, headers=headers) as r:
        assert r.status == 200, await r.text()
        first = await r.json()
    msg = first["choices"][0]["message"]
    (call,) = msg["tool_calls"]
    messages += [msg, {"role": "tool", "tool_call_id": call["id"], "content": f"result {n}"}]
    async with http.post(url, json={"model": "gpt-4o-mini", "messages": messages}, headers=headers) as r:
        assert r.status == 200, await r.text()
        assert (await r.json())["choices"][0]["message"]["content"] == "done"


class Alternating(FakeUpstream):
    """A model that asks for one tool call on a fresh conversation and answers once it has the result."""

    def next_reply(self) -> Reply:
        body = self.seen[-1].body if self.seen else {}
        has_result = any(m.get("role") == "tool" for m in (body or {}).get("messages", []))
        if has_result:
            return Reply(text="done")
        n = len(self.seen)
        return Reply(tool_calls=[(f"call_{n}", "lookup", {"n": n})])


async def test_a_thousand_sessions_are_recorded_exactly(start_tripwire: StartTripwire) -> None:
    from aiohttp.test_utils import TestServer

    fake = Alternating()
    server = TestServer(fake.app, host="127.0.0.1")
    await server.start_server()
    try:
        tw = await start_tripwire(upstream={"url": str(server.make_url("")).rstrip("/")})
        gate = asyncio.Semaphore(CONCURRENCY)
        connector = aiohttp.TCPConnector(limit=CONCURRENCY)
        async with aiohttp.ClientSession(connector=connector) as http:

            async def one(n: int) -> None:
                async with gate:
                    await agent(http, tw.url + CHAT, n)

            await asyncio.gather(*(one(n) for n in range(SESSIONS)))
            await tw.flush()
            async with http.get(tw.admin_url + "/metrics") as r:
                metrics = await r.text()
    finally:
        await server.close()

    assert len(fake.calls(CHAT)) == 2 * SESSIONS
    run_ids = tw.run_ids()
    assert len(run_ids) == SESSIONS
    sessions = set()
    for run_id in run_ids:
        run, events = assert_run_valid(tw.data_dir, run_id)
        types = [e["event_type"] for e in events]
        assert types == ["RUN_START", "LLM_CALL", "TOOL_CALL", "LLM_CALL"], (run_id, types)
        assert run["counts"] == {"llm_calls": 2, "tool_calls": 1, "errors": 0, "loop_warnings": 0}
        session = json.loads((tw.data_dir / "runs" / run_id / "tripwire.json").read_text())["session_id"]
        task = events[1]["payload"]["prompt"][0]["content"]
        assert task == f"task {session.removeprefix('load-')}"  # the run holds its own session's calls
        assert events[2]["payload"]["result"] == f"result {session.removeprefix('load-')}"
        sessions.add(session)
    assert len(sessions) == SESSIONS
    families = {f.name: f for f in text_string_to_metric_families(metrics)}
    llm = sum(s.value for s in families["tripwire_llm_calls"].samples if s.name.endswith("_total"))
    tools = sum(s.value for s in families["tripwire_tool_calls"].samples if s.name.endswith("_total"))
    assert (llm, tools) == (2 * SESSIONS, SESSIONS)
