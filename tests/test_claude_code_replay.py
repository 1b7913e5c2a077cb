"""Claude Code 2.1.197 through Tripwire, replayed from the real CLI's traffic
(tests/fixtures/claude_code_2_1_197.json: `claude -p "..." --allowedTools Bash mcp__demo`).

What docs/clients.md says of it: its side request (a title for the session: no tools, one user
message) and its conversation land in one run, named by the prompt; the Bash call and the MCP call
the model asked for are TOOL_CALLs with their results; and the side request is an LLM call like any
other, so `max_llm_calls: 1` lets the title through and refuses the first step of the conversation
(docs/clients.md says to count one more)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aiohttp

from tests.conftest import AGENT_KEY, Running, StartTripwire
from tests.fakes import Reply
from tests.schema import assert_run_valid

CLAUDE = json.loads((Path(__file__).parent / "fixtures" / "claude_code_2_1_197.json").read_text())
ROUTE = "/agents/claude/llm/anthropic"


def reply(blocks: list[dict[str, Any]]) -> Reply:
    text = "".join(b["text"] for b in blocks if b["type"] == "text")
    calls = [(b["id"], b["name"], b["input"]) for b in blocks if b["type"] == "tool_use"]
    return Reply(text=text, tool_calls=calls)


async def replay(tw: Running) -> list[int]:
    headers = {**CLAUDE["headers"], "x-api-key": AGENT_KEY}
    statuses = []
    async with aiohttp.ClientSession() as http:
        for request in CLAUDE["requests"]:
            url = tw.url + ROUTE + request["path"] + "?beta=true"
            async with http.post(url, json=request["body"], headers=headers) as resp:
                statuses.append(resp.status)
                await resp.read()
            if resp.status != 200:
                break
    return statuses


def test_the_fixture_is_a_side_request_then_the_conversation() -> None:
    side, *conversation = (r["body"] for r in CLAUDE["requests"])
    assert not side.get("tools") and len(side["messages"]) == 1
    assert all(body["tools"] for body in conversation) and len(conversation) == 3


async def test_one_run_with_its_tool_calls(start_tripwire: StartTripwire, fake_upstream) -> None:
    fake, url = fake_upstream
    fake.replies = [Reply(text="Capture run"), *(reply(blocks) for blocks in CLAUDE["answers"])]
    fake.default = Reply(text="done.")
    tw = await start_tripwire(llm={"anthropic": {"url": url}})
    assert await replay(tw) == [200, 200, 200, 200]
    await tw.flush()
    (run_id,) = tw.run_ids()
    _, events = assert_run_valid(tw.data_dir, run_id)
    assert tw.run_json(run_id)["counts"]["llm_calls"] == 4  # the side request counts
    assert events[0]["name"] == "run echo, then the demo echo"
    calls = {e["name"]: e["payload"] for e in events if e["event_type"] == "TOOL_CALL"}
    assert calls["Bash"]["args"]["command"] == "echo hello-from-claude"
    assert calls["Bash"]["result"] == "hello-from-claude"
    assert calls["mcp__demo__echo"]["args"] == {"text": "hi from claude"}


async def test_max_llm_calls_counts_the_side_request(start_tripwire: StartTripwire, fake_upstream) -> None:
    fake, url = fake_upstream
    fake.replies = [Reply(text="Capture run"), *(reply(blocks) for blocks in CLAUDE["answers"])]
    tw = await start_tripwire(llm={"anthropic": {"url": url}}, guards={"limits": {"max_llm_calls": 1}})
    assert await replay(tw) == [200, 429]
    forwarded = fake.calls("/v1/messages")
    assert len(forwarded) == 1 and not forwarded[0].body.get("tools")  # only the title went
