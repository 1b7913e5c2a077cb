"""Responses API chains across replicas (issue 13): an agent chaining with previous_response_id whose
calls land on different replicas is judged on the chain's whole history, as in one process, and a
blocked (synthetic) answer continued through another replica goes to the real parent."""

from __future__ import annotations

from typing import Any

import openai
import pytest

from tests.conftest import AGENT_KEY, Running, StartTripwire
from tests.fakes import FakeUpstream, Reply
from tests.pipeline_errors import no_pipeline_errors  # noqa: F401 (autouse fixture)

GUARDS = {"loop_detection": {"action": "block", "threshold": 3, "max_repeated_tool_steps": 10}}
SESSION = {"X-Tripwire-Agent": "researcher", "X-Tripwire-Session": "chain-1"}


def client(tw: Running) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=tw.url + "/v1", api_key=AGENT_KEY, default_headers=SESSION)


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
async def test_a_chain_spread_over_replicas_is_judged_whole_and_continues_a_block(
    start_tripwire: StartTripwire, fake_upstream: tuple[FakeUpstream, str], redis_url: str, stream: bool
) -> None:
    fake, url = fake_upstream
    fake.replies = [Reply(tool_calls=[(f"call_{i}", "get_weather", {"city": "Paris"})]) for i in range(3)] + [
        Reply(text="Paris is sunny")
    ]
    replicas = [
        await start_tripwire(upstream={"url": url}, guards=GUARDS, state={"url": redis_url}) for _ in range(3)
    ]
    clients = [client(r) for r in replicas]
    turn = 0

    async def create(**kw: Any) -> Any:
        nonlocal turn
        c = clients[turn % len(clients)]  # round robin: each link of the chain on another replica
        turn += 1
        if not stream:
            return await c.responses.create(model="gpt-4o", **kw)
        async with c.responses.stream(model="gpt-4o", **kw) as s:
            return await s.get_final_response()

    response = await create(input="weather in Paris?")
    ids = [response.id]
    for _ in range(3):
        (call,) = [item for item in response.output if item.type == "function_call"]
        output = {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}
        response = await create(previous_response_id=response.id, input=[output])
        ids.append(response.id)
        if response.id.startswith("resp_tripwire_"):
            break
    # as in one process (tests/test_guards_e2e_llm.py): the 4th request is blocked, never sent upstream
    assert len(fake.calls("/v1/responses")) == 3
    assert response.output_text.startswith("[tripwire] blocked:")
    blocked_input = output

    final = await create(previous_response_id=response.id, input="fine, just summarise")
    assert final.output_text == "Paris is sunny"
    sent = fake.calls("/v1/responses")[-1].body
    assert sent["previous_response_id"] == ids[2]  # the real parent, which the upstream knows
    assert sent["input"][0] == blocked_input  # the tool output the parent is waiting for
    assert sent["input"][1]["content"].startswith("[tripwire] blocked:")
    assert sent["input"][2] == {"role": "user", "content": "fine, just summarise"}
