"""A model that answers every "continue" with the same text and no tool call is a loop (issue 31),
through the running proxy with the real `openai` and `anthropic` SDKs, in the three dialects.

The fake model says the same sentence on every request; the harness answers each with "continue".
No tool is ever called, so no tool pattern sees it. The request whose conversation ends with the
3rd identical reply to the same nudge is warned (forwarded, a LOOP_WARNING), the one with the 5th
(`threshold`) is refused with a blocked answer that ends the turn; a replay of the run from its
trace takes the same decisions. A model whose text moves on is never touched.
"""

from __future__ import annotations

from typing import Any

import anthropic
import openai
import pytest

from proxy.replay import replay_dir
from tests.conftest import AGENT_KEY, StartTripwire
from tests.fakes import FakeUpstream, Reply
from tests.pipeline_errors import no_pipeline_errors  # noqa: F401 (autouse fixture)
from tests.test_guards_e2e_llm import SESSION, loop_warnings, one_run

SAME = "I have reviewed the migration plan. Shall I continue with the next step?"
STEPS = 8
REFUSED_AT = 6  # the request whose conversation holds the 5th identical reply


async def chat_agent(base: str) -> list[str]:
    """The texts the agent received, request by request, until a blocked answer (or STEPS)."""
    client = openai.AsyncOpenAI(base_url=base + "/v1", api_key=AGENT_KEY, default_headers=SESSION)
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Migrate the orders table."}]
    got = []
    for _ in range(STEPS):
        answer = await client.chat.completions.create(model="gpt-4o-mini", messages=messages)
        text = answer.choices[0].message.content or ""
        got.append(text)
        if text.startswith("[tripwire]"):
            break
        messages += [{"role": "assistant", "content": text}, {"role": "user", "content": "continue"}]
    return got


async def anthropic_agent(base: str) -> list[str]:
    client = anthropic.AsyncAnthropic(
        base_url=base + "/llm/anthropic", api_key=AGENT_KEY, default_headers=SESSION
    )
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Migrate the orders table."}]
    got = []
    for _ in range(STEPS):
        msg = await client.messages.create(model="claude-sonnet-4-5", max_tokens=200, messages=messages)
        text = msg.content[0].text  # type: ignore[union-attr]
        got.append(text)
        if text.startswith("[tripwire]"):
            break
        messages += [
            {"role": "assistant", "content": [{"type": "text", "text": text}]},
            {"role": "user", "content": [{"type": "text", "text": "continue"}]},
        ]
    return got


async def responses_agent(base: str) -> list[str]:
    """Stateless Responses (Codex's `store: false`): the whole conversation as input each time."""
    client = openai.AsyncOpenAI(base_url=base + "/v1", api_key=AGENT_KEY, default_headers=SESSION)
    items: list[Any] = [{"role": "user", "content": "Migrate the orders table."}]
    got = []
    for _ in range(STEPS):
        response = await client.responses.create(model="gpt-4o", input=items, store=False)
        text = response.output_text
        got.append(text)
        if text.startswith("[tripwire]"):
            break
        items += [
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]},
            {"role": "user", "content": "continue"},
        ]
    return got


AGENTS = {
    "chat": (chat_agent, "/v1/chat/completions"),
    "anthropic": (anthropic_agent, "/v1/messages"),
    "responses": (responses_agent, "/v1/responses"),
}


async def _start(start_tripwire: StartTripwire, url: str, dialect: str) -> Any:
    if dialect == "anthropic":
        return await start_tripwire(llm={"anthropic": {"url": url}})
    return await start_tripwire(upstream={"url": url})


@pytest.mark.parametrize("dialect", sorted(AGENTS))
async def test_the_same_reply_to_every_continue_is_warned_then_refused_and_replays(
    start_tripwire: StartTripwire, fake_upstream: tuple[FakeUpstream, str], dialect: str
) -> None:
    fake, url = fake_upstream
    agent, path = AGENTS[dialect]
    fake.replies = [Reply(text=SAME) for _ in range(STEPS)]
    tw = await _start(start_tripwire, url, dialect)
    got = await agent(tw.url)
    assert got[:-1] == [SAME] * (REFUSED_AT - 1) and got[-1].startswith("[tripwire] blocked:"), got
    assert len(fake.calls(path)) == REFUSED_AT - 1  # the refused request never reached the model
    run_id, events = await one_run(tw)
    warnings = [
        (w["payload"]["action"], w["payload"]["threshold"]) for w in loop_warnings(events, "repeated_reply")
    ]
    assert warnings == [("warn", 3), ("block", 5)]
    replay = replay_dir(tw.data_dir / "runs" / run_id)
    assert replay.live and replay.replayed_checks == replay.live


@pytest.mark.parametrize("dialect", sorted(AGENTS))
async def test_a_model_whose_text_moves_on_is_never_touched(
    start_tripwire: StartTripwire, fake_upstream: tuple[FakeUpstream, str], dialect: str
) -> None:
    fake, url = fake_upstream
    agent, path = AGENTS[dialect]
    fake.replies = [Reply(text=f"Part {i + 1}: the {i + 1}th table is migrated.") for i in range(STEPS)]
    tw = await _start(start_tripwire, url, dialect)
    got = await agent(tw.url)
    assert len(got) == STEPS and not any(t.startswith("[tripwire]") for t in got)
    _, events = await one_run(tw)
    assert loop_warnings(events, "repeated_reply") == []
