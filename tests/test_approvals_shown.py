"""What a person sees of a held LLM call (issue 32 item 3): the tool calls the held step repeats
(name, arguments redacted as the trace keeps them) and the loop's evidence, in `GET /api/approvals`,
the webhook and the approval_requested STATE_UPDATE; before, only `{"model", "stream"}`."""

from __future__ import annotations

import asyncio
from typing import Any

import anthropic
import openai
import pytest

from tests.conftest import AGENT_KEY, StartTripwire
from tests.fakes import FakeUpstream, Reply, webhook_receiver
from tests.pipeline_errors import no_pipeline_errors  # noqa: F401 (autouse fixture)
from tests.test_approvals import approvals, decide, until

HEADERS = {"X-Tripwire-Session": "shown-1", "X-Tripwire-Agent": "looper"}
ARGS = {"city": "Paris", "api_key": "sk-live-1234567890abcdef"}  # a secret the trace redacts
GUARDS = {"loop_detection": {"action": "ask", "threshold": 3, "max_repeated_tool_steps": 10}}


async def agent(base: str, dialect: str) -> str:
    """The agent loop: the model asks for get_weather(ARGS) again and again; it runs it each time."""
    if dialect == "anthropic":
        a = anthropic.AsyncAnthropic(
            base_url=base + "/llm/anthropic", api_key=AGENT_KEY, default_headers=HEADERS, max_retries=0
        )
        messages: list[dict[str, Any]] = [{"role": "user", "content": "weather?"}]
        for _ in range(20):
            msg = await a.messages.create(model="claude-sonnet-4-5", max_tokens=100, messages=messages)
            uses = [b for b in msg.content if b.type == "tool_use"]
            if not uses:
                return "".join(b.text for b in msg.content if b.type == "text")
            messages.append({"role": "assistant", "content": [b.model_dump() for b in msg.content]})
            messages.append(
                {
                    "role": "user",
                    "content": [
                        {"type": "tool_result", "tool_use_id": u.id, "content": "sunny"} for u in uses
                    ],
                }
            )
        raise AssertionError("never ended")
    o = openai.AsyncOpenAI(base_url=base + "/v1", api_key=AGENT_KEY, default_headers=HEADERS, max_retries=0)
    chat: list[Any] = [{"role": "user", "content": "weather?"}]
    for _ in range(20):
        answer = await o.chat.completions.create(model="gpt-4o-mini", messages=chat)
        message = answer.choices[0].message
        if not message.tool_calls:
            return str(message.content)
        chat.append(message.model_dump(exclude_none=True))
        chat += [{"role": "tool", "tool_call_id": tc.id, "content": "sunny"} for tc in message.tool_calls]
    raise AssertionError("never ended")


@pytest.mark.parametrize("dialect", ["chat", "anthropic"])
async def test_a_held_llm_call_shows_the_tool_calls_it_repeats_and_the_evidence(
    start_tripwire: StartTripwire, fake_upstream: tuple[FakeUpstream, str], dialect: str
) -> None:
    fake, url = fake_upstream
    fake.replies = [
        Reply(tool_calls=[(f"call_{i}", "get_weather", ARGS), (f"aux_{i}", "get_time", {"tz": "CET"})])
        for i in range(3)
    ] + [Reply(text="done")]
    where = {"llm": {"anthropic": {"url": url}}} if dialect == "anthropic" else {"upstream": {"url": url}}
    async with webhook_receiver() as hook:
        tw = await start_tripwire(**where, guards=GUARDS, admin_token="hunter2", alert_webhook=hook.url)
        run = asyncio.create_task(agent(tw.url, dialect))
        (approval,) = await until(lambda: approvals(tw), "the looping call held")
        await until(lambda: _now(any(h.get("event") == "approval_requested" for h in hook.got)), "webhook")
        (posted,) = [h for h in hook.got if h.get("event") == "approval_requested"]
        status, _ = await decide(tw, approval["id"], {"decision": "approve"})
        assert status == 200
        assert await run == "done"
    redacted = {"city": "Paris", "api_key": "__REDACTED__"}
    expected = [
        {"name": "get_weather", "arguments": redacted},
        {"name": "get_time", "arguments": {"tz": "CET"}},
    ]
    await tw.flush()
    (requested,) = [e for e in tw.events() if e["name"] == "approval_requested"]
    tool_call_ids = {e["event_id"] for e in tw.events() if e["event_type"] == "TOOL_CALL"}
    for shown in (approval, posted, requested["payload"]["approval"]):
        assert shown["call"]["tool_calls"] == expected
        assert shown["kind"] == "ping_pong"  # get_weather -> get_time, three rounds
        evidence = shown["evidence"]
        assert evidence["repetitions"] >= 2 and "get_weather" in evidence["pattern"], evidence
        # the calls' TOOL_CALL events, which the run's timeline shows
        assert evidence["event_ids"] and set(evidence["event_ids"]) <= tool_call_ids
        assert "sk-live" not in str(shown)


async def _now(value: Any) -> Any:
    return value
