"""Claude Code through Tripwire, replayed from the real CLI's traffic, two versions:
tests/fixtures/claude_code_2_1_197.json and claude_code_2_1_332.json (`claude -p "..." --allowedTools
Bash mcp__demo`, each fixture's `_source` says how it was captured).

What docs/clients.md says of them: the conversation lands in one run, named by the prompt; the Bash
call and the MCP call the model asked for are TOOL_CALLs with their results. 2.1.197 sends a side
request first (a title for the session: no tools, one user message), an LLM call like any other, so
`max_llm_calls: 1` lets the title through and refuses the first step of the conversation; 2.1.332
sends none. Both move their `cache_control` markers to the newest blocks on every request, and
2.1.332 resends a mid-conversation system message as a plain string after sending it as one text
block: neither is an edit, so each LLM_CALL records only the messages new since the previous one."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.conftest import AGENT_KEY, Running, StartTripwire
from tests.fakes import Reply
from tests.schema import assert_run_valid

FIXTURES = Path(__file__).parent / "fixtures"
CLAUDE_197 = json.loads((FIXTURES / "claude_code_2_1_197.json").read_text())
CLAUDE_332 = json.loads((FIXTURES / "claude_code_2_1_332.json").read_text())
VERSIONS = {"2.1.197": CLAUDE_197, "2.1.332": CLAUDE_332}
ROUTE = "/agents/claude/llm/anthropic"


def reply(blocks: list[dict[str, Any]]) -> Reply:
    text = "".join(b["text"] for b in blocks if b["type"] == "text")
    calls = [(b["id"], b["name"], b["input"]) for b in blocks if b["type"] == "tool_use"]
    return Reply(text=text, tool_calls=calls)


def replies(fixture: dict[str, Any]) -> list[Reply]:
    """What the capture's fake answered: the side request's title (when there is one), the script."""
    side = [] if fixture["requests"][0]["body"].get("tools") else [Reply(text="Capture run")]
    return [*side, *(reply(blocks) for blocks in fixture["answers"])]


async def replay(tw: Running, fixture: dict[str, Any] = CLAUDE_197) -> list[int]:
    headers = {**fixture["headers"], "x-api-key": AGENT_KEY}
    statuses = []
    async with aiohttp.ClientSession() as http:
        for request in fixture["requests"]:
            url = tw.url + ROUTE + request["path"] + "?beta=true"
            async with http.post(url, json=request["body"], headers=headers) as resp:
                statuses.append(resp.status)
                await resp.read()
            if resp.status != 200:
                break
    return statuses


def test_the_fixture_is_a_side_request_then_the_conversation() -> None:
    side, *conversation = (r["body"] for r in CLAUDE_197["requests"])
    assert not side.get("tools") and len(side["messages"]) == 1
    assert all(body["tools"] for body in conversation) and len(conversation) == 3


def test_2_1_332_sends_no_side_request_and_reshapes_its_system_message() -> None:
    bodies = [r["body"] for r in CLAUDE_332["requests"]]
    assert len(bodies) == 3 and all(body["tools"] for body in bodies)
    assert CLAUDE_332["headers"]["User-Agent"].startswith("claude-cli/2.1.332")
    first, *later = (body["messages"][1] for body in bodies)
    assert first["role"] == "system" and [set(b) for b in first["content"]] == [
        {"type", "text", "cache_control"}
    ]
    assert all(m["role"] == "system" and m["content"] == first["content"][0]["text"] for m in later)
    # the marker moves: on the newest tool result of each request, gone from the one before
    assert "cache_control" in bodies[1]["messages"][3]["content"][0]
    assert "cache_control" not in bodies[2]["messages"][3]["content"][0]


async def replayed(
    start_tripwire: StartTripwire, fake_upstream, fixture: dict[str, Any]
) -> tuple[Running, str, list]:
    """The fixture's requests through Tripwire, each answered 200; (tripwire, its one run, its events)."""
    fake, url = fake_upstream
    fake.replies = replies(fixture)
    fake.default = Reply(text="done.")
    tw = await start_tripwire(llm={"anthropic": {"url": url}})
    assert await replay(tw, fixture) == [200] * len(fixture["requests"])
    await tw.flush()
    (run_id,) = tw.run_ids()
    _, events = assert_run_valid(tw.data_dir, run_id)
    return tw, run_id, events


@pytest.mark.parametrize("version", sorted(VERSIONS))
async def test_one_run_with_its_tool_calls(
    start_tripwire: StartTripwire, fake_upstream, version: str
) -> None:
    fixture = VERSIONS[version]
    tw, run_id, events = await replayed(start_tripwire, fake_upstream, fixture)
    # every request is an LLM call (2.1.197's side request counts)
    assert tw.run_json(run_id)["counts"]["llm_calls"] == len(fixture["requests"])
    assert events[0]["name"] == "run echo, then the demo echo"
    calls = {e["name"]: e["payload"] for e in events if e["event_type"] == "TOOL_CALL"}
    assert calls["Bash"]["args"]["command"] == "echo hello-from-claude"
    assert calls["Bash"]["result"] == "hello-from-claude"
    assert calls["mcp__demo__echo"]["args"] == {"text": "hi from claude"}


# the messages each LLM_CALL records: all of a conversation's first request's, then the answer and
# the tool result each later request adds (2.1.197's title is a conversation of its own)
NEW_MESSAGES = {"2.1.197": [2, 3, 2, 2], "2.1.332": [3, 2, 2]}


@pytest.mark.parametrize("version", sorted(VERSIONS))
async def test_each_call_records_only_its_new_messages(
    start_tripwire: StartTripwire, fake_upstream, version: str
) -> None:
    fixture = VERSIONS[version]
    _, _, events = await replayed(start_tripwire, fake_upstream, fixture)
    llm = [e["payload"] for e in events if e["event_type"] == "LLM_CALL"]
    assert [len(p["prompt"]) for p in llm] == NEW_MESSAGES[version]
    # the system prompt plus the request's messages
    assert [p["prompt_messages_total"] for p in llm] == [
        len(r["body"]["messages"]) + 1 for r in fixture["requests"]
    ]
    last = fixture["requests"][-1]["body"]["messages"]
    assert llm[-1]["prompt"] == last[-2:]  # recorded as sent, its marker included


async def test_max_llm_calls_counts_the_side_request(start_tripwire: StartTripwire, fake_upstream) -> None:
    fake, url = fake_upstream
    fake.replies = replies(CLAUDE_197)
    tw = await start_tripwire(llm={"anthropic": {"url": url}}, guards={"limits": {"max_llm_calls": 1}})
    assert await replay(tw) == [200, 429]
    forwarded = fake.calls("/v1/messages")
    assert len(forwarded) == 1 and not forwarded[0].body.get("tools")  # only the title went


async def test_2_1_332_max_llm_calls_counts_its_steps(start_tripwire: StartTripwire, fake_upstream) -> None:
    fake, url = fake_upstream
    fake.replies = replies(CLAUDE_332)
    tw = await start_tripwire(llm={"anthropic": {"url": url}}, guards={"limits": {"max_llm_calls": 1}})
    assert await replay(tw, CLAUDE_332) == [200, 429]
    assert len(fake.calls("/v1/messages")) == 1
