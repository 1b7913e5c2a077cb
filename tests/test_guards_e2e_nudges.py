"""A harness that nudges with the same words continues the turn (SPEC §5.1, issue 21 item 4), through
the running proxy with the real `openai` and `anthropic` SDKs, in the three dialects.

The fake model asks for the same tool with the same arguments at every step, and the harness answers
each step with the tool's result and "Continue.". Each nudge used to start a new turn, so no per-turn
pattern ever fired. The first "Continue." follows the task, so it begins a turn; every later one
repeats it word for word and goes on with it: the request whose history holds the 4th identical
step of that turn (the session's 5th call, within max(threshold + 1, 2k) = 6 of the loop's start)
is refused. A real new question at
every step still begins a new turn each time: the same agent is never refused.
"""

from __future__ import annotations

from typing import Any

import anthropic
import openai
import pytest

from tests.conftest import AGENT_KEY, StartTripwire
from tests.fakes import FakeUpstream, Reply
from tests.pipeline_errors import no_pipeline_errors  # noqa: F401 (autouse fixture)
from tests.test_guards_e2e_llm import SESSION, loop_warnings, one_run

GUARDS = {"loop_detection": {"action": "block"}}
BLOCKED_AT = 6  # the request whose history holds the 5th call (the 4th identical step of the nudged turn)
STEPS = 10


def nudge(step: int, *, harness: bool) -> str:
    return "Continue." if harness else f"Now question {step}: what about Paris?"


def repeat_forever(fake: FakeUpstream, prefix: str) -> None:
    fake.replies = [Reply(tool_calls=[(f"{prefix}{i}", "get_weather", {"city": "Paris"})]) for i in range(20)]


async def chat_agent(base: str, *, harness: bool) -> tuple[int, str]:
    """(requests answered by the model, the last answer's text)."""
    client = openai.AsyncOpenAI(base_url=base + "/v1", api_key=AGENT_KEY, default_headers=SESSION)
    messages: list[dict[str, Any]] = [{"role": "user", "content": "weather in Paris?"}]
    for step in range(1, STEPS + 1):
        answer = await client.chat.completions.create(model="gpt-4o-mini", messages=messages)
        msg = answer.choices[0].message
        if not msg.tool_calls:
            return step - 1, msg.content or ""
        messages.append(msg.model_dump(exclude_none=True))
        messages += [
            {"role": "tool", "tool_call_id": tc.id, "content": "sunny, 21C"} for tc in msg.tool_calls
        ]
        messages.append({"role": "user", "content": nudge(step, harness=harness)})
    return STEPS, ""


async def anthropic_agent(base: str, *, harness: bool) -> tuple[int, str]:
    """Claude-Code style: each step's tool results and the nudge in one user message."""
    client = anthropic.AsyncAnthropic(
        base_url=base + "/llm/anthropic", api_key=AGENT_KEY, default_headers=SESSION
    )
    messages: list[dict[str, Any]] = [{"role": "user", "content": "weather in Paris?"}]
    for step in range(1, STEPS + 1):
        msg = await client.messages.create(model="claude-sonnet-4-5", max_tokens=200, messages=messages)
        if msg.stop_reason != "tool_use":
            return step - 1, msg.content[0].text  # type: ignore[union-attr]
        messages.append({"role": "assistant", "content": [b.model_dump() for b in msg.content]})
        blocks: list[dict[str, Any]] = [
            {"type": "tool_result", "tool_use_id": b.id, "content": "sunny"}
            for b in msg.content
            if b.type == "tool_use"
        ]
        messages.append(
            {"role": "user", "content": [*blocks, {"type": "text", "text": nudge(step, harness=harness)}]}
        )
    return STEPS, ""


async def responses_agent(base: str, *, harness: bool) -> tuple[int, str]:
    """A Responses chain: each request sends the tool's output and the nudge, naming the answer before."""
    client = openai.AsyncOpenAI(base_url=base + "/v1", api_key=AGENT_KEY, default_headers=SESSION)
    response = await client.responses.create(model="gpt-4o", input="weather in Paris?")
    for step in range(1, STEPS + 1):
        calls = [item for item in response.output if item.type == "function_call"]
        if not calls:
            return step - 1, response.output_text
        items: list[Any] = [
            {"type": "function_call_output", "call_id": c.call_id, "output": "sunny"} for c in calls
        ]
        items.append({"role": "user", "content": nudge(step, harness=harness)})
        response = await client.responses.create(
            model="gpt-4o", previous_response_id=response.id, input=items
        )
    return STEPS, response.output_text


AGENTS = {
    "chat": (chat_agent, "/v1/chat/completions", "call_"),
    "anthropic": (anthropic_agent, "/v1/messages", "toolu_"),
    "responses": (responses_agent, "/v1/responses", "call_"),
}


async def _start(start_tripwire: StartTripwire, url: str, dialect: str) -> Any:
    if dialect == "anthropic":
        return await start_tripwire(llm={"anthropic": {"url": url}}, guards=GUARDS)
    return await start_tripwire(upstream={"url": url}, guards=GUARDS)


@pytest.mark.parametrize("dialect", sorted(AGENTS))
async def test_a_stuck_agent_nudged_with_the_same_words_is_refused_within_the_bound(
    start_tripwire: StartTripwire, fake_upstream: tuple[FakeUpstream, str], dialect: str
) -> None:
    fake, url = fake_upstream
    agent, path, prefix = AGENTS[dialect]
    repeat_forever(fake, prefix)
    tw = await _start(start_tripwire, url, dialect)
    answered, text = await agent(tw.url, harness=True)
    assert text.startswith("[tripwire] blocked:"), text
    assert answered == BLOCKED_AT - 1 and len(fake.calls(path)) == BLOCKED_AT - 1  # the 6th never went
    _, events = await one_run(tw)
    (warning,) = loop_warnings(events, "repetition", "identical_step")
    assert warning["payload"]["action"] == "block"


@pytest.mark.parametrize("dialect", sorted(AGENTS))
async def test_a_new_question_at_every_step_still_begins_a_turn(
    start_tripwire: StartTripwire, fake_upstream: tuple[FakeUpstream, str], dialect: str
) -> None:
    fake, url = fake_upstream
    agent, path, prefix = AGENTS[dialect]
    repeat_forever(fake, prefix)
    tw = await _start(start_tripwire, url, dialect)
    answered, _ = await agent(tw.url, harness=False)
    first = 1 if dialect == "responses" else 0  # the Responses agent's first request asked the task alone
    assert answered == STEPS and len(fake.calls(path)) == STEPS + first
    _, events = await one_run(tw)
    assert loop_warnings(events, "repetition", "identical_step", "no_progress", "per_tool") == []
